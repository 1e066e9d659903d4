"""Sampling: each step draws the next token from the model's distribution
(after `temperature` and a top-k or top-p cut), instead of ranking.

It is a strategy of the one search (`search.py`): the step's candidates
(`transforms.candidates`) are ranked by their log-probability plus Gumbel
noise, and the best of that ranking is a draw from the distribution (the
Gumbel-max trick); their values stay the log-probabilities, which the
search adds up into the output's score. So every path of the search
samples alike: the host search, its compiled segments and loop,
ensembles (from the models' mean distribution) and the SavedModel.

The noise is a function of the seed, the source (a hash of its token ids,
`source_keys`), the step and the token (an integer hash, `gumbel_noise`),
the same on every backend and path: a source's sample is a function of
the source and the seed, whatever batch it is in.
"""

from keras_transformer.runtime.array_ops import array_ops

# lowbias32's multipliers (Chris Wellons' integer hash), as int32 bit
# patterns, and the seed's and step's spreads: int32 products wrap as
# uint32 ones do on every backend.
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B - 2**32)
_SEED_SPREAD, _STEP_SPREAD = 0x9E3779B1 - 2**32, 0x85EBCA77 - 2**32


def gumbel_noise(seed, keys, index, vocabulary_size, ops):
    """`(sources, vocabulary_size)` float32 standard Gumbel noise for step
    `index` (a Python int or a scalar tensor) of the search seeded with
    `seed`, for the sources of int32 `keys` (`source_keys`).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_transformer.runtime.array_ops import KERAS_OPS
    >>> keys = ops.convert_to_tensor([7, 8], "int32")
    >>> noise = ops.convert_to_numpy(gumbel_noise(0, keys, 3, 5, KERAS_OPS))
    >>> noise.shape, bool(np.isfinite(noise).all())
    ((2, 5), True)
    """
    tokens = ops.arange(vocabulary_size, dtype="int32")[None, :]
    step = _hashed(ops.cast(keys, "int32") + ops.cast(index, "int32") * _STEP_SPREAD + _wrapped(seed * _SEED_SPREAD), ops)
    x = _hashed(tokens + step[:, None] * _MULTIPLIERS[0], ops)
    # 23 bits: (2m + 1) / 2**24 is exact in float32, strictly inside (0, 1).
    uniform = (ops.cast(ops.bitwise_and(ops.right_shift(x, 9), 0x7FFFFF), "float32") * 2.0 + 1.0) / 2.0**24
    return -ops.log(-ops.log(uniform))


def source_keys(encoder_ids, encoder_mask, ops):
    """An int32 key of each source from its token ids, whatever padding
    its batch gives it: the sum of a hash of each token and position."""
    ids = ops.cast(encoder_ids, "int32")
    positions = ops.arange(ops.shape(ids)[1], dtype="int32")[None, :]
    hashed = _hashed(ids + positions * _STEP_SPREAD, ops) * ops.cast(encoder_mask, "int32")
    return ops.sum(hashed, axis=1)


def _wrapped(value):
    """A Python int as the int32 its low 32 bits make."""
    return (value + 2**31) % 2**32 - 2**31


def _hashed(x, ops):
    """lowbias32 of int32 `x`: shifts made logical by a mask."""
    x = ops.bitwise_xor(x, ops.bitwise_and(ops.right_shift(x, 16), 0xFFFF))
    x = x * _MULTIPLIERS[0]
    x = ops.bitwise_xor(x, ops.bitwise_and(ops.right_shift(x, 15), 0x1FFFF))
    x = x * _MULTIPLIERS[1]
    return ops.bitwise_xor(x, ops.bitwise_and(ops.right_shift(x, 16), 0xFFFF))


def sampling_transforms(settings):
    """The logits transforms that set the distribution sampled from:
    division by the temperature, then the top-k or top-p cut."""
    transforms = []
    if settings.temperature != 1.0:
        transforms.append(lambda logits, index, ops, history: ops.cast(logits, "float32") / settings.temperature)
    if settings.sampling == "top_k":
        transforms.append(lambda logits, index, ops, history: top_k_cut(logits, settings.top_k, ops))
    elif settings.sampling == "top_p":
        transforms.append(lambda logits, index, ops, history: top_p_cut(logits, settings.top_p, ops))
    return transforms


def top_k_cut(logits, k, ops):
    """`logits` with `-inf` below each row's k-th largest (ties kept)."""
    k = min(k, ops.shape(logits)[1])
    kth = ops.top_k(ops.cast(logits, "float32"), k)[0][:, k - 1 :]
    return ops.where(logits >= kth, ops.cast(logits, "float32"), float("-inf"))


def top_p_cut(logits, p, ops):
    """`logits` with `-inf` for each row's tokens outside the fewest most
    probable ones whose probabilities sum to at least `p` (the most
    probable always kept; ties at the cut kept)."""
    logits = ops.cast(logits, "float32")
    ordered = ops.top_k(logits, ops.shape(logits)[1])[0]
    probabilities = ops.exp(ordered - ops.logsumexp(ordered, axis=-1, keepdims=True))
    before = ops.cumsum(probabilities, axis=1) - probabilities  # the mass of the more probable ones
    kept = ops.sum(ops.cast(before < p, "int32"), axis=1)
    smallest = ops.take_along_axis(ordered, ops.reshape(kept - 1, (-1, 1)), axis=1)
    return ops.where(logits >= smallest, logits, float("-inf"))


def sampled_extensions(logits, log_probs, index, settings, keys):
    """The candidates of a sampling step, as `rules.best_extensions` gives
    a search's: `(values, flat indices)`, `(batch, 2)`: the token that
    ranks best by log-probability plus Gumbel noise (the draw), valued by
    log-probability (the beam's plus the token's), then none (`-inf`). `logits` are the
    step's after its transforms, with `-inf` for the tokens never output;
    `keys`, the sources' `source_keys`."""
    ops = array_ops(logits)
    logits = ops.cast(logits, "float32")
    token_log_probs = logits - ops.logsumexp(logits, axis=-1, keepdims=True)
    vocabulary_size = ops.shape(logits)[1]
    noisy = token_log_probs + gumbel_noise(settings.seed, keys, index, vocabulary_size, ops)
    log_probs = ops.convert_to_tensor(log_probs, "float32")
    # One beam a source (`DecodingSettings` refuses more): its row. The
    # draw is the one candidate (the second, `-inf`, is never used: were it
    # kept, a source whose draw ends it at its budget would finish the
    # runner-up too, and keep the better of the two).
    _, flat = ops.top_k(noisy, 2)
    drawn = ops.take_along_axis(token_log_probs, flat[:, :1], axis=1) + log_probs
    values = ops.concatenate([drawn, ops.full(ops.shape(drawn), float("-inf"), "float32")], axis=1)
    return values, flat

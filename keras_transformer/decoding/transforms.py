"""Per-step transforms of the next-token logits, before the search ranks
them: the one seam where a step's choices are shaped (as transformers'
`LogitsProcessor`s).

Every path of the search (the host search a step a call, its compiled
segments, the compiled loop, ensembles and the SavedModel) ranks a step's
candidates through `candidates` (`search.py` and `interface.py` call it),
so a transform added to `step_transforms` applies to all of them.

A transform is `transform(logits, index, ops, history)`: `(rows,
vocabulary_size)` float32 logits (or log-probabilities) at output position
`index` (a scalar: a Python int or a tensor), in the namespace `ops` of
`keras_transformer.runtime.array_ops`; it returns logits of the same shape.
`history` is int32 `(rows, width)`, each row's output so far (positions
before `index`; zeros after), where the settings ask for it
(`uses_history`): the search passes its beams' tokens (`search.py`).
"""

import functools

import numpy as np

from keras_transformer.decoding.rules import best_extensions
from keras_transformer.decoding.sampling import sampled_extensions
from keras_transformer.decoding.sampling import sampling_transforms
from keras_transformer.runtime.array_ops import array_ops


def forced_prefix(prefix):
    """The transform that forces the token ids `prefix` at the first
    `len(prefix)` output positions: every other token's logit is `-inf`
    there, and the forced token's 0, so that its log-probability is 0 (the
    output's score is that of the tokens after the prefix, as with
    transformers' `forced_bos_token_id`).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_transformer.runtime.array_ops import KERAS_OPS
    >>> logits = np.zeros((1, 4), "float32")
    >>> transform = forced_prefix((2,))
    >>> ops.convert_to_numpy(transform(logits, 0, KERAS_OPS)).tolist()
    [[-inf, -inf, 0.0, -inf]]
    >>> ops.convert_to_numpy(transform(logits, 1, KERAS_OPS)).tolist()  # past the prefix
    [[0.0, 0.0, 0.0, 0.0]]
    """
    prefix = np.asarray(prefix, "int32")

    def transform(logits, index, ops, history=None):
        vocabulary_size = ops.shape(logits)[1]
        forced_ids = ops.convert_to_tensor(prefix, "int32")
        at = ops.minimum(index, len(prefix) - 1)
        token = ops.take(forced_ids, ops.reshape(ops.cast(at, "int32"), (1,)), axis=0)
        forced = ops.where(ops.arange(vocabulary_size, dtype="int32")[None, :] == token[:, None], 0.0, float("-inf"))
        return ops.where(ops.cast(index, "int32") < len(prefix), ops.cast(forced, "float32"), ops.cast(logits, "float32"))

    return transform


def forced_prefixes(prefixes, beams):
    """The transform that forces each source's own tokens at the first
    output positions, as `forced_prefix` forces one prefix for all:
    `prefixes` is int32 `(sources, length)`, a row a source (the target
    language code of a multilingual model's SavedModel, then the prefix),
    and the logits' rows are the sources' `beams` beams, consecutive.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_transformer.runtime.array_ops import KERAS_OPS
    >>> logits = np.zeros((4, 3), "float32")  # 2 sources of 2 beams
    >>> transform = forced_prefixes(np.array([[2], [1]], "int32"), beams=2)
    >>> ops.convert_to_numpy(transform(logits, 0, KERAS_OPS)).tolist()
    [[-inf, -inf, 0.0], [-inf, -inf, 0.0], [-inf, 0.0, -inf], [-inf, 0.0, -inf]]
    """

    def transform(logits, index, ops, history=None):
        vocabulary_size = ops.shape(logits)[1]
        sources, length = ops.shape(prefixes)[0], ops.shape(prefixes)[1]
        at = ops.reshape(ops.cast(ops.minimum(index, length - 1), "int32"), (1,))
        token = ops.reshape(ops.take(ops.convert_to_tensor(prefixes, "int32"), at, axis=1), (-1, 1))
        token = ops.reshape(ops.broadcast_to(token, (sources, beams)), (-1,))
        forced = ops.where(ops.arange(vocabulary_size, dtype="int32")[None, :] == token[:, None], 0.0, float("-inf"))
        return ops.where(ops.cast(index, "int32") < length, ops.cast(forced, "float32"), ops.cast(logits, "float32"))

    return transform


def no_repeat_ngram(n):
    """The transform that bans repeated n-grams (fairseq's and
    transformers' `no_repeat_ngram_size`): a token that would complete,
    with the row's last `n - 1` tokens, an n-gram the row's output already
    holds gets `-inf` (the other tokens' probabilities are then those of
    the model's distribution over the tokens allowed).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_transformer.runtime.array_ops import KERAS_OPS
    >>> history = np.array([[3, 1, 3, 0, 0]], "int32")  # 3 1 3 so far
    >>> logits = np.zeros((1, 4), "float32")
    >>> ops.convert_to_numpy(no_repeat_ngram(2)(logits, 3, KERAS_OPS, history)).tolist()  # not 1 after 3 again
    [[0.0, -inf, 0.0, 0.0]]
    """

    def transform(logits, index, ops, history):
        # (Found where the history is: on the host where PyTorch keeps the
        # search's state there, `runtime.array_ops.search_state_ops`.)
        banned = repeated_ngram_ends(history, index, n, ops.shape(logits)[1], array_ops(history))
        return ops.where(ops.convert_to_tensor(banned, "bool"), float("-inf"), ops.cast(logits, "float32"))

    return transform


def repeated_ngram_ends(history, index, n, vocabulary_size, ops):
    """Bool `(rows, vocabulary_size)`: the tokens that would complete, at
    output position `index`, an n-gram that each row of `history` (int32
    `(rows, width)`, the tokens before `index`) holds already.

    Each earlier start `p` (with `p + n - 1 < index`) whose `n - 1` tokens
    are the row's last `n - 1` bans the token at `p + n - 1`; the starts
    are compared at once, over a copy of `history` padded with `n` tokens
    that match nothing, so that every start's tokens lie inside it (any
    width, a traced one too).
    """
    history = ops.cast(history, "int32")
    rows = ops.shape(history)[0]
    starts = ops.shape(history)[1] + 1
    padded = ops.concatenate([history, ops.full((rows, n), -1, "int32")], axis=1)
    index = ops.cast(index, "int32")
    same = ops.broadcast_to(ops.arange(starts, dtype="int32")[None, :] < index - (n - 1), (rows, starts))
    if n > 1:
        positions = index - (n - 1) + ops.arange(n - 1, dtype="int32")
        last = ops.take(history, ops.where(positions < 0, 0, positions), axis=1)
        for j in range(n - 1):
            same = same & (padded[:, j : j + starts] == last[:, j : j + 1])
    following = ops.where(same, padded[:, n - 1 : n - 1 + starts], 0)
    flat = ops.reshape(ops.arange(rows, dtype="int32")[:, None] * vocabulary_size + following, (-1, 1))
    counts = ops.scatter(flat, ops.reshape(ops.cast(same, "int32"), (-1,)), (rows * vocabulary_size,))
    return ops.reshape(counts > 0, (rows, vocabulary_size))


def uses_history(settings):
    """Whether the transforms of `settings` read each row's tokens so far
    (`candidates`' `history`)."""
    return settings.no_repeat_ngram_size > 0


@functools.lru_cache(maxsize=256)
def step_transforms(settings):
    """The transforms that `settings` (a `DecodingSettings`) asks for,
    in the order they apply: the n-gram ban first (a sampling cut keeps
    the best tokens allowed), the forced prefix last."""
    transforms = [no_repeat_ngram(settings.no_repeat_ngram_size)] if settings.no_repeat_ngram_size else []
    transforms += sampling_transforms(settings)
    if settings.target_prefix:
        transforms.append(forced_prefix(settings.target_prefix))
    return tuple(transforms)


def candidates(logits, log_probs, index, never_output, settings, keys=None, history=None, prefixes=None):
    """Rule 2 of the search (`rules.py`) after the step's transforms: the
    `2 * beam_size` best one-token extensions of each source's beams,
    `(values, flat indices)` as `rules.best_extensions` gives them; where
    `settings.sampling` asks for it, a draw first (`sampling.py`).

    Args:
        logits: `(rows, vocabulary_size)` next-token logits (the beams of
            a source consecutive rows).
        log_probs: `(sources, beams)` float32, the beams' log-probabilities.
        index: the output position the logits are for.
        never_output: `rules.never_output_bias` of the model.
        settings: the search's `DecodingSettings`.
        keys: where `settings.sampling`, the sources' `sampling.source_keys`.
        history: where `uses_history(settings)`, int32 `(rows, width)`:
            each row's output tokens so far (`search.history_of`).
        prefixes: int32 `(sources, length)`, each source's forced first
            tokens (`forced_prefixes`, last), or None.
    """
    transforms = step_transforms(settings)
    if prefixes is not None:
        transforms = (*transforms, forced_prefixes(prefixes, settings.beam_size))
    if uses_history(settings) and history is None:
        raise ValueError("These settings' transforms read the outputs so far: give candidates their history.")
    if settings.sampling is not None:
        # (The tokens never output leave before a top-k or top-p cut.)
        ops = array_ops(logits)
        logits = ops.cast(logits, "float32") + ops.convert_to_tensor(never_output, "float32")
    if transforms:
        ops = array_ops(logits)
        for transform in transforms:
            logits = transform(logits, index, ops, history)
    if settings.sampling is not None:
        return sampled_extensions(logits, log_probs, index, settings, keys)
    return best_extensions(logits, log_probs, never_output, 2 * settings.beam_size)

"""The rules of beam search (paper section 6.1), written once.

The search (`search.py`) applies them at every step, however it is driven
(`beam.py`). The formulas take arrays of a NumPy-like namespace `xp`
(`runtime.array_ops`' in the search, NumPy where a caller has numbers).

The rules:

1. **Output budget.** A source of n tokens may have n + `max_length_offset`
   output tokens (the paper: 50), within the model's positions.
2. **Candidates.** Each step ranks the `2 * beam_size` best one-token
   extensions of a source's live beams by log-probability (as fairseq
   does); padding and start tokens are never candidates.
3. **Ranking.** End tokens among the best `beam_size` candidates finish
   hypotheses (the end token counts in |Y|, it is not in the output); the
   best `beam_size` other candidates stay live. A finished hypothesis
   scores log P(Y | X) / lp(Y), with lp of `length_penalty`.
4. **Maximum length.** At its budget a source's live beams finish as they
   are.
5. **Stopping** (`search_is_over`): see there.
"""

import functools
import math

import numpy as np
from keras import ops


def length_penalty(length, alpha, kind="gnmt", xp=np, dtype="float64"):
    """lp(Y): GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), or
    |Y| ** alpha for `"length"`, in `dtype`.

    Example:

    >>> round(float(length_penalty(7, 0.6)), 4)  # ((5 + 7) / 6) ** 0.6
    1.5157
    >>> round(float(length_penalty(7, 0.6, "length")), 4)  # 7 ** 0.6
    3.2141
    """
    length = xp.asarray(length, dtype)
    if kind == "length":
        return length**alpha
    return ((5.0 + length) / 6.0) ** alpha


def output_budget(source_lengths, max_length_offset, limit, xp=np):
    """Rule 1: the output tokens a source of `source_lengths` tokens may
    have: its length plus `max_length_offset`, within the model's `limit`
    positions (the start token takes one)."""
    return xp.minimum(source_lengths + max_length_offset, limit - 1)


def output_budgets(sources, max_length_offset, limit):
    """`output_budget` of each non-empty source (token id lists) as an int
    array, refusing an offset that leaves a source no output token."""
    budgets = output_budget(np.array([len(ids) for ids in sources], "int64"), max_length_offset, limit)
    if len(budgets) and budgets.min() < 1:
        raise ValueError(
            f"max_length_offset={max_length_offset} leaves no output token for a source of "
            f"{min(len(ids) for ids in sources)} tokens: outputs may have the source's length plus "
            "max_length_offset tokens."
        )
    return budgets


def never_output_bias(model):
    """Rule 2's `(vocabulary_size,)` float32 bias: `-inf` for the tokens
    that decoding never outputs (padding and start), 0 for the others."""
    bias = np.zeros(model.backbone.vocabulary_size, "float32")
    bias[model.special_token_ids.never_output] = -np.inf
    return bias


def best_extensions(logits, log_probs, never_output, count):
    """Rule 2: the `count` best one-token extensions of each source's beams.

    Runs inside the compiled decoding step (Keras ops), so that only `count`
    candidates a source leave the device.

    A source's `count` best extensions are among the `count` best tokens of
    each of its beams, so each beam's tokens are ranked first and only
    those candidates are combined with the beams' log-probabilities: at 64
    sources of 4 beams and 8,000 tokens, every pass over the `(rows,
    vocabulary_size)` log-probabilities moves 8 MB, and the two passes that
    added the never-output bias and the beams' log-probabilities to all of
    them took 3.3 ms a step on PyTorch, against 5.1-5.6 ms for the output
    projection's matrix product (float32, 2-core CPU). The never-output
    tokens are dropped after that ranking (each beam ranks as many more
    tokens as there are never-output tokens). PyTorch ranks a source's
    chunks of tokens at once instead (`_torch_best_extensions`). The
    values are those of ranking all `beams * vocabulary_size` extensions
    at once, and so is the
    order of ties (lower beam, then lower token first) where the backend's
    `top_k` keeps lower indices first, as JAX's and TensorFlow's do.

    Args:
        logits: `(batch * beams, vocabulary_size)` next-token logits.
        log_probs: `(batch, beams)` float32 log-probabilities of the beams
            (`-inf` for beams that are not live).
        never_output: `(vocabulary_size,)` float32 NumPy array, 0 for
            tokens that may be output and `-inf` for those that may not
            (padding, start).
        count: how many extensions to return a source.

    Returns:
        `(values, indices)`, each `(batch, count)`, best first: the
        extensions' log-probabilities and their flat indices
        `beam * vocabulary_size + token`.

    Example:

    >>> import numpy as np
    >>> logits = np.log(np.array([[0.1, 0.6, 0.3], [0.5, 0.1, 0.4]], "float32"))
    >>> log_probs = np.log(np.array([[0.5, 0.5]], "float32"))
    >>> never = np.array([-np.inf, 0.0, 0.0], "float32")  # token 0 is never output
    >>> values, indices = best_extensions(logits, log_probs, never, 3)
    >>> print(np.exp(ops.convert_to_numpy(values)).round(2))
    [[0.3  0.2  0.15]]
    >>> ops.convert_to_numpy(indices).tolist()  # beam * 3 + token
    [[1, 5, 2]]
    """
    import keras

    if keras.config.backend() == "torch":
        return _torch_best_extensions(logits, log_probs, never_output, count)
    log_probs = ops.convert_to_tensor(log_probs, "float32")
    batch, beams = ops.shape(log_probs)[0], ops.shape(log_probs)[1]
    logits = ops.cast(logits, "float32")
    vocabulary_size = len(never_output)
    per_beam = count + int(np.isneginf(never_output).sum())
    # (`count` is a tensor in a TensorFlow graph traced for any beam size.)
    per_beam = min(per_beam, vocabulary_size) if isinstance(per_beam, int) else ops.minimum(per_beam, vocabulary_size)
    if isinstance(per_beam, int) and isinstance(beams, int):
        # (A single beam over a vocabulary of fewer than `count` tokens has
        # fewer extensions: all of them.)
        count = min(count, beams * per_beam)
    best, tokens = _best_log_probs(logits, per_beam)
    best = ops.add(best, ops.take(ops.convert_to_tensor(never_output), tokens))
    candidates = ops.add(log_probs[:, :, None], ops.reshape(best, (batch, beams, per_beam)))
    values, order = ops.top_k(ops.reshape(candidates, (batch, beams * per_beam)), count)
    tokens = ops.take_along_axis(ops.reshape(tokens, (batch, beams * per_beam)), order, axis=1)
    return values, (order // per_beam) * vocabulary_size + tokens


def _torch_best_extensions(logits, log_probs, never_output, count):
    """`best_extensions` on PyTorch, in PyTorch's own calls: PyTorch runs a
    decoding step eagerly, and for one sentence's beams the dozen Keras ops
    of the other version (each converting and checking its inputs) took as
    long as the decoder layers' arithmetic.

    Where the vocabulary divides into chunks (`_source_chunk_length`), a
    source's extensions are ranked in chunks of its beams' tokens
    (`_best_in_chunks`), not each beam's tokens first: PyTorch's CPU
    `topk` costs about a microsecond a row for rows of a few hundred
    values, and ranking each of 256 beams' best chunks and then their
    tokens took more than the log-softmax itself. Otherwise each beam's
    best tokens are ranked first, as on the other backends.
    """
    import torch

    logits = torch.as_tensor(logits)
    log_probs = torch.as_tensor(log_probs, dtype=torch.float32, device=logits.device)
    batch, beams = log_probs.shape
    vocabulary_size = len(never_output)
    bias, forbidden = _torch_never_output(never_output, logits.device)
    if logits.dtype == torch.float32 or torch.is_grad_enabled():
        token_log_probs = torch.log_softmax(logits.float(), dim=-1)
    else:
        # Lower-precision logits: their float32 copy, this function's own,
        # takes the log-softmax in place (row by row, each row read before
        # it is written). Another new buffer of the logits' size costs more
        # than the log-softmax at 64 sentences' beams: bfloat16, (256,
        # 8,000) logits, 2-core AMD EPYC, the conversion and log-softmax
        # 2.3-4.2 ms a step into a new buffer, 2.4 in place.
        token_log_probs = logits.float()
        torch.ops.aten._log_softmax.out(token_log_probs, -1, False, out=token_log_probs)
    chunk = _source_chunk_length(beams, vocabulary_size, count)
    if chunk is not None:
        token_log_probs.index_fill_(1, forbidden, -math.inf)  # (a new tensor: this step's own)
        return _best_in_chunks(token_log_probs.view(batch, beams, vocabulary_size), log_probs, count, chunk)
    per_beam = min(count + len(forbidden), vocabulary_size)
    count = min(count, beams * per_beam)
    best, tokens = torch.topk(token_log_probs, per_beam)
    candidates = (best + bias[tokens]).view(batch, beams, per_beam) + log_probs[:, :, None]
    values, order = torch.topk(candidates.view(batch, beams * per_beam), count)
    tokens = tokens.view(batch, beams * per_beam).gather(1, order)
    return values, (order // per_beam) * vocabulary_size + tokens


def _best_in_chunks(token_log_probs, log_probs, count, chunk):
    """The `count` best extensions of each source's beams, from their
    `(batch, beams, vocabulary_size)` token log-probabilities (never-output
    tokens at `-inf`) and `(batch, beams)` log-probabilities, ranked in
    chunks of `chunk` consecutive tokens of a beam: a source's `count` best
    extensions lie in the `count` chunks whose best extension (the chunk's
    best token plus its beam's log-probability) is best, since each of
    those chunks holds an extension at least as good as the `count`-th
    best, so only those chunks' tokens are ranked. Each value is a token's
    log-probability plus its beam's, as ranking every extension gives it;
    PyTorch's `topk` leaves the order of equal values open.
    """
    import torch

    batch, beams, vocabulary_size = token_log_probs.shape
    per_beam = vocabulary_size // chunk
    chunks = token_log_probs.view(batch, beams * per_beam, chunk)
    maxima = chunks.amax(-1).view(batch, beams, per_beam) + log_probs[:, :, None]
    _, best_chunks = torch.topk(maxima.view(batch, beams * per_beam), count)
    beam_of_chunk = best_chunks // per_beam
    candidates = chunks.gather(1, best_chunks[:, :, None].expand(-1, -1, chunk))
    candidates = candidates + log_probs.gather(1, beam_of_chunk)[:, :, None]
    values, within = torch.topk(candidates.view(batch, count * chunk), count)
    picked = best_chunks.gather(1, within // chunk)  # beam * per_beam + chunk of the beam
    # (`chunk` divides the vocabulary: chunk `picked` starts at flat index
    # `beam * vocabulary_size + (picked % per_beam) * chunk`, `picked * chunk`.)
    return values, picked * chunk + within % chunk


@functools.lru_cache(maxsize=64)  # (called at every step with the same few arguments)
def _source_chunk_length(beams, vocabulary_size, count):
    """The chunk length of `_best_in_chunks`: the divisor of
    `vocabulary_size` from 32 to 320 tokens nearest 160, with at least
    `4 * count` chunks a source; None where there is none. Measured on
    8,000 tokens (2-core Intel Xeon, 64 sources of 4 beams, the whole
    ranking with the log-softmax): 1.37 ms in chunks of 160 tokens, 1.55
    of 32, 1.68 of 64, 1.60 of 400; each beam's tokens ranked first, 2.04.
    """
    divisors = [
        n for n in range(32, 321) if vocabulary_size % n == 0 and beams * (vocabulary_size // n) >= 4 * count
    ]
    return min(divisors, key=lambda n: abs(n - 160), default=None)


# The last never-output bias `_torch_never_output` converted: a search
# passes the same array at every step.
_never_output_held = [None, None]


def _torch_never_output(never_output, device):
    """`never_output` as a PyTorch tensor on `device`, and the indices of
    the tokens it forbids (a tensor); converted once for the same array."""
    import torch

    array, held = _never_output_held
    if array is not never_output or held[0].device != device:
        forbidden = np.flatnonzero(np.isneginf(never_output))
        held = (torch.as_tensor(never_output, device=device), torch.as_tensor(forbidden, device=device))
        _never_output_held[:] = [never_output, held]
    return held


def _best_log_probs(logits, k):
    """`keras.ops.top_k(keras.ops.log_softmax(logits), k)` for 2-D float32
    `logits`.

    A row's log-softmax is its logits less its log-sum-exp, so on JAX and
    TensorFlow the best logits are ranked and only they are normalized:
    XLA fuses a log-softmax into each op that reads it, computing it
    again in each (256 rows of 8,000 tokens, 2 cores: 1.6 ms a step on JAX
    against 3.9, 3.1 against 4.7 on TensorFlow). (PyTorch's log-softmax is
    one kernel, faster than its log-sum-exp and a subtraction: there it
    comes first, `_torch_best_extensions`.)
    """
    best, tokens = _top_k_of_many(logits, k)
    return best - ops.logsumexp(logits, axis=-1, keepdims=True), tokens


def _top_k_of_many(x, k):
    """`keras.ops.top_k(x, k)` over the last axis of a 2-D `x`, for `k` much
    smaller than the axis (a few tokens of a vocabulary), on JAX and
    TensorFlow (PyTorch ranks a source's chunks at once:
    `_best_in_chunks`).

    Ranking all 8,000 tokens of 256 rows for their 10 best took 2.5 ms in
    JAX's compiled `top_k` (2 cores): as much as half the output
    projection's matrix product. So the axis is cut into equal chunks: the
    k best values lie in the k chunks with the largest maxima (each of
    those holds a value at least the k-th best), and `top_k` ranks those
    chunks' positions only: 1.2 ms. The values are `top_k`'s, and among
    equal values the lower index comes first, as `top_k` orders them (the
    chosen chunks are read in index order). Without a chunk length that
    divides the axis (32 to 128 positions) it is `top_k` itself: padding
    the axis would copy it.
    """
    size = ops.shape(x)[1]
    chunk = _chunk_length(size, k)
    if chunk is None:
        return ops.top_k(x, k)
    chunks = ops.reshape(x, (-1, size // chunk, chunk))
    _, best_chunks = ops.top_k(ops.max(chunks, axis=-1), k)
    best_chunks = ops.sort(best_chunks, axis=-1)  # index order, for the order of ties
    candidates = ops.reshape(ops.take_along_axis(chunks, best_chunks[:, :, None], axis=1), (-1, k * chunk))
    values, within = ops.top_k(candidates, k)
    return values, ops.take_along_axis(best_chunks, within // chunk, axis=1) * chunk + within % chunk


def _chunk_length(size, k):
    """The chunk length of `_top_k_of_many` for an axis of `size`: the
    divisor of `size` from 32 to 128 nearest 64 (fastest on 8,000 tokens),
    if the axis has at least 4 * k chunks; else None (also where either is
    not a Python int: a TensorFlow graph traced for any shape or beam
    size)."""
    if not (isinstance(size, int) and isinstance(k, int)):
        return None
    divisors = [n for n in range(32, 129) if size % n == 0 and size // n >= 4 * k]
    return min(divisors, key=lambda n: abs(n - 64), default=None)


def search_is_over(
    finished_count,
    best_live_log_prob,
    nth_best_score,
    kth_best_score,
    length,
    budget,
    beam_size,
    num_results,
    alpha,
    kind="gnmt",
    xp=np,
    dtype="float64",
):
    """Rule 5: whether a source with live beams is done before its budget.

    `"gnmt"`: done with `beam_size` finished hypotheses, or once the n-th
    best finished score (n results asked for) is at least the best score a
    live beam can still reach: log-probabilities only fall, and with alpha
    >= 0 the penalty only grows, so that is the best live log-probability
    over the penalty at the budget.

    `"length"` (transformers' `early_stopping=False`): with `beam_size`
    finished, done once the best live beam, scored at the current length,
    does not beat the k-th best finished one.

    Args:
        finished_count: finished hypotheses so far.
        best_live_log_prob: the best live beam's log-probability.
        nth_best_score, kth_best_score: the `num_results`-th and
            `beam_size`-th best finished scores (`-inf` while fewer).
        length: output tokens so far; budget: the source's output budget.
        beam_size, num_results, alpha, kind: the search's settings.
        xp, dtype: the array namespace, and the scores' float type.
    """
    if kind == "length":
        return (finished_count >= beam_size) & (
            best_live_log_prob / length_penalty(length, alpha, kind, xp, dtype) <= kth_best_score
        )
    reachable = best_live_log_prob / length_penalty(budget, alpha, kind, xp, dtype)
    return (finished_count >= beam_size) | ((finished_count >= num_results) & (nth_best_score >= reachable))

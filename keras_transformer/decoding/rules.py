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

import numpy as np
from keras import ops

from keras_transformer.runtime.kernels import backend_kernel


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
    chunks of tokens at once instead (`runtime.torch_ranking`). The
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
    own = backend_kernel("best_extensions")
    if own is not None:  # (PyTorch's: `runtime/torch_ranking.py`)
        return own(logits, log_probs, never_output, count)
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


def _best_log_probs(logits, k):
    """`keras.ops.top_k(keras.ops.log_softmax(logits), k)` for 2-D float32
    `logits`.

    A row's log-softmax is its logits less its log-sum-exp, so on JAX and
    TensorFlow the best logits are ranked and only they are normalized:
    XLA fuses a log-softmax into each op that reads it, computing it
    again in each (256 rows of 8,000 tokens, 2 cores: 1.6 ms a step on JAX
    against 3.9, 3.1 against 4.7 on TensorFlow). (PyTorch's log-softmax is
    one kernel, faster than its log-sum-exp and a subtraction: there it
    comes first, `runtime.torch_ranking`.)
    """
    best, tokens = _top_k_of_many(logits, k)
    return best - ops.logsumexp(logits, axis=-1, keepdims=True), tokens


def _top_k_of_many(x, k):
    """`keras.ops.top_k(x, k)` over the last axis of a 2-D `x`, for `k` much
    smaller than the axis (a few tokens of a vocabulary), on JAX and
    TensorFlow (PyTorch ranks a source's chunks at once:
    `runtime.torch_ranking`).

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

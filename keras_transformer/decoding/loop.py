"""Beam search as loops on the device.

The rules of `rules.py`, written here in Keras ops inside a
`keras.ops.while_loop` that JAX and TensorFlow compile whole (`jax.jit`,
XLA), so that no step waits for the host:

- `search_loop`: the whole search of a batch, a source in and its best
  hypotheses out. For a few sentences at a time on JAX and TensorFlow, and
  in the SavedModel (`keras_transformer.export`).
- `search_segment`: steps from a given state until the batch should shrink
  or the cache grow. `beam.beam_search`'s host search of a larger batch on
  JAX and TensorFlow runs a few segments, dropping done sources from the
  batch and growing the self-attention cache between them (what pays off
  for large batches), with the state that `initial_state` makes,
  `kept_slots` shrinks and `grown_state` grows (each compiled:
  `interface.search_state_functions`). Run a step a call with the rules on the host
  (NumPy), as PyTorch runs it, the shipped preset's translations 64 at a
  time on a 2-core CPU were 1.19-1.23x (float32) and 1.24-1.39x
  (bfloat16) slower: each call passes the model's weights, and two parts
  of a batch searched at once waited in turn for Python's interpreter lock
  to rank their candidates.

What differs from the host search a step a call: each source keeps its
`beam_size` best finished hypotheses, not all of them (the results and
the stopping rule read only those); and scores are float32 (JAX computes
in float32 unless told otherwise), not float64, which can only matter for
hypotheses whose scores tie to 7 digits. `search_loop` also keeps every
source in the batch until all are done, with a cache of a fixed length
from the start (`beam._search_in_loop` tries a short one first).

On TensorFlow the segments hold self-attention caches that they never
reorder (`layers.beam_cache`, `SEGMENT_BEAM_CACHES`) where the model's
`empty_self_attention_cache` takes `beams`: a step reorders only which
row holds each position of a beam's history, not every layer's keys and
values. Not for a bfloat16 model on a CPU, whose plain caches hold their
numbers' bits (`layers.cache_bits`) and reorder faster.
"""
import inspect

import keras
from keras import ops

from keras_transformer.decoding.compiled import loop_output_columns
from keras_transformer.decoding.rules import KerasOps
from keras_transformer.decoding.rules import best_extensions
from keras_transformer.decoding.rules import length_penalty
from keras_transformer.decoding.rules import never_output_bias
from keras_transformer.decoding.rules import search_is_over
from keras_transformer.layers import beam_cache
from keras_transformer.layers import cache_bits
from keras_transformer.layers.direct_calls import take_rows
from keras_transformer.layers.direct_calls import zero_padded


def search_loop(
    model, encoder_ids, encoder_mask, budgets, max_length, beam_size, num_results=1, alpha=0.6, kind="gnmt"
):
    """Beam search of a batch of sources as one `keras.ops.while_loop`.

    Args:
        model: a `Seq2SeqDecodingModel`.
        encoder_ids, encoder_mask: int32 `(batch, source_length)`, every
            source non-empty.
        budgets: int32 `(batch,)`, each source's output budget
            (`rules.output_budget`).
        max_length: the self-attention cache's positions (an int; a
            scalar tensor in a TensorFlow graph). The search stops when
            the cache is full: with more positions than the largest
            budget, every source is done by then.
        beam_size, num_results, alpha, kind: as `beam.beam_search`'s
            `beam_size`, `num_results`, `alpha` and `length_penalty`.

    Returns:
        `(token_ids, lengths, scores, log_probs, done)`, the `num_results`
        best finished hypotheses of each source, best first: token ids
        `(batch, num_results, max_length - 1)` (without the end token,
        padded with zeros beyond `lengths`), and their scores (log P / lp)
        and log-probabilities, float32; `done`, a boolean scalar, whether
        every source was done before the cache was full (else the
        hypotheses are not the search's result: `beam._search_in_loop`
        searches again with a longer cache).
    """
    n = num_results
    batch = ops.shape(encoder_ids)[0]
    # One row of encoder keys and values a source, which its k beams (rows
    # source * k to source * k + k - 1) all read.
    cross = model.cross_attention_cache(model.encode(encoder_ids, encoder_mask))
    body = _search_step(model, cross, encoder_mask, budgets, max_length - 1, beam_size, num_results, alpha, kind)

    def cond(index, tokens, parents, sequences, log_probs, finished, count, done, caches):
        return ~ops.all(done) & (index < max_length - 1)

    state = initial_state(model, batch, beam_size, max_length, width=max_length - 1)
    with loop_output_columns(model):
        final = ops.while_loop(cond, body, state)
    token_ids, lengths, scores, log_probs = final[5]
    return token_ids[:, :n], lengths[:, :n], scores[:, :n], log_probs[:, :n], ops.all(final[7])


def search_segment(model, state, encoder_mask, cross, budgets, min_live, beam_size, num_results=1, alpha=0.6,
                   kind="gnmt"):
    """Steps of `search_loop`'s loop from `state` on, until every source
    is done, the self-attention cache is full, or at most `min_live`
    sources are still searching: the host search (`beam.beam_search`)
    runs a batch as a few such segments, dropping done sources from the
    batch and growing the cache between them.

    Args:
        model: a `Seq2SeqDecodingModel`.
        state: the search's state, as `initial_state` makes it: `(index,
            tokens, parents, sequences, log_probs, finished, count, done,
            caches)`, where the token ids (`sequences` and the finished
            hypotheses') have the self-attention cache's length.
        encoder_mask: int32 `(batch, source_length)`.
        cross: the encoder-decoder attention caches, one row a source.
        budgets: int32 `(batch,)`, each source's output budget.
        min_live: int32 scalar: the segment ends when at most this many
            sources are still searching (0: when all are done).
        beam_size, num_results, alpha, kind: as `search_loop`'s.

    Returns:
        The state after the last step.
    """
    width = ops.shape(state[3])[2]
    body = _search_step(model, cross, encoder_mask, budgets, width, beam_size, num_results, alpha, kind)

    def cond(index, tokens, parents, sequences, log_probs, finished, count, done, caches):
        searching = ops.sum(ops.cast(~done, "int32"))
        return (searching > min_live) & (index < width)

    # (No `loop_output_columns` here: a segment's batch is at least 8
    # sources' beams, where the two layouts multiply alike, and the copy
    # would be made again at every call.)
    return ops.while_loop(cond, body, state)


def initial_state(model, batch, beam_size, length, width=None, beam_caches=False):
    """The state of a search of `batch` sources before its first step:
    `(index, tokens, parents, sequences, log_probs, finished, count, done,
    caches)`, with self-attention caches of `length` positions
    (`model.empty_self_attention_cache`) and token ids of `width` (by
    default `length`). Keras ops, so that `batch` may be a tensor (the
    SavedModel's batch size is known only when it runs). Only the first
    beam of a source is live at the start: the others would repeat it.
    With `beam_caches`, caches that the search never reorders
    (`empty_caches`)."""
    k, width = beam_size, length if width is None else width
    never = ops.convert_to_tensor(float("-inf"), "float32")
    first = ops.where(ops.arange(k)[None, :] == 0, ops.zeros((batch, k)), never)
    return (
        ops.convert_to_tensor(0, "int32"),
        ops.full((batch * k,), model.special_token_ids.start, "int32"),
        ops.arange(batch * k, dtype="int32"),
        ops.zeros((batch, k, width), "int32"),
        ops.cast(first, "float32"),
        (
            ops.zeros((batch, k, width), "int32"),
            ops.zeros((batch, k), "int32"),
            ops.full((batch, k), never, "float32"),
            ops.full((batch, k), never, "float32"),
        ),
        ops.zeros((batch,), "int32"),
        ops.zeros((batch,), "bool"),
        [tuple(cache) for cache in empty_caches(model, batch, k, length, beam_caches)],
    )


# Where the host search's segments (`search_segment`) hold self-attention
# caches that they never reorder (`layers.beam_cache`), by backend: a step
# then reorders which row holds each position of a beam's history, not
# every layer's keys and values, but each beam's query is scored against
# every row of its source (4x the attention's products at beam 4).
# Measured with the shipped preset's first model, 512 test_2016_flickr
# sentences 64 at a time, beam 4, 2-core AMD EPYC, four alternating passes
# (time with the plain cache / with this one, median): TensorFlow 1.10x
# (float32) and 1.11x (bfloat16); JAX 1.01x and 0.96-0.99x (again with
# `benchmarks/beam_caches.py`: TensorFlow 1.04x and 1.09x, JAX 1.02x and
# 1.00x, and JAX's bfloat16 BLEU 0.2 lower). One sentence at a
# time in one loop (`search_loop`, 48 sentences, float32) it was slower:
# JAX 0.85x, TensorFlow 0.95x; so that loop keeps a row a beam.
SEGMENT_BEAM_CACHES = {"jax": False, "tensorflow": True}


def segment_beam_caches(model):
    """Whether `search_segment`'s states hold `layers.beam_cache` caches
    for `model` on this backend: where `SEGMENT_BEAM_CACHES` says so, but
    not where the model's plain caches hold bfloat16 numbers as their
    bits (`layers.cache_bits`). Those reorder as integers, and their
    search ran as fast or faster than one with beam caches: TensorFlow
    bfloat16, the same 512 sentences 64 at a time, 1.02x and 1.05x (two
    runs; beam caches holding bits too, 0.95x)."""
    if not SEGMENT_BEAM_CACHES.get(keras.config.backend(), False):
        return False
    return not any(cache_bits.holds_bits(cache[0]) for cache in model.empty_self_attention_cache(1, 1))


def empty_caches(model, batch, beam_size, length, beam_caches=False):
    """The zeroed self-attention caches of a search of `batch` sources:
    with `beam_caches`, `layers.beam_cache`'s where the model makes them;
    else a row a beam."""
    if beam_caches and _takes_beams(model):
        return model.empty_self_attention_cache(batch, length, beams=beam_size)
    return model.empty_self_attention_cache(batch * beam_size, length)


def _takes_beams(model):
    try:
        return "beams" in inspect.signature(model.empty_self_attention_cache).parameters
    except (TypeError, ValueError):  # (a callable without a signature)
        return False


def reordered_caches(caches, parents, beam_size):
    """The self-attention caches for beams that descend from the rows
    `parents` (int32 `(batch * beam_size,)`, each a row of the same
    source's beams): a plain cache's rows taken, a beam cache's origins
    (`layers.beam_cache.reordered`)."""
    if any(beam_cache.is_beam_cache(cache) for cache in caches):
        grouped = ops.reshape(parents, (-1, beam_size))
        parent_beams = grouped - ops.arange(ops.shape(grouped)[0], dtype="int32")[:, None] * beam_size
    return [
        beam_cache.reordered(cache, parent_beams) if beam_cache.is_beam_cache(cache)
        else tuple(ops.take(x, parents, axis=0) for x in cache)
        for cache in caches
    ]


def kept_slots(state, cross, keep, beam_size):
    """The search state and encoder-decoder caches of the batch slots
    `keep` (int32 indices, ascending) only: the host search drops done
    sources between segments (`beam.beam_search`). The beams' rows are
    taken from the self-attention caches, and the pending parents (rows of
    those caches) numbered anew."""
    index, tokens, parents, sequences, log_probs, finished, count, done, caches = state
    k = beam_size
    keep = ops.convert_to_tensor(keep, "int32")
    first_rows = keep[:, None] * k  # each kept source's first beam row
    beam_rows = ops.reshape(first_rows + ops.arange(k, dtype="int32")[None, :], (-1,))
    # A source's beams descend from its own beams: their parents, less its
    # first row, are beam numbers.
    beams = ops.reshape(take_rows(parents, beam_rows), (-1, k)) - first_rows
    parents = ops.reshape(ops.arange(ops.shape(keep)[0], dtype="int32")[:, None] * k + beams, (-1,))
    state = (
        index, take_rows(tokens, beam_rows), parents, take_rows(sequences, keep), take_rows(log_probs, keep),
        tuple(take_rows(x, keep) for x in finished), take_rows(count, keep), take_rows(done, keep),
        [
            beam_cache.kept(cache, keep) if beam_cache.is_beam_cache(cache)
            else tuple(take_rows(x, beam_rows) for x in cache)
            for cache in caches
        ],
    )
    cross = [(take_rows(keys, keep), take_rows(values, keep)) for keys, values in cross]
    return state, cross


def grown_state(state, length):
    """The search state with `length` positions of self-attention cache
    and of token ids (zeros after the old ones): the host search grows
    them between segments as outputs grow."""
    index, tokens, parents, sequences, log_probs, finished, count, done, caches = state
    ids, lengths, scores, finished_log_probs = finished
    return (
        index, tokens, parents, zero_padded(sequences, 2, length), log_probs,
        (zero_padded(ids, 2, length), lengths, scores, finished_log_probs), count, done,
        padded_caches(caches, length),
    )


def padded_caches(caches, length):
    """Each `(keys, values)` cache, `(batch, heads, positions, d)`,
    zero-padded to `length` positions (a `layers.beam_cache` likewise):
    both host searches grow their self-attention caches so
    (`grown_state`, `beam._search`)."""
    return [
        beam_cache.padded(cache, length, zero_padded) if beam_cache.is_beam_cache(cache)
        else (zero_padded(cache[0], 2, length), zero_padded(cache[1], 2, length))
        for cache in caches
    ]


def _search_step(model, cross, encoder_mask, budgets, width, beam_size, num_results, alpha, kind):
    """The loop's body: one step of the search's rules (`rules.py`) on the
    device, for token ids of `width` positions."""
    k, n = beam_size, num_results
    special = model.special_token_ids
    pad_id, end_id = special.pad, special.end
    never_output = never_output_bias(model)
    vocabulary_size = model.backbone.vocabulary_size
    budgets = ops.convert_to_tensor(budgets, "int32")
    batch = ops.shape(encoder_mask)[0]
    rank = ops.arange(2 * k, dtype="int32")[None, :]
    rows = ops.arange(batch, dtype="int32")
    positions = ops.arange(width, dtype="int32")[None, None, :]
    never = ops.convert_to_tensor(float("-inf"), "float32")

    def penalty(length):
        return length_penalty(length, alpha, kind, xp=KerasOps, dtype="float32")

    def along(x, indices):
        """`x[i, indices[i, j]]` for `x` of `(batch, m)` or `(batch, m, width)`."""
        if len(ops.shape(x)) == 3:
            indices = ops.broadcast_to(indices[:, :, None], ops.shape(indices) + (width,))
        return ops.take_along_axis(x, indices, axis=1)

    def merge_finished(finished, ids, lengths, scores, log_probs):
        """Keeps the k best finished hypotheses; earlier ones first on ties
        (`top_k` keeps the lower index first among equal values)."""
        merged = [ops.concatenate([old, new], axis=1) for old, new in zip(finished, (ids, lengths, scores, log_probs))]
        _, best = ops.top_k(merged[2], k)
        return tuple(along(x, best) for x in merged)

    def body(index, tokens, parents, sequences, log_probs, finished, count, done, caches):
        caches = reordered_caches(caches, parents, k)
        logits, cache = model.call_decoder_with_cache(tokens[:, None], index, list(zip(caches, cross)), encoder_mask)
        caches = [self_cache for self_cache, _ in cache]
        values, flat = best_extensions(logits, log_probs, never_output, 2 * k)
        flat = ops.cast(flat, "int32")
        parent, token = flat // vocabulary_size, flat % vocabulary_size
        length = index + 1
        usable = ops.isfinite(values) & ~done[:, None]
        is_end = token == end_id

        # Rule 3: end tokens among the best k finish hypotheses (without
        # the end token); the best k other extensions stay live.
        ends = usable & is_end & (rank < k)
        finished = merge_finished(
            finished, along(sequences, parent), ops.full(ops.shape(parent), index, "int32"),
            ops.where(ends, values / penalty(length), never), values,
        )
        count = count + ops.sum(ops.cast(ends, "int32"), axis=1)
        others = usable & ~is_end
        chosen = others & (ops.cumsum(ops.cast(others, "int32"), axis=1) <= k)
        # The chosen candidates in rank order, then the others.
        _, order = ops.top_k(ops.cast(ops.where(chosen, -rank, -2 * k - rank), "float32"), k)
        live = along(chosen, order)
        new_log_probs = ops.where(live, along(values, order), never)
        new_parents = ops.where(live, along(parent, order), 0)
        new_tokens = ops.where(live, along(token, order), pad_id)
        sequences = ops.where(positions == index, new_tokens[:, :, None], along(sequences, new_parents))

        # Rule 4: at its budget a source's live beams finish as they are.
        at_budget = (length >= budgets) & ~done
        last = live & at_budget[:, None]
        finished = merge_finished(
            finished, sequences, ops.full(ops.shape(new_parents), length, "int32"),
            ops.where(last, new_log_probs / penalty(length), never), new_log_probs,
        )

        # Rule 5, and sources with nothing live.
        over = search_is_over(
            count, ops.max(new_log_probs, axis=1), finished[2][:, n - 1], finished[2][:, k - 1],
            length, budgets, k, n, alpha, kind, xp=KerasOps, dtype="float32",
        )
        done = done | at_budget | (ops.sum(ops.cast(live, "int32"), axis=1) == 0) | over
        log_probs = ops.where(done[:, None], never, new_log_probs)
        parents = ops.reshape(rows[:, None] * k + new_parents, (-1,))
        return (index + 1, ops.reshape(new_tokens, (-1,)), parents, sequences, log_probs, finished, count, done, caches)

    return body

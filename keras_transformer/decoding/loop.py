"""Beam search as loops on the device.

The search's body (`search.cached_step`: a decoder step, then the rules
of `rules.py` in `search.advance`) inside a `keras.ops.while_loop` that
JAX and TensorFlow compile whole (`jax.jit`, XLA), so that no step waits
for the host:

- `search_loop`: the whole search of a batch, a source in and its best
  hypotheses out. For a few sentences at a time on JAX and TensorFlow, and
  in the SavedModel (`keras_transformer.export`).
- `search_segment`: steps from a given state until the batch should shrink
  or the cache grow. `beam.beam_search`'s host search of a larger batch on
  JAX and TensorFlow runs a few segments, dropping done sources from the
  batch and growing the self-attention cache between them (what pays off
  for large batches), with the state that `search.initial_state` makes,
  `search.kept_slots` shrinks and `search.grown_state` grows (each
  compiled: `interface.search_state_functions`). Run a step a call, the
  shipped preset's translations 64 at a time on a 2-core CPU were
  1.19-1.23x (float32) and 1.24-1.39x (bfloat16) slower: each call passes
  the model's weights, and two parts of a batch searched at once waited in
  turn for Python's interpreter lock.

`search_loop` keeps every source in the batch until all are done, with a
cache of a fixed length from the start (`beam._search_in_loop` tries a
short one first).

On TensorFlow the segments hold self-attention caches that they never
reorder (`runtime.beam_cache`, `runtime.backend_choices.SEGMENT_BEAM_CACHES`) where the model's
`empty_self_attention_cache` takes `beams`: a step reorders only which
row holds each position of a beam's history, not every layer's keys and
values. Not for a bfloat16 model on a CPU, whose plain caches hold their
numbers' bits (`runtime.cache_bits`) and reorder faster.
"""
from keras import ops

from keras_transformer.runtime.backend_choices import beam_caches_in_segments
from keras_transformer.runtime.compiled import loop_output_columns
from keras_transformer.decoding.sampling import source_keys
from keras_transformer.decoding.search import cached_step
from keras_transformer.decoding.search import initial_state
from keras_transformer.runtime import cache_bits
from keras_transformer.runtime.array_ops import KERAS_OPS


def search_loop(model, encoder_ids, encoder_mask, budgets, max_length, settings, prefixes=None):
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
        settings: the search's `DecodingSettings`.
        prefixes: int32 `(batch, length)`: each source's forced first
            tokens (the SavedModel's target language code of each text),
            or None (`settings.target_prefix` forces one for all).

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
    n = settings.num_results
    batch = ops.shape(encoder_ids)[0]
    # One row of encoder keys and values a source, which its k beams (rows
    # source * k to source * k + k - 1) all read.
    cross = model.cross_attention_cache(model.encode(encoder_ids, encoder_mask))
    keys = source_keys(encoder_ids, encoder_mask, KERAS_OPS) if settings.sampling else None
    body = cached_step(model, cross, encoder_mask, budgets, settings, keys, prefixes)

    def cond(index, tokens, parents, sequences, log_probs, finished, count, done, caches):
        return ~ops.all(done) & (index < max_length - 1)

    state = initial_state(model, batch, settings.beam_size, max_length, width=max_length - 1)
    with loop_output_columns(model):
        final = ops.while_loop(cond, body, state)
    token_ids, lengths, scores, log_probs = final[5]
    return token_ids[:, :n], lengths[:, :n], scores[:, :n], log_probs[:, :n], ops.all(final[7])


def search_segment(model, state, encoder_mask, cross, budgets, min_live, settings, keys=None):
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
        settings: the search's `DecodingSettings`.
        keys: where sampling, the sources' `sampling.source_keys`.

    Returns:
        The state after the last step.
    """
    width = ops.shape(state[3])[2]
    body = cached_step(model, cross, encoder_mask, budgets, settings, keys)

    def cond(index, tokens, parents, sequences, log_probs, finished, count, done, caches):
        searching = ops.sum(ops.cast(~done, "int32"))
        return (searching > min_live) & (index < width)

    # (No `loop_output_columns` here: a segment's batch is at least 8
    # sources' beams, where the two layouts multiply alike, and the copy
    # would be made again at every call.)
    return ops.while_loop(cond, body, state)


def segment_beam_caches(model):
    """Whether `search_segment`'s states hold `runtime.beam_cache` caches
    for `model` on this backend: where `runtime.backend_choices.SEGMENT_BEAM_CACHES` says so, but
    not where the model's plain caches hold bfloat16 numbers as their
    bits (`runtime.cache_bits`). Those reorder as integers, and their
    search ran as fast or faster than one with beam caches: TensorFlow
    bfloat16, the same 512 sentences 64 at a time, 1.02x and 1.05x (two
    runs; beam caches holding bits too, 0.95x)."""
    if not beam_caches_in_segments():
        return False
    return not any(cache_bits.holds_bits(cache[0]) for cache in model.empty_self_attention_cache(1, 1))



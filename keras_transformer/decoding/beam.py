"""Beam search with a length penalty (paper section 6.1).

"We used beam search with a beam size of 4 and length penalty alpha = 0.6.
We set the maximum output length during inference to input length + 50, but
terminate early when possible."

The length penalty is GNMT's (Wu et al., 2016):

    lp(Y) = ((5 + |Y|) / 6) ** alpha,    score(Y) = log P(Y | X) / lp(Y)

where |Y| counts the output tokens, the end token included. keras-hub's
`BeamSampler` has no length penalty and keeps extending beams that already
ended, adding to their scores; here a hypothesis that emits the end token is
set aside, finished, and never extended again.

The search's rules (output budget, candidates, ranking, maximum length,
stopping) are written once in `rules.py`. This module's host search drops
sources that are done from the batch and grows the self-attention cache as
outputs grow. On PyTorch it runs the rules on the host between eager steps
(`interface.decoding_functions`); on JAX and TensorFlow each call of
compiled code runs a segment of steps with the rules on the device
(`loop.search_segment`), until the batch should shrink or the cache grow
(which compiled functions do too: `loop.kept_slots`, `loop.grown_state`).
For a few sources at a time on JAX and TensorFlow the whole search runs in
one compiled loop instead (`loop.search_loop`, which the SavedModel runs
too), and on their CPUs a large batch is searched in parts at once, one a
core (`compiled.concurrent_parts`). With `beam_size=1` this is greedy
decoding.
"""

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from keras_transformer.decoding.compiled import compiles_steps
from keras_transformer.decoding.compiled import compiles_whole_loops
from keras_transformer.decoding.compiled import concurrent_parts
from keras_transformer.decoding.compiled import id_list
from keras_transformer.decoding.compiled import to_numpy
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.interface import decoding_functions
from keras_transformer.decoding.interface import search_loop_function
from keras_transformer.decoding.interface import search_segment_function
from keras_transformer.decoding.interface import search_state_functions
from keras_transformer.decoding.interface import segment_holds_beam_caches
from keras_transformer.decoding.loop import padded_caches
from keras_transformer.decoding.rules import LENGTH_PENALTIES
from keras_transformer.decoding.rules import length_penalty
from keras_transformer.decoding.rules import output_budgets
from keras_transformer.decoding.rules import search_is_over
from keras_transformer.layers.direct_calls import take_rows
from keras_transformer.layers.direct_calls import unchanged_weights

_penalty = length_penalty  # `beam_search`'s argument of the same name hides it

# Positions by which the self-attention cache grows (a multiple of 8).
CACHE_CHUNK = 16

# The same where steps are not compiled (PyTorch's eager host search):
# every step reorders the whole cache, so it grows by fewer positions at a
# time (no step shapes to compile). The preset's first model, 512
# test_2016_flickr sentences 64 at a time, beam 4, 2-core AMD EPYC,
# alternating passes, medians of three runs (8 against 16): float32 1.00x,
# 1.02x, 1.03x; bfloat16 1.04x, 1.03x, 1.04x (510 of 512 translations the
# same, BLEU 39.97 against 39.95); one sentence at a time, 0.99x both.
EAGER_CACHE_CHUNK = 8

# The same in the host search's segments (`_search_in_segments`) where they
# hold a row a beam: every step reorders (copies) that cache, its unwritten
# positions too, so it grows by fewer positions at a time (one more segment
# call and copy a growth). Segments holding `layers.beam_cache` caches,
# which no step copies, grow them by CACHE_CHUNK. The preset's first model,
# 512 test_2016_flickr sentences 64 at a time, beam 4, 2-core AMD EPYC,
# alternating passes, the same translations (medians, 8 against 16): JAX
# 1.03x (float32) and 1.04x, 1.06x (bfloat16, two runs); TensorFlow
# bfloat16 1.01x, 1.04x; TensorFlow float32 (beam caches) 0.97x.
SEGMENT_CACHE_CHUNK = 8

# Batches of at most this many sources run in one compiled loop where the
# backend compiles one (`loop.py`), by backend: for them the host search's
# calls cost more than what it saves by dropping finished sources from the
# batch and growing the cache as outputs grow. The host search in segments
# (`_search_in_segments`), the preset's first model, test_2016_flickr,
# beam 4, 2-core AMD EPYC, loop's time / segments' (three alternating
# pairs): JAX batch 1 0.82-0.94, batch 2 0.95-1.21, batch 4 1.30-1.39;
# TensorFlow batch 1 0.71-0.80, batch 2 0.70-0.82, batch 4 0.93-1.09.
LOOP_BATCH_SIZES = {"jax": 1, "tensorflow": 4}

# The same for an ensemble (`decoding.ensemble.Ensemble`), whose host
# search runs a step a call (segments would compile every model's step into
# one program). Measured by benchmarks/loop_vs_host.py with a step a call
# (beam 4, Multi30k, 2 CPU cores), loop / host speed: batch 1 1.2-1.4x (JAX)
# and 2.4x (TensorFlow), batch 4 0.75-1.1x and 1.6x, batch 16 0.8x and 0.9x.
ENSEMBLE_LOOP_BATCH_SIZE = 4

# The one-loop search's first cache holds this many positions more than
# the padded sources (`_search_in_loop`). 0: the budgets' cache at once.
FIRST_LOOP_POSITIONS = 16

# Where steps are compiled for each shape, batches shrink to no fewer slots
# than this: each smaller size would compile every step shape again (for
# each source length and cache length), for the last few steps of a batch,
# whose cost hardly depends on the rows at that size.
MIN_COMPILED_SLOTS = 8

# A batch searched in parts at once (`compiled.concurrent_parts`) gives
# each part at least this many sources. Measured on a 2-core CPU (beam 4,
# Multi30k test_2016, alternating passes, two parts against one search):
# 64 sources at a time JAX 1.19-1.25x, TensorFlow 1.05-1.19x; 32 at a time
# 1.07-1.13x and 1.04-1.09x; 16 at a time (parts of 8) JAX 0.95-1.02x.
MIN_PART_SOURCES = 16


def pad_sources(sources, pad_id, max_length=None, multiple=8):
    """Source token id lists as a padded batch: `(encoder_token_ids,
    encoder_padding_mask)`, int32, the length rounded up to a multiple of
    `multiple` (8: compiled functions are reused across batches; 1 where
    nothing is compiled), and at most `max_length` (the model's
    `max_sequence_length`: learned positions have no more)."""
    longest = max(len(ids) for ids in sources)
    if max_length is not None and longest > max_length:
        raise ValueError(
            f"A source of {longest} tokens is longer than the model's max_sequence_length="
            f"{max_length}. Split the text into sentences first."
        )
    length = round_up(longest, multiple)
    if max_length is not None:
        length = min(length, max_length)
    encoder_ids = np.full((len(sources), length), pad_id, "int32")
    for row, ids in enumerate(sources):
        encoder_ids[row, : len(ids)] = ids
    return encoder_ids, (encoder_ids != pad_id).astype("int32")


def _grow_self_attention_cache(cache, length):
    """Zero-pads every self-attention key/value cache, `(batch, heads,
    positions, d)`, to `length` positions (the encoder-decoder caches as
    they are)."""
    return list(zip(padded_caches([self_cache for self_cache, _ in cache], length), [cross for _, cross in cache]))


def round_up(value, multiple):
    return -(-value // multiple) * multiple


def loop_cache_length(source_length, max_length_offset, limit, xp=np):
    """The self-attention cache's positions in the one-loop search of
    sources padded to `source_length` tokens: from the padded length, not
    the budgets, so that sources padded alike share one compiled loop
    (`xp=tf` for the SavedModel's graph, `keras_transformer.export`)."""
    return xp.minimum(round_up(source_length + max_length_offset + 1, 8), limit)


def beam_search(
    model,
    sources,
    beam_size=4,
    alpha=0.6,
    max_length_offset=50,
    num_results=1,
    length_penalty="gnmt",
    functions=None,
    in_loop=None,
):
    """Translates token id sequences with beam search.

    Args:
        model: a `Seq2SeqDecodingModel` (`keras_transformer.decoding.interface`),
            such as a `TransformerSeq2SeqLM`.
        sources: a list of source token id lists (start and end tokens
            included); an empty list gives an empty result.
        beam_size: live hypotheses per source (the paper: 4).
        alpha: length penalty exponent (the paper: 0.6; 0 ranks by raw
            log-probability).
        max_length_offset: at most source length + this many output tokens
            (the paper: 50), and never more than the model's
            `max_sequence_length` allows.
        num_results: how many best hypotheses to return per source (at most
            `beam_size`).
        length_penalty: `"gnmt"` (the paper's) or `"length"` (|Y| **
            alpha), which also stops as transformers' beam search does
            (`early_stopping=False`), so that it gives transformers'
            outputs.
        functions: the `(encode, step)` pair to run a step a call, ranking
            on the host (another pair times other ways of running a step,
            as `benchmarks/decode.py` does). By default PyTorch runs the
            model's `decoding_functions(model)` so, and so do ensembles
            (`decoding.ensemble.Ensemble`); JAX and TensorFlow run
            segments of steps (`loop.search_segment`). Where steps are not
            compiled (PyTorch), the first step runs one beam a source and
            `step` is given `beam_size=beam_size`.
        in_loop: run the whole search in one compiled loop (`loop.py`):
            by default on JAX and TensorFlow for batches of at most
            `loop_batch_size(model)` sources; `False` runs the host search.

    Returns:
        For each source, a list of `num_results` `(token_ids, score,
        log_probability)` tuples, best first; token ids exclude the start
        and end tokens. Empty sources give `[]`.
    """
    _check_arguments(beam_size, num_results, alpha, length_penalty)
    # Lists of ints, whether given as lists, arrays or tensors (on any
    # device: NumPy reads only the CPU's).
    sources = [id_list(ids, "int32") for ids in sources]
    results = [[] for _ in sources]
    rows = [i for i, ids in enumerate(sources) if ids]
    if not rows:
        return results
    settings = _Settings(
        beam_size, num_results, alpha, length_penalty, model.special_token_ids.end, model.backbone.vocabulary_size
    )
    if in_loop is None:
        in_loop = functions is None and compiles_whole_loops() and len(rows) <= loop_batch_size(model)
    if in_loop:
        search = _search_in_loop
    elif functions is None and compiles_whole_loops() and not isinstance(model, Ensemble):
        search = _search_in_segments
    else:
        search = _search
    # (Asking the backend for its devices only where a batch has two parts' sources.)
    parts = 1 if in_loop else len(rows) // MIN_PART_SOURCES
    parts = min(concurrent_parts(), parts) if parts > 1 else 1
    if parts > 1:
        search = functools.partial(_search_in_parts, parts, search)
    # No weight changes while a search runs: PyTorch's steps check what
    # they hold of the weights once (`direct_calls.unchanged_weights`).
    with unchanged_weights():
        finished = search(model, [sources[i] for i in rows], max_length_offset, settings, functions)
    for source, i in enumerate(rows):
        ranked = sorted(finished[source], key=lambda item: -item[0])[:num_results]
        results[i] = [(ids, float(score), float(log_prob)) for score, log_prob, ids in ranked]
    return results


def loop_batch_size(model):
    """The largest batch that `beam_search` runs in one compiled loop by
    default (`LOOP_BATCH_SIZES`, `ENSEMBLE_LOOP_BATCH_SIZE`); 0 where the
    backend compiles no loop (PyTorch)."""
    if not compiles_whole_loops():
        return 0
    if isinstance(model, Ensemble):
        return ENSEMBLE_LOOP_BATCH_SIZE
    return LOOP_BATCH_SIZES[keras.config.backend()]


def _search(model, sources, max_length_offset, settings, functions):
    """`beam_search` of non-empty sources: each source's finished
    hypotheses, `(score, log_prob, token_ids)`, in no order."""
    special = model.special_token_ids
    batch, k = len(sources), settings.beam_size
    limit = model.backbone.max_sequence_length
    # Where steps are compiled for each shape (JAX, TensorFlow), shapes are
    # kept to a few: sources padded to a multiple of 8 positions, done
    # sources leaving in powers of two (`_slots_to_keep`). Where they are
    # not (PyTorch), sources are padded to the longest and leave at once.
    compiled_steps = compiles_steps()
    encoder_ids, encoder_mask = pad_sources(sources, special.pad, limit, 8 if compiled_steps else 1)
    budgets = output_budgets(sources, max_length_offset, limit)
    max_length = min(round_up(int(budgets.max()) + 1, 8), limit)

    encode, step = functions or decoding_functions(model)
    _, cross_caches = encode(encoder_ids, encoder_mask)
    # The self-attention cache grows by `chunk` positions when full:
    # each step reorders it to the beams' parents and attends over all of
    # it, so its length, not the maximum output length, sets the step's cost.
    # The encoder's keys and values (and padding mask) stay one row a
    # source: the k beams of a source, consecutive rows, all read it.
    # Only one beam a source is live at the start (the others would repeat
    # it): the first step runs it alone, one row a source, and the k beams
    # then read that row's cache; where steps are compiled, it runs next to
    # k - 1 beams of probability 0 instead, for one shape throughout.
    beams = k if compiled_steps else 1
    chunk = CACHE_CHUNK if compiled_steps else EAGER_CACHE_CHUNK
    cache_length = min(chunk, max_length)
    cache = list(zip(model.empty_self_attention_cache(batch * beams, cache_length), cross_caches))
    parents_flat = np.arange(batch * beams, dtype="int32")

    tokens = np.full((batch * beams,), special.start, "int32")
    sequences = np.zeros((batch, beams, 0), "int32")
    log_probs = np.full((batch, beams), -np.inf, "float32")
    log_probs[:, 0] = 0.0
    finished = [[] for _ in range(batch)]  # per source: (score, log_prob, token_ids)
    # The batch's slots: which source each holds. Sources that are done
    # leave the batch (see below); `done` marks those still in it.
    slots = np.arange(batch)
    done = np.zeros(batch, bool)

    for index in range(max_length - 1):
        if index == cache_length:
            cache_length = min(cache_length + chunk, max_length)
            cache = _grow_self_attention_cache(cache, cache_length)
        values, indices, cache = step(
            tokens[:, None], np.asarray(index, "int32"), cache, encoder_mask, parents_flat, log_probs,
            **({} if beams == k else {"beam_size": k}),
        )
        # The 2k best extensions of each source's beams, best first: their
        # log-probabilities and flat indices into (beam, token).
        candidates = to_numpy(values).astype("float64")
        order = to_numpy(indices)
        if candidates.shape[1] < 2 * k:  # a first beam with fewer extensions
            missing = ((0, 0), (0, 2 * k - candidates.shape[1]))
            candidates, order = np.pad(candidates, missing, constant_values=-np.inf), np.pad(order, missing)

        size = len(slots)
        length = index + 1
        searching = [finished[source] for source in slots]
        new_log_probs, parents, new_tokens, live = _rank(
            settings, candidates, order, sequences, done, length, searching, special.pad
        )
        done = _sources_done(
            settings, new_log_probs, parents, new_tokens, live, sequences, done, length, budgets[slots], searching
        )
        if done.all():
            break
        # Row indices into the cache, as the next step reads it.
        parents_flat = (np.arange(size)[:, None] * beams + parents).reshape(-1).astype("int32")
        beams = k
        sequences = np.concatenate(
            [sequences[np.arange(size)[:, None], parents], new_tokens[:, :, None]], axis=2
        )
        log_probs = np.where(done[:, None], -np.inf, new_log_probs).astype("float32")
        tokens = new_tokens.reshape(-1)

        keep = _slots_to_keep(done, compiled_steps)
        if len(keep) < size:
            beam_rows = (keep[:, None] * k + np.arange(k)).reshape(-1)
            # The next step's reorder of the self-attention caches also drops
            # the rows that leave; the encoder's keys and values drop here.
            parents_flat = parents_flat[beam_rows]
            rows = ops.convert_to_tensor(keep, "int32")
            cache = [
                (self_cache, (take_rows(keys, rows), take_rows(values, rows))) for self_cache, (keys, values) in cache
            ]
            encoder_mask, tokens = encoder_mask[keep], tokens[beam_rows]
            sequences, log_probs, done, slots = sequences[keep], log_probs[keep], done[keep], slots[keep]

    return finished


def _search_in_segments(model, sources, max_length_offset, settings, functions=None):
    """`_search` where steps are compiled (JAX, TensorFlow): the same rules
    and the same batch sizes, but each call of compiled code runs steps
    until the batch should shrink or the cache grow (`loop.search_segment`,
    the search's rules on the device), not one: a few calls a batch, not
    one a step. Each source's best `beam_size` finished hypotheses,
    `(score, log_prob, token_ids)`, in no order.

    A host search pays at every step for a call of compiled code (its
    arguments, the model's weights among them) and for ranking on the host
    (NumPy calls); two parts of a batch searched at once (`_search_in_parts`)
    waited in turn for Python's interpreter lock to do it.
    """
    special = model.special_token_ids
    batch, k = len(sources), settings.beam_size
    limit = model.backbone.max_sequence_length
    encoder_ids, encoder_mask = pad_sources(sources, special.pad, limit)
    budgets = output_budgets(sources, max_length_offset, limit).astype("int32")
    max_length = min(round_up(int(budgets.max()) + 1, 8), limit)
    segment = search_segment_function(model, k, settings.num_results, settings.alpha, settings.kind)
    _, cross = decoding_functions(model)[0](encoder_ids, encoder_mask)

    chunk = CACHE_CHUNK if segment_holds_beam_caches(model) else SEGMENT_CACHE_CHUNK
    cache_length = min(chunk, max_length)
    initial, kept, grown = search_state_functions(model, k)
    state = initial(batch=batch, length=cache_length)
    slots = np.arange(batch)  # which source each slot of the batch holds
    finished = [[] for _ in range(batch)]
    while True:
        min_live = _largest_power_of_two_below(len(slots)) if len(slots) > MIN_COMPILED_SLOTS else 0
        state = segment(state, encoder_mask, cross, budgets[slots], np.asarray(min_live, "int32"))
        index, done = int(to_numpy(state[0])), to_numpy(state[7])
        keep = np.zeros(0, "int64") if done.all() else _slots_to_keep(done)
        if len(keep) < len(slots):
            leaving = np.setdiff1d(np.arange(len(slots)), keep)
            _collect(finished, slots[leaving], [to_numpy(x)[leaving] for x in state[5]])
        if done.all():
            return finished
        if len(keep) < len(slots):
            state, cross = _kept(kept, state, cross, keep)
            encoder_mask, slots = encoder_mask[keep], slots[keep]
        if index == cache_length:
            cache_length = min(cache_length + chunk, max_length)
            state = _grown(grown, state, cache_length)


def _kept(kept, state, cross, keep):
    """`kept(state, cross, keep)` (`loop.kept_slots`, compiled) of the
    slots `keep`."""
    return kept(state, cross, keep.astype("int32"))


def _grown(grown, state, length):
    """`grown(state, length=length)` (`loop.grown_state`, compiled)."""
    return grown(state, length=length)


def _largest_power_of_two_below(size):
    """The largest power of two less than `size` (> 1): a batch of `size`
    slots shrinks (`_slots_to_keep`) once at most this many sources search."""
    return 1 << int(size - 1).bit_length() - 1


def _collect(finished, sources, hypotheses):
    """Appends to `finished[source]` each finished hypothesis of the
    `loop.search_segment` state's `(token_ids, lengths, scores, log_probs)`
    (rows in the order of `sources`)."""
    token_ids, lengths, scores, log_probs = hypotheses
    for row, source in enumerate(sources):
        for j in np.flatnonzero(np.isfinite(scores[row])):
            finished[source].append(
                (float(scores[row, j]), float(log_probs[row, j]), token_ids[row, j, : lengths[row, j]].tolist())
            )


def _search_in_parts(parts, search_part, model, sources, max_length_offset, settings, functions):
    """`search_part` (`_search` or `_search_in_segments`) of `parts` parts
    of the sources at once, each in a thread of its own
    (`compiled.concurrent_parts`), the sources interleaved (a batch sorted
    by length gives each part alike)."""
    groups = [list(range(part, len(sources), parts)) for part in range(parts)]

    def search(group):
        return search_part(model, [sources[i] for i in group], max_length_offset, settings, functions)

    with ThreadPoolExecutor(parts) as pool:
        found = list(pool.map(search, groups))
    finished = [None] * len(sources)
    for group, group_finished in zip(groups, found):
        for i, hypotheses in zip(group, group_finished):
            finished[i] = hypotheses
    return finished


def _search_in_loop(model, sources, max_length_offset, settings, functions=None):
    """`_search` as one compiled loop (`loop.search_loop`): each source's
    `num_results` best finished hypotheses.

    The loop's self-attention cache first holds `FIRST_LOOP_POSITIONS`
    positions more than the padded sources, and the loop runs again with
    the cache of every position the budgets allow
    (`loop_cache_length`) only where some source was not done when that
    one was full. Each step reorders the whole cache and attends over it,
    and the budgets' cache was about twice as long as the translations
    needed (test_2016_flickr: 76 positions on average against 36; no
    translation of the shipped preset's first model outgrew the shorter
    one in test_2016_flickr or test_2017_flickr). One sentence at a time
    (its first model, 48 test_2016_flickr sentences, beam 4, medians of
    five passes each, alternating, 2-core AMD EPYC), JAX translated 1.18x
    and 1.15x as fast in two runs, TensorFlow 1.13x, with the same
    translations: the positions after a step's weigh exactly 0 in its
    attention, so a shorter cache changes at most the rounding of the
    attention's sums over positions.
    """
    limit = model.backbone.max_sequence_length
    encoder_ids, encoder_mask = pad_sources(sources, model.special_token_ids.pad, limit)
    budgets = output_budgets(sources, max_length_offset, limit).astype("int32")
    max_length = int(loop_cache_length(encoder_ids.shape[1], max_length_offset, limit))
    first = max_length
    if FIRST_LOOP_POSITIONS:
        first = min(round_up(encoder_ids.shape[1] + FIRST_LOOP_POSITIONS, 8), max_length)
    search = search_loop_function(model, settings.beam_size, settings.num_results, settings.alpha, settings.kind)
    for length in dict.fromkeys((first, max_length)):  # (one search where they are equal)
        *found, done = search(encoder_ids, encoder_mask, budgets, np.zeros(length, "int32"))
        if bool(ops.convert_to_numpy(done)):
            break
    token_ids, lengths, scores, log_probs = (ops.convert_to_numpy(x) for x in found)
    return [
        [(float(scores[row, j]), float(log_probs[row, j]), token_ids[row, j, : lengths[row, j]].tolist())
         for j in range(settings.num_results) if np.isfinite(scores[row, j])]
        for row in range(len(sources))
    ]


def _check_arguments(beam_size, num_results, alpha, kind):
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}.")
    if not 1 <= num_results <= beam_size:
        raise ValueError(f"num_results must be between 1 and beam_size={beam_size}, got {num_results}.")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}.")
    if kind not in LENGTH_PENALTIES:
        raise ValueError(f"Unknown length_penalty {kind!r}; expected one of {LENGTH_PENALTIES}.")


class _Settings(NamedTuple):
    beam_size: int
    num_results: int
    alpha: float
    kind: str
    end_id: int
    vocabulary_size: int


def _rank(settings, candidates, order, sequences, done, length, finished, pad_id):
    """Rule 3 (see `rules.py`) for the sources still searching (rows not
    `done`), all at once: end tokens among a source's best `beam_size`
    candidates finish hypotheses (appended to its list in `finished` as
    `(score, log_prob, ids)`); its best `beam_size` other candidates stay
    live, best first.

    Args:
        candidates, order: `(rows, 2 * beam_size)`, each source's best
            extensions (`rules.best_extensions`): log-probabilities, best
            first, and flat indices `beam * vocabulary_size + token`.
        sequences: `(rows, beams, length - 1)` the beams' tokens.

    Returns:
        `(log_probs, parents, tokens, live)`: the live beams' values, each
        `(rows, beam_size)` (`-inf`, 0 and `pad_id` where fewer are live),
        and how many each source has.
    """
    k = settings.beam_size
    parent, token = np.divmod(order.astype("int64"), settings.vocabulary_size)
    usable = np.isfinite(candidates)
    usable[done] = False
    is_end = token == settings.end_id
    ends = usable[:, :k] & is_end[:, :k]
    if ends.any():
        penalty = _penalty(length, settings.alpha, settings.kind)
        for row, rank in zip(*np.nonzero(ends)):
            value = candidates[row, rank]
            finished[row].append((value / penalty, value, sequences[row, parent[row, rank]].tolist()))
    others = usable & ~is_end
    chosen = others & (np.cumsum(others, axis=1) <= k)
    picks = np.argsort(~chosen, axis=1, kind="stable")[:, :k]  # the chosen, in rank order
    # (Indexing by rows and picks, not `np.take_along_axis`: run at every
    # step on a few numbers, this function's time is NumPy's call overhead.)
    rows = np.arange(len(picks))[:, None]
    live = chosen[rows, picks]
    dead = ~live
    log_probs, parents, tokens = candidates[rows, picks], parent[rows, picks], token[rows, picks].astype("int32")
    log_probs[dead], parents[dead], tokens[dead] = -np.inf, 0, pad_id
    return log_probs, parents, tokens, live.sum(axis=1)


def _sources_done(settings, log_probs, parents, tokens, live, sequences, done, length, budgets, finished):
    """Rules 4 and 5 after `_rank`, all sources at once: at its budget a
    source's live beams finish as they are (appended to `finished`) and it
    is done; otherwise it is done with no live beam or by
    `rules.search_is_over`. Returns the new `done`."""
    k, n = settings.beam_size, settings.num_results
    at_budget = ~done & (length >= budgets)
    if at_budget.any():
        penalty = _penalty(length, settings.alpha, settings.kind)
        for row in np.flatnonzero(at_budget):
            for beam in range(live[row]):
                ids = sequences[row, parents[row, beam]].tolist() + [int(tokens[row, beam])]
                finished[row].append((log_probs[row, beam] / penalty, log_probs[row, beam], ids))
    # The n-th and k-th best finished scores (-inf while fewer).
    best = np.full((len(done), k), -np.inf)
    counts = np.zeros(len(done), "int64")
    for row, hypotheses in enumerate(finished):
        counts[row] = len(hypotheses)
        if len(hypotheses) >= n and not done[row]:  # (with fewer, rule 5 waits)
            scores = sorted((score for score, _, _ in hypotheses), reverse=True)[:k]
            best[row, : len(scores)] = scores
    over = search_is_over(
        counts, log_probs.max(axis=1), best[:, n - 1], best[:, k - 1], length, budgets, k, n,
        settings.alpha, settings.kind,
    )
    return done | at_budget | (live == 0) | over


def _slots_to_keep(done, compiled_steps=True):
    """The batch slots the next step keeps. Where steps are compiled for
    each shape (JAX, TensorFlow): all of them, or, when at most half hold
    live sources, the live ones and some done ones as filler, to the next
    power of two and at least `MIN_COMPILED_SLOTS` (a few shapes, so
    compiled steps are reused; finished sources cost nothing). Otherwise
    (PyTorch, eager): the live ones."""
    live_rows = np.flatnonzero(~done)
    if not compiled_steps:
        return np.arange(len(done)) if len(live_rows) == len(done) else live_rows
    size = max(1 << int(len(live_rows) - 1).bit_length(), MIN_COMPILED_SLOTS)
    if size >= len(done):
        return np.arange(len(done))
    return np.concatenate([live_rows, np.flatnonzero(done)[: size - len(live_rows)]])

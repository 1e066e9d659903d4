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
stopping) are written once in `rules.py`, and the search's step once in
`search.py`. This module drives it. Its host search drops sources that are
done from the batch and grows the self-attention cache as outputs grow
(`search.kept_slots`, `search.grown_state`): on PyTorch, and for
ensembles, a decoder step (`interface.decoding_functions`) and the
search's step (`search.advance`) a call; on JAX and TensorFlow a
compiled segment of steps a call (`loop.search_segment`), until the batch
should shrink or the cache grow. For a few sources at a time on JAX and
TensorFlow the whole search runs in one compiled loop instead
(`loop.search_loop`, which the SavedModel runs too), and on their CPUs a
large batch is searched in parts at once, one a core
(`compiled.concurrent_parts`). With `beam_size=1` this is greedy
decoding.
"""

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from keras import ops

from keras_transformer.runtime.backend_choices import loop_batch_size as loop_batch_size_here
from keras_transformer.runtime.compiled import compiles_steps
from keras_transformer.runtime.compiled import compiles_whole_loops
from keras_transformer.runtime.compiled import concurrent_parts
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.interface import advance_function
from keras_transformer.decoding.interface import decoding_functions
from keras_transformer.decoding.interface import search_loop_function
from keras_transformer.decoding.interface import search_segment_function
from keras_transformer.decoding.interface import search_state_functions
from keras_transformer.decoding.interface import segment_holds_beam_caches
from keras_transformer.decoding.rules import output_budgets
from keras_transformer.decoding.sampling import source_keys
from keras_transformer.decoding.search import history_of
from keras_transformer.decoding.settings import DecodingSettings
from keras_transformer.decoding.transforms import uses_history
from keras_transformer.runtime.direct_calls import unchanged_weights
from keras_transformer.runtime.array_ops import array_ops
from keras_transformer.runtime.array_ops import id_list
from keras_transformer.runtime.array_ops import to_numpy


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
# call and copy a growth). Segments holding `runtime.beam_cache` caches,
# which no step copies, grow them by CACHE_CHUNK. The preset's first model,
# 512 test_2016_flickr sentences 64 at a time, beam 4, 2-core AMD EPYC,
# alternating passes, the same translations (medians, 8 against 16): JAX
# 1.03x (float32) and 1.04x, 1.06x (bfloat16, two runs); TensorFlow
# bfloat16 1.01x, 1.04x; TensorFlow float32 (beam caches) 0.97x.
SEGMENT_CACHE_CHUNK = 8

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


def round_up(value, multiple):
    return -(-value // multiple) * multiple


def loop_cache_length(source_length, max_length_offset, limit, xp=np):
    """The self-attention cache's positions in the one-loop search of
    sources padded to `source_length` tokens: from the padded length, not
    the budgets, so that sources padded alike share one compiled loop
    (`xp=tf` for the SavedModel's graph, `keras_transformer.export`)."""
    return xp.minimum(round_up(source_length + max_length_offset + 1, 8), limit)


def beam_search(model, sources, settings=None, functions=None, in_loop=None, **setting_values):
    """Translates token id sequences with beam search.

    Args:
        model: a `Seq2SeqDecodingModel` (`keras_transformer.decoding.interface`),
            such as a `TransformerSeq2SeqLM`.
        sources: a list of source token id lists (start and end tokens
            included); an empty list gives an empty result.
        settings: a `DecodingSettings`; or give its fields as keywords
            (`beam_size=4, alpha=0.6, max_length_offset=50, num_results=1,
            length_penalty="gnmt", target_prefix=()`).
        functions: the `(encode, step)` pair to run a step a call (another
            pair times other ways of running a step, as
            `benchmarks/decode.py` does; see `interface.decoding_functions`
            for their signatures). By default PyTorch runs the model's
            `decoding_functions(model)` so, and so do ensembles
            (`decoding.ensemble.Ensemble`); JAX and TensorFlow run
            segments of steps (`loop.search_segment`).
        in_loop: run the whole search in one compiled loop (`loop.py`):
            by default on JAX and TensorFlow for batches of at most
            `loop_batch_size(model)` sources; `False` runs the host search.

    Returns:
        For each source, a list of `num_results` `(token_ids, score,
        log_probability)` tuples, best first; token ids exclude the start
        and end tokens. Empty sources give `[]`.
    """
    if settings is None:
        settings = DecodingSettings(**setting_values)
    elif setting_values:
        raise TypeError(f"Give settings or its fields as keywords, not both: got {sorted(setting_values)} too.")
    settings.check_for(model.backbone.vocabulary_size, model.special_token_ids.never_output)
    # Lists of ints, whether given as lists, arrays or tensors (on any
    # device: NumPy reads only the CPU's).
    sources = [id_list(ids, "int32") for ids in sources]
    results = [[] for _ in sources]
    rows = [i for i, ids in enumerate(sources) if ids]
    if not rows:
        return results
    if in_loop is None:
        in_loop = functions is None and compiles_whole_loops() and len(rows) <= loop_batch_size(model)
    search = _search_in_loop if in_loop else _host_search
    # (Asking the backend for its devices only where a batch has two parts' sources.)
    parts = 1 if in_loop else len(rows) // MIN_PART_SOURCES
    parts = min(concurrent_parts(), parts) if parts > 1 else 1
    if parts > 1:
        search = functools.partial(_search_in_parts, parts, search)
    # No weight changes while a search runs: PyTorch's steps check what
    # they hold of the weights once (`direct_calls.unchanged_weights`).
    with unchanged_weights():
        finished = search(model, [sources[i] for i in rows], settings, functions)
    for source, i in enumerate(rows):
        ranked = sorted(finished[source], key=lambda item: -item[0])[: settings.num_results]
        results[i] = [(ids, float(score), float(log_prob)) for score, log_prob, ids in ranked]
    return results


def loop_batch_size(model):
    """The largest batch that `beam_search` runs in one compiled loop by
    default (`runtime.backend_choices.LOOP_BATCH_SIZES`, `ENSEMBLE_LOOP_BATCH_SIZE`); 0 where the
    backend compiles no loop (PyTorch)."""
    if not compiles_whole_loops():
        return 0
    if isinstance(model, Ensemble):
        return ENSEMBLE_LOOP_BATCH_SIZE
    return loop_batch_size_here()


def _host_search(model, sources, settings, functions=None):
    """The search of non-empty sources driven from the host: each source's
    best `beam_size` finished hypotheses, `(score, log_prob, token_ids)`,
    in no order.

    Each call runs the search (`search.py`) from a state until the batch
    should shrink or the self-attention cache grow, which happens here
    between calls: on JAX and TensorFlow a compiled segment of steps
    (`loop.search_segment`); for ensembles, for `functions` and on
    PyTorch, one decoder step and the search's step (`search.advance`).
    Where steps are compiled for each shape (JAX, TensorFlow), shapes are
    kept to a few: sources padded to a multiple of 8 positions, done
    sources leaving in powers of two (`_slots_to_keep`). Where they are
    not (PyTorch), sources are padded to the longest and leave at once.

    A segment of steps a call saves what a call costs at every step: its
    arguments (the model's weights among them), and two parts of a batch
    searched at once (`_search_in_parts`) waiting in turn for Python's
    interpreter lock.
    """
    special, k = model.special_token_ids, settings.beam_size
    limit = model.backbone.max_sequence_length
    compiled_steps = compiles_steps()
    encoder_ids, encoder_mask = pad_sources(sources, special.pad, limit, 8 if compiled_steps else 1)
    budgets = output_budgets(sources, settings.max_length_offset, limit).astype("int32")
    max_length = min(round_up(int(budgets.max()) + 1, 8), limit)
    segments = functions is None and compiles_whole_loops() and not isinstance(model, Ensemble)
    encode, step = functions or decoding_functions(model)
    _, cross = encode(encoder_ids, encoder_mask)
    if segments:
        run = _segment_runner(model, settings)
        chunk = CACHE_CHUNK if segment_holds_beam_caches(model) else SEGMENT_CACHE_CHUNK
    else:
        run = _step_runner(model, settings, step)
        chunk = CACHE_CHUNK if compiled_steps else EAGER_CACHE_CHUNK
    cache_length = min(chunk, max_length)
    keys = to_numpy(source_keys(encoder_ids, encoder_mask, array_ops())) if settings.sampling else None
    initial, kept, grown = search_state_functions(model, k)
    state = initial(batch=len(sources), length=cache_length, beam_caches=segments)
    slots = np.arange(len(sources))  # which source each slot of the batch holds
    finished = [[] for _ in sources]
    while True:
        state = run(state, encoder_mask, cross, budgets[slots], len(slots), None if keys is None else keys[slots])
        index, done = int(to_numpy(state[0])), to_numpy(state[7])
        keep = np.zeros(0, "int64") if done.all() else _slots_to_keep(done, compiled_steps)
        if len(keep) < len(slots):
            leaving = np.setdiff1d(np.arange(len(slots)), keep)
            _collect(finished, slots[leaving], [to_numpy(x)[leaving] for x in state[5]])
        if done.all():
            return finished
        if len(keep) < len(slots):
            # (Where steps run eagerly, the next step's reorder of the
            # self-attention caches drops the rows that leave.)
            state, cross = kept(state, cross, keep.astype("int32"), reorder_later=not compiled_steps)
            encoder_mask, slots = encoder_mask[keep], slots[keep]
        if index == cache_length:
            cache_length = min(cache_length + chunk, max_length)
            state = grown(state, length=cache_length)


def _segment_runner(model, settings):
    """`run(state, encoder_mask, cross, budgets, slots, keys)` of `_host_search`:
    a compiled segment of steps (`loop.search_segment`), until at most
    half the slots' sources search (the batch then shrinks: `_slots_to_keep`)."""
    segment = search_segment_function(model, settings)

    def run(state, encoder_mask, cross, budgets, slots, keys):
        min_live = _largest_power_of_two_below(slots) if slots > MIN_COMPILED_SLOTS else 0
        return segment(state, encoder_mask, cross, budgets, np.asarray(min_live, "int32"), keys)

    return run


def _step_runner(model, settings, step):
    """`run(state, encoder_mask, cross, budgets, slots, keys)` of `_host_search`:
    one decoder step (`step`, as `interface.decoding_functions` makes
    it), then the search's step (`search.advance`)."""
    advance = advance_function(model, settings)
    step_settings = settings.replace(max_length_offset=0, num_results=1)  # (what the step reads)
    k = settings.beam_size
    # Where steps run eagerly, whatever their shapes, the first step runs
    # each source's one live beam alone (the others would repeat it), and
    # the next step's beams read that row of the self-attention caches.
    one_beam_first = k > 1 and not compiles_steps()

    def run(state, encoder_mask, cross, budgets, slots, keys):
        index, tokens, parents, sequences, log_probs, _, _, _, caches = state
        index = np.asarray(to_numpy(index), "int32")
        first = one_beam_first and int(index) == 0
        # (`keys` only where sampling, the beams' tokens so far only where
        # the transforms read them: a step that does neither need not take them.)
        extra = [keys, history_of(sequences) if uses_history(settings) else None]
        if first:
            tokens, parents, log_probs = tokens[::k], parents[::k], log_probs[:, :1]
            extra[1] = None if extra[1] is None else extra[1][::k]
        while extra and extra[-1] is None:
            extra.pop()
        values, flat, cache = step(
            tokens[:, None], index, list(zip(caches, cross)), encoder_mask, parents, log_probs, *extra,
            settings=step_settings,
        )
        if first:  # (one beam of a small vocabulary may have fewer extensions than two beams' worth)
            values, flat = _padded_candidates(values, flat, 2 * k)
        # (The caches stay out of the compiled search step: passed through
        # a compiled function, they would be copied at every step.)
        state = advance((*state[:8], []), values, flat, [], budgets)
        if first:  # (every beam descends from its source's first: row `source` of the caches)
            state = (*state[:2], state[2] // k, *state[3:])
        return (*state[:8], [self_cache for self_cache, _ in cache])

    return run


def _padded_candidates(values, flat, count):
    """A step's candidates `(values, flat indices)`, `(batch, m)`, padded
    to `count` columns with candidates that are none (`-inf`)."""
    ops = array_ops(values)
    missing = count - ops.shape(values)[1]
    if missing <= 0:
        return values, flat
    batch = ops.shape(values)[0]
    return (ops.concatenate([ops.cast(values, "float32"), ops.full((batch, missing), float("-inf"), "float32")], 1),
            ops.concatenate([ops.cast(flat, "int32"), ops.zeros((batch, missing), "int32")], 1))


def _largest_power_of_two_below(size):
    """The largest power of two less than `size` (> 1): a batch of `size`
    slots shrinks (`_slots_to_keep`) once at most this many sources search."""
    return 1 << int(size - 1).bit_length() - 1


def _collect(finished, sources, hypotheses):
    """Appends to `finished[source]` each finished hypothesis of the search
    state's `(token_ids, lengths, scores, log_probs)` (rows in the order
    of `sources`)."""
    token_ids, lengths, scores, log_probs = hypotheses
    for row, source in enumerate(sources):
        for j in np.flatnonzero(np.isfinite(scores[row])):
            finished[source].append(
                (float(scores[row, j]), float(log_probs[row, j]), token_ids[row, j, : lengths[row, j]].tolist())
            )


def _search_in_parts(parts, search_part, model, sources, settings, functions):
    """`search_part` (`_host_search`) of `parts` parts of the sources at
    once, each in a thread of its own (`compiled.concurrent_parts`), the
    sources interleaved (a batch sorted by length gives each part alike)."""
    groups = [list(range(part, len(sources), parts)) for part in range(parts)]

    def search(group):
        return search_part(model, [sources[i] for i in group], settings, functions)

    with ThreadPoolExecutor(parts) as pool:
        found = list(pool.map(search, groups))
    finished = [None] * len(sources)
    for group, group_finished in zip(groups, found):
        for i, hypotheses in zip(group, group_finished):
            finished[i] = hypotheses
    return finished


def _search_in_loop(model, sources, settings, functions=None):
    """The search as one compiled loop (`loop.search_loop`): each source's
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
    budgets = output_budgets(sources, settings.max_length_offset, limit).astype("int32")
    max_length = int(loop_cache_length(encoder_ids.shape[1], settings.max_length_offset, limit))
    first = max_length
    if FIRST_LOOP_POSITIONS:
        first = min(round_up(encoder_ids.shape[1] + FIRST_LOOP_POSITIONS, 8), max_length)
    search = search_loop_function(model, settings)
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

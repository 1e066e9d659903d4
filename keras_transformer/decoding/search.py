"""The search (paper section 6.1), written once: its state and one step.

Every way of running beam search drives this body, and only the driving
differs (`beam.py`): the host search calls a decoder step and `advance`
a step at a time (PyTorch, ensembles), or a compiled segment of steps
(`loop.search_segment`, JAX and TensorFlow), dropping done sources from
the batch and growing the self-attention cache between calls; the
compiled loop (`loop.search_loop`) runs `cached_step` until every source
is done (a few sentences at a time, and the SavedModel). Greedy decoding
is a search with one beam.

The state of a search of `batch` sources with `k` beams each:

- `index`: the output position of the next step (a scalar);
- `tokens`: `(batch * k,)` each beam's last token, the next step's input;
- `parents`: `(batch * k,)` the self-attention cache's row of each beam's
  history, which the next step reorders the cache to;
- `sequences`: `(batch, k, width)` the live beams' tokens;
- `log_probs`: `(batch, k)` their log-probabilities (`-inf`: not live);
- `finished`: each source's `k` best finished hypotheses, best first:
  `(token_ids (batch, k, width), lengths, scores, log_probs)`;
- `count`: `(batch,)` how many hypotheses each source has finished;
- `done`: `(batch,)` which sources are done;
- `caches`: per decoder layer, the self-attention cache.

The arrays are made in the namespace of `runtime.array_ops`: `keras.ops`,
which JAX and TensorFlow trace into compiled code, or on PyTorch, which
runs each step eagerly, the same ops called on PyTorch directly.
"""

import inspect

from keras_transformer.decoding.rules import length_penalty
from keras_transformer.decoding.rules import never_output_bias
from keras_transformer.decoding.rules import search_is_over
from keras_transformer.decoding.transforms import candidates
from keras_transformer.decoding.transforms import uses_history
from keras_transformer.runtime import beam_cache
from keras_transformer.runtime.array_ops import array_ops
from keras_transformer.runtime.array_ops import search_state_ops


def advance(state, values, flat, caches, budgets, settings, special, vocabulary_size):
    """One step of the search's rules (`rules.py`), given the step's
    candidates: the state after it.

    Args:
        state: the state before the step (see the module docstring).
        values, flat: `(batch, 2 * k)` the candidates of each source
            (`transforms.candidates`), best first: log-probabilities and
            flat indices `beam * vocabulary_size + token`.
        caches: the self-attention caches after the step.
        budgets: int32 `(batch,)` each source's output budget.
        settings: the `DecodingSettings`; special: the model's special
            token ids; vocabulary_size: the model's.
    """
    index, _, _, sequences, _, finished, count, done, _ = state
    ops = array_ops(done)
    values = ops.convert_to_tensor(values, "float32")
    k, n = settings.beam_size, settings.num_results
    width = ops.shape(sequences)[2]
    never = float("-inf")
    rank = ops.arange(2 * k, dtype="int32")[None, :]
    budgets = ops.convert_to_tensor(budgets, "int32")

    def along(x, indices):
        """`x[i, indices[i, j]]` for `x` of `(batch, m)` or `(batch, m, width)`."""
        if len(ops.shape(x)) == 3:
            indices = ops.broadcast_to(indices[:, :, None], ops.shape(indices) + (width,))
        return ops.take_along_axis(x, indices, axis=1)

    def penalised(log_probs, length):
        return log_probs / length_penalty(length, settings.alpha, settings.length_penalty, ops, "float32")

    flat = ops.cast(flat, "int32")
    parent, token = flat // vocabulary_size, flat % vocabulary_size
    length = index + 1
    usable = ops.isfinite(values) & ~done[:, None]
    is_end = token == special.end

    # Rule 3: end tokens among the best k finish hypotheses (without the
    # end token); the best k other extensions stay live.
    ends = usable & is_end & (rank < k)
    if ops.may_hold_true(ends):
        finished = _merged(ops, along, finished, k, along(sequences, parent),
                           ops.full(ops.shape(parent), index, "int32"), ops.where(ends, penalised(values, length), never),
                           values)
    count = count + ops.sum(ops.cast(ends, "int32"), axis=1)
    others = usable & ~is_end
    chosen = others & (ops.cumsum(ops.cast(others, "int32"), axis=1) <= k)
    # The chosen candidates in rank order, then the others.
    _, order = ops.top_k(ops.cast(ops.where(chosen, -rank, -2 * k - rank), "float32"), k)
    live = along(chosen, order)
    log_probs = ops.where(live, along(values, order), never)
    parents = ops.where(live, along(parent, order), 0)
    tokens = ops.where(live, along(token, order), special.pad)
    positions = ops.arange(width, dtype="int32")[None, None, :]
    sequences = ops.where(positions == index, tokens[:, :, None], along(sequences, parents))

    # Rule 4: at its budget a source's live beams finish as they are.
    at_budget = (length >= budgets) & ~done
    if ops.may_hold_true(at_budget):
        finished = _merged(ops, along, finished, k, sequences, ops.full(ops.shape(parents), length, "int32"),
                           ops.where(live & at_budget[:, None], penalised(log_probs, length), never), log_probs)

    # Rule 5, and sources with nothing live.
    over = search_is_over(
        count, ops.max(log_probs, axis=1), finished[2][:, n - 1], finished[2][:, k - 1], length, budgets, k, n,
        settings.alpha, settings.length_penalty, xp=ops, dtype="float32",
    )
    done = done | at_budget | (ops.sum(ops.cast(live, "int32"), axis=1) == 0) | over
    log_probs = ops.where(done[:, None], never, log_probs)
    rows = ops.arange(ops.shape(done)[0], dtype="int32")
    parents = ops.reshape(rows[:, None] * k + parents, (-1,))
    return (index + 1, ops.reshape(tokens, (-1,)), parents, sequences, log_probs, finished, count, done, caches)


def _merged(ops, along, finished, k, ids, lengths, scores, log_probs):
    """The `k` best of a source's finished hypotheses and new ones (scores
    `-inf` where not finished); earlier ones first on ties where `top_k`
    keeps the lower index first among equal values. (Where no new one
    finishes, the merge keeps the finished ones as they are: `advance`
    skips it where the namespace can tell, `may_hold_true`.)"""
    merged = [ops.concatenate([old, new], axis=1) for old, new in zip(finished, (ids, lengths, scores, log_probs))]
    _, best = ops.top_k(merged[2], k)
    return tuple(along(x, best) for x in merged)


def cached_step(model, cross, encoder_mask, budgets, settings, keys=None, prefixes=None):
    """The compiled loops' body (`loop.py`): the self-attention caches
    reordered to the beams' parents, one cached decoder step of `model`,
    its candidates (`transforms.candidates`; `keys` where sampling, the
    beams' tokens so far where the transforms read them, `prefixes` where
    each source has its own forced first tokens), then `advance`."""
    never_output = never_output_bias(model)
    special, vocabulary_size = model.special_token_ids, model.backbone.vocabulary_size

    def body(*state):
        index, tokens, parents, sequences, log_probs, _, _, _, caches = state
        caches = reordered_caches(caches, parents, settings.beam_size)
        logits, cache = model.call_decoder_with_cache(tokens[:, None], index, list(zip(caches, cross)), encoder_mask)
        history = history_of(sequences) if uses_history(settings) else None
        values, flat = candidates(logits, log_probs, index, never_output, settings, keys, history, prefixes)
        return advance(state, values, flat, [c for c, _ in cache], budgets, settings, special, vocabulary_size)

    return body


def history_of(sequences):
    """Each beam's output so far, as the step's rows read it: the state's
    `sequences` `(batch, k, width)` as `(batch * k, width)` (the live beams'
    tokens, in the order of the next step's logits)."""
    ops = array_ops(sequences)
    return ops.reshape(sequences, (-1, ops.shape(sequences)[2]))


def initial_state(model, batch, beam_size, length, width=None, beam_caches=False):
    """The state of a search of `batch` sources before its first step,
    with self-attention caches of `length` positions
    (`model.empty_self_attention_cache`) and token ids of `width` (by
    default `length`). `batch` may be a tensor (the SavedModel's batch
    size is known only when it runs). Only the first beam of a source is
    live at the start: the others would repeat it. With `beam_caches`,
    caches that the search never reorders (`empty_caches`)."""
    caches = [tuple(cache) for cache in empty_caches(model, batch, beam_size, length, beam_caches)]
    ops = search_state_ops(caches[0][0] if caches else None)
    k, width = beam_size, length if width is None else width
    never = ops.convert_to_tensor(float("-inf"), "float32")
    first = ops.where(ops.arange(k, dtype="int32")[None, :] == 0, ops.zeros((batch, k), "float32"), never)
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
        caches,
    )


def empty_caches(model, batch, beam_size, length, beam_caches=False):
    """The zeroed self-attention caches of a search of `batch` sources:
    with `beam_caches`, `runtime.beam_cache`'s where the model makes them;
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
    (`runtime.beam_cache.reordered`)."""
    ops = _cache_ops(caches)
    parents = ops.convert_to_tensor(parents, "int32")
    if any(beam_cache.is_beam_cache(cache) for cache in caches):
        grouped = ops.reshape(parents, (-1, beam_size))
        parent_beams = grouped - ops.arange(ops.shape(grouped)[0], dtype="int32")[:, None] * beam_size
    return [
        beam_cache.reordered(cache, parent_beams) if beam_cache.is_beam_cache(cache)
        else tuple(ops.take(x, parents, axis=0) for x in cache)
        for cache in caches
    ]


def kept_slots(state, cross, keep, beam_size, reorder_later=False):
    """The search state and encoder-decoder caches of the batch slots
    `keep` (int32 indices, ascending) only: the host search drops done
    sources between calls (`beam.beam_search`). A source's beams keep
    their parents. The beams' rows are taken from the self-attention
    caches and the parents numbered anew; or, with `reorder_later`, the
    caches stay as they are and the parents name their rows there, so
    that the next step's reorder drops the other rows (one copy of the
    caches, not two: where steps run eagerly)."""
    index, tokens, parents, sequences, log_probs, finished, count, done, caches = state
    ops = array_ops(parents)
    k = beam_size
    keep = ops.convert_to_tensor(keep, "int32")
    beam_rows = ops.reshape(keep[:, None] * k + ops.arange(k, dtype="int32")[None, :], (-1,))

    def take(x, rows):
        return ops.take(x, rows, axis=0)

    parents = take(parents, beam_rows)
    if reorder_later:
        kept_caches = caches
    else:
        # A source's beams descend from its own beams: their parents, less
        # its first row, are beam numbers.
        beams = ops.reshape(parents, (-1, k)) - keep[:, None] * k
        parents = ops.reshape(ops.arange(ops.shape(keep)[0], dtype="int32")[:, None] * k + beams, (-1,))
        cache_ops = _cache_ops(caches)
        cache_rows, cache_keep = (cache_ops.convert_to_tensor(x, "int32") for x in (beam_rows, keep))
        kept_caches = [
            beam_cache.kept(cache, cache_keep) if beam_cache.is_beam_cache(cache)
            else tuple(cache_ops.take(x, cache_rows, axis=0) for x in cache)
            for cache in caches
        ]
    state = (
        index, take(tokens, beam_rows), parents, take(sequences, keep), take(log_probs, keep),
        tuple(take(x, keep) for x in finished), take(count, keep), take(done, keep), kept_caches,
    )
    cache_ops = _cache_ops(cross)
    cache_keep = cache_ops.convert_to_tensor(keep, "int32")
    return state, [(cache_ops.take(keys, cache_keep, axis=0), cache_ops.take(values, cache_keep, axis=0))
                   for keys, values in cross]


def grown_state(state, length):
    """The search state with `length` positions of self-attention cache
    and of token ids (zeros after the old ones): the host search grows
    them between calls as outputs grow."""
    index, tokens, parents, sequences, log_probs, finished, count, done, caches = state
    ops = array_ops(parents)
    ids, lengths, scores, finished_log_probs = finished
    return (
        index, tokens, parents, ops.pad_to(sequences, 2, length), log_probs,
        (ops.pad_to(ids, 2, length), lengths, scores, finished_log_probs), count, done,
        padded_caches(caches, length, _cache_ops(caches)),
    )


def _cache_ops(caches):
    """The namespace of the self-attention caches' tensors (the state's
    other arrays may be the host's: `array_ops.search_state_ops`)."""
    return array_ops(caches[0][0] if caches else None)


def padded_caches(caches, length, ops):
    """Each `(keys, values)` cache, `(batch, heads, positions, d)`,
    zero-padded to `length` positions (a `runtime.beam_cache` likewise)."""
    return [
        beam_cache.padded(cache, length, ops.pad_to) if beam_cache.is_beam_cache(cache)
        else (ops.pad_to(cache[0], 2, length), ops.pad_to(cache[1], 2, length))
        for cache in caches
    ]

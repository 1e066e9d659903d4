"""What decoding needs of a model, and the decoding functions made from it.

Decoding (`beam_search`, `greedy_search`, the SavedModel's search) depends
on the small interface below, not on a model class: any encoder-decoder
that provides it decodes with this package's searches. Calls flow one way:
the searches call `decoding_functions(model)`, which calls the model's
interface methods; the model never calls back into a search's internals.
"""

import threading
import types
from typing import Any
from typing import Protocol
from typing import runtime_checkable

from keras import ops

from keras_transformer.runtime.compiled import compile_for_inference
from keras_transformer.runtime.compiled import compile_for_models
from keras_transformer.runtime.compiled import compiles_steps
from keras_transformer.runtime.compiled import structure_key
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.ensemble import log_mean
from keras_transformer.decoding.ensemble import probabilities_of
from keras_transformer.decoding.loop import search_loop
from keras_transformer.decoding.loop import search_segment
from keras_transformer.decoding.loop import segment_beam_caches
from keras_transformer.decoding.rules import never_output_bias
from keras_transformer.decoding.search import advance
from keras_transformer.decoding.search import grown_state
from keras_transformer.decoding.search import initial_state
from keras_transformer.decoding.search import kept_slots
from keras_transformer.decoding.transforms import candidates
from keras_transformer.runtime.direct_calls import in_place_cache_writes
from keras_transformer.runtime.array_ops import array_ops


@runtime_checkable
class Seq2SeqDecodingModel(Protocol):
    """The model interface of incremental decoding (paper section 6.1).

    `TransformerSeq2SeqLM` provides it.

    Attributes:
        special_token_ids: a `SpecialTokenIds` (pad, start, end, unk,
            source start): decoding starts from `start`, stops at `end`,
            and never outputs `never_output`.
        backbone: has `vocabulary_size` and `max_sequence_length` (the
            longest sequence the positions allow).
        variables: the weights the methods below read (on JAX the
            compiled decoding functions take them as inputs).
    """

    special_token_ids: Any
    backbone: Any
    variables: Any

    def encode(self, encoder_token_ids, encoder_padding_mask):
        """The encoder output `(batch, source_length, d_model)`."""

    def cross_attention_cache(self, encoder_output):
        """Per decoder layer, the encoder output's `(keys, values)` for the
        encoder-decoder attention; rows may be repeated or taken."""

    def empty_self_attention_cache(self, batch_size, max_length, beams=None):
        """Per decoder layer, zeroed self-attention `(keys, values)` of
        `max_length` positions, `(batch, heads, positions, ...)`. With
        `beams` (optional: the compiled searches pass it only where the
        method takes it), caches that beam search never reorders, for
        `batch_size` sources of `beams` beams
        (`keras_transformer.runtime.beam_cache`)."""

    def call_decoder_with_cache(self, token_ids, index, cache, encoder_padding_mask):
        """One cached step: `token_ids` `(batch, 1)` at position `index`,
        `cache` a list of `(self_attention_cache, cross_attention_cache)`
        per layer. The cross-attention caches and `encoder_padding_mask`
        may have one row a source for several consecutive rows of
        `token_ids` (a source's beams). Returns `(logits (batch,
        vocabulary_size), cache)`."""


# The model attributes holding its compiled functions: on the model, so
# that they go when it goes (they refer to it).
_ATTRIBUTE = "_decoding_functions"
_LOOPS = "_decoding_loops"


def forget_decoding_functions(model):
    """Drops `model`'s compiled decoding functions, after its variables
    changed (quantization): the next search compiles them again."""
    for attribute in (_ATTRIBUTE, _LOOPS):
        if getattr(model, attribute, None) is not None:
            setattr(model, attribute, None)


class _CompiledLoops:
    """The compiled search loops of a model, by settings: held in a plain
    object, since Keras and TensorFlow would track a dict attribute (and
    refuse to save its non-string keys in a SavedModel)."""

    def __init__(self):
        self.by_settings = {}


def search_loop_function(model, settings, prefixes=False):
    """`loop.search_loop` of `model` with these settings (a
    `DecodingSettings`), compiled for the backend, made once per model and
    settings: `search(encoder_ids, encoder_mask, budgets, positions)` gives
    `(token_ids, lengths, scores, log_probs, done)`; `positions`, any int32
    vector, has the length of the self-attention cache (so that it is a
    shape, which compilers see). With `prefixes`, `search` takes each
    source's forced first tokens last (`loop.search_loop`'s `prefixes`)."""

    def search(encoder_ids, encoder_mask, budgets, positions, *forced):
        return search_loop(model, encoder_ids, encoder_mask, budgets, ops.shape(positions)[0], settings, *forced)

    return _compiled_once(model, ("loop", _search_key(settings), bool(prefixes)), search)


def search_segment_function(model, settings):
    """`loop.search_segment` of `model` with these settings, compiled for
    the backend, made once per model and settings: `segment(state,
    encoder_mask, cross, budgets, min_live, keys=None)` gives the state
    after the segment's steps."""

    def segment(state, encoder_mask, cross, budgets, min_live, keys=None):
        return search_segment(model, state, encoder_mask, cross, budgets, min_live, settings, keys)

    return _compiled_once(model, ("segment", _search_key(settings)), segment)


def advance_function(model, settings):
    """`search.advance` for `model`'s special tokens and vocabulary with
    these settings, compiled for the backend (it reads no weights), made
    once per model and settings: `advance(state, values, flat, caches,
    budgets)`, for the host search's steps a call."""
    special, vocabulary_size = model.special_token_ids, model.backbone.vocabulary_size

    def advanced(state, values, flat, caches, budgets):
        return advance(state, values, flat, caches, budgets, settings, special, vocabulary_size)

    return _compiled_once(model, ("advance", _search_key(settings)), advanced, reads_weights=False)


def _search_key(settings):
    """What of the settings a compiled search depends on (the output
    budgets are its inputs)."""
    return settings.replace(max_length_offset=0)


def search_state_functions(model, beam_size):
    """The host search's changes of a `loop.search_segment` state between
    segments, compiled for the backend, made once per model and beam size:
    `(initial, kept, grown)`, where `initial(batch=..., length=...,
    beam_caches=...)` is `search.initial_state` (with the segments' beam
    caches where `segment_holds_beam_caches` and `beam_caches`), `kept(state,
    cross, keep, reorder_later=...)` is `search.kept_slots` and
    `grown(state, length=...)` is `search.grown_state` (keyword arguments:
    Python values).

    Run op by op, they were a fifth of a translation's time 64 sentences
    at a time on JAX (each of their dozens of ops dispatched from Python,
    while the other part of the batch waited for the interpreter lock):
    the shipped preset's first model, bfloat16, 2-core AMD EPYC, 7 ms to
    make a state, 3 to drop slots, 3 to grow, against segments of 40 ms.
    """
    def initial(batch, length, beam_caches=True):
        beam_caches = beam_caches and segment_holds_beam_caches(model)
        return initial_state(model, batch, beam_size, length, beam_caches=beam_caches)

    def kept(state, cross, keep, reorder_later=False):
        return kept_slots(state, cross, keep, beam_size, reorder_later)

    # (They read no weights: compiled without them as inputs.)
    functions = (initial, kept, grown_state)
    return tuple(
        _compiled_once(model, ("state", name, beam_size), function, reads_weights=False)
        for name, function in zip(("initial", "kept", "grown"), functions)
    )


def segment_holds_beam_caches(model):
    """`loop.segment_beam_caches(model)`, decided once per model and kept
    with its compiled functions (`forget_decoding_functions` drops it too):
    whether the states of `search_state_functions` hold `runtime.beam_cache`
    caches, which also sets how the host search grows them
    (`beam.SEGMENT_CACHE_CHUNK`). (Deciding asks the model for an empty
    cache: not at every search.)"""
    return _made_once(model, ("segment beam caches",), lambda: segment_beam_caches(model))


def _compiled_once(model, key, function, reads_weights=True):
    """`function` compiled for the backend (`compile_for_inference`), kept
    on `model` under `key`: compiled once per model and key. A function
    that reads none of the model's weights is compiled without them as
    inputs (`reads_weights=False`): each call would pass them all."""
    return _made_once(model, key, lambda: compile_for_inference(model if reads_weights else _WITHOUT_WEIGHTS, function))


def _made_once(model, key, make):
    """`make()`, kept on `model` under `key`: made once per model and key."""
    # (The parts of a batch, searched in threads at once, ask at once: one
    # of them makes it, and a function made so then compiles once.)
    with _MAKING:
        if getattr(model, _LOOPS, None) is None:
            setattr(model, _LOOPS, _CompiledLoops())
        loops = getattr(model, _LOOPS).by_settings
        if key not in loops:
            loops[key] = make()
        return loops[key]


_MAKING = threading.Lock()


# What `compile_for_inference` compiles a function that reads no weights for.
_WITHOUT_WEIGHTS = types.SimpleNamespace(variables=[])


def decoding_functions(model):
    """The encoder and the beam search step of `model` (a
    `Seq2SeqDecodingModel`), compiled for the backend (see
    `keras_transformer.runtime.compiled`), made once per model.

    Returns:
        `(encode, step)`: `encode(encoder_token_ids, encoder_padding_mask)`
        gives `(encoder_output, cross_attention_caches)`;
        `step(token_ids, index, cache, encoder_padding_mask, parents,
        log_probs, keys=None, history=None, *, settings)` first reorders
        the self-attention caches to the beams' `parents` (row indices),
        runs `call_decoder_with_cache`, and returns `(values, indices,
        cache)`: the `2 * beams` best extensions of each source's beams
        (`transforms.candidates`, with the sampling's `keys` and the beams'
        tokens so far, `history`, where `settings` read them) given the
        beams' `(batch, beams)` log-probabilities; `beam_size` (an int, where
        steps are not compiled) asks for `2 * beam_size` instead, for a
        first step that runs one beam a source. The beams of a source are
        consecutive rows of `token_ids` and the self-attention caches; the
        cross-attention caches and `encoder_padding_mask` have one row a
        source.
    """
    functions = getattr(model, _ATTRIBUTE, None)
    if functions is None and isinstance(model, Ensemble) and compiles_steps():
        functions = _ensemble_decoding_functions(model)
        setattr(model, _ATTRIBUTE, functions)
    if functions is None:
        never_output = never_output_bias(model)

        def encode(encoder_token_ids, encoder_padding_mask):
            return _model_encode(model, encoder_token_ids, encoder_padding_mask)

        def step(token_ids, index, cache, encoder_padding_mask, parents, log_probs, keys=None, history=None, *,
                 settings):
            cache = _reordered(cache, parents)
            # The reordered caches are new tensors, this step's own: PyTorch
            # writes the new position into them without copying them again.
            with in_place_cache_writes():
                logits, cache = model.call_decoder_with_cache(token_ids, index, cache, encoder_padding_mask)
            values, indices = candidates(logits, log_probs, index, never_output, settings, keys, history)
            return values, indices, cache

        functions = (compile_for_inference(model, encode), compile_for_inference(model, step))
        setattr(model, _ATTRIBUTE, functions)
    return functions


def _ensemble_decoding_functions(ensemble):
    """`decoding_functions` of an `Ensemble` where steps are compiled (JAX,
    TensorFlow), with each model's encoder and step compiled once for all
    the models built alike (`compiled.compile_for_models`), and the
    models' probabilities averaged and ranked in a function of their own.

    Compiled as one function, an ensemble of 5 models is 5 times the code
    for the compiler at each shape the search meets: the shipped presets'
    ensemble, whose models are alike, translated 256 sentences from a cold
    command in 80 s on JAX and 117 s on TensorFlow, against 26 and 33 s for
    its first model alone (`benchmarks/startup.py`).
    """
    never_output = never_output_bias(ensemble)
    compiled = {}  # by structure: (encode, step)
    members = []
    for model in ensemble.models:
        key = structure_key(model) or id(model)
        if key not in compiled:
            compiled[key] = (compile_for_models(model, _model_encode), compile_for_models(model, _model_step))
        members.append((model, *compiled[key]))

    def rank(probabilities, log_probs, index, keys=None, history=None, *, settings):
        return candidates(log_mean(probabilities), log_probs, index, never_output, settings, keys, history)

    rank = compile_for_inference(_WITHOUT_WEIGHTS, rank)  # (it reads no weights)

    def encode(encoder_token_ids, encoder_padding_mask):
        outputs, caches = [], []
        for model, model_encode, _ in members:
            output, cache = model_encode(model, encoder_token_ids, encoder_padding_mask)
            outputs.append(output)
            caches.extend(cache)
        return tuple(outputs), caches

    def step(token_ids, index, cache, encoder_padding_mask, parents, log_probs, keys=None, history=None, *,
             settings):
        probabilities, new_cache = [], []
        for (model, _, model_step), model_cache in zip(members, ensemble.split_cache(cache)):
            model_probabilities, model_cache = model_step(
                model, token_ids, index, model_cache, encoder_padding_mask, parents
            )
            probabilities.append(model_probabilities)
            new_cache.extend(model_cache)
        values, indices = rank(probabilities, log_probs, index, keys, history, settings=settings)
        return values, indices, new_cache

    return encode, step


def _model_encode(model, encoder_token_ids, encoder_padding_mask):
    """A model's encoder output and its encoder-decoder keys and values."""
    output = model.encode(encoder_token_ids, encoder_padding_mask)
    return output, model.cross_attention_cache(output)


def _reordered(cache, parents):
    """The self-attention caches reordered to the beams' `parents` (row
    indices); the cross-attention caches as they are."""
    # (On PyTorch the namespace's own conversion and `index_select`: Keras'
    # conversion took 12.6 us a step against 2.2, one sentence at a time.)
    ops = array_ops(cache[0][0][0] if cache else None)
    parents = ops.convert_to_tensor(parents, "int32")
    return [((ops.take(keys, parents, axis=0), ops.take(values, parents, axis=0)), cross)
            for (keys, values), cross in cache]


def _model_step(model, token_ids, index, cache, encoder_padding_mask, parents):
    """One model's part of an ensemble's step: its caches reordered to the
    beams' parents, its decoder step, its next-token probabilities."""
    logits, cache = model.call_decoder_with_cache(token_ids, index, _reordered(cache, parents), encoder_padding_mask)
    return probabilities_of(logits), cache

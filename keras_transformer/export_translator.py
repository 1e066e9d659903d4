"""The SavedModel's translator (`keras_transformer.export`): the model,
its tokenizer and beam search as one `tf.Module`, whose `translate` and
`translate_ids` are the SavedModel's signatures, and the function that
saves it.

The beam search here is `keras_transformer.decoding.loop.search_loop`, the
search that `generate` runs for a few sentences at a time on JAX and
TensorFlow, compiled by XLA with `jit_compile` as `generate` compiles it
on TensorFlow (a few sources at a time, sorted by length). An M2M100 or
NLLB-200 model's signatures take its languages (`export_languages.py`):
each text's target code is forced first in the search (`search_loop`'s
`prefixes`).
"""

import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.decoding import rules
from keras_transformer.decoding.beam import ENSEMBLE_LOOP_BATCH_SIZE
from keras_transformer.decoding.beam import loop_cache_length
from keras_transformer.decoding.beam import round_up
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.interface import search_loop_function
from keras_transformer.decoding.loop import search_loop
from keras_transformer.export_languages import language_inputs
from keras_transformer.runtime.backend_choices import LOOP_BATCH_SIZES
from keras_transformer.utils.text import BLANK_PATTERN


def write_saved_model(model, path, settings, target_prefix=None, jit_compile=False, ensemble=False):
    languages = language_inputs(model, target_prefix)
    if languages is not None:  # (each text's target code forced first, then the prefix)
        settings = settings.replace(target_prefix=())
    elif target_prefix is not None:
        settings = settings.replace(target_prefix=model.target_prefix_ids(target_prefix))
    translator = Translator(model, settings, jit_compile, ensemble, languages)
    signatures = {"serving_default": translator.translate, "translate_ids": translator.translate_ids}
    # The signatures translate; no gradients to trace for them.
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    tf.saved_model.save(translator, path, signatures=signatures, options=options)


class _Untracked:
    """Holds a model where `tf.Module` does not track it."""

    def __init__(self, model):
        self.model = model


class Translator(tf.Module):
    """The model, the tokenizer and beam search as one `tf.Module`, with
    `translate` and `translate_ids` (the signatures) as its functions;
    with `jit_compile`, the search in them is compiled by XLA; with
    `ensemble`, the model and its `ensemble_members` decode together;
    with `languages` (`export_languages.LanguageInputs`), they take a
    multilingual model's languages."""

    def __init__(self, model, settings, jit_compile=False, ensemble=False, languages=None):
        super().__init__(name="translator")
        if model.preprocessor is None:
            raise ValueError("Export needs a model with a preprocessor (its tokenizer).")
        members = list(model.ensemble_members) if ensemble else []
        decoding = Ensemble([model, *members]) if members else model
        # The models' variables are tracked here, so that the SavedModel
        # saves them; the models themselves are held untracked
        # (`_Untracked`): the saver would otherwise walk every attribute of
        # every layer.
        self._held = _Untracked(decoding)
        self.model_variables = list(decoding.variables)
        tokenizer = model.preprocessor.tokenizer
        if hasattr(tokenizer, "graph_tokenizer"):  # MarianTokenizer: tracked tables
            self.tokenizer = tokenizer.graph_tokenizer()
        else:
            self.tokenizer = tf_text.SentencepieceTokenizer(model=tokenizer.proto, out_type=tf.int32)
        settings.check_for(model.backbone.vocabulary_size, model.special_token_ids.never_output)
        # (One result a source: the SavedModel's search is keyed without the offset.)
        self.settings = settings.replace(num_results=1)
        self.max_length_offset = settings.max_length_offset
        self.jit_compile = jit_compile
        special = model.special_token_ids
        self.pad_id, self.end_id = special.pad, special.end
        self.source_start_id = special.source_start
        # Traced once each, here, as concrete functions: the saver traces
        # a `tf.function` method once more, in its own context.
        self.languages = languages
        text = [tf.TensorSpec([None], tf.string, name="text"), *(languages.specs() if languages else [])]
        self.translate = tf.function(self._translate, input_signature=text, autograph=False).get_concrete_function()
        self.translate_ids = tf.function(
            self._translate_ids, input_signature=text, autograph=False
        ).get_concrete_function()

    def _translate(self, text, *languages):
        token_ids, lengths, _ = self._search(text, *languages)
        ragged = tf.RaggedTensor.from_tensor(token_ids, lengths=lengths)
        return {"translations": self.tokenizer.detokenize(ragged)}

    def _translate_ids(self, text, *languages):
        token_ids, lengths, scores = self._search(text, *languages)
        return {"token_ids": token_ids, "lengths": lengths, "scores": scores}

    def _search(self, text, *languages):
        model = self._held.model
        limit = model.backbone.max_sequence_length
        empty = tf.strings.regex_full_match(text, BLANK_PATTERN)  # what generate calls blank
        prefixes = None
        if self.languages is not None:
            text, prefixes = self.languages.framed(text, empty, *languages)
        # A blank text is searched as an empty one (its translation is
        # empty): whitespace can make hundreds of pieces.
        pieces = self.tokenizer.tokenize(tf.where(empty, "", text))
        batch = tf.shape(text)[0]
        end = tf.fill([batch, 1], self.end_id)
        # Framed as the preprocessor frames sources (`SpecialTokenIds.frame_source`).
        if self.source_start_id is None:
            sources = tf.concat([pieces, end], axis=1)
        else:
            sources = tf.concat([tf.fill([batch, 1], self.source_start_id), pieces, end], axis=1)
        source_lengths = tf.cast(sources.row_lengths(), tf.int32)
        check = tf.debugging.assert_less_equal(
            tf.where(empty, 0, source_lengths), limit,
            message=f"A source is longer than the model's max_sequence_length={limit} tokens; "
            "split the text into sentences first.",
        )
        with tf.control_dependencies([check]):
            encoder_ids = sources.to_tensor(default_value=self.pad_id)
        encoder_mask = tf.cast(tf.sequence_mask(source_lengths, tf.shape(encoder_ids)[1]), tf.int32)
        budgets = rules.output_budget(source_lengths, self.max_length_offset, limit, xp=tf.math)
        token_ids, lengths, scores = self._beam_search(encoder_ids, encoder_mask, budgets, prefixes)
        lengths = tf.where(empty, 0, lengths)
        scores = tf.where(empty, 0.0, scores)
        token_ids = token_ids[:, : tf.reduce_max(tf.concat([lengths, [0]], axis=0))]
        token_ids = tf.where(tf.sequence_mask(lengths, tf.shape(token_ids)[1]), token_ids, self.pad_id)
        return token_ids, lengths, scores

    def _compiled_beam_search(self, encoder_ids, encoder_mask, budgets, prefixes=None):
        """`_beam_search` compiled by XLA, as `generate` searches a few
        sources at a time on TensorFlow: the sources sorted by length, in
        chunks of `LOOP_BATCH_SIZES["tensorflow"]` (an ensemble's:
        `ENSEMBLE_LOOP_BATCH_SIZE`; fewer in a smaller batch), the last one
        filled up with copies of its longest source, each chunk searched
        by `generate`'s compiled loop (`interface.search_loop_function`) at
        its own length rounded up to 8 tokens and the cache length that
        follows from it (`beam.loop_cache_length`). So a chunk's shape
        depends on its sources' length, not on the batch (but for batches
        of 1-3): XLA compiles once a length. (64 sources at a time ran
        2.4x as fast in chunks as in one loop, where every source waits
        for the batch's longest output: docs/export.md.)"""
        model = self._held.model
        limit = model.backbone.max_sequence_length
        batch = tf.shape(encoder_ids)[0]
        most = ENSEMBLE_LOOP_BATCH_SIZE if isinstance(model, Ensemble) else LOOP_BATCH_SIZES["tensorflow"]
        size = tf.minimum(batch, most)
        source_lengths = tf.reduce_sum(encoder_mask, axis=1)
        order = tf.argsort(source_lengths, stable=True)
        chunks = (batch + size - 1) // tf.maximum(size, 1)
        filled = tf.concat([order, tf.repeat(order[-1:], chunks * size - batch)], axis=0)
        # Room for every chunk's length rounded up to 8.
        batch_width = tf.shape(encoder_ids)[1]
        padding = [[0, 0], [0, tf.minimum(round_up(batch_width, 8), limit) - batch_width]]
        encoder_ids = tf.pad(encoder_ids, padding, constant_values=self.pad_id)
        encoder_mask = tf.pad(encoder_mask, padding)
        width = loop_cache_length(tf.shape(encoder_ids)[1], self.max_length_offset, limit, xp=tf) - 1
        search = search_loop_function(model, self.settings, prefixes is not None)

        def chunk(i, found_ids, found_lengths, found_scores):
            rows = filled[i * size : (i + 1) * size]
            length = tf.minimum(round_up(tf.reduce_max(tf.gather(source_lengths, rows)), 8), limit)
            ids, lengths, scores, _, _ = search(
                tf.gather(encoder_ids, rows)[:, :length], tf.gather(encoder_mask, rows)[:, :length],
                tf.gather(budgets, rows),
                tf.zeros([loop_cache_length(length, self.max_length_offset, limit, xp=tf)], tf.int32),
                *([] if prefixes is None else [tf.gather(prefixes, rows)]),
            )
            ids = tf.pad(ids[:, 0], [[0, 0], [0, width - tf.shape(ids)[2]]])
            return (i + 1, found_ids.write(i, ids), found_lengths.write(i, lengths[:, 0]),
                    found_scores.write(i, scores[:, 0]))

        def searched():
            arrays = [tf.TensorArray(dtype, size=chunks, element_shape=shape) for dtype, shape in
                      ((tf.int32, [None, None]), (tf.int32, [None]), (tf.float32, [None]))]
            _, *arrays = tf.while_loop(lambda i, *_: i < chunks, chunk, [0, *arrays])
            # Back to the batch's order; the copies that filled the last chunk dropped.
            back = tf.math.invert_permutation(order)
            return tuple(tf.gather(array.concat()[:batch], back) for array in arrays)

        # (An empty list of chunks cannot be concatenated: no texts, no search.)
        nothing = (tf.zeros([0, width], tf.int32), tf.zeros([0], tf.int32), tf.zeros([0], tf.float32))
        return tf.cond(batch > 0, searched, lambda: nothing)

    def _beam_search(self, encoder_ids, encoder_mask, budgets, prefixes=None):
        """`decoding.loop.search_loop` with the export's settings (and
        each source's forced `prefixes`): the best finished hypothesis of
        each source."""
        if self.jit_compile:
            return self._compiled_beam_search(encoder_ids, encoder_mask, budgets, prefixes)
        max_budget = tf.reduce_max(tf.concat([budgets, [1]], axis=0))  # 1 for an empty batch
        # The cache holds the start token's position and the longest output.
        token_ids, lengths, scores, _, _ = search_loop(
            self._held.model, encoder_ids, encoder_mask, budgets, max_budget + 1, self.settings, prefixes
        )
        return token_ids[:, 0], lengths[:, 0], scores[:, 0]

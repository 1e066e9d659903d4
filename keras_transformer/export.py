"""Export to a TensorFlow SavedModel that translates strings.

The SavedModel holds the whole translation: SentencePiece tokenization
(tensorflow-text), the encoder, beam search with the key/value cache and the
length penalty of paper section 6.1 (beam size and alpha fixed at export, at
most source length + `max_length_offset` output tokens), and detokenization.
It loads with `tf.saved_model.load` or TensorFlow Serving, with TensorFlow
and tensorflow-text installed and neither Keras nor this package:

    import tensorflow as tf
    import tensorflow_text  # registers the SentencePiece ops

    translator = tf.saved_model.load("exported/en-de")
    translator.signatures["serving_default"](tf.constant(["A dog runs."]))
    # {"translations": <tf.Tensor: [b"Ein Hund rennt."]>}

Signatures:

- `serving_default`: `text` (1-D strings) -> `translations` (1-D strings).
- `translate_ids`: `text` -> `token_ids` (int32 `(batch, length)`, padded
  with the padding id, no start or end token), `lengths` (int32
  `(batch,)`) and `scores` (float32 `(batch,)`, log P / lp).

The beam search here is `keras_transformer.decoding.loop.search_loop`, the
search that `generate` runs for a few sentences at a time on JAX and
TensorFlow: it follows the rules of `keras_transformer.decoding.rules`
(output budgets, candidates, ranking, stopping), as the host search does, so
that the SavedModel gives the package's own translations. An empty or blank text
gives an empty translation (score 0); a text longer than the model's
`max_sequence_length` fails with an error naming the limit.

Export runs through TensorFlow: under another backend, `export_saved_model`
runs itself in a TensorFlow subprocess (weights are portable).

`jit_compile=True` compiles the search with XLA, as `generate` compiles it
on TensorFlow: one sentence at a time several times as fast, at the cost of
a compilation for every new input shape (see `export_saved_model`).
`ensemble=True` holds all the models of an ensemble preset and decodes them
together, as `generate` does; by default the SavedModel holds the first.
"""

import dataclasses
import errno
import json
import os
import re
import subprocess
import sys

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.decoding import rules
from keras_transformer.decoding.beam import ENSEMBLE_LOOP_BATCH_SIZE
from keras_transformer.decoding.beam import loop_cache_length
from keras_transformer.decoding.beam import round_up
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.interface import search_loop_function
from keras_transformer.decoding.loop import search_loop
from keras_transformer.decoding.settings import DecodingSettings
from keras_transformer.runtime.backend_choices import LOOP_BATCH_SIZES
from keras_transformer.export_checks import check_export
from keras_transformer.export_checks import load_for_export
from keras_transformer.presets import ensembles
from keras_transformer.utils.files import move_into_place
from keras_transformer.utils.files import reporting_full_disk
from keras_transformer.utils.files import staging_directory
from keras_transformer.utils.locks import locked
from keras_transformer.utils.text import BLANK_PATTERN

# What `tf.saved_model.save` writes: an overwrite replaces these only.
SAVED_MODEL_ENTRIES = ("saved_model.pb", "saved_model.pbtxt", "fingerprint.pb", "variables", "assets")


def export_saved_model(
    model, export_dir, beam_size=4, alpha=0.6, max_length_offset=50, overwrite=False, dtype=None, quantize=None,
    jit_compile=False, ensemble=False, length_penalty="gnmt", target_prefix=None, settings=None,
):
    """Writes a SavedModel that translates strings (see the module docstring).

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor (exported in
            its own precision), or a preset name or directory.
        export_dir: the SavedModel's directory.
        beam_size: beams per source (1: greedy decoding).
        alpha: length penalty exponent.
        max_length_offset: at most source length + this many output tokens.
        overwrite: replace an earlier export (a SavedModel) in
            `export_dir`: its `saved_model.pb`, `fingerprint.pb`,
            `variables/` and `assets/`; other files there (TF Serving's
            `assets.extra/`, notes) stay. Without it a non-empty
            `export_dir` is an error and stays as it is; so is one that
            holds no SavedModel, even with it.
        dtype: for a preset, the precision the SavedModel computes in
            (`"bfloat16"`, `"float16"`; default: the preset's, float32);
            weights are stored in it too.
        quantize: for a preset, `"int8"`: int8 weights with a float scale
            per output (Keras's `model.quantize("int8")`; the shipped en-de
            preset's SavedModel: 14 MiB instead of 33).
        jit_compile: compile the encoder and beam search with XLA
            (`tf.function(jit_compile=True)`), as `generate` runs them on
            TensorFlow: a few sources at a time, sorted by length; the
            tokenization stays outside. Several times as fast, one
            sentence at a time and in batches (docs/export.md); but XLA
            compiles once for each source length (rounded up to 8 tokens;
            for requests of 1-3 texts, once for each number too), 1-3 s on
            a CPU at the first request of that shape. TensorFlow Serving
            runs such a SavedModel on CPUs only with
            `--xla_cpu_compilation_enabled=true` (without it the first
            request fails).
        ensemble: for an ensemble preset (or a model with
            `ensemble_members`), hold all its models and decode them
            together, as `generate` does by default
            (`keras_transformer.decoding.Ensemble`): the preset's quality,
            at the cost of every model's weights and steps. Without it the
            SavedModel holds the first model alone, and says so in a
            warning; with it, a model of one model is an error.
        length_penalty: `"gnmt"` (the paper's) or `"length"`, as
            `generate` takes it.
        target_prefix: text (tokenized by the model's tokenizer, as
            `generate` takes it) or token ids that every translation starts
            with, forced in the SavedModel's search.
        settings: a `DecodingSettings` (sampling, for one) to search with
            instead of `beam_size`, `alpha`, `max_length_offset` and
            `length_penalty`.

    Returns:
        `export_dir`.

    Raises:
        FileExistsError: `export_dir` is not empty and `overwrite` is False.
        DirectoryInUseError: another process writes `export_dir` (an
            `OSError`; `keras_transformer.utils.locks`).
        ValueError: bad settings, or a model that cannot be exported (no
            preprocessor, or a WordPiece tokenizer: the export tokenizes
            with tensorflow-text's SentencePiece).
        ExportError: the TensorFlow subprocess (other backends) failed.

    A failed export leaves nothing behind, and an existing export is only
    replaced once the new one is complete. A full disk is a `DiskFullError`
    (an `OSError`).
    """
    # (Checked now; a prefix given as text is tokenized where the model is loaded.)
    if settings is None:
        settings = DecodingSettings(
            beam_size=beam_size, alpha=alpha, length_penalty=length_penalty, max_length_offset=max_length_offset,
        )
    if isinstance(target_prefix, (list, tuple)):
        settings = settings.replace(target_prefix=target_prefix)
    check_export(model, settings, dtype, quantize, ensemble)
    precision = {"dtype": dtype, "quantize": quantize}
    search = {"settings": settings, "target_prefix": target_prefix, "jit_compile": bool(jit_compile),
              "ensemble": bool(ensemble)}
    export_dir = os.path.abspath(os.fspath(export_dir))
    if os.path.isfile(export_dir):
        raise FileExistsError(f"{export_dir!r} is a file; give a directory for the SavedModel.")
    # One writer at a time (utils/locks.py): a second export into the
    # directory fails at once, before it checks or writes anything.
    with locked(export_dir, "export"):
        if os.path.isdir(export_dir) and os.listdir(export_dir):
            if not overwrite:
                raise FileExistsError(
                    f"{export_dir!r} is not empty. Choose another directory, or pass "
                    "overwrite=True (--overwrite) to replace the SavedModel there."
                )
            # Replacing only an earlier export keeps a mistyped path (a preset,
            # a home directory) from being emptied.
            if not os.path.isfile(os.path.join(export_dir, "saved_model.pb")):
                raise FileExistsError(
                    f"{export_dir!r} is not empty and holds no SavedModel (saved_model.pb): overwrite "
                    "replaces an earlier export only. Choose another directory."
                )
        if not ensemble:  # after the checks that may refuse the export
            ensembles.warn_first_model_only(
                model, "The SavedModel", "export with ensemble=True (--ensemble) to hold them all"
            )
        with reporting_full_disk("exporting the SavedModel to", export_dir), staging_directory(
            export_dir, "exporting"
        ) as staging:
            saved_model = os.path.join(staging, "saved_model")
            if keras.config.backend() == "tensorflow":
                model = load_for_export(model, **precision, ensemble=ensemble)
                _write(model, saved_model, **search)
            else:
                _write_in_tensorflow_process(model, saved_model, staging, search, **precision)
            # Only what a SavedModel holds is replaced: files the user added
            # beside it (TF Serving's assets.extra/, notes) stay.
            move_into_place(saved_model, export_dir, replaces=SAVED_MODEL_ENTRIES)
    return export_dir


class ExportError(RuntimeError):
    """The export's TensorFlow subprocess failed; the message ends with its
    error output."""


def _write_in_tensorflow_process(model, saved_model, staging, search, dtype=None, quantize=None):
    from keras_transformer.models import TransformerSeq2SeqLM

    if isinstance(model, TransformerSeq2SeqLM):
        preset = os.path.join(staging, "preset")
        model.save_to_preset(preset)
    else:
        preset = model  # checked by `_check_exportable`
    command = [
        sys.executable, "-m", "keras_transformer.export", preset, saved_model, "--settings",
        json.dumps(dataclasses.asdict(search["settings"])),
    ]
    prefix = search["target_prefix"]
    if prefix is not None:
        command += ["--target-prefix", prefix if isinstance(prefix, str) else ",".join(str(int(t)) for t in prefix)]
    command += ["--jit-compile"] if search["jit_compile"] else []
    command += ["--ensemble"] if search["ensemble"] else []
    command += ["--dtype", dtype] if dtype else []
    command += ["--quantize", quantize] if quantize else []
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise _subprocess_error(result.stderr)


# The subprocess reports the errors of bad input (the preset, the settings,
# the file system) on one line after this marker, so that the caller raises
# them again as they are, not as a traceback in an ExportError.
_ERROR_MARKER = "keras_transformer.export error: "


def _subprocess_error(stderr):
    """The subprocess's reported error as the exception it was (a
    `PresetError`, `ValueError` or `OSError`), else an `ExportError` that
    ends with its error output."""
    from keras_transformer.presets import PresetError

    for line in reversed(stderr.splitlines()):
        if line.startswith(_ERROR_MARKER):
            error = json.loads(line[len(_ERROR_MARKER) :])
            if error["type"] in ("PresetError", "ValueError"):
                return (PresetError if error["type"] == "PresetError" else ValueError)(error["message"])
            raised = OSError(error["message"])
            raised.errno = error["errno"]
            return raised
    return ExportError(f"The export under TensorFlow failed:\n{stderr[-4000:]}")


def _write(model, path, settings, target_prefix=None, jit_compile=False, ensemble=False):
    if target_prefix is not None:
        settings = settings.replace(target_prefix=model.target_prefix_ids(target_prefix))
    translator = Translator(model, settings, jit_compile, ensemble)
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
    `ensemble`, the model and its `ensemble_members` decode together."""

    def __init__(self, model, settings, jit_compile=False, ensemble=False):
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
        text = [tf.TensorSpec([None], tf.string, name="text")]
        self.translate = tf.function(self._translate, input_signature=text, autograph=False).get_concrete_function()
        self.translate_ids = tf.function(
            self._translate_ids, input_signature=text, autograph=False
        ).get_concrete_function()

    def _translate(self, text):
        token_ids, lengths, _ = self._search(text)
        ragged = tf.RaggedTensor.from_tensor(token_ids, lengths=lengths)
        return {"translations": self.tokenizer.detokenize(ragged)}

    def _translate_ids(self, text):
        token_ids, lengths, scores = self._search(text)
        return {"token_ids": token_ids, "lengths": lengths, "scores": scores}

    def _search(self, text):
        model = self._held.model
        limit = model.backbone.max_sequence_length
        empty = tf.strings.regex_full_match(text, BLANK_PATTERN)  # what generate calls blank
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
        token_ids, lengths, scores = self._beam_search(encoder_ids, encoder_mask, budgets)
        lengths = tf.where(empty, 0, lengths)
        scores = tf.where(empty, 0.0, scores)
        token_ids = token_ids[:, : tf.reduce_max(tf.concat([lengths, [0]], axis=0))]
        token_ids = tf.where(tf.sequence_mask(lengths, tf.shape(token_ids)[1]), token_ids, self.pad_id)
        return token_ids, lengths, scores

    def _compiled_beam_search(self, encoder_ids, encoder_mask, budgets):
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
        search = search_loop_function(model, self.settings)

        def chunk(i, found_ids, found_lengths, found_scores):
            rows = filled[i * size : (i + 1) * size]
            length = tf.minimum(round_up(tf.reduce_max(tf.gather(source_lengths, rows)), 8), limit)
            ids, lengths, scores, _, _ = search(
                tf.gather(encoder_ids, rows)[:, :length], tf.gather(encoder_mask, rows)[:, :length],
                tf.gather(budgets, rows),
                tf.zeros([loop_cache_length(length, self.max_length_offset, limit, xp=tf)], tf.int32),
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

    def _beam_search(self, encoder_ids, encoder_mask, budgets):
        """`decoding.loop.search_loop` with the export's settings: the
        best finished hypothesis of each source."""
        if self.jit_compile:
            return self._compiled_beam_search(encoder_ids, encoder_mask, budgets)
        max_budget = tf.reduce_max(tf.concat([budgets, [1]], axis=0))  # 1 for an empty batch
        # The cache holds the start token's position and the longest output.
        token_ids, lengths, scores, _, _ = search_loop(
            self._held.model, encoder_ids, encoder_mask, budgets, max_budget + 1, self.settings
        )
        return token_ids[:, 0], lengths[:, 0], scores[:, 0]


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description="Export a preset to a SavedModel (runs under TensorFlow).")
    parser.add_argument("preset")
    parser.add_argument("export_dir")
    parser.add_argument("--settings", default="{}", help="a DecodingSettings as JSON")
    parser.add_argument("--target-prefix", help="text, or token ids separated by commas")
    parser.add_argument("--dtype")
    parser.add_argument("--quantize")
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--ensemble", action="store_true")
    args = parser.parse_args(argv)
    try:
        model = load_for_export(args.preset, args.dtype, args.quantize, args.ensemble)
        settings = DecodingSettings(**json.loads(args.settings))
        prefix = args.target_prefix
        if prefix is not None and re.fullmatch(r"\d+(,\d+)*", prefix):
            prefix = [int(token) for token in prefix.split(",")]
        _write(model, args.export_dir, settings, prefix, args.jit_compile, args.ensemble)
    except Exception as error:
        from keras_transformer.presets import PresetError
        from keras_transformer.utils.files import is_disk_full

        if is_disk_full(error):  # TensorFlow's own errors too
            report = {"type": "OSError", "errno": errno.ENOSPC, "message": f"No space left on device: {error}"}
        elif isinstance(error, (ValueError, OSError)):
            kind = "PresetError" if isinstance(error, PresetError) else "OSError" if isinstance(error, OSError) else "ValueError"
            report = {"type": kind, "errno": getattr(error, "errno", None), "message": str(error)}
        else:
            raise  # a bug: the traceback says where
        print(_ERROR_MARKER + json.dumps(report), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

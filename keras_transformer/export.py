"""Export to a TensorFlow SavedModel that translates strings.

The SavedModel holds the whole translation: SentencePiece tokenization
(tensorflow-text), the encoder, beam search with the key/value cache and the
length penalty of paper section 6.1 (beam size and alpha fixed at export, at
most source length + `max_length_offset` output tokens), and detokenization.
It loads with `tf.saved_model.load` or TensorFlow Serving, with TensorFlow
and tensorflow-text installed and neither Keras nor this package:

        import tensorflow_text  # registers the SentencePiece ops

    translator = tf.saved_model.load("exported/en-de")
    translator.signatures["serving_default"](tf.constant(["A dog runs."]))
    # {"translations": <tf.Tensor: [b"Ein Hund rennt."]>}

Signatures:

- `serving_default`: `text` (1-D strings) -> `translations` (1-D strings).
- `translate_ids`: `text` -> `token_ids` (int32 `(batch, length)`, padded
  with the padding id, no start or end token), `lengths` (int32
  `(batch,)`) and `scores` (float32 `(batch,)`, log P / lp).

An M2M100 or NLLB-200 model's signatures take `source_language` and
`target_language` too, 1-D strings, one for all texts or one each, `""` for
the model's default (`export_languages.py`): `signatures["serving_default"](text=...,
source_language=tf.constant(["en"]), target_language=tf.constant(["de"]))`.

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

from keras_transformer.decoding.settings import DecodingSettings
from keras_transformer.export_checks import check_export
from keras_transformer.export_checks import load_for_export
from keras_transformer.export_translator import write_saved_model
from keras_transformer.presets import ensembles
from keras_transformer.utils.files import move_into_place
from keras_transformer.utils.files import reporting_full_disk
from keras_transformer.utils.files import staging_directory
from keras_transformer.utils.locks import locked

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
                write_saved_model(model, saved_model, **search)
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
        write_saved_model(model, args.export_dir, settings, prefix, args.jit_compile, args.ensemble)
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

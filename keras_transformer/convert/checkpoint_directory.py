"""Writing a model of this package out as a transformers checkpoint
directory: what `export_marian` and `export_m2m100` share.

The directory holds what transformers' `save_pretrained` of a model and its
tokenizer write (`config.json`, `generation_config.json`,
`model.safetensors`, the tokenizer's files), written aside and moved into
place under the directory's lock, so that a failed write leaves the
directory as it was; an earlier export there is replaced only when asked
(`overwrite`), and a directory holding anything else never is.
"""

import json
import os

from keras_transformer.convert import marian
from keras_transformer.presets import PresetError
from keras_transformer.presets import ensembles
from keras_transformer.utils.files import move_into_place
from keras_transformer.utils.files import reporting_full_disk
from keras_transformer.utils.files import staging_directory
from keras_transformer.utils.locks import locked

# The model types that an export writes: a directory holding one of them
# is an earlier export, which `overwrite` replaces.
EXPORTED_MODEL_TYPES = ("marian", "m2m_100")
# What an earlier write of a transformers checkpoint may have left that
# loaders would read instead of (or beside) the new files: weights of every
# framework, whole or sharded, and the tokenizer files of every family.
EARLIER_FILES = (
    "model.safetensors", "model-*.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json",
    "tf_model.h5", "flax_model.msgpack", "rust_model.ot",
    "source.spm", "target.spm", "vocab.json", "sentencepiece.bpe.model", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "generation_config.json",
)


def load_task(model, what):
    """`model` as a `TransformerSeq2SeqLM` with a preprocessor: a task as
    it is, or a preset's name, directory or handle loaded; `what` names
    the export in the error."""
    from keras_transformer.models import TransformerSeq2SeqLM

    if not isinstance(model, TransformerSeq2SeqLM):
        model = TransformerSeq2SeqLM.from_preset(model)
    if model.preprocessor is None:
        raise PresetError(f"{what} needs a model with a preprocessor (its tokenizer).")
    return model


def refuse_quantized(backbone, what):
    """Refuses a backbone that `quantize` made int8: an export writes float
    weights (`what` names it)."""
    quantized = [
        layer.name for layer in backbone._flatten_layers()
        if getattr(getattr(layer, "dtype_policy", None), "quantization_mode", None)
    ]
    if quantized:
        raise PresetError(
            f"{what} writes float weights, and this model computes with quantized ones (`quantize`, "
            f"layer {quantized[0]!r}): export the float model, before `quantize` (CTranslate2 quantizes "
            "it itself: `ct2-transformers-converter --quantization int8`)."
        )


def generation_config(decoder_start, end, pad, never_output, max_length, **more):
    """transformers' `generation_config.json` fields of an export: its
    special ids, beam 4 as the paper, and the tokens that this package
    never outputs kept out (`bad_words_ids`); `more` adds fields, or
    takes one out with None."""
    config = {
        "decoder_start_token_id": decoder_start,
        "eos_token_id": end,
        "forced_eos_token_id": end,
        "pad_token_id": pad,
        "bad_words_ids": [[token] for token in never_output],
        "num_beams": 4,
        "max_length": max_length,
        **more,
    }
    return {key: value for key, value in config.items() if value is not None}


def write_checkpoint(model, output_dir, overwrite, tensors, json_files, other_files, what, command):
    """Writes a transformers checkpoint directory.

    Args:
        model: the model written (an ensemble's first model: a warning
            says so).
        output_dir: the directory; it must be empty or absent unless
            `overwrite`, and then hold an earlier export (a `config.json`
            of a model type in `EXPORTED_MODEL_TYPES`).
        overwrite: replace an earlier export's files (`EARLIER_FILES` and
            those written); other files there stay.
        tensors: `model.safetensors`' arrays by name (float32 NumPy), or
            a function that makes them (called once the directory is
            checked).
        json_files: file name -> a JSON object.
        other_files: file name -> bytes.
        what: the kind of model written ("Marian", "m2m_100"), for messages.
        command: the name of the lock's holder ("export-marian").

    Returns:
        `output_dir`, absolute.
    """
    output_dir = os.path.abspath(os.path.expanduser(os.fspath(output_dir)))
    if os.path.isfile(output_dir):
        raise FileExistsError(f"{output_dir!r} is a file; give a directory.")
    # One writer at a time (utils/locks.py): a second export into the
    # directory fails at once, before it checks or writes anything.
    with locked(output_dir, command):
        if os.path.isdir(output_dir) and os.listdir(output_dir):
            if not overwrite:
                raise FileExistsError(f"{output_dir!r} is not empty. Choose another directory, or pass overwrite=True.")
            # Replacing only an earlier export keeps a mistyped path (a preset,
            # a project's own config.json) from being overwritten.
            model_type = (marian.read_config(output_dir) or {}).get("model_type")
            if model_type not in EXPORTED_MODEL_TYPES:
                raise FileExistsError(
                    f"{output_dir!r} is not empty and holds no {what} model (a {marian.CONFIG_FILE} of model_type "
                    f"{' or '.join(map(repr, EXPORTED_MODEL_TYPES))}): overwrite replaces an earlier export only. "
                    "Choose another directory."
                )
        # A checkpoint holds one model (after the checks that may refuse the export).
        ensembles.warn_first_model_only(model, f"The {what} directory")
        try:
            from safetensors.numpy import save_file
        except ImportError as error:
            raise ImportError("Writing model.safetensors needs safetensors: pip install safetensors.") from error
        with reporting_full_disk(f"writing the {what} model to", output_dir), staging_directory(output_dir) as staging:
            save_file(tensors() if callable(tensors) else tensors, os.path.join(staging, marian.SAFETENSORS_FILE), metadata={"format": "pt"})
            for name, content in json_files.items():
                with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                    json.dump(content, f, indent=2, ensure_ascii=False)
            for name, data in other_files.items():
                with open(os.path.join(staging, name), "wb") as f:
                    f.write(data)
            move_into_place(staging, output_dir, replaces=EARLIER_FILES)
    return output_dir


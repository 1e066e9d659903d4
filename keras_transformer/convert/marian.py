"""Marian (opus-mt) checkpoints in and out.

Helsinki-NLP's opus-mt models are this paper's architecture: post-norm
encoder and decoder layers, one embedding matrix shared by source, target and
the output projection, scaled by sqrt(d_model), sinusoidal positions. What
differs is handled here, checked against transformers' `modeling_marian.py`:

- the feed-forward activation (swish/SiLU): a backbone argument;
- `final_logits_bias`: the backbone's `output_bias`;
- special ids: `</s>` 0, `<unk>` 1, padding the last id and the first
  decoder input, sources without a start token: `MarianTokenizer`;
- positions: Marian puts the sines in the first half of d_model and the
  cosines in the second, this package interleaves them (section 3.5). The
  residual stream is permuted instead (`marian_weights.py`): every weight's
  d_model axis is reordered on the way in (and back on the way out).
  LayerNorm and attention do not depend on the order of that axis, so the
  logits are the same.

`load_task` reads what `MarianMTModel.save_pretrained` and
`MarianTokenizer.save_pretrained` write, from a directory or an `hf://`
handle; `from_preset` of every class of this package reads it the same
way (this module registers its loader with
`keras_transformer.presets.formats`). `export_marian` writes any model of
this package in that form, for transformers and for CTranslate2's
`ct2-transformers-converter`.
"""

import contextlib
import importlib.util
import json
import os

from keras_transformer.convert.checkpoint_tensors import CheckpointTensors
from keras_transformer.convert.marian_weights import assign_checkpoint_weights
from keras_transformer.convert.marian_weights import marian_to_backbone_weights
from keras_transformer.convert.marian_weights import refuse_reshaped
from keras_transformer.layers.initializers import initial_values_skipped
from keras_transformer.presets import PresetError
from keras_transformer.presets import formats
from keras_transformer.presets import hub
from keras_transformer.utils.locks import locked

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON = "source.spm", "target.spm", "vocab.json"
# transformers' activation names -> Keras'.
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
OFFLINE_HELP = (
    "Without network access, download the model once on a machine that has it "
    "(`huggingface-cli download {repo} --local-dir DIR`, or `save_pretrained` of "
    "the transformers model and tokenizer), copy DIR here and pass the directory: "
    "`from_preset(DIR)`, `keras-transformer translate --preset DIR`."
)


# === Reading a Marian directory or hub handle ===


def fetch_file(preset, name, required=True):
    """The local path of file `name` of a transformers checkpoint (a
    directory, or an `hf://` handle: downloaded), or None when an optional
    file is absent."""
    preset = os.fspath(preset)
    if "://" not in preset:
        path = os.path.join(preset, name)
        if os.path.isfile(path):
            return path
        if required:
            raise PresetError(f"The model directory {preset!r} has no {name}.")
        return None
    # keras-hub has no public call that fetches one file of a handle; its
    # `get_file` downloads it into the hub's cache like the other files.
    from keras_transformer.utils.keras_hub_internals import get_file

    hub.prepare(preset)  # without a network, fail within seconds
    try:
        return get_file(preset, name)
    except Exception as error:  # the hub client's errors have no common base
        missing = _is_missing_file(error)
        if missing and not required:
            return None
        repo = preset.split("://", 1)[1]
        if missing:
            reason = f"the hub has no {name} for {repo!r} (is the handle right?)"
        else:
            reason = f"the Hugging Face hub could not be reached or refused it ({hub.unreachable(preset) or _root_cause(error)})"
        raise PresetError(f"Could not fetch {name} of {preset!r}: {reason}. " + OFFLINE_HELP.format(repo=repo)) from error


def _causes(error):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_missing_file(error):
    """Whether the hub answered that the file does not exist, as opposed to
    not being reached: huggingface_hub raises `LocalEntryNotFoundError`
    (offline, file not cached) and `RemoteEntryNotFoundError` (the hub
    says 404), both `EntryNotFoundError`s, and keras-hub turns either into
    a `FileNotFoundError`."""
    for cause in _causes(error):
        names = {cls.__name__ for cls in type(cause).__mro__}
        if "LocalEntryNotFoundError" in names:
            return False
        if "EntryNotFoundError" in names:
            return True
    return False


def _root_cause(error):
    root = list(_causes(error))[-1]
    return f"{type(root).__name__}: {root}"


def read_config(preset):
    """The Hugging Face `config.json` of a preset, or None if it has none
    or it is not one (a preset of this package has a keras-hub config)."""
    preset = os.fspath(preset)
    if "://" not in preset and not os.path.isfile(os.path.join(preset, CONFIG_FILE)):
        return None
    if "://" in preset and not preset.startswith("hf://"):
        return None
    path = fetch_file(preset, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def is_marian(preset):
    """Whether `preset` (a directory or `hf://` handle) holds a Marian
    checkpoint as transformers saves it (`config.json` with
    `model_type: marian`)."""
    if not isinstance(preset, (str, os.PathLike)):
        return False
    config = read_config(preset)
    return bool(config) and config.get("model_type") == "marian"


def backbone_config(config):
    """`TransformerBackbone` arguments for a Marian `config.json`; a clear
    error for what the backbone cannot hold."""

    def get(name, default=None):
        return config.get(name, default)

    refuse = []
    if get("encoder_layers") != get("decoder_layers"):
        refuse.append(f"unequal encoder and decoder depth ({get('encoder_layers')} and {get('decoder_layers')} layers)")
    if get("encoder_ffn_dim") != get("decoder_ffn_dim"):
        refuse.append("unequal encoder and decoder feed-forward widths")
    if get("encoder_attention_heads") != get("decoder_attention_heads"):
        refuse.append("unequal encoder and decoder head counts")
    if not get("share_encoder_decoder_embeddings", True) or get("decoder_vocab_size") not in (None, get("vocab_size")):
        refuse.append("separate source and target vocabularies")
    if not get("tie_word_embeddings", True):
        refuse.append("an output projection not tied to the embeddings")
    if get("normalize_before", False) or get("add_final_layer_norm", False):
        refuse.append("pre-norm layers")
    activation = ACTIVATIONS.get(get("activation_function", "gelu"))
    if activation is None:
        refuse.append(f"the activation {get('activation_function')!r}")
    if get("d_model", 0) % 2:
        refuse.append("an odd d_model")
    if refuse:
        raise PresetError(
            "This Marian model cannot be loaded: it has " + "; ".join(refuse) + ". The Transformer of "
            "this package has one shared vocabulary, equal encoder and decoder stacks and post-norm layers."
        )
    return {
        "vocabulary_size": get("vocab_size"),
        "num_layers": get("encoder_layers"),
        "d_model": get("d_model"),
        "d_ff": get("encoder_ffn_dim"),
        "num_heads": get("encoder_attention_heads"),
        "dropout": get("dropout", 0.1),
        "attention_dropout": get("attention_dropout", 0.0),
        "max_sequence_length": get("max_position_embeddings", 512),
        "activation": activation,
        "scale_embeddings": bool(get("scale_embedding", False)),
        "output_bias": True,
    }


def read_state_dict(preset, family="Marian"):
    """The checkpoint's tensors (`checkpoint_tensors.CheckpointTensors`:
    by name, `model.` prefixes dropped, each read as a float32 NumPy array
    when asked for; `family` names the checkpoint's kind in errors)."""
    path = fetch_file(preset, SAFETENSORS_FILE, required=False)
    if path is not None:
        if importlib.util.find_spec("safetensors") is None:
            raise ImportError(
                "Reading model.safetensors needs the safetensors package: pip install safetensors "
                "(or pip install 'keras-aiayn[hub]')."
            )
        return CheckpointTensors(path)
    path = fetch_file(preset, PYTORCH_FILE, required=False)
    if path is None:
        raise PresetError(f"The {family} model {os.fspath(preset)!r} has neither {SAFETENSORS_FILE} nor {PYTORCH_FILE}.")
    if importlib.util.find_spec("torch") is None:
        raise ImportError(f"Reading {PYTORCH_FILE} needs PyTorch; or convert it to {SAFETENSORS_FILE}.")
    return CheckpointTensors(path)


def check_tokenizer_files(preset):
    """Refuses the opus models this package cannot tokenize."""
    tokenizer_config = fetch_file(preset, TOKENIZER_CONFIG_FILE, required=False)
    if tokenizer_config is not None:
        with open(tokenizer_config, encoding="utf-8") as f:
            if json.load(f).get("separate_vocabs"):
                raise PresetError(
                    "This Marian model has separate source and target vocabularies "
                    "(separate_vocabs); this package's Transformer shares one vocabulary."
                )
    for name in (SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON):
        try:
            fetch_file(preset, name)
        except PresetError as error:
            if "Could not fetch" in str(error) and not _is_missing_file(error.__cause__):
                raise
            raise PresetError(
                f"The Marian model {os.fspath(preset)!r} has no {name}. Only opus-mt models with "
                "SentencePiece vocabularies (source.spm, target.spm, vocab.json) load; the BPE-based "
                "ones do not."
            ) from error


# === Building this package's objects ===


def load_tokenizer(preset, **kwargs):
    """A `MarianTokenizer` from a Marian directory or handle; `kwargs` go
    to its constructor."""
    from keras_transformer.models.transformer.marian_tokenizer import MarianTokenizer

    check_tokenizer_files(preset)
    files = [fetch_file(preset, name) for name in (SOURCE_SPM, TARGET_SPM, VOCABULARY_JSON)]
    try:
        tokenizer = MarianTokenizer(*files, **kwargs)
        source_start = _source_start_token(read_config(preset) or {}, tokenizer)
        if source_start is not None and "source_start_token" not in kwargs:
            tokenizer = MarianTokenizer(*files, source_start_token=source_start, **kwargs)
        return tokenizer
    except (ValueError, RuntimeError, OSError) as error:
        raise PresetError(f"The tokenizer files of {os.fspath(preset)!r} cannot be read: {error}") from error


def _source_start_token(config, tokenizer):
    """The piece put before sources: `bos_token_id` when it is neither
    `</s>` nor padding (opus-mt configs give `</s>`; models written out by
    `export_marian` give their `<s>`)."""
    bos = config.get("bos_token_id")
    if not isinstance(bos, int) or bos in (tokenizer.end_token_id, tokenizer.pad_token_id):
        return None
    if not 0 <= bos < tokenizer.vocabulary_size():
        return None
    return tokenizer.id_to_token(bos)


# The backbone arguments that set the weights' shapes.
WEIGHT_SHAPE_ARGUMENTS = (
    "vocabulary_size", "num_layers", "d_model", "d_ff", "num_heads", "key_dim", "value_dim", "output_bias",
    "position_encoding", "normalize_first",
)


# What a Marian model has where the backbone's config above names nothing.
_BACKBONE_DEFAULTS = {"key_dim": None, "value_dim": None, "position_encoding": "sinusoidal", "normalize_first": False}


def load_backbone(preset, load_weights=True, dtype=None, config=None, **overrides):
    """A `TransformerBackbone` holding a Marian checkpoint; `overrides`
    replace the arguments read from its config.json (`dropout=0.3`), as
    `from_preset`'s keywords do for a preset of this package."""
    from keras_transformer.models.transformer.backbone import TransformerBackbone

    config = config or read_config(preset)
    arguments = backbone_config(config)
    reshaped = {
        name: value for name, value in overrides.items()
        if name in WEIGHT_SHAPE_ARGUMENTS and value != arguments.get(name, _BACKBONE_DEFAULTS.get(name))
    }
    if load_weights and reshaped:
        # Checked here: a smaller model would take a part of the weights
        # without a word.
        refuse_reshaped("The Marian checkpoint", reshaped, {
            name: arguments.get(name, _BACKBONE_DEFAULTS.get(name)) for name in reshaped})
    # (Built to take the checkpoint's weights: no random values drawn first.)
    with initial_values_skipped() if load_weights else contextlib.nullcontext():
        backbone = TransformerBackbone(**{**arguments, **overrides}, dtype=dtype)
    if load_weights:
        weights = marian_to_backbone_weights(read_state_dict(preset), backbone, config.get("decoder_start_token_id"))
        assign_checkpoint_weights("The Marian checkpoint", backbone, weights)
    return backbone



def load_preprocessor(preset, tokenizer=None, config=None, **kwargs):
    """A `TransformerSeq2SeqLMPreprocessor` of a Marian directory or handle;
    `kwargs` go to its constructor (`encoder_sequence_length=128`)."""
    from keras_transformer.models.transformer.seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor

    config = config or read_config(preset)
    tokenizer = tokenizer or load_tokenizer(preset)
    _check_special_ids(config, tokenizer)
    length = min(config.get("max_position_embeddings", 512), 256)
    kwargs = {"encoder_sequence_length": length, "decoder_sequence_length": length, **kwargs}
    return TransformerSeq2SeqLMPreprocessor(tokenizer, **kwargs)


def _check_special_ids(config, tokenizer):
    """The config's ids must be the vocabulary's, as transformers uses them."""
    expected = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.end_token_id,
        "decoder_start_token_id": tokenizer.pad_token_id,
    }
    wrong = {key: (config[key], value) for key, value in expected.items() if config.get(key, value) != value}
    if wrong:
        raise PresetError(
            f"The Marian config.json's special ids do not match vocab.json: {wrong} (config, vocab.json). "
            "Decoding would start or stop at the wrong token."
        )
    if config.get("vocab_size") != tokenizer.vocabulary_size():
        raise PresetError(
            f"The Marian config.json has vocab_size={config.get('vocab_size')} but vocab.json has "
            f"{tokenizer.vocabulary_size()} ids: the vocabulary does not belong to this model."
        )


def load_task(preset, load_weights=True, dtype=None, backbone=None, preprocessor=None, **kwargs):
    """A `TransformerSeq2SeqLM` (backbone, preprocessor and tokenizer) from
    a Marian directory or handle, compiled with the paper's recipe unless
    `compile=False`. A `backbone` or `preprocessor` given is used instead
    of the checkpoint's; `kwargs` go to the task's constructor."""
    from keras_transformer.models.transformer.seq2seq_lm import TransformerSeq2SeqLM

    config = read_config(preset)
    if preprocessor is None:
        preprocessor = load_preprocessor(preset, config=config)
    if backbone is None:
        backbone = load_backbone(preset, load_weights=load_weights, dtype=dtype, config=config)
    return TransformerSeq2SeqLM(backbone, preprocessor, **kwargs)


def from_preset(cls, preset, load_weights=True, load_task_weights=True, **kwargs):
    """What `cls.from_preset(preset, **kwargs)` returns for a Marian
    preset, by the keras-hub role of `cls` (backbone, tokenizer,
    preprocessor or task). The keywords do what they do for a preset of
    this package: a backbone's replace its config's (`dropout=0.3`), the
    others go to the constructor. (A Marian checkpoint has no task
    weights: `load_task_weights` changes nothing.)"""
    import keras_hub

    if issubclass(cls, keras_hub.models.Task):
        return load_task(preset, load_weights=load_weights, **kwargs)
    if issubclass(cls, keras_hub.models.Backbone):
        return load_backbone(preset, load_weights=load_weights, **kwargs)
    if issubclass(cls, keras_hub.models.Preprocessor):
        return load_preprocessor(preset, **kwargs)
    return load_tokenizer(preset, **kwargs)


# `from_preset` of every class of this package reads Marian checkpoints.
formats.register_format("marian", is_marian, from_preset)


def convert(source, preset_dir, overwrite=False):
    """Converts a Marian checkpoint (directory or `hf://` handle) into a
    preset of this package at `preset_dir` (`keras-transformer convert`).

    Args:
        source: the Marian checkpoint's directory or `hf://` handle.
        preset_dir: the preset directory to write: new or empty, unless
            `overwrite`.
        overwrite: replace an earlier preset in `preset_dir` (as
            `save_to_preset` does: files that are not a preset's stay).

    Returns:
        The converted `TransformerSeq2SeqLM`.

    Raises:
        FileExistsError: `preset_dir` is a file, or is not empty and
            `overwrite` is False (checked before the checkpoint is read).
        DirectoryInUseError: another process writes `preset_dir` (an
            `OSError`; `keras_transformer.utils.locks`).
        PresetError: `source` is not a Marian checkpoint.

    Example:

    ```python
    from keras_transformer.convert import convert_marian
    convert_marian("hf://Helsinki-NLP/opus-mt-en-de", "opus-mt-en-de")
    ```
    """
    check_output_dir(preset_dir, overwrite)
    if not is_marian(source):
        path = os.fspath(source)
        if "://" not in path and not os.path.exists(path):
            raise PresetError(f"{path!r} does not exist: give a Marian checkpoint's directory or an hf:// handle.")
        if "://" not in path and os.path.isfile(os.path.join(path, "metadata.json")):
            raise PresetError(
                f"{path!r} is already a preset of keras_transformer, not a Marian checkpoint: load it "
                "as it is (`from_preset`, `--preset`)."
            )
        raise PresetError(
            f"{path!r} is not a Marian checkpoint: it needs a config.json with "
            "model_type 'marian', as transformers' MarianMTModel.save_pretrained writes."
        )
    model = load_task(source)
    # One writer at a time (utils/locks.py): the output checked again and
    # the preset saved under the directory's lock (which the save takes again).
    with locked(preset_dir, "convert"):
        check_output_dir(preset_dir, overwrite)
        model.save_to_preset(preset_dir, metadata={"converted_from": os.fspath(source), "source_format": "marian"})
    return model


def check_output_dir(preset_dir, overwrite):
    """As `export` and `export_marian` do: a non-empty directory is the
    user's, replaced only when they say so."""
    path = os.path.abspath(os.path.expanduser(os.fspath(preset_dir)))
    if os.path.isfile(path):
        raise FileExistsError(f"{path!r} is a file; give a directory for the preset.")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise FileExistsError(
            f"{path!r} is not empty. Choose another directory, or pass overwrite=True (--overwrite) "
            "to replace the preset there."
        )

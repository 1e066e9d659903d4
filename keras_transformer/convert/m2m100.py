"""fairseq's multilingual checkpoints (M2M100, NLLB-200 dense) in.

transformers saves both as `model_type: m2m_100`. They are this paper's
architecture with known differences, each a backbone option, checked
against transformers' `modeling_m2m_100.py`:

- pre-norm layers with a final LayerNorm after each stack:
  `normalize_first=True`;
- fairseq's sinusoids (sines then cosines, frequencies
  10000^(-i / (d_model/2 - 1))), positions counted from padding id + 1:
  `position_encoding="fairseq_sinusoidal"`, `position_offset`;
- embeddings scaled by sqrt(d_model) (`scale_embedding`), ReLU, one
  embedding matrix for source, target and output, no logits bias: the
  paper's own;
- one SentencePiece model, language codes as tokens, sources
  `[source code] text </s>`, decoding from `</s>` with the target code
  forced first: `M2M100Tokenizer` and `generate(target_language=...)`.

`from_preset` of every class of this package reads these checkpoints (this
module registers its loader with `keras_transformer.presets.formats`), and
refuses, with the reason, the checkpoints of other transformers model
types (NLLB-MoE among them).
"""

import contextlib
import os

import numpy as np

from keras_transformer.convert.checkpoint_tensors import RowBlocks
from keras_transformer.convert.checkpoint_tensors import tensors_equal
from keras_transformer.convert.m2m100_files import family_and_licence
from keras_transformer.convert.m2m100_files import load_tokenizer
from keras_transformer.convert.marian import WEIGHT_SHAPE_ARGUMENTS
from keras_transformer.convert.marian import check_output_dir
from keras_transformer.convert.marian import read_config
from keras_transformer.convert.marian import read_state_dict
from keras_transformer.convert.marian_weights import assign_checkpoint_weights
from keras_transformer.convert.marian_weights import layer_names
from keras_transformer.convert.marian_weights import refuse_reshaped
from keras_transformer.convert.marian_weights import to_ours
from keras_transformer.layers.initializers import initial_values_skipped
from keras_transformer.presets import PresetError
from keras_transformer.presets import formats
from keras_transformer.utils.locks import locked

MODEL_TYPE = "m2m_100"
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
# The model types `from_preset` reads: this module's and Marian's.
SUPPORTED = "marian (opus-mt) and m2m_100 (M2M100, NLLB-200 dense)"


def is_m2m100(preset):
    """Whether `preset` (a directory or `hf://` handle) holds a
    transformers checkpoint of `model_type: m2m_100`.

    Example:

    ```python
    is_m2m100("hf://facebook/nllb-200-distilled-600M")  # True
    ```
    """
    return _model_type(preset) == MODEL_TYPE


def _model_type(preset):
    if not isinstance(preset, (str, os.PathLike)):
        return None
    config = read_config(preset)
    return config.get("model_type") if config else None


def _is_other_transformers_model(preset):
    """A transformers checkpoint of a model type that no converter reads
    (Marian's module recognizes its own first)."""
    model_type = _model_type(preset)
    return model_type is not None and model_type not in (MODEL_TYPE, "marian")


def refuse_model_type(model_type):
    """The error for a transformers checkpoint of another model type."""
    if model_type in ("nllb-moe", "nllb_moe"):
        reason = "NLLB-MoE is a mixture of experts, which this package's Transformer does not hold; "
        reason += "the dense NLLB-200 checkpoints (facebook/nllb-200-distilled-600M, -1.3B, -3.3B) load"
    else:
        reason = "this package's Transformer holds only the encoder-decoders of the same architecture"
    return PresetError(
        f"Checkpoints of model_type {model_type!r} cannot be loaded: {reason}. Supported: {SUPPORTED}."
    )


def backbone_config(config):
    """`TransformerBackbone` arguments for an `m2m_100` `config.json`; a
    clear error for what the backbone cannot hold."""
    if config.get("model_type") != MODEL_TYPE:
        raise refuse_model_type(config.get("model_type"))

    def get(name, default=None):
        return config.get(name, default)

    refuse = []
    for part, what in (("layers", "depths"), ("ffn_dim", "feed-forward widths"), ("attention_heads", "head counts")):
        if get(f"encoder_{part}") != get(f"decoder_{part}"):
            refuse.append(f"unequal encoder and decoder {what}")
    if not get("tie_word_embeddings", True):
        refuse.append("an output projection not tied to the embeddings")
    activation = ACTIVATIONS.get(get("activation_function", "relu"))
    if activation is None:
        refuse.append(f"the activation {get('activation_function')!r}")
    if get("d_model", 0) % 2:
        refuse.append("an odd d_model (fairseq pads its sinusoids with zeros)")
    if get("decoder_start_token_id", get("eos_token_id")) != get("eos_token_id", 2):
        refuse.append("a decoder start token other than </s>")
    if refuse:
        raise PresetError(
            "This m2m_100 model cannot be loaded: it has " + "; ".join(refuse) + ". The Transformer of "
            "this package has equal encoder and decoder stacks and one tied embedding matrix."
        )
    return {
        "vocabulary_size": get("vocab_size"),
        "num_layers": get("encoder_layers"),
        "d_model": get("d_model"),
        "d_ff": get("encoder_ffn_dim"),
        "num_heads": get("encoder_attention_heads"),
        "dropout": get("dropout", 0.1),
        "attention_dropout": get("attention_dropout", 0.0),
        "max_sequence_length": get("max_position_embeddings", 1024),
        "activation": activation,
        "scale_embeddings": bool(get("scale_embedding", True)),
        "output_bias": False,
        "normalize_first": True,
        "position_encoding": "fairseq_sinusoidal",
        "position_offset": get("pad_token_id", 1) + 1,
    }


def backbone_weights(state, backbone):
    """{variable path: array} parts for `backbone` from an `m2m_100` state
    dict (or `CheckpointTensors`; `model.` prefixes dropped), a module at a
    time, as `assign_checkpoint_weights` takes them."""
    name = "shared.weight" if "shared.weight" in state else "encoder.embed_tokens.weight"
    if name not in state:
        raise PresetError("The m2m_100 checkpoint has no shared embedding (model.shared.weight).")
    for tied in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        if tied in state and tied != name and not tensors_equal(state, tied, name):
            raise PresetError(f"The m2m_100 checkpoint's {tied} differs from the shared embedding: not supported.")
    identity = np.arange(backbone.d_model)
    yield {"token_embedding/embeddings": RowBlocks(state, name)}
    for decoder in (False, True):
        for i in range(backbone.num_layers):
            for theirs, ours, kind in layer_names("", i, decoder):
                yield to_ours(state, theirs, ours, kind, identity, backbone.num_heads)
        side = "decoder" if decoder else "encoder"
        yield to_ours(state, f"{side}.layer_norm", f"{side}_norm", "norm", identity, backbone.num_heads)


def load_backbone(preset, load_weights=True, dtype=None, config=None, **overrides):
    """A `TransformerBackbone` holding an `m2m_100` checkpoint; `overrides`
    replace the arguments read from its config.json (`dropout=0.3`)."""
    from keras_transformer.models.transformer.backbone import TransformerBackbone

    arguments = backbone_config(config or read_config(preset))
    reshaped = {name: value for name, value in overrides.items()
                if name in (*WEIGHT_SHAPE_ARGUMENTS, "position_offset") and value != arguments.get(name)}
    if load_weights and reshaped:
        refuse_reshaped("The m2m_100 checkpoint", reshaped, {name: arguments.get(name) for name in reshaped})
    # (Built to take the checkpoint's weights: no random values drawn first.)
    with initial_values_skipped() if load_weights else contextlib.nullcontext():
        backbone = TransformerBackbone(**{**arguments, **overrides}, dtype=dtype)
    if load_weights:
        weights = backbone_weights(read_state_dict(preset, family="m2m_100"), backbone)
        assign_checkpoint_weights("The m2m_100 checkpoint", backbone, weights)
    return backbone


def load_preprocessor(preset, tokenizer=None, config=None, **kwargs):
    """A `TransformerSeq2SeqLMPreprocessor` of an `m2m_100` checkpoint;
    `kwargs` go to its constructor (`encoder_sequence_length=128`)."""
    from keras_transformer.models.transformer.seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor

    config = config or read_config(preset)
    tokenizer = tokenizer or load_tokenizer(preset)
    _check_special_ids(config, tokenizer)
    length = min(config.get("max_position_embeddings", 1024), 256)
    kwargs = {"encoder_sequence_length": length, "decoder_sequence_length": length, **kwargs}
    return TransformerSeq2SeqLMPreprocessor(tokenizer, **kwargs)


def _check_special_ids(config, tokenizer):
    expected = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.end_token_id}
    wrong = {key: (config[key], value) for key, value in expected.items() if config.get(key, value) != value}
    if wrong:
        raise PresetError(
            f"The m2m_100 config.json's special ids do not match the tokenizer's: {wrong} (config, tokenizer). "
            "Decoding would start or stop at the wrong token."
        )
    if config.get("vocab_size", 0) < tokenizer.vocabulary_size():
        raise PresetError(
            f"The m2m_100 config.json has vocab_size={config.get('vocab_size')} but the tokenizer has "
            f"{tokenizer.vocabulary_size()} ids: the vocabulary does not belong to this model."
        )


def load_task(preset, load_weights=True, dtype=None, backbone=None, preprocessor=None, **kwargs):
    """A `TransformerSeq2SeqLM` (backbone, preprocessor and tokenizer) from
    an `m2m_100` directory or handle; `kwargs` go to the task's constructor."""
    from keras_transformer.models.transformer.seq2seq_lm import TransformerSeq2SeqLM

    config = read_config(preset)
    backbone_config(config)  # (refused before the tokenizer files are fetched)
    if preprocessor is None:
        preprocessor = load_preprocessor(preset, config=config)
    if backbone is None:
        backbone = load_backbone(preset, load_weights=load_weights, dtype=dtype, config=config)
    return TransformerSeq2SeqLM(backbone, preprocessor, **kwargs)


def from_preset(cls, preset, load_weights=True, load_task_weights=True, **kwargs):
    """What `cls.from_preset(preset, **kwargs)` returns for an `m2m_100`
    checkpoint, by the keras-hub role of `cls`, as for Marian's."""
    import keras_hub

    config = read_config(preset)
    if config.get("model_type") != MODEL_TYPE:
        raise refuse_model_type(config.get("model_type"))
    if issubclass(cls, keras_hub.models.Task):
        return load_task(preset, load_weights=load_weights, **kwargs)
    if issubclass(cls, keras_hub.models.Backbone):
        return load_backbone(preset, load_weights=load_weights, config=config, **kwargs)
    if issubclass(cls, keras_hub.models.Preprocessor):
        return load_preprocessor(preset, config=config, **kwargs)
    return load_tokenizer(preset, **kwargs)


# `from_preset` of every class of this package reads m2m_100 checkpoints,
# and names the model type of other transformers checkpoints it cannot read.
formats.register_format("m2m_100", is_m2m100, from_preset)
formats.register_format("other transformers model types", _is_other_transformers_model, from_preset)


def convert(source, preset_dir, overwrite=False):
    """Converts an `m2m_100` checkpoint (M2M100, NLLB-200; a directory or
    `hf://` handle) into a preset of this package at `preset_dir`
    (`keras-transformer convert`). The preset's metadata carries the
    checkpoint's languages and licence (NLLB-200: CC-BY-NC-4.0).

    Args:
        source: the checkpoint's directory or `hf://` handle.
        preset_dir: the preset directory to write: new or empty, unless
            `overwrite`.
        overwrite: replace an earlier preset in `preset_dir`.

    Returns:
        The converted `TransformerSeq2SeqLM`.

    Example:

    ```python
    from keras_transformer.convert import convert_m2m100
    convert_m2m100("hf://facebook/nllb-200-distilled-600M", "nllb-200-600M")
    ```
    """
    check_output_dir(preset_dir, overwrite)
    model_type = _model_type(source)
    if model_type != MODEL_TYPE:
        raise refuse_model_type(model_type)
    model = load_task(source)
    tokenizer = model.preprocessor.tokenizer
    family, licence = family_and_licence(source, tokenizer)
    # One writer at a time (utils/locks.py), as `convert_marian`.
    with locked(preset_dir, "convert"):
        check_output_dir(preset_dir, overwrite)
        model.save_to_preset(preset_dir, metadata={
            "converted_from": os.fspath(source), "source_format": MODEL_TYPE, "family": family, "license": licence,
            "language_codes": list(tokenizer.language_codes),
        })
    return model

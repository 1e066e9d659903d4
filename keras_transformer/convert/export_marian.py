"""Any model of this package as a Hugging Face Marian directory.

The directory holds what `MarianMTModel.save_pretrained` and
`MarianTokenizer.save_pretrained` write (`config.json`,
`generation_config.json`, `model.safetensors`, `source.spm`, `target.spm`,
`vocab.json`, `tokenizer_config.json`), so that transformers loads it and
CTranslate2's `ct2-transformers-converter` converts it.

Models trained by this package frame sources as `<s> ... </s>`, while
transformers' `MarianTokenizer` adds only `</s>`: give such a model
`[bos_token_id] + tokenizer(text).input_ids` (the config records
`bos_token_id`), as `docs/pretrained.md` shows. Imported Marian models have no
source start token and need nothing.
"""

import json
import os
import shutil
import tempfile

from keras_transformer.convert import marian
from keras_transformer.presets import PresetError

# Keras activation names -> transformers'.
ACTIVATIONS = {"relu": "relu", "silu": "swish", "gelu": "gelu"}


def export_marian(model, output_dir, overwrite=False):
    """Writes `model` as a transformers Marian directory.

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor, or the name,
            directory or handle of a preset.
        output_dir: the directory to write; it must be empty or absent
            unless `overwrite`.
        overwrite: replace the files of an earlier export in `output_dir`
            (other files there stay).

    Returns:
        `output_dir`.

    Raises:
        PresetError: a model that Marian cannot hold (pre-norm layers,
            learned positions, d_k != d_model / h, a WordPiece vocabulary,
            an activation other than ReLU, SiLU or GELU).
        FileExistsError: `output_dir` is not empty and `overwrite` is False.

    Example:

    ```python
    from keras_transformer.convert import export_marian
    export_marian("transformer_multi30k_en_de", "marian-en-de")
    # transformers.MarianMTModel.from_pretrained("marian-en-de")
    # ct2-transformers-converter --model marian-en-de --output_dir ct2-en-de
    ```
    """
    model = _load(model)
    backbone, tokenizer = model.backbone, model.preprocessor.tokenizer
    config = marian_config(model)
    assets = _tokenizer_files(tokenizer)
    output_dir = os.path.abspath(os.fspath(output_dir))
    if os.path.isfile(output_dir):
        raise FileExistsError(f"{output_dir!r} is a file; give a directory.")
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir!r} is not empty. Choose another directory, or pass overwrite=True.")
    try:
        from safetensors.numpy import save_file
    except ImportError as error:
        raise ImportError("Writing model.safetensors needs safetensors: pip install safetensors.") from error
    os.makedirs(os.path.dirname(output_dir), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.writing-", dir=os.path.dirname(output_dir))
    try:
        save_file(marian.backbone_to_marian_weights(backbone), os.path.join(staging, marian.SAFETENSORS_FILE),
                  metadata={"format": "pt"})
        files = {
            marian.CONFIG_FILE: config,
            marian.GENERATION_CONFIG_FILE: _generation_config(model, config),
            marian.TOKENIZER_CONFIG_FILE: {
                "tokenizer_class": "MarianTokenizer",
                "model_max_length": backbone.max_sequence_length,
                "separate_vocabs": False,
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
            },
            "special_tokens_map.json": {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
        }
        for name, content in files.items():
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2, ensure_ascii=False)
        for name, data in assets.items():
            with open(os.path.join(staging, name), "wb") as f:
                f.write(data)
        os.makedirs(output_dir, exist_ok=True)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir


def _load(model):
    from keras_transformer.models import TransformerSeq2SeqLM

    if not isinstance(model, TransformerSeq2SeqLM):
        model = TransformerSeq2SeqLM.from_preset(model)
    if model.preprocessor is None:
        raise PresetError("export_marian needs a model with a preprocessor (its tokenizer).")
    return model


def marian_config(model):
    """The transformers `MarianConfig` fields of `model` (a dict)."""
    backbone, special = model.backbone, model.special_token_ids
    refuse = []
    if backbone.normalize_first:
        refuse.append("pre-norm layers")
    if backbone.position_encoding != "sinusoidal":
        refuse.append("learned positions")
    d_k = backbone.d_model // backbone.num_heads
    if backbone.d_model % backbone.num_heads or backbone.key_dim not in (None, d_k) or backbone.value_dim not in (None, d_k):
        refuse.append("d_k or d_v other than d_model / h")
    activation = ACTIVATIONS.get(backbone.activation)
    if activation is None:
        refuse.append(f"the activation {backbone.activation!r}")
    if refuse:
        raise PresetError("Marian cannot hold this model: it has " + ", ".join(refuse) + ".")
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": backbone.vocabulary_size,
        "decoder_vocab_size": backbone.vocabulary_size,
        "d_model": backbone.d_model,
        "encoder_layers": backbone.num_layers,
        "decoder_layers": backbone.num_layers,
        "encoder_attention_heads": backbone.num_heads,
        "decoder_attention_heads": backbone.num_heads,
        "encoder_ffn_dim": backbone.d_ff,
        "decoder_ffn_dim": backbone.d_ff,
        "activation_function": activation,
        "dropout": backbone.dropout,
        "attention_dropout": backbone.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": backbone.max_sequence_length,
        "scale_embedding": bool(backbone.scale_embeddings),
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "pad_token_id": special.pad,
        "eos_token_id": special.end,
        "forced_eos_token_id": special.end,
        "decoder_start_token_id": special.start,
        "bos_token_id": special.source_start,
    }


def _generation_config(model, config):
    special = model.special_token_ids
    return {
        "decoder_start_token_id": special.start,
        "eos_token_id": special.end,
        "forced_eos_token_id": special.end,
        "pad_token_id": special.pad,
        # As this package, never output padding or the start token.
        "bad_words_ids": [[token] for token in special.never_output],
        "num_beams": 4,
        "max_length": config["max_position_embeddings"],
    }


def _tokenizer_files(tokenizer):
    """source.spm, target.spm and vocab.json (bytes) of a tokenizer."""
    from keras_transformer.models.transformer.marian_tokenizer import MarianTokenizer
    from keras_transformer.models.transformer.tokenizer import TransformerTokenizer

    if isinstance(tokenizer, MarianTokenizer):
        vocabulary = tokenizer.vocabulary
        source, target = tokenizer.source_spm, tokenizer.target_spm
    elif isinstance(tokenizer, TransformerTokenizer):
        import sentencepiece

        proto = tokenizer.proto
        processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        vocabulary = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
        source = target = proto
    else:
        raise PresetError(
            f"Marian tokenizes with SentencePiece; this model's tokenizer is a {type(tokenizer).__name__}."
        )
    return {
        marian.SOURCE_SPM: source,
        marian.TARGET_SPM: target,
        marian.VOCABULARY_JSON: json.dumps(vocabulary, ensure_ascii=False, indent=0).encode("utf-8"),
    }

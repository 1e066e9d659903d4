"""Any model of this package as a Hugging Face Marian directory.

The directory holds what `MarianMTModel.save_pretrained` and
`MarianTokenizer.save_pretrained` write (`config.json`,
`generation_config.json`, `model.safetensors`, `source.spm`, `target.spm`,
`vocab.json`, `tokenizer_config.json`), so that transformers loads it and
CTranslate2's `ct2-transformers-converter` converts it.

The directory is laid out as Marian's own are, which is what engines that
read Marian directories assume (CTranslate2's converter among them):

- `<pad>` is the last id, and the ids of the other pieces keep their order;
- decoding starts from `<pad>`, whose embedding is zero (CTranslate2 starts
  from a zero vector and drops the `<pad>` row). The first decoder input of
  this package's models is the embedding of their start token: that vector,
  scaled as embeddings are, is added to the first row of the decoder's
  position table (`model.decoder.embed_positions.weight`, which transformers
  loads from the checkpoint). The decoder reads the same numbers.
  transformers' `save_pretrained` does not save position tables: a model
  re-saved by transformers loses this row; write it out again from here;
- tokens that this package never outputs (its start token `<s>`) get a
  final logits bias of -10000, so that no engine outputs them.

Models trained by this package frame sources as `<s> ... </s>`, while
transformers' `MarianTokenizer` adds only `</s>`: give such a model
`[bos_token_id] + tokenizer(text).input_ids` (the config records
`bos_token_id`), as `docs/pretrained.md` shows. Imported Marian models have no
source start token and need nothing.
"""

import json

import numpy as np

from keras_transformer.convert import marian
from keras_transformer.convert import marian_weights
from keras_transformer.convert.checkpoint_directory import generation_config
from keras_transformer.convert.checkpoint_directory import load_task
from keras_transformer.convert.checkpoint_directory import refuse_quantized
from keras_transformer.convert.checkpoint_directory import write_checkpoint
from keras_transformer.presets import PresetError

# Keras activation names -> transformers'.
ACTIVATIONS = {"relu": "relu", "silu": "swish", "gelu": "gelu"}
# The final logits bias of tokens that are never output (float16-safe).
NEVER_OUTPUT_BIAS = -1e4
# transformers' MarianLayerNorm epsilon (nn.LayerNorm's default), fixed.
MARIAN_LAYER_NORM_EPSILON = 1e-5


def export_marian(model, output_dir, overwrite=False):
    """Writes `model` as a transformers Marian directory.

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor, or the name,
            directory or handle of a preset.
        output_dir: the directory to write; it must be empty or absent
            unless `overwrite`.
        overwrite: replace the files of an earlier export in `output_dir`
            (other files there stay); a directory that holds no exported
            model is never written into.

    Returns:
        `output_dir`.

    Raises:
        PresetError: a model that Marian cannot hold (pre-norm layers,
            learned positions, d_k != d_model / h, a WordPiece vocabulary,
            an activation other than ReLU, SiLU or GELU).
        FileExistsError: `output_dir` is not empty and `overwrite` is False,
            or it holds files but no exported model.
        DirectoryInUseError: another process writes `output_dir` (an
            `OSError`; `keras_transformer.utils.locks`).

    Example:

    ```python
    from keras_transformer.convert import export_marian
    export_marian("transformer_multi30k_en_de", "marian-en-de")
    # transformers.MarianMTModel.from_pretrained("marian-en-de")
    # ct2-transformers-converter --model marian-en-de --output_dir ct2-en-de
    ```
    """
    model = load_task(model, "export_marian")
    backbone, tokenizer = model.backbone, model.preprocessor.tokenizer
    layout = MarianLayout(model.special_token_ids, backbone.vocabulary_size)
    config = marian_config(model, layout)
    json_files = {
        marian.CONFIG_FILE: config,
        marian.GENERATION_CONFIG_FILE: generation_config(
            layout.decoder_start, layout.end, layout.pad, layout.never_output, config["max_position_embeddings"]),
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
    return write_checkpoint(model, output_dir, overwrite, lambda: _marian_weights(backbone, layout), json_files,
                            _tokenizer_files(tokenizer, layout), "Marian", "export-marian")


class MarianLayout:
    """Where this package's ids go in a Marian vocabulary: `<pad>` last,
    the other ids in their order (`order[new_id] == old_id`)."""

    def __init__(self, special, vocabulary_size):
        self.order = [i for i in range(vocabulary_size) if i != special.pad] + [special.pad]
        new_id = {old: new for new, old in enumerate(self.order)}
        self.new_id = new_id
        self.pad = self.decoder_start = new_id[special.pad]
        self.end = new_id[special.end]
        self.start = new_id[special.start]
        self.source_start = None if special.source_start is None else new_id[special.source_start]
        self.never_output = sorted(new_id[i] for i in special.never_output)


def _marian_weights(backbone, layout):
    """The Marian state dict of `backbone` in `layout`, with the first
    decoder input moved into the decoder's position table."""
    state = marian_weights.backbone_to_marian_weights(backbone)
    embeddings = state["model.shared.weight"][layout.order]
    bias = state["final_logits_bias"][:, layout.order]
    scale = np.sqrt(backbone.d_model) if backbone.scale_embeddings else 1.0
    first_input = scale * embeddings[layout.start]
    embeddings[layout.pad] = 0.0
    for token in layout.never_output:
        if token != layout.pad:
            bias[:, token] = NEVER_OUTPUT_BIAS
    positions = marian_weights.marian_positions(backbone.max_sequence_length, backbone.d_model)
    decoder_positions = positions.copy()
    decoder_positions[0] += first_input
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight"):
        state[name] = embeddings
    state["final_logits_bias"] = bias
    state["model.encoder.embed_positions.weight"] = positions
    state["model.decoder.embed_positions.weight"] = decoder_positions
    return {name: np.ascontiguousarray(value, "float32") for name, value in state.items()}


def marian_config(model, layout=None):
    """The transformers `MarianConfig` fields of `model` (a dict)."""
    backbone = model.backbone
    layout = layout or MarianLayout(model.special_token_ids, backbone.vocabulary_size)
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
    if backbone.layer_norm_epsilon != MARIAN_LAYER_NORM_EPSILON:
        refuse.append(f"layer_norm_epsilon={backbone.layer_norm_epsilon!r} (Marian's LayerNorms use 1e-5)")
    if refuse:
        raise PresetError("Marian cannot hold this model: it has " + ", ".join(refuse) + ".")
    refuse_quantized(backbone, "export_marian")
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
        "pad_token_id": layout.pad,
        "eos_token_id": layout.end,
        "forced_eos_token_id": layout.end,
        "decoder_start_token_id": layout.decoder_start,
        # The source start token (as opus-mt configs, `eos_token_id` when
        # sources have none).
        "bos_token_id": layout.end if layout.source_start is None else layout.source_start,
    }


def _tokenizer_files(tokenizer, layout):
    """source.spm, target.spm and vocab.json (bytes, ids in `layout`) of a
    tokenizer."""
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
        if processor.id_to_piece(layout.order[-1]) != "<pad>":
            raise PresetError("Marian's tokenizer needs the padding piece to be '<pad>'.")
        source = target = proto
    else:
        raise PresetError(
            f"Marian tokenizes with SentencePiece; this model's tokenizer is a {type(tokenizer).__name__}."
        )
    return {
        marian.SOURCE_SPM: source,
        marian.TARGET_SPM: target,
        marian.VOCABULARY_JSON: json.dumps(
            {piece: layout.new_id[i] for piece, i in vocabulary.items()}, ensure_ascii=False, indent=0
        ).encode("utf-8"),
    }

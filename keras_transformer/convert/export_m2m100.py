"""M2M100 and NLLB-200 models of this package as transformers `m2m_100`
directories, for transformers and CTranslate2.

The directory holds what `M2M100ForConditionalGeneration.save_pretrained`
and the family's tokenizer write: `config.json`, `generation_config.json`,
`model.safetensors`, `sentencepiece.bpe.model`, `tokenizer_config.json`,
and for M2M100 `vocab.json` (`M2M100Tokenizer`; the language codes follow
its pieces in fairseq's order); NLLB-200's pieces are numbered as fairseq
numbers the SentencePiece model's, which `NllbTokenizer` rebuilds from
`sentencepiece.bpe.model`, and the language codes, specials and `<mask>`
get their ids from `tokenizer_config.json`'s `added_tokens_decoder`.

The ids and weights are the model's own, unchanged: an imported checkpoint
keeps its layout (padding 1, `</s>` 2, decoding from `</s>` with the target
code forced first), and every embedding row is written as it is,
`<pad>`'s too (transformers' `padding_idx` only keeps that row out of
training; it loads the row from the checkpoint, and CTranslate2 keeps
it). transformers and CTranslate2 compute fairseq's sinusoids themselves.
`generation_config.json` starts decoding from `</s>` and, where the model
has a default target language (its tokenizer's `target_language`,
transformers' `tgt_lang`), forces that code first (`forced_bos_token_id`),
as `generate` does without `target_language`.
"""

import json

import numpy as np

from keras_transformer.convert import m2m100_files
from keras_transformer.convert import marian_weights
from keras_transformer.convert.checkpoint_directory import generation_config
from keras_transformer.convert.checkpoint_directory import load_task
from keras_transformer.convert.checkpoint_directory import refuse_quantized
from keras_transformer.convert.checkpoint_directory import write_checkpoint
from keras_transformer.convert.export_marian import ACTIVATIONS
from keras_transformer.convert.export_marian import MARIAN_LAYER_NORM_EPSILON
from keras_transformer.models.transformer.languages import M2M100_CODES
from keras_transformer.presets import PresetError

TOKENIZER_CLASSES = {"M2M100": "M2M100Tokenizer", "NLLB-200": "NllbTokenizer"}
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "pad_token": "<pad>",
                  "unk_token": "<unk>"}


def is_m2m100_model(model):
    """Whether `model` (a `TransformerSeq2SeqLM`) is of the M2M100 / NLLB
    family: pre-norm, fairseq's sinusoids, an `M2M100Tokenizer`."""
    from keras_transformer.models import M2M100Tokenizer

    return isinstance(getattr(model.preprocessor, "tokenizer", None), M2M100Tokenizer)


def export_m2m100(model, output_dir, overwrite=False):
    """Writes an M2M100 or NLLB-200 model as a transformers `m2m_100`
    directory.

    Args:
        model: a `TransformerSeq2SeqLM` of the family (imported from an
            `m2m_100` checkpoint, fine-tuned or not), or the name,
            directory or handle of a preset of one.
        output_dir: the directory to write; it must be empty or absent
            unless `overwrite`.
        overwrite: replace the files of an earlier export in `output_dir`
            (other files there stay); a directory that holds no exported
            model is never written into.

    Returns:
        `output_dir`.

    Raises:
        PresetError: a model that `m2m_100` cannot hold (post-norm layers,
            other positions, d_k != d_model / h, a logits bias, another
            tokenizer) or whose ids transformers' tokenizers would not
            give.
        FileExistsError: `output_dir` is not empty and `overwrite` is
            False, or it holds files but no exported model.

    Example:

    ```python
    from keras_transformer.convert import export_m2m100
    export_m2m100("nllb-200-600M-en-fr", "nllb-en-fr")
    # transformers.AutoModelForSeq2SeqLM.from_pretrained("nllb-en-fr")
    # ct2-transformers-converter --model nllb-en-fr --output_dir ct2-nllb-en-fr
    ```
    """
    model = load_task(model, "export_m2m100")
    backbone, tokenizer = model.backbone, model.preprocessor.tokenizer
    config = m2m100_config(model)
    family, _ = m2m100_files.family_and_licence(None, tokenizer)
    tokenizer_config, files = _tokenizer_files(tokenizer, family, backbone)
    special = model.special_token_ids
    forced = {} if tokenizer.target_language is None else {
        "forced_bos_token_id": tokenizer.language_id(tokenizer.target_language)}
    json_files = {
        "config.json": config,
        # (fairseq's models end where they end: no `</s>` forced at the limit)
        "generation_config.json": generation_config(
            special.start, special.end, special.pad, special.never_output, config["max_position_embeddings"],
            bos_token_id=config["bos_token_id"], forced_eos_token_id=None, **forced),
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": {key: value for key, value in tokenizer_config.items() if key.endswith("_token")},
    }
    return write_checkpoint(model, output_dir, overwrite, lambda: _m2m100_weights(backbone), json_files, files,
                            family, "export-m2m100")


def m2m100_config(model):
    """The transformers `M2M100Config` fields of `model` (a dict), or an
    error naming what `m2m_100` cannot hold."""
    backbone = model.backbone
    special = model.special_token_ids
    refuse = []
    if not is_m2m100_model(model):
        tokenizer = getattr(model.preprocessor, "tokenizer", None)
        refuse.append(f"a {type(tokenizer).__name__} (M2M100 and NLLB-200 models have an M2M100Tokenizer)")
    if not backbone.normalize_first:
        refuse.append("post-norm layers")
    if backbone.position_encoding != "fairseq_sinusoidal" or backbone.position_offset != special.pad + 1:
        refuse.append("positions other than fairseq's sinusoids counted from the padding id + 1")
    d_k = backbone.d_model // backbone.num_heads
    if backbone.d_model % backbone.num_heads or backbone.key_dim not in (None, d_k) or backbone.value_dim not in (None, d_k):
        refuse.append("d_k or d_v other than d_model / h")
    if backbone.output_bias:
        refuse.append("a logits bias")
    activation = ACTIVATIONS.get(backbone.activation)
    if activation is None:
        refuse.append(f"the activation {backbone.activation!r}")
    if backbone.layer_norm_epsilon != MARIAN_LAYER_NORM_EPSILON:
        refuse.append(f"layer_norm_epsilon={backbone.layer_norm_epsilon!r} (m2m_100's LayerNorms use 1e-5)")
    if special.start != special.end or special.source_start is not None:
        refuse.append("a decoder start other than </s>, or a source start token")
    if refuse:
        raise PresetError("m2m_100 cannot hold this model: it has " + "; ".join(refuse) + ".")
    refuse_quantized(backbone, "export_m2m100")
    vocabulary = model.preprocessor.tokenizer.vocabulary
    return {
        "architectures": ["M2M100ForConditionalGeneration"],
        "model_type": "m2m_100",
        "vocab_size": backbone.vocabulary_size,
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
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "max_position_embeddings": backbone.max_sequence_length,
        "scale_embedding": bool(backbone.scale_embeddings),
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "init_std": 0.02,
        "use_cache": True,
        "pad_token_id": special.pad,
        "eos_token_id": special.end,
        "decoder_start_token_id": special.start,
        "bos_token_id": vocabulary.get("<s>", special.end),
    }


def _m2m100_weights(backbone):
    """The `m2m_100` state dict of `backbone`: the same d_model order (no
    permutation, unlike Marian's), every embedding row as it is, the final
    LayerNorm of each stack; no position tables (transformers computes
    them)."""
    values = marian_weights.backbone_values(backbone)
    identity = np.arange(backbone.d_model)
    embeddings = values["token_embedding/embeddings"]
    state = {name: embeddings for name in (
        "model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
        "lm_head.weight")}
    state.update(marian_weights.checkpoint_layers(values, backbone.num_layers, identity))
    for side in ("encoder", "decoder"):
        state.update(marian_weights.to_theirs(values, f"model.{side}.layer_norm", f"{side}_norm", "norm", identity))
    return {name: np.ascontiguousarray(value, "float32") for name, value in state.items()}


def _tokenizer_files(tokenizer, family, backbone):
    """`(tokenizer_config.json, {file name: bytes})` of an `M2M100Tokenizer`
    as transformers' `M2M100Tokenizer` or `NllbTokenizer` reads them, or an
    error where those would number the pieces otherwise."""
    codes, vocabulary = list(tokenizer.language_codes), tokenizer.vocabulary
    files = {m2m100_files.SPM_FILE: tokenizer.source_spm}
    added = sorted((i, token) for token, i in vocabulary.items() if token in (*SPECIAL_TOKENS.values(), "<mask>")
                   or token in set(codes))
    config = {"tokenizer_class": TOKENIZER_CLASSES[family], **SPECIAL_TOKENS,
              "model_max_length": backbone.max_sequence_length}
    if family == "M2M100":
        pieces = {piece: i for piece, i in vocabulary.items() if piece not in set(codes)}
        listed = next((name for name, names in M2M100_CODES.items() if [f"__{c}__" for c in names] == codes), None)
        if sorted(pieces.values()) != list(range(len(pieces))) or listed is None or (
                [vocabulary[code] for code in codes] != list(range(len(pieces), len(pieces) + len(codes)))):
            raise PresetError(
                "transformers' M2M100Tokenizer numbers the pieces of vocab.json from 0 and puts fairseq's list of "
                "language codes (m2m100's 100 or wmt21's 8) after them; this model's vocabulary is not laid out "
                "so, and no M2M100 directory would read it as the model does."
            )
        files[m2m100_files.VOCABULARY_JSON] = json.dumps(pieces, ensure_ascii=False, indent=0).encode("utf-8")
        languages = {"language_codes": listed, "num_madeup_words": max(backbone.vocabulary_size - len(vocabulary), 0)}
        names = {code: code.strip("_") for code in codes}
    else:
        # NllbTokenizer numbers the pieces as fairseq does (the SentencePiece
        # ids plus one) and takes the added tokens' ids from the config.
        numbered, _ = m2m100_files.fairseq_numbering(tokenizer.source_spm, codes)
        tokens = {token for _, token in added}
        if {p: i for p, i in numbered.items() if p not in tokens} != {
                p: i for p, i in vocabulary.items() if p not in tokens}:
            raise PresetError(
                "transformers' NllbTokenizer numbers the pieces as fairseq does (the SentencePiece ids plus "
                "one); this model's vocabulary is numbered otherwise, and no NLLB directory would read it as "
                "the model does."
            )
        languages = {"mask_token": "<mask>", "cls_token": "<s>", "legacy_behaviour": False}
        names = {code: code for code in codes}
    return {
        **config,
        **languages,
        "src_lang": names.get(tokenizer.source_language),
        "tgt_lang": names.get(tokenizer.target_language),
        "extra_special_tokens": codes,
        "added_tokens_decoder": {
            str(i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for i, token in added
        },
    }, files

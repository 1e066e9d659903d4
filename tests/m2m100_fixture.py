"""Tiny random M2M100 and NLLB-200 checkpoints, built and saved by
transformers itself (`M2M100ForConditionalGeneration` and its tokenizers),
from a SentencePiece BPE model trained on the sentences of `tiny_spm`."""

import io
import json
import os
import shutil

import numpy as np

from tiny_spm import SOURCES
from tiny_spm import TARGETS

M2M100_CODES = (
    "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr ht hu "
    "hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps pt "
    "ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
).split()
NLLB_CODES = ["eng_Latn", "deu_Latn", "fra_Latn", "zho_Hans", "zho_Hant"]
SPM_FILE = "sentencepiece.bpe.model"
# Texts that are not among the pairs, one with a piece the SentencePiece
# model has never seen (an unknown piece).
TEXTS = [
    "A man rides a horse down the street.",
    "Hi",
    "Two girls are playing in the snow!",
    "People.",
    "A little girl in a pink dress is climbing the stairs.",
    "An older man sits on a bench, reading Ω.",
]


def _spm():
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.set_random_generator_seed(0)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SOURCES + TARGETS), model_writer=model, vocab_size=200, model_type="bpe",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    return model.getvalue()


def _m2m100_tokenizer(directory, proto):
    import sentencepiece
    from transformers import M2M100Tokenizer

    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(processor.get_piece_size()):
        if not (processor.is_control(i) or processor.is_unknown(i)):
            vocabulary.setdefault(processor.id_to_piece(i), len(vocabulary))
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocabulary, f, ensure_ascii=False)
    # transformers 5 keeps only the codes given as extra special tokens.
    return M2M100Tokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, SPM_FILE),
                           src_lang="en", tgt_lang="de", extra_special_tokens=[f"__{c}__" for c in M2M100_CODES])


def _nllb_tokenizer(directory):
    from transformers import NllbTokenizer

    return NllbTokenizer.from_pretrained(directory, extra_special_tokens=NLLB_CODES, src_lang="eng_Latn",
                                         tgt_lang="deu_Latn")


def save_tiny(directory, family, seed=0, init_std=0.3, **config_overrides):
    """Writes a tiny random `family` ("m2m100" or "nllb") checkpoint into
    `directory` with `save_pretrained`; returns `directory`. Its weights
    are drawn with a large `init_std`, so that its next-token
    distributions are peaked (greedy and beam choices that do not hinge on
    float rounding) and its outputs varied."""
    import torch
    from transformers import M2M100Config
    from transformers import M2M100ForConditionalGeneration

    os.makedirs(directory, exist_ok=True)
    building = directory + ".building"
    os.makedirs(building, exist_ok=True)
    proto = _spm()
    with open(os.path.join(building, SPM_FILE), "wb") as f:
        f.write(proto)
    tokenizer = _m2m100_tokenizer(building, proto) if family == "m2m100" else _nllb_tokenizer(building)
    config = dict(
        vocab_size=len(tokenizer) + (8 if family == "m2m100" else 3), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=128, dropout=0.1, attention_dropout=0.0, scale_embedding=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, init_std=init_std,
    )
    config.update(config_overrides)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(M2M100Config(**config))
    model.eval()
    generator = np.random.default_rng(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.copy_(parameter + torch.tensor(generator.normal(0, 0.2, parameter.shape)))
        shared = model.get_input_embeddings().weight
        shared.copy_(torch.tensor(generator.normal(0, 0.1, shared.shape)))
    _calibrate_end(model, tokenizer, config["eos_token_id"])
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    shutil.copy(os.path.join(building, SPM_FILE), os.path.join(directory, SPM_FILE))  # (as hub repositories hold it)
    shutil.rmtree(building)
    return directory


def _calibrate_end(model, tokenizer, eos, max_new_tokens=20):
    """Moves the decoder's final LayerNorm bias towards `</s>`'s embedding
    until greedy decoding ends some of `TEXTS` within `max_new_tokens` and
    not all (random models end everything at once or nothing)."""
    import torch

    inputs = tokenizer(TEXTS, return_tensors="pt", padding=True)
    forced = tokenizer.convert_tokens_to_ids(next(c for c in (f"__{tokenizer.tgt_lang}__", tokenizer.tgt_lang)
                                                  if c in tokenizer.get_vocab()))
    bias = model.model.decoder.layer_norm.bias
    start, direction = bias.detach().clone(), model.get_input_embeddings().weight[eos].detach().clone()
    low, high = 0.0, 40.0
    for _ in range(30):
        middle = (low + high) / 2
        with torch.no_grad():
            bias.copy_(start + middle * direction)
            out = model.generate(**inputs, num_beams=1, max_new_tokens=max_new_tokens, do_sample=False,
                                 forced_bos_token_id=forced)
        ended = int((out[:, 2:] == eos).any(dim=1).sum())
        if 1 < ended < len(TEXTS) - 1:
            return
        low, high = (middle, high) if ended <= 1 else (low, middle)
    raise RuntimeError("Could not calibrate the tiny model's end token.")


def save_sized(directory, tokenizer_directory, **config):
    """Writes a random `m2m_100` checkpoint of the shape `config` gives
    (transformers' `M2M100Config` fields: `d_model`, `encoder_layers`,
    `vocab_size`...) into `directory`, with the tokenizer files of the
    checkpoint in `tokenizer_directory` (`save_tiny`'s); returns
    `directory`. Its weights are transformers' own random ones: for sizes
    (memory, speed), not translations."""
    import torch
    from transformers import M2M100Config
    from transformers import M2M100ForConditionalGeneration

    with open(os.path.join(tokenizer_directory, "config.json"), encoding="utf-8") as f:
        tiny = json.load(f)
    kept = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "scale_embedding")
    config = {**{key: tiny[key] for key in kept}, "max_position_embeddings": 256, **config}
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(M2M100Config(**config)).eval()
    model.save_pretrained(directory)
    for name in os.listdir(tokenizer_directory):
        if name not in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copy(os.path.join(tokenizer_directory, name), os.path.join(directory, name))
    return directory

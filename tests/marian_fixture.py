"""A tiny random Marian checkpoint, built and saved by transformers itself.

Two SentencePiece models (English source, German target) trained on a few
thousand Multi30k lines, one joint `vocab.json` numbered as opus-mt's are
(`</s>` 0, `<unk>` 1, the pieces, a `>>de<<` language token, `<pad>` last),
and a `MarianMTModel` with d_model 64, 2 + 2 layers, swish, a non-zero
`final_logits_bias` and LayerNorm weights that are not 1: what
`save_pretrained` writes for opus-mt, small.
"""

import hashlib
import io
import json
import os
import shutil
import tempfile

import numpy as np


def _train_spm(lines, size):
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.set_random_generator_seed(0)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=size, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    return model.getvalue()


def marian_vocabulary(source_proto, target_proto, language_tokens=(">>de<<",)):
    import sentencepiece

    pieces = ["</s>", "<unk>"]
    for proto in (source_proto, target_proto):
        processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not (processor.is_control(i) or processor.is_unknown(i)) and piece not in pieces:
                pieces.append(piece)
    pieces += list(language_tokens) + ["<pad>"]
    return {piece: i for i, piece in enumerate(pieces)}


# A directory shared by the test runs of every backend (set by
# tests/run_all_backends.sh): the tiny checkpoint does not depend on the
# Keras backend, so it is built once for the three runs.
CACHE_VARIABLE = "KERAS_TRANSFORMER_TEST_CACHE"


def tiny_marian_dir(fallback_directory, sources, targets, **kwargs):
    """The directory of `save_tiny_marian(directory, sources, targets,
    **kwargs)`: built into `fallback_directory`, or, with
    $KERAS_TRANSFORMER_TEST_CACHE set, found or built once under it (keyed
    by this module's code and the arguments, written whole or not at all)."""
    cache = os.environ.get(CACHE_VARIABLE)
    if not cache:
        save_tiny_marian(fallback_directory, sources, targets, **kwargs)
        return fallback_directory
    key = hashlib.sha256()
    with open(__file__, "rb") as f:
        key.update(f.read())
    key.update(json.dumps([list(sources), list(targets), sorted(kwargs.items())], default=list).encode())
    directory = os.path.join(cache, "tiny-marian-" + key.hexdigest()[:16])
    if not os.path.isdir(directory):
        os.makedirs(cache, exist_ok=True)
        building = tempfile.mkdtemp(dir=cache)
        save_tiny_marian(building, sources, targets, **kwargs)
        try:
            os.rename(building, directory)
        except OSError:  # another run built it first
            shutil.rmtree(building, ignore_errors=True)
    return directory


def save_tiny_marian(directory, sources, targets, seed=0, calibration_texts=(), max_new_tokens=40, train_steps=200,
                     **config_overrides):
    """Writes a tiny Marian model and tokenizer into `directory` with
    transformers' `save_pretrained`; returns `(model, tokenizer)`.

    The model is trained for `train_steps` steps on the pairs, so that it
    decodes varied tokens (a random one repeats one token), with peaked
    next-token distributions that do not hinge on float rounding.

    With `calibration_texts`, the logits bias of `</s>` is raised until
    greedy decoding ends some of them within `max_new_tokens` and not all:
    random models otherwise end everything at once or nothing."""
    import torch
    from transformers import MarianConfig
    from transformers import MarianMTModel
    from transformers import MarianTokenizer

    os.makedirs(directory, exist_ok=True)
    source_proto, target_proto = _train_spm(sources, 300), _train_spm(targets, 300)
    vocabulary = marian_vocabulary(source_proto, target_proto)
    files = {"source.spm": source_proto, "target.spm": target_proto}
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocabulary, f, ensure_ascii=False)
    tokenizer = MarianTokenizer(
        os.path.join(directory, "source.spm"), os.path.join(directory, "target.spm"),
        os.path.join(directory, "vocab.json"), source_lang="en", target_lang="de",
    )
    pad = vocabulary["<pad>"]
    config = dict(
        vocab_size=len(vocabulary), decoder_vocab_size=len(vocabulary), d_model=64,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, activation_function="swish", max_position_embeddings=128,
        scale_embedding=True, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=0, share_encoder_decoder_embeddings=True, dropout=0.1,
    )
    config.update(config_overrides)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**config))
    if train_steps:
        _train(model, tokenizer, sources, targets, train_steps)
    model.eval()
    generator = np.random.default_rng(seed)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.tensor(generator.normal(0, 0.5, model.final_logits_bias.shape)))
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.copy_(parameter + torch.tensor(generator.normal(0, 0.2, parameter.shape)))
    if calibration_texts:
        _calibrate_end(model, tokenizer, calibration_texts, max_new_tokens)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def _train(model, tokenizer, sources, targets, steps, batch_size=32):
    import torch

    batch = tokenizer(list(sources), text_target=list(targets), padding=True, truncation=True, max_length=40,
                      return_tensors="pt")
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = np.random.default_rng(0)
    for _ in range(steps):
        rows = torch.tensor(generator.choice(len(sources), batch_size, replace=False))
        loss = model(**{name: value[rows] for name, value in batch.items()}).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _calibrate_end(model, tokenizer, texts, max_new_tokens):
    import torch

    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    inputs = tokenizer(list(texts), return_tensors="pt", padding=True)
    for _ in range(40):
        with torch.no_grad():
            out = model.generate(**inputs, num_beams=1, max_new_tokens=max_new_tokens, bad_words_ids=[[pad]],
                                 forced_eos_token_id=None)
        ended = int((out[:, 1:] == eos).any(dim=1).sum())
        if 0 < ended < len(texts):
            return
        step = 0.25 if ended == 0 else -0.25
        with torch.no_grad():
            model.final_logits_bias[0, eos] += step
    raise RuntimeError("Could not calibrate the tiny Marian model's end token.")

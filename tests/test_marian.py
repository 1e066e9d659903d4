"""Marian (opus-mt) checkpoints: loaded and written, checked against
transformers' own outputs on a tiny random model that transformers builds."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from helpers import once  # noqa: E402
from marian_fixture import tiny_marian_dir  # noqa: E402

from keras_transformer.presets import PresetError  # noqa: E402

TEXTS = [
    "A man rides a bicycle down the street.",
    ">>de<< Two dogs are playing in the snow!",
    "Hi",
    "A little girl in a pink dress is climbing the stairs of a wooden playhouse.",
    "People.",
    "An older woman sits on a bench, reading.",
]


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory, multi30k_train):
    sources, targets = multi30k_train
    return tiny_marian_dir(str(tmp_path_factory.mktemp("marian")), sources[:3000], targets[:3000],
                           calibration_texts=TEXTS, max_new_tokens=30)


@pytest.fixture(scope="module")
def hf(marian_dir):
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(marian_dir)


@pytest.fixture(scope="module")
def ours(marian_dir):
    from keras_transformer.models import TransformerSeq2SeqLM

    return TransformerSeq2SeqLM.from_preset(marian_dir)


def _hf_generate(model, ids, **kwargs):
    """transformers' decoding of one source's ids, without the start token
    and the end token."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), forced_eos_token_id=None, do_sample=False, **kwargs)[0].tolist()
    out = out[1:]
    return out[: out.index(model.config.eos_token_id)] if model.config.eos_token_id in out else out


def test_tokenizer_matches_transformers(ours, hf):
    _, tokenizer = hf
    preprocessor = ours.preprocessor
    # Sources: source.spm, ids from vocab.json, </s> only, >>de<< one token.
    assert preprocessor.generate_preprocess(TEXTS) == [tokenizer(text).input_ids for text in TEXTS]
    targets = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    assert preprocessor.target_token_ids(targets) == [tokenizer(text_target=t).input_ids[:-1] for t in targets]
    ids = [tokenizer(text_target=t).input_ids[:-1] for t in targets] + [tokenizer(TEXTS[1]).input_ids[:-1]]
    assert preprocessor.generate_postprocess(ids) == tokenizer.batch_decode(ids, skip_special_tokens=True)
    special = ours.special_token_ids
    assert (special.end, special.unk, special.pad, special.start, special.source_start) == (
        0, 1, ours.backbone.vocabulary_size - 1, ours.backbone.vocabulary_size - 1, None,
    )


def test_logits_match_transformers_on_padded_batches(ours, hf):
    model, tokenizer = hf
    batch = tokenizer(TEXTS, text_target=[t[::-1] for t in TEXTS], padding=True, return_tensors="np")
    pad = model.config.pad_token_id
    labels = np.where(batch["labels"] == -100, pad, batch["labels"])
    decoder_ids = np.concatenate([np.full((len(TEXTS), 1), pad), labels[:, :-1]], axis=1).astype("int32")
    decoder_mask = np.concatenate([np.ones((len(TEXTS), 1)), labels[:, :-1] != pad], axis=1).astype("int32")
    inputs = {
        "encoder_token_ids": batch["input_ids"].astype("int32"),
        "encoder_padding_mask": batch["attention_mask"].astype("int32"),
        "decoder_token_ids": decoder_ids,
        "decoder_padding_mask": decoder_mask,
    }
    logits = keras.ops.convert_to_numpy(ours(inputs))
    with torch.no_grad():
        expected = model(
            input_ids=torch.tensor(inputs["encoder_token_ids"]).long(),
            attention_mask=torch.tensor(inputs["encoder_padding_mask"]),
            decoder_input_ids=torch.tensor(decoder_ids).long(),
            decoder_attention_mask=torch.tensor(decoder_mask),
        ).logits.numpy()
    real = decoder_mask.astype(bool)
    assert np.abs(logits - expected)[real].max() < 1e-4
    assert np.abs(expected[real]).max() > 1.0  # not trivially small


def test_greedy_and_beam_search_match_transformers(ours, hf):
    model, tokenizer = hf
    pad, offset = model.config.pad_token_id, 30
    sources = ours.preprocessor.generate_preprocess(TEXTS)
    greedy = ours.generate({"encoder_token_ids": _pad(sources, pad), "encoder_padding_mask": _mask(sources)},
                           sampler="greedy", max_length_offset=offset)
    beam = ours.generate({"encoder_token_ids": _pad(sources, pad), "encoder_padding_mask": _mask(sources)},
                         beam_size=4, alpha=1.0, length_penalty="length", max_length_offset=offset)
    ended = 0
    for ids, ours_greedy, ours_beam in zip(sources, greedy, beam):
        budget = len(ids) + offset
        assert ours_greedy == _hf_generate(model, ids, num_beams=1, max_new_tokens=budget, bad_words_ids=[[pad]])
        assert ours_beam == _hf_generate(
            model, ids, num_beams=4, length_penalty=1.0, max_new_tokens=budget, bad_words_ids=[[pad]]
        )
        ended += len(ours_greedy) < budget
    assert 0 < ended < len(TEXTS), [len(g) for g in greedy]  # outputs that end, and outputs cut at the limit
    # Varied outputs (the fixture is trained a little), not one token repeated.
    assert sum(len(set(ids)) >= 5 for ids in greedy + beam) >= len(TEXTS), (greedy, beam)
    assert len({tuple(ids) for ids in greedy}) == len(TEXTS)
    strings = ours.generate(TEXTS, sampler="greedy", max_length_offset=offset)
    assert strings == tokenizer.batch_decode(greedy, skip_special_tokens=True)


def _pad(sources, pad):
    ids = np.full((len(sources), max(map(len, sources))), pad, "int32")
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    return ids


def _mask(sources):
    return (np.arange(max(map(len, sources)))[None, :] < np.array([[len(s)] for s in sources])).astype("int32")


def test_convert_fine_tune_save_and_load(ours, marian_dir, tmp_path, capsys):
    from keras_transformer.cli import main
    from keras_transformer.models import MarianTokenizer
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.models import TransformerTokenizer

    preset = str(tmp_path / "preset")
    main(["convert", marian_dir, preset])
    converted = TransformerSeq2SeqLM.from_preset(preset)
    assert converted.generate(TEXTS[:3], sampler="greedy") == ours.generate(TEXTS[:3], sampler="greedy")
    backbone = TransformerBackbone.from_preset(marian_dir)
    assert backbone.activation == "silu" and backbone.output_bias
    assert ours.compiled and TransformerSeq2SeqLM.from_preset(marian_dir, compile=False).compiled is False
    tokenizer = TransformerTokenizer.from_preset(marian_dir)
    assert isinstance(tokenizer, MarianTokenizer) and tokenizer.vocabulary_size() == backbone.vocabulary_size
    capsys.readouterr()
    main(["translate", "--preset", marian_dir, "--beam-size", "1", *TEXTS[:3]])
    assert capsys.readouterr().out.splitlines() == ours.generate(TEXTS[:3], sampler="greedy")

    # Marian framing: sources end with </s> and have no start token; the
    # decoder starts from the padding id; targets use target.spm.
    pairs = {"encoder_text": TEXTS[:4], "decoder_text": ["Ein Mann.", "Zwei Hunde.", "Hallo", "Ein Mädchen."]}
    x, y, _ = converted.preprocessor(pairs)
    special = converted.special_token_ids
    first = keras.ops.convert_to_numpy(x["encoder_token_ids"])[0].tolist()
    assert first[: len(first) - first[::-1].index(special.end)] == converted.preprocessor.generate_preprocess(TEXTS[:1])[0]
    assert keras.ops.convert_to_numpy(x["decoder_token_ids"])[:, 0].tolist() == [special.pad] * 4
    target = converted.preprocessor.target_token_ids(["Ein Mann."])[0] + [special.end]
    assert keras.ops.convert_to_numpy(y)[0, : len(target)].tolist() == target

    before = [v.numpy().copy() for v in converted.backbone.trainable_variables[:2]]
    converted.compile(warmup_steps=1)
    history = converted.fit(pairs, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert any(not np.allclose(b, v.numpy()) for b, v in zip(before, converted.backbone.trainable_variables[:2]))


@once
def test_convert_replaces_a_preset_only_with_overwrite(marian_dir, tmp_path, capsys):
    from keras_transformer.cli import main
    from keras_transformer.presets.layout import METADATA_FILE

    output = tmp_path / "preset"
    output.mkdir()
    (output / "NOTES.md").write_text("mine")
    with pytest.raises(SystemExit, match="is not empty. Choose another directory, or pass overwrite=True"):
        main(["convert", marian_dir, str(output)])
    assert os.listdir(output) == ["NOTES.md"]
    (output / "NOTES.md").unlink()
    main(["convert", marian_dir, str(output)])
    first = (output / METADATA_FILE).stat().st_mtime_ns
    with pytest.raises(SystemExit, match="is not empty"):
        main(["convert", marian_dir, str(output)])
    assert (output / METADATA_FILE).stat().st_mtime_ns == first
    (output / "NOTES.md").write_text("mine")
    main(["convert", marian_dir, str(output), "--overwrite"])
    assert (output / METADATA_FILE).stat().st_mtime_ns != first and (output / "NOTES.md").read_text() == "mine"
    with pytest.raises(SystemExit, match="is a file; give a directory"):
        main(["convert", marian_dir, str(output / "NOTES.md")])


def test_from_preset_keywords_apply_to_marian_checkpoints(ours, marian_dir):
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor

    # As for a preset of this package: a backbone's keywords replace its
    # config's, the others go to the constructor.
    backbone = TransformerBackbone.from_preset(marian_dir, dropout=0.3)
    assert backbone.dropout == 0.3 and ours.backbone.dropout != 0.3
    for mine, theirs in zip(backbone.weights, ours.backbone.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine), keras.ops.convert_to_numpy(theirs))
    # A smaller model would take a part of the weights without a word.
    layers = ours.backbone.num_layers
    with pytest.raises(PresetError, match=rf"do not fit num_layers={layers - 1}: its config.json gives num_layers={layers}"):
        TransformerBackbone.from_preset(marian_dir, num_layers=layers - 1, dropout=0.3)
    assert TransformerBackbone.from_preset(marian_dir, num_layers=layers - 1, load_weights=False).num_layers == layers - 1
    for keyword, value in (("key_dim", 4), ("position_encoding", "learned"), ("normalize_first", True)):
        with pytest.raises(PresetError, match=f"do not fit {keyword}={value!r}: its config.json gives"):
            TransformerBackbone.from_preset(marian_dir, **{keyword: value})
    preprocessor = TransformerSeq2SeqLMPreprocessor.from_preset(marian_dir, encoder_sequence_length=16)
    assert preprocessor.encoder_sequence_length == 16
    assert preprocessor.decoder_sequence_length == ours.preprocessor.decoder_sequence_length
    task = TransformerSeq2SeqLM.from_preset(marian_dir, preprocessor=preprocessor, backbone=backbone, name="mine")
    assert task.preprocessor is preprocessor and task.backbone is backbone and task.name == "mine"
    with pytest.raises(TypeError, match="did you mean 'load_weights'"):
        TransformerSeq2SeqLM.from_preset(marian_dir, load_weight=False)


def test_unsupported_marian_models_are_refused(marian_dir, tmp_path):
    from keras_transformer.models import TransformerSeq2SeqLM

    def variant(name, edit):
        directory = tmp_path / name
        shutil.copytree(marian_dir, directory)
        edit(str(directory))
        return str(directory)

    def set_config(directory, **changes):
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            config = json.load(f)
        config.update(changes)
        with open(path, "w") as f:
            json.dump(config, f)

    deeper = variant("depth", lambda d: set_config(d, decoder_layers=3))
    with pytest.raises(PresetError, match="unequal encoder and decoder depth"):
        TransformerSeq2SeqLM.from_preset(deeper)

    def separate(directory):
        path = os.path.join(directory, "tokenizer_config.json")
        with open(path) as f:
            config = json.load(f)
        with open(path, "w") as f:
            json.dump({**config, "separate_vocabs": True}, f)

    with pytest.raises(PresetError, match="separate source and target vocabularies"):
        TransformerSeq2SeqLM.from_preset(variant("separate", separate))
    with pytest.raises(PresetError, match="BPE"):
        TransformerSeq2SeqLM.from_preset(variant("bpe", lambda d: os.remove(os.path.join(d, "source.spm"))))


def test_hub_handle_without_network_says_how_to_work_offline(monkeypatch, tmp_path):
    import socket

    huggingface_hub = pytest.importorskip("huggingface_hub")
    from keras_transformer.models import TransformerSeq2SeqLM

    def refused(*args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", lambda seconds: None)  # its retries
    with pytest.raises(PresetError, match="could not be reached.*download the model once") as raised:
        TransformerSeq2SeqLM.from_preset("hf://Helsinki-NLP/opus-mt-en-de")
    assert "doesn't exist" not in str(raised.value)


def test_hub_handle_loads_pytorch_weights_when_it_has_no_safetensors(marian_dir, ours, monkeypatch, tmp_path):
    """A hub repository with `pytorch_model.bin` only (many opus-mt ones):
    the hub's "no such file" for model.safetensors means "try the other"."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from safetensors.torch import load_file

    from keras_transformer.models import TransformerSeq2SeqLM

    repository = tmp_path / "repository"
    shutil.copytree(marian_dir, repository)
    torch.save(load_file(repository / "model.safetensors"), repository / "pytorch_model.bin")
    os.remove(repository / "model.safetensors")
    asked = []

    def download(repo_id, filename, **kwargs):
        asked.append(filename)
        if not (repository / filename).exists():
            raise huggingface_hub.errors.EntryNotFoundError(f"404: {filename} is not in {repo_id}")
        return str(repository / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    loaded = TransformerSeq2SeqLM.from_preset("hf://someone/tiny-marian")
    assert "model.safetensors" in asked and "pytorch_model.bin" in asked
    assert loaded.generate(TEXTS[:3], sampler="greedy") == ours.generate(TEXTS[:3], sampler="greedy")


@once
def test_export_marian_of_the_shipped_preset_translates_as_this_package(multi30k_dir, tmp_path):
    """The written-out directory: transformers (greedy), CTranslate2's
    converter and this package's own import all translate as the preset."""
    from keras_transformer.convert import export_marian
    from keras_transformer.datasets import multi30k
    from keras_transformer.models import TransformerSeq2SeqLM

    # The shipped preset's first model: a Marian directory holds one model.
    ours = TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_ensemble=False)
    directory = export_marian(ours, str(tmp_path / "marian"))
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    # Marian's layout: padding last, the first decoder input.
    assert model.config.pad_token_id == model.config.decoder_start_token_id == len(tokenizer) - 1
    sources, _ = multi30k.load("test_2016_flickr", "en", "de", data_dir=multi30k_dir)
    sources = sources[:20]
    expected = ours.generate(sources, sampler="greedy")
    # transformers' tokenizer adds </s> only: this package's models read <s> first.
    source_ids = [[model.config.bos_token_id, *tokenizer(source).input_ids] for source in sources]
    for ids, translation in zip(source_ids, expected):
        out = _hf_generate(model, ids, num_beams=1, max_new_tokens=len(ids) + 50)
        assert tokenizer.decode(out, skip_special_tokens=True) == translation

    ctranslate2 = pytest.importorskip("ctranslate2")
    ctranslate2.converters.TransformersConverter(directory).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    results = translator.translate_batch([tokenizer.convert_ids_to_tokens(ids) for ids in source_ids], beam_size=1)
    assert [tokenizer.convert_tokens_to_string(r.hypotheses[0]) for r in results] == expected

    imported = TransformerSeq2SeqLM.from_preset(directory)
    assert imported.generate(sources, sampler="greedy") == expected


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="the SavedModel export runs in TensorFlow")
def test_converted_model_exports_a_saved_model(ours, tmp_path):
    import tensorflow as tf

    from keras_transformer.export import export_saved_model

    export_saved_model(ours, str(tmp_path / "saved"), beam_size=2, alpha=0.6, max_length_offset=10)
    translator = tf.saved_model.load(str(tmp_path / "saved"))
    outputs = translator.signatures["serving_default"](tf.constant(TEXTS))["translations"].numpy()
    expected = ours.generate(TEXTS, beam_size=2, alpha=0.6, max_length_offset=10)
    assert [text.decode("utf-8") for text in outputs] == expected

"""M2M100 and NLLB-200 checkpoints (`model_type: m2m_100`): loaded and
checked against transformers' own outputs on tiny random models that
transformers builds and saves."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from helpers import once  # noqa: E402
from m2m100_fixture import TEXTS  # noqa: E402
from m2m100_fixture import save_tiny  # noqa: E402

from keras_transformer.presets import PresetError  # noqa: E402

# The target languages each family is checked with, as the checkpoint names them.
TARGETS = {"m2m100": ("__de__", "__fr__"), "nllb": ("deu_Latn", "fra_Latn")}
SOURCE = {"m2m100": "__en__", "nllb": "eng_Latn"}


@pytest.fixture(scope="module", params=["m2m100", "nllb"])
def family(request, tmp_path_factory):
    directory = save_tiny(str(tmp_path_factory.mktemp(request.param) / "checkpoint"), request.param)
    from keras_transformer.models import TransformerSeq2SeqLM

    model = transformers.M2M100ForConditionalGeneration.from_pretrained(directory).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    return request.param, directory, model, tokenizer, TransformerSeq2SeqLM.from_preset(directory)


def _hf_generate(model, ids, forced, **kwargs):
    """transformers' output ids (the forced target code first; without
    `forced`, generation_config.json's)."""
    forcing = {} if forced is None else {"forced_bos_token_id": forced}
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, **forcing, **kwargs)[0].tolist()
    out = out[1:]
    return out[: out.index(model.config.eos_token_id)] if model.config.eos_token_id in out else out


@once  # (the tokenizer, languages, files and errors: the same on every backend)
def test_tokenization_matches_transformers(family):
    name, _, _, tokenizer, ours = family
    preprocessor = ours.preprocessor
    # Sources: [source code] pieces </s>, unknown pieces as <unk>.
    expected = [tokenizer(text).input_ids for text in TEXTS]
    assert preprocessor.generate_preprocess(TEXTS) == expected
    assert tokenizer.unk_token_id in expected[-1]
    # Targets: [target code] pieces (and </s>, which the preprocessor adds).
    targets = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    assert preprocessor.target_token_ids(targets) == [tokenizer(text_target=t).input_ids[:-1] for t in targets]
    ids = [tokenizer(text_target=t).input_ids for t in targets]
    assert preprocessor.generate_postprocess(ids) == tokenizer.batch_decode(ids, skip_special_tokens=True)
    special = ours.special_token_ids
    assert (special.pad, special.start, special.end, special.source_start) == (1, 2, 2, None)
    assert special.never_output == [1]


def test_logits_match_transformers_on_padded_batches(family):
    _, _, model, tokenizer, ours = family
    assert _logits_difference(model, tokenizer, ours) < 1e-4


def test_loads_in_bfloat16(family):
    """`from_preset(..., dtype="bfloat16")`: bfloat16 weights (assigned a
    block of rows at a time, cast on the way), logits near float32's."""
    _, directory, model, tokenizer, ours = family
    from keras_transformer.models import TransformerSeq2SeqLM

    half = TransformerSeq2SeqLM.from_preset(directory, dtype="bfloat16")
    embeddings = half.backbone.token_embedding.embeddings
    assert keras.backend.standardize_dtype(embeddings.dtype) == "bfloat16"
    expected = keras.ops.convert_to_numpy(ours.backbone.token_embedding.embeddings)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.cast(embeddings, "float32")), expected, rtol=1e-2,
                               atol=1e-6)
    assert _logits_difference(model, tokenizer, half) < 0.05 * _logits_difference(model, tokenizer, None)


def _logits_difference(model, tokenizer, ours):
    """The largest difference between transformers' `model`'s logits and
    `ours`' on a padded batch of `TEXTS` (teacher forcing); without
    `ours`, transformers' largest logit."""
    targets = [text[::-1] for text in TEXTS]
    batch = tokenizer(TEXTS, text_target=targets, padding=True, return_tensors="np")
    pad, start = model.config.pad_token_id, model.config.decoder_start_token_id
    labels = np.where(batch["labels"] == -100, pad, batch["labels"])
    decoder_ids = np.concatenate([np.full((len(TEXTS), 1), start), labels[:, :-1]], axis=1).astype("int32")
    decoder_mask = np.concatenate([np.ones((len(TEXTS), 1)), labels[:, :-1] != pad], axis=1).astype("int32")
    inputs = {
        "encoder_token_ids": batch["input_ids"].astype("int32"),
        "encoder_padding_mask": batch["attention_mask"].astype("int32"),
        "decoder_token_ids": decoder_ids,
        "decoder_padding_mask": decoder_mask,
    }
    with torch.no_grad():
        expected = model(
            input_ids=torch.tensor(inputs["encoder_token_ids"]).long(),
            attention_mask=torch.tensor(inputs["encoder_padding_mask"]),
            decoder_input_ids=torch.tensor(decoder_ids).long(),
            decoder_attention_mask=torch.tensor(decoder_mask),
        ).logits.numpy()
    real = decoder_mask.astype(bool)
    assert np.abs(expected[real]).max() > 1.0  # not trivially small
    if ours is None:  # (the logits' scale)
        return np.abs(expected[real]).max()
    logits = keras.ops.convert_to_numpy(keras.ops.cast(ours(inputs), "float32"))
    return np.abs(logits - expected)[real].max()


def _padded(sources, pad):
    ids = np.full((len(sources), max(map(len, sources))), pad, "int32")
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    return {"encoder_token_ids": ids, "encoder_padding_mask": (ids != pad).astype("int32")}


def test_greedy_and_beam_search_match_transformers(family):
    name, _, model, tokenizer, ours = family
    if name == "nllb" and keras.config.backend() != "torch":
        # (One model class decodes both: its computation is checked on
        # every backend with M2M100's codes, NLLB-200's framing once.)
        pytest.skip("M2M100's checks the decoding on every backend; NLLB-200's runs in PyTorch's run")
    pad, offset = model.config.pad_token_id, 15
    sources = ours.preprocessor.generate_preprocess(TEXTS)
    ended, outputs = 0, []
    for target in TARGETS[name]:
        forced = tokenizer.convert_tokens_to_ids(target)
        greedy = ours.generate(_padded(sources, pad), sampler="greedy", max_length_offset=offset,
                               target_language=target)
        beam = ours.generate(_padded(sources, pad), beam_size=4, alpha=1.0, length_penalty="length",
                             max_length_offset=offset, target_language=target)
        for ids, ours_greedy, ours_beam in zip(sources, greedy, beam):
            budget = len(ids) + offset
            assert ours_greedy[0] == ours_beam[0] == forced
            assert ours_greedy == _hf_generate(model, ids, forced, num_beams=1, max_new_tokens=budget,
                                               bad_words_ids=[[pad]])
            assert ours_beam == _hf_generate(model, ids, forced, num_beams=4, length_penalty=1.0,
                                             max_new_tokens=budget, bad_words_ids=[[pad]])
            ended += len(ours_greedy) < budget
        outputs += greedy + beam
        strings = ours.generate(TEXTS, sampler="greedy", max_length_offset=offset, source_language=SOURCE[name],
                                target_language=target)
        assert strings == tokenizer.batch_decode(greedy, skip_special_tokens=True)
    assert 0 < ended < 2 * len(TEXTS)  # outputs that end, and outputs cut at the limit
    assert len({tuple(ids) for ids in outputs}) >= 4, outputs  # not one output for all


@once  # (the tokenizer, languages, files and errors: the same on every backend)
def test_languages_by_code_and_iso_alias(family, capsys):
    from keras_transformer.cli import main

    name, directory, _, _, ours = family
    german, french = TARGETS[name]
    assert german in ours.languages and french in ours.languages and SOURCE[name] in ours.languages
    texts = TEXTS[:3]
    expected = ours.generate(texts, sampler="greedy", source_language=SOURCE[name], target_language=french)
    assert ours.generate(texts, sampler="greedy", source_language="en", target_language="fr") == expected
    assert ours.generate(texts, sampler="greedy", source_language="eng", target_language="fra") == expected
    assert ours.generate(texts, sampler="greedy", source_language="en", target_language="de") != expected
    # The tokenizer's own languages (src_lang en, tgt_lang de) without arguments.
    assert ours.generate(texts, sampler="greedy") == ours.generate(
        texts, sampler="greedy", source_language="en", target_language="de")
    capsys.readouterr()
    main(["translate", "--preset", directory, "--beam-size", "1", "--from", "en", "--to", "fr", *texts])
    assert capsys.readouterr().out.splitlines() == expected
    with pytest.raises(ValueError, match=r"does not know the target_language 'fra_Latm'.*Close matches: fra_Latn"
                       if name == "nllb" else r"does not know the target_language '__fx__'. Close matches: .*__fr__"):
        ours.generate(texts, target_language="fra_Latm" if name == "nllb" else "__fx__")
    with pytest.raises(ValueError, match="does not know the source_language 'klingon'"):
        ours.generate(texts, source_language="klingon", target_language="de")
    if name == "nllb":
        with pytest.raises(ValueError, match="'zh' is ambiguous for this model: it has zho_Hans, zho_Hant"):
            ours.generate(texts, target_language="zh")


@once  # (the tokenizer, languages, files and errors: the same on every backend)
def test_one_pair_models_refuse_languages():
    from keras_transformer.models.transformer.languages import with_languages

    with pytest.raises(ValueError, match="translates one language pair: it takes no source_language"):
        with_languages(None, ["A dog."], None, "de", None)


@once  # (the tokenizer, languages, files and errors: the same on every backend)
def test_convert_writes_a_preset_with_languages_and_licence(family, tmp_path, capsys):
    from keras_transformer import presets
    from keras_transformer.cli import main
    from keras_transformer.models import M2M100Tokenizer
    from keras_transformer.models import TransformerSeq2SeqLM

    name, directory, _, _, ours = family
    preset = str(tmp_path / "preset")
    main(["convert", directory, preset])
    metadata = presets.read_metadata(preset)
    assert metadata["license"] == ("CC-BY-NC-4.0" if name == "nllb" else "MIT")
    assert metadata["language_codes"] == ours.languages
    # `presets` names the languages (and the licence) of a converted preset, and of a checkpoint.
    capsys.readouterr()
    count = len(ours.languages)
    for described in (preset, directory):
        main(["presets", described])
        out = capsys.readouterr().out
        assert f"languages: {count}, any to any ({', '.join(ours.languages[:6])}" in out, out
        assert f"license: {metadata['license']}" in out
    main(["presets", preset, "--languages"])
    assert " ".join(ours.languages[-3:]) in capsys.readouterr().out
    main(["presets"])
    assert "languages: en to de" in capsys.readouterr().out  # the shipped presets' pair
    converted = TransformerSeq2SeqLM.from_preset(preset)
    assert isinstance(converted.preprocessor.tokenizer, M2M100Tokenizer)
    assert converted.languages == ours.languages
    options = dict(sampler="greedy", source_language="en", target_language="fr")
    assert converted.generate(TEXTS[:3], **options) == ours.generate(TEXTS[:3], **options)


def _variant(directory, tmp_path, name, **changes):
    copy = tmp_path / name
    shutil.copytree(directory, copy)
    with open(copy / "config.json") as f:
        config = json.load(f)
    with open(copy / "config.json", "w") as f:
        json.dump({**config, **changes}, f)
    return str(copy)


@once  # (the tokenizer, languages, files and errors: the same on every backend)
def test_unsupported_variants_are_refused(family, tmp_path):
    from keras_transformer.cli import main
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    _, directory, _, _, _ = family
    with pytest.raises(PresetError, match="model_type 'nllb-moe' cannot be loaded: NLLB-MoE is a mixture"):
        TransformerSeq2SeqLM.from_preset(_variant(directory, tmp_path, "moe", model_type="nllb-moe"))
    with pytest.raises(PresetError, match="model_type 'bart' cannot be loaded.*Supported: marian"):
        TransformerBackbone.from_preset(_variant(directory, tmp_path, "bart", model_type="bart"))
    with pytest.raises(SystemExit, match="model_type 'bart' cannot be loaded"):
        main(["convert", str(tmp_path / "bart"), str(tmp_path / "out")])
    with pytest.raises(PresetError, match="unequal encoder and decoder depths"):
        TransformerSeq2SeqLM.from_preset(_variant(directory, tmp_path, "deep", decoder_layers=3))
    with pytest.raises(PresetError, match="an output projection not tied"):
        TransformerSeq2SeqLM.from_preset(_variant(directory, tmp_path, "untied", tie_word_embeddings=False))
    with pytest.raises(PresetError, match="do not fit num_layers=1"):
        TransformerBackbone.from_preset(directory, num_layers=1)
    os.remove(tmp_path / "deep" / "sentencepiece.bpe.model")
    with pytest.raises(PresetError, match="has no sentencepiece.bpe.model"):
        TransformerSeq2SeqLM.from_preset(_variant(str(tmp_path / "deep"), tmp_path, "no-spm", decoder_layers=2))


def _ctranslate2_greedy(directory, tokenizer, sources, target, offset, tmp_path):
    """CTranslate2's greedy outputs (ids, the target code first) of the
    transformers directory `directory`, converted by its own converter."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    converted = str(tmp_path / "ct2")
    if not os.path.isdir(converted):
        ctranslate2.converters.TransformersConverter(directory).convert(converted)
    translator = ctranslate2.Translator(converted, device="cpu")
    return [
        tokenizer.convert_tokens_to_ids(translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids)], target_prefix=[[target]], beam_size=1,
            max_decoding_length=len(ids) + offset)[0].hypotheses[0])
        for ids in sources
    ]


@once  # (a write-out reads the weights as numbers, the same on every backend)
def test_write_out_loads_in_transformers_and_ctranslate2(family, tmp_path, capsys):
    """`export-transformers` writes an m2m_100 directory: transformers'
    model and tokenizer load it (the tokenizer class of the family, the same
    ids; logits within 1e-4; greedy outputs with the default target language
    of generation_config.json), CTranslate2 converts it and translates as
    this package for two target languages, and this package reads it back."""
    from keras_transformer.cli import main
    from keras_transformer.convert import export_m2m100
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLM

    name, directory, _, _, ours = family
    out = str(tmp_path / "exported")
    main(["export-transformers", "--preset", directory, out])
    assert capsys.readouterr().out.strip() == f"Wrote the m2m_100 model to {out}"
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "M2M100ForConditionalGeneration"
    assert type(tokenizer).__name__.startswith({"m2m100": "M2M100Tokenizer", "nllb": "NllbTokenizer"}[name])
    sources = ours.preprocessor.generate_preprocess(TEXTS)
    assert [tokenizer(text).input_ids for text in TEXTS] == sources
    assert _logits_difference(model, tokenizer, ours) < 1e-4
    offset, pad = 15, model.config.pad_token_id
    # generation_config.json: decoding from </s>, the tokenizer's target language forced first.
    expected = ours.generate(_padded(sources, pad), sampler="greedy", max_length_offset=offset)
    assert [_hf_generate(model, ids, None, num_beams=1, max_new_tokens=len(ids) + offset) for ids in sources] == expected
    outputs = []
    for target in TARGETS[name]:
        expected = ours.generate(_padded(sources, pad), sampler="greedy", max_length_offset=offset, target_language=target)
        assert _ctranslate2_greedy(out, tokenizer, sources, target, offset, tmp_path) == expected, target
        outputs += expected
    assert len({tuple(ids) for ids in outputs}) >= 4, outputs  # not one output for all
    again = TransformerSeq2SeqLM.from_preset(out)
    assert again.languages == ours.languages
    for mine, theirs in zip(ours.backbone.weights, again.backbone.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(theirs), keras.ops.convert_to_numpy(mine))
    assert again.generate(TEXTS, sampler="greedy", target_language="fr") == ours.generate(
        TEXTS, sampler="greedy", target_language="fr")
    # What m2m_100 cannot hold is refused before anything is written.
    post_norm = TransformerBackbone.from_config({**ours.backbone.get_config(), "normalize_first": False})
    with pytest.raises(PresetError, match="m2m_100 cannot hold this model: it has post-norm layers"):
        export_m2m100(TransformerSeq2SeqLM(post_norm, ours.preprocessor), tmp_path / "post-norm")
    assert not (tmp_path / "post-norm").exists()


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="the SavedModel export runs in TensorFlow")
def test_saved_model_takes_the_languages_as_inputs(family, tmp_path):
    """The SavedModel of a multilingual model takes `source_language` and
    `target_language` (one for all texts or one each; "" for the model's
    own) and translates as `generate` does, searched in the graph (M2M100)
    and compiled by XLA (NLLB-200)."""
    import tensorflow as tf

    from keras_transformer.export import export_saved_model

    name, _, _, _, ours = family
    german, french = TARGETS[name]
    options = dict(beam_size=2, max_length_offset=10)
    by_target = {target: ours.generate(TEXTS, **options, target_language=target) for target in (german, french)}
    mixed = [(german, french, "de", "fr")[i % 4] for i in range(len(TEXTS))]
    expected = [by_target[(german, french)[i % 2]][i] for i in range(len(TEXTS))]
    assert by_target[german] != by_target[french]
    for jit_compile in (name == "nllb",):  # (the graph's search for one family, XLA's for the other)
        directory = export_saved_model(ours, str(tmp_path / f"saved-{jit_compile}"), jit_compile=jit_compile, **options)
        translate = tf.saved_model.load(directory).signatures["serving_default"]

        def strings(target, source=""):
            outputs = translate(text=tf.constant(TEXTS), source_language=tf.constant([source]),
                                target_language=tf.constant(target))["translations"].numpy()
            return [output.decode("utf-8") for output in outputs]

        assert strings(mixed) == expected
        assert strings(["FR"], source="eng") == by_target[french]
        assert strings([""]) == by_target[german]  # the tokenizer's target language (tgt_lang)
        with pytest.raises(tf.errors.InvalidArgumentError, match="does not know a target_language given"):
            strings(["klingon"])


@once  # (the loader streams the same on every backend; benchmarks/load_memory.py measures each)
def test_a_checkpoint_loads_within_one_and_a_half_times_its_size(tmp_path_factory):
    """`from_preset` of a 231 MiB checkpoint that transformers builds
    (d_model 512, 6+6 layers, 32,000 tokens) peaks at most 1.5x its
    float32 size above the memory before it (the high-water mark of a
    process of its own, `benchmarks/load_memory.py`):
    the tensors are read one at a time, the embeddings a block of rows at
    a time (reading the whole file first and converting it peaked at
    3.1x)."""
    import subprocess
    import sys

    from conftest import ROOT
    from m2m100_fixture import save_sized

    root = tmp_path_factory.mktemp("memory")
    tiny = save_tiny(str(root / "tiny"), "m2m100")
    directory = save_sized(str(root / "sized"), tiny, d_model=512, encoder_layers=6, decoder_layers=6,
                           encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                           decoder_ffn_dim=2048, vocab_size=32000)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "load_memory.py"), "--probe", directory,
                             tiny], capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "torch"})
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["float32_bytes"] > 200 * 2**20
    assert row["peak"] <= 1.5, row


@once  # (the framing is the same on every backend; fit itself is tested on each in test_seq2seq_lm.py)
def test_fine_tuning_on_a_new_pair_frames_the_languages_as_fairseq(family, multi30k_dir, tmp_path):
    """`fit(..., source_language="en", target_language="fr")` on a few
    Multi30k en-fr pairs: the preprocessor frames them as transformers'
    tokenizer does (sources `[eng_Latn] text </s>`, labels `[fra_Latn]
    text </s>`, decoder inputs `</s> [fra_Latn] text`), so that the loss
    equals transformers' own on the same pairs; the loss drops, generate
    still forces the target code, and the fine-tuned model writes out as
    an m2m_100 directory that transformers reads with the same logits."""
    from keras_transformer.convert import export_m2m100
    from keras_transformer.datasets import multi30k
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor

    name, directory, model, tokenizer, _ = family
    if name != "nllb":
        pytest.skip("the framing is the family's: checked once, with NLLB-200's codes")
    sources, targets = multi30k.load("train", "en", "fr", data_dir=multi30k_dir)
    sources, targets = sources[:16], targets[:16]
    # (A model of its own, trained; sequences as long as the pairs need: 96 tokens.)
    ours = TransformerSeq2SeqLM.from_preset(directory, preprocessor=TransformerSeq2SeqLMPreprocessor.from_preset(
        directory, encoder_sequence_length=96, decoder_sequence_length=96))
    x = {"encoder_text": sources, "decoder_text": targets}
    framed = ours.preprocessor(*[_framed(ours, x)])[0:2]
    tokenizer.src_lang, tokenizer.tgt_lang = "eng_Latn", "fra_Latn"
    theirs = tokenizer(sources, text_target=targets)
    special = ours.special_token_ids
    for row, (ids, labels) in enumerate(zip(theirs["input_ids"], theirs["labels"])):
        ids_ours = keras.ops.convert_to_numpy(framed[0]["encoder_token_ids"][row]).tolist()
        labels_ours = keras.ops.convert_to_numpy(framed[1][row]).tolist()
        assert ids_ours[: len(ids)] == ids and labels_ours[: len(labels)] == labels
        decoder = keras.ops.convert_to_numpy(framed[0]["decoder_token_ids"][row]).tolist()
        assert decoder[: len(labels)] == [special.start, *labels[:-1]]
    # The loss without label smoothing is transformers' (their decoder inputs from the labels).
    ours.compile(optimizer=keras.optimizers.Adam(3e-3), loss=LabelSmoothedCrossEntropy(0.0, ignore_class=special.pad))
    before = ours.evaluate(x, batch_size=16, source_language="en", target_language="fr", verbose=0, return_dict=True)
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == special.pad] = -100  # (as transformers' DataCollatorForSeq2Seq)
    with torch.no_grad():
        expected = model(**batch).loss.item()
    assert before["loss"] == pytest.approx(expected, rel=1e-4)
    history = ours.fit(x, batch_size=8, epochs=8, source_language="en", target_language="fr", verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0], losses
    french = tokenizer.convert_tokens_to_ids("fra_Latn")
    outputs = ours.generate(_padded(ours.preprocessor.generate_preprocess(sources[:4]), special.pad),
                            sampler="greedy", source_language="en", target_language="fr", max_length_offset=10)
    assert all(ids[0] == french for ids in outputs)
    exported = transformers.AutoModelForSeq2SeqLM.from_pretrained(export_m2m100(ours, tmp_path / "tuned")).eval()
    assert _logits_difference(exported, tokenizer, ours) < 1e-4


def _framed(model, x):
    from keras_transformer.models.transformer.languages import with_pair_languages

    return with_pair_languages(model.preprocessor.tokenizer, x, "en", "fr")


@once  # (the run's framing and files; fit's framing is checked on every backend above)
def test_a_training_run_from_a_multilingual_preset_learns_the_pair(family, multi30k_dir, tmp_path, capsys):
    """`train --from-preset PRESET --source en --target fr` (or
    `--source-language` / `--target-language` as the model names them):
    the run's batches are framed with the codes, the run keeps the
    imported tokenizer to resume with, and the saved model translates
    into the target language by default."""
    from keras_transformer import presets
    from keras_transformer.cli import main
    from keras_transformer.data.batching import tokenize_pairs
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.training import train_multi30k

    name, directory, _, tokenizer, ours = family
    if name != "nllb":
        pytest.skip("the run's framing is the family's: checked once, with NLLB-200's codes")
    preset, run = str(tmp_path / "preset"), str(tmp_path / "run")
    main(["convert", directory, preset])
    with pytest.raises(SystemExit, match="does not know the source_language 'klingon'"):
        main(["train", "--output-dir", run, "--from-preset", preset, "--source-language", "klingon", "--data-dir",
              multi30k_dir, "--target", "fr", "--limit", "8"])
    assert not os.path.exists(run)  # (a failed start leaves nothing)
    settings = dict(data_dir=multi30k_dir, initial_preset=preset, source="en", target="fr", target_language="fra_Latn",
                    limit=32, validation_limit=16, bleu_sentences=0, max_tokens=512, warmup_steps=10, initial_step=0,
                    verbose=0)
    model, history = train_multi30k(run, epochs=1, **settings)
    assert os.path.isdir(os.path.join(run, "tokenizer")) and not os.path.exists(os.path.join(run, "tokenizer.spm"))
    model, history = train_multi30k(run, epochs=2, **settings)  # resumed, with the kept tokenizer
    assert len(history.history["loss"]) == 1
    saved = TransformerSeq2SeqLM.from_preset(os.path.join(run, "model"))
    kept = saved.preprocessor.tokenizer
    assert (kept.source_language, kept.target_language) == ("eng_Latn", "fra_Latn")
    assert presets.read_metadata(os.path.join(run, "model"))["languages"] == {"source": "en", "target": "fr"}
    # The pairs as transformers' tokenizer frames them.
    tokenizer.src_lang, tokenizer.tgt_lang = "eng_Latn", "fra_Latn"
    sources, targets = ["A dog runs."], ["Un chien court."]
    encoder_ids, decoder_ids, _ = tokenize_pairs(sources, targets, kept)
    theirs = tokenizer(sources, text_target=targets)
    assert [list(ids) for ids in encoder_ids] == theirs["input_ids"]
    assert [list(ids) for ids in decoder_ids] == [[ours.special_token_ids.start, *theirs["labels"][0]]]
    french = tokenizer.convert_tokens_to_ids("fra_Latn")
    sources = saved.preprocessor.generate_preprocess(TEXTS[:2])
    assert all(ids[0] == french for ids in saved.generate(_padded(sources, 1), sampler="greedy", max_length_offset=5))

"""Bad or hostile input ends in a clear error that names the problem, never
in a traceback, a silently wrong result or the loss of the user's files."""

import errno
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import warnings

import keras
import pytest

from keras_transformer import cli
from keras_transformer import cli_io
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models import TransformerTokenizer
from keras_transformer.presets import PresetError
from keras_transformer.utils.files import DiskFullError

from helpers import once
from legacy_int8 import save_legacy_preset

TEXTS = ["A dog runs.", "Two men play soccer."]


@pytest.fixture
def preset(small_tokenizer, tmp_path):
    """A two-layer model saved as a preset: `(model, directory)`."""
    backbone = TransformerBackbone(
        small_tokenizer.vocabulary_size(), num_layers=2, d_model=32, d_ff=64, num_heads=2,
        dropout=0.0, max_sequence_length=48,
    )
    model = TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(small_tokenizer, 24, 24))
    model.save_to_preset(tmp_path / "preset")
    return model, str(tmp_path / "preset")


def _stdin(monkeypatch, data):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape"))


# --- Text ---


def test_text_that_is_not_utf8_names_the_line(preset, monkeypatch, tmp_path, capsys):
    model, directory = preset
    _stdin(monkeypatch, b"A dog runs.\n\xff\xfe bad\n")
    with pytest.raises(SystemExit, match="error: line 2 of standard input is not valid UTF-8"):
        cli.main(["translate", "--preset", directory, "--beam-size", "1"])
    _stdin(monkeypatch, bytes(range(128, 256)) * 10)
    with pytest.raises(SystemExit, match="error: line 1 of standard input is not valid UTF-8"):
        cli.main(["translate", "--preset", directory, "--beam-size", "1"])
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("A dog runs.\nÜber alles.\n".encode("latin-1"))
    with pytest.raises(SystemExit, match="error: line 2 of .*latin1.txt is not valid UTF-8"):
        cli.main(["translate", "--preset", directory, "-i", str(latin1)])
    # In Python: lone surrogates (bytes decoded with 'surrogateescape', as
    # sys.argv is) and bytes that are not UTF-8.
    with pytest.raises(ValueError, match="Text 1 holds '\\\\udcff' at character 6.*lone surrogate"):
        model.generate(["A dog.", "A dog \udcff runs."], sampler="greedy")
    with pytest.raises(ValueError, match="Text 0 is not valid UTF-8"):
        model.generate([b"\xff dog"], sampler="greedy")


@once
def test_a_byte_order_mark_is_not_translated(preset, tmp_path, capsys):
    model, directory = preset
    assert cli_io.decode_lines(b"\xef\xbb\xbfA dog runs.\r\nA cat.\n", "f") == ["A dog runs.", "A cat."]
    with_bom = tmp_path / "bom.txt"
    with_bom.write_bytes("\ufeffA dog runs.\n".encode("utf-8"))
    cli.main(["translate", "--preset", directory, "--beam-size", "1", "-i", str(with_bom)])
    assert capsys.readouterr().out == model.generate(["A dog runs."], sampler="greedy")[0] + "\n"


def test_generate_says_what_it_takes(preset):
    model, _ = preset
    for bad in (None, 5, 2.5):
        with pytest.raises(TypeError, match="generate\\(\\) takes a string, a list of strings"):
            model.generate(bad)
    for alpha in (float("nan"), float("inf"), -1.0, "0.6"):
        with pytest.raises(ValueError, match="alpha .* must be a finite number >= 0"):
            model.generate(TEXTS, alpha=alpha)
    # Greedy decoding has no length penalty, but a bad value is still a mistake.
    with pytest.raises(ValueError, match="alpha .* must be a finite number >= 0"):
        model.generate(TEXTS, sampler="greedy", alpha=float("nan"))


def test_export_refuses_bad_settings_before_any_work(preset, tmp_path):
    from keras_transformer.export import export_saved_model

    model, _ = preset
    for alpha in ("0.6", float("inf")):
        with pytest.raises(ValueError, match="alpha .* must be a finite number >= 0"):
            export_saved_model(model, str(tmp_path / "exported"), alpha=alpha)
    # An ensemble's export of a preset (or model) of one model.
    for one_model in preset:
        with pytest.raises(ValueError, match=r"ensemble=True \(--ensemble\) exports an ensemble preset's models"):
            export_saved_model(one_model, str(tmp_path / "exported"), ensemble=True)
    assert not os.path.exists(tmp_path / "exported")


def test_cli_refuses_infinite_numbers(preset, capsys):
    _, directory = preset
    for option in (["--alpha", "inf"], ["--alpha", "nan"], ["--alpha=-inf"]):
        with pytest.raises(SystemExit):
            cli.main(["translate", "--preset", directory, *option, "A dog."])
        assert "argument --alpha: must be" in capsys.readouterr().err


# --- Presets ---


def test_a_vocabulary_of_another_size_is_refused(preset, multi30k_train):
    _, directory = preset
    sources, targets = multi30k_train
    other = TransformerTokenizer.from_texts(sources[:2000] + targets[:2000], vocabulary_size=600)
    with open(os.path.join(directory, "assets", "tokenizer", "vocabulary.spm"), "wb") as f:
        f.write(other.proto)
    for cls in (TransformerSeq2SeqLM, TransformerSeq2SeqLMPreprocessor):
        with pytest.raises(PresetError, match="vocabulary.spm' has 600 pieces, but the model .* has vocabulary_size 1000"):
            cls.from_preset(directory)


def test_damaged_weights_are_a_preset_error(preset):
    _, directory = preset
    weights = os.path.join(directory, "model.weights.h5")
    with open(weights, "r+b") as f:  # HDF5's own structures (a B-tree node), not a tensor
        f.seek(6144)
        f.write(b"\xff" * 16)
    with pytest.raises(PresetError, match="SHA-256"):  # checked before the file is walked
        TransformerSeq2SeqLM.from_preset(directory)
    _edit_json(directory, "metadata.json", lambda m: m.pop("weights_sha256"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no SHA-256 recorded
        with pytest.raises(PresetError, match="model.weights.h5' is corrupt or truncated"):
            TransformerSeq2SeqLM.from_preset(directory)


def test_checksums_malformed_or_missing(preset):
    model, directory = preset
    _edit_json(directory, "metadata.json", lambda m: m.update(weights_sha256={"model.weights.h5": "abc"}))
    with pytest.raises(PresetError, match="malformed 'weights_sha256'"):
        TransformerSeq2SeqLM.from_preset(directory)
    os.remove(os.path.join(directory, "metadata.json"))
    with pytest.warns(UserWarning, match="records no SHA-256 of its weights"):
        TransformerSeq2SeqLM.from_preset(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per directory
        TransformerSeq2SeqLM.from_preset(directory)


def test_a_config_that_does_not_fit_the_weights_is_refused(preset):
    _, directory = preset
    _set_in_model_configs(directory, "num_layers", 1)
    with pytest.raises(PresetError, match=r"do not fit the model .*config.json.* hold \d+ variables, .* has \d+ \(num_layers: 1\)"):
        TransformerSeq2SeqLM.from_preset(directory)
    with pytest.raises(PresetError, match="do not fit"):
        TransformerBackbone.from_preset(directory)


def test_weights_of_other_shapes_than_the_config_are_refused(preset):
    """Same variables, other sizes (a config edited to another d_ff): Keras
    refuses the shapes; the error names the weights and the config."""
    _, directory = preset
    _set_in_model_configs(directory, "d_ff", 128)
    for cls in (TransformerSeq2SeqLM, TransformerBackbone):
        with pytest.raises(PresetError, match=r"weights in .*model.weights.h5' do not fit the model in .*config.json'"):
            cls.from_preset(directory)


def test_crafted_presets_are_refused_with_the_file(preset):
    _, directory = preset
    original = _read_json(directory, "config.json")
    lambda_layer = {
        "module": "keras.layers", "class_name": "Lambda", "registered_name": "keras_transformer>TransformerBackbone",
        "config": {"function": {"class_name": "__lambda__", "config": {"code": "print('hello')"}}},
    }
    _write_json(directory, "config.json", lambda_layer)
    with pytest.raises(PresetError, match="config.json' names 'Lambda' as 'keras_transformer>TransformerBackbone'"):
        TransformerSeq2SeqLM.from_preset(directory)
    # A class of the package with an argument Keras refuses: Keras' own
    # error, at the preset boundary.
    _write_json(directory, "config.json", original)
    original_task = _read_json(directory, "task.json")
    _set_in_model_configs(directory, "activation", "bogus")
    with pytest.raises(PresetError, match="cannot be built from its config files.*bogus"):
        TransformerBackbone.from_preset(directory)
    _write_json(directory, "config.json", original)
    _write_json(directory, "task.json", original_task)
    _edit_json(directory, "tokenizer.json", lambda t: t["config"].update(proto="/etc/passwd"))
    with pytest.raises(PresetError, match="tokenizer.json' gives the tokenizer's 'proto'"):
        TransformerTokenizer.from_preset(directory)


@once
def test_a_save_replaces_no_files_of_the_users(preset, tmp_path, monkeypatch):
    """A directory with files named as a preset's (its own config.json, an
    assets/ folder) but no preset is not saved into; a preset is."""
    from helpers import directory_contents

    model, directory = preset
    project = tmp_path / "project"
    (project / "assets" / "img").mkdir(parents=True)
    (project / "assets" / "img" / "logo.png").write_bytes(b"png")
    (project / "config.json").write_text('{"app": 1}')
    (project / "notes.md").write_text("notes")
    before = directory_contents(project)
    with pytest.raises(PresetError, match=r"holds assets, config.json, which a save would replace, but no preset"):
        model.save_to_preset(project)
    assert directory_contents(project) == before
    for nowhere in ("", None):
        with pytest.raises(PresetError, match="give the path of a directory"):
            model.save_to_preset(nowhere)
    model.save_to_preset(directory)  # an earlier save's preset: replaced
    # "~" is the home directory, as in a shell.
    monkeypatch.setenv("HOME", str(tmp_path))
    model.save_to_preset("~/home-preset")
    assert os.path.isfile(tmp_path / "home-preset" / "config.json")
    assert TransformerBackbone.from_preset("~/home-preset").count_params() == model.backbone.count_params()


@once
def test_export_marian_overwrites_an_earlier_export_only(preset, tmp_path):
    pytest.importorskip("safetensors")
    from helpers import directory_contents

    from keras_transformer.convert import export_marian

    model, _ = preset
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.json").write_text('{"app": 1}')
    before = directory_contents(project)
    with pytest.raises(FileExistsError, match="holds no Marian model"):
        export_marian(model, project, overwrite=True)
    assert directory_contents(project) == before
    export_marian(model, tmp_path / "marian")
    # Weights of another format from an earlier write would be read by
    # some loaders instead of the new ones: they go.
    (tmp_path / "marian" / "pytorch_model.bin").write_bytes(b"old weights")
    (tmp_path / "marian" / "NOTES.md").write_text("mine")
    export_marian(model, tmp_path / "marian", overwrite=True)
    assert json.loads((tmp_path / "marian" / "config.json").read_text())["model_type"] == "marian"
    assert not (tmp_path / "marian" / "pytorch_model.bin").exists()
    assert (tmp_path / "marian" / "NOTES.md").read_text() == "mine"


@once
def test_export_marian_refuses_what_marian_cannot_hold(preset, tmp_path):
    pytest.importorskip("safetensors")
    from keras_transformer.convert import export_marian

    model, _ = preset
    # transformers' Marian LayerNorms use 1e-5, whatever the config says.
    config = {**model.backbone.get_config(), "layer_norm_epsilon": 1e-6}
    other = TransformerSeq2SeqLM(TransformerBackbone.from_config(config), model.preprocessor)
    with pytest.raises(PresetError, match="layer_norm_epsilon=1e-06 .Marian's LayerNorms use 1e-5"):
        export_marian(other, tmp_path / "epsilon")
    # Keras' int8 kernels are not float weights: refused, not written.
    quantized = TransformerSeq2SeqLM(TransformerBackbone.from_config(model.backbone.get_config()), model.preprocessor)
    quantized.quantize("int8")
    with pytest.raises(PresetError, match="computes with quantized ones .*before `quantize`"):
        export_marian(quantized, tmp_path / "int8")
    assert not (tmp_path / "epsilon").exists() and not (tmp_path / "int8").exists()


@once
def test_translate_refuses_to_write_over_its_input(preset, tmp_path):
    _, directory = preset
    sources = tmp_path / "captions.en"
    sources.write_text("A dog runs.\n")
    with pytest.raises(SystemExit, match="is the --input file: its sentences would be replaced"):
        cli.main(["translate", "--preset", directory, "-i", str(sources), "-o", str(sources)])
    assert sources.read_text() == "A dog runs.\n"


@once
def test_generate_checks_its_counts_token_ids_and_ensemble(preset):
    import numpy as np

    model, _ = preset
    for name, value in (("beam_size", 2.5), ("beam_size", "4"), ("beam_size", True), ("batch_size", 1.5),
                        ("max_length_offset", 2.5), ("max_length_offset", None)):
        with pytest.raises(TypeError, match=f"{name} must be an integer, got {value!r}"):
            model.generate(TEXTS, **{name: value})
    with pytest.raises(ValueError, match="beam_size must be at least 1, got 0"):
        model.generate(TEXTS, beam_size=0)
    vocabulary_size = model.backbone.vocabulary_size

    def ids(token_ids, mask=None):
        token_ids = np.asarray(token_ids)
        return {"encoder_token_ids": token_ids,
                "encoder_padding_mask": np.ones(token_ids.shape, bool) if mask is None else np.asarray(mask)}

    for inputs, error, message in (
        (ids([5, 6, 7]), ValueError, r"shape \(batch, length\), got \(3,\); for one source, add a batch axis"),
        (ids([[5.0, 6.5]]), TypeError, "encoder_token_ids must hold integers, got float64"),
        (ids([[5, vocabulary_size]]), ValueError, rf"holds {vocabulary_size}, outside the vocabulary \[0, {vocabulary_size}\)"),
        (ids([[5, -1]]), ValueError, "holds -1, outside the vocabulary"),
        (ids([[5, 6, 7]], [[1, 1]]), ValueError, r"encoder_padding_mask has the shape \(1, 2\), encoder_token_ids \(1, 3\)"),
    ):
        with pytest.raises(error, match=message):
            model.generate(inputs)
    # An id outside the vocabulary under the padding mask is padding.
    assert model.generate(ids([[5, 6, vocabulary_size]], [[1, 1, 0]]), sampler="greedy") == model.generate(
        ids([[5, 6]]), sampler="greedy")
    for ensemble, message in (("abc", "ensemble must be a list of TransformerSeq2SeqLM models, got str"),
                              ([model.backbone], r"ensemble\[0\] is a TransformerBackbone, not a TransformerSeq2SeqLM")):
        with pytest.raises(TypeError, match=message):
            model.generate(TEXTS, ensemble=ensemble)


@once
def test_an_ensemble_of_models_of_other_languages_is_refused(preset, tmp_path):
    model, _ = preset
    for source, target in (("en", "de"), ("de", "en")):
        model.save_to_preset(tmp_path / f"{source}-{target}", metadata={"languages": {"source": source, "target": target}})
    en_de, de_en = (TransformerSeq2SeqLM.from_preset(tmp_path / pair) for pair in ("en-de", "de-en"))
    with pytest.raises(ValueError, match="Ensemble model 1 translates en-de, model 0 de-en: .* the same languages"):
        de_en.generate(TEXTS, ensemble=[en_de])
    with pytest.raises(ValueError, match="the same languages"):
        de_en.set_ensemble_members([en_de])
    assert not de_en.ensemble_members
    de_en.set_ensemble_members([TransformerSeq2SeqLM.from_preset(tmp_path / "de-en"), model])  # languages unknown: kept


@once
def test_from_preset_refuses_unknown_keywords_and_dtypes(preset):
    _, directory = preset
    with pytest.raises(TypeError, match="unexpected keyword argument 'load_ensembl' \\(did you mean 'load_ensemble'\\?\\)"):
        TransformerSeq2SeqLM.from_preset(directory, load_ensembl=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dropuot' \\(did you mean 'dropout'\\?\\)"):
        TransformerBackbone.from_preset(directory, dropuot=0.2)
    assert TransformerBackbone.from_preset(directory, dropout=0.2).dropout == 0.2
    for dtype in ("float17", "int8", "int8_from_float32"):
        with pytest.raises(ValueError, match=f"dtype={dtype!r} is not a dtype to load a model in"):
            TransformerSeq2SeqLM.from_preset(directory, dtype=dtype)


@once
def test_the_models_refuse_keywords_they_do_not_take(preset):
    # keras.Model's functional constructor drops unknown keywords: keras-hub's
    # hidden_dim used to build a model of the default width, 512.
    model, _ = preset
    with pytest.raises(TypeError, match="unexpected keyword argument 'hidden_dim'; did you mean 'd_model'"):
        TransformerBackbone(100, num_layers=1, num_heads=2, hidden_dim=16, d_ff=32)
    with pytest.raises(TypeError, match="'num_head'; did you mean 'num_heads'"):
        TransformerBackbone(100, num_layers=1, num_head=2)
    with pytest.raises(TypeError, match="TransformerSeq2SeqLM.. got an unexpected keyword argument 'tokenizer'"):
        TransformerSeq2SeqLM(model.backbone, tokenizer=model.preprocessor.tokenizer)
    # What keras.Model takes still passes, and configs still round-trip.
    assert TransformerSeq2SeqLM(model.backbone, name="named", trainable=False).name == "named"
    assert TransformerSeq2SeqLM(model.backbone, compile=False).compiled is False  # keras-hub Task's keyword
    _, directory = preset
    assert TransformerSeq2SeqLM.from_preset(directory, compile=False).compiled is False
    assert TransformerSeq2SeqLM.from_preset(directory).compiled is True
    assert TransformerBackbone.from_config(model.backbone.get_config()).d_model == 32


@once
def test_fit_evaluate_and_predict_say_what_data_they_take(preset):
    # Checked before the data goes into tf.data, whose traceback buried the
    # preprocessor's message (or which failed on lists of other lengths).
    model, _ = preset
    with pytest.raises(ValueError, match="^fit: .*takes a dict with keys 'encoder_text' .*got list as x and targets as y"):
        model.fit(TEXTS, ["Ein Hund rennt."], epochs=1, verbose=0)
    with pytest.raises(ValueError, match="^fit: encoder_text has 2 texts, decoder_text 1 text"):
        model.fit({"encoder_text": TEXTS, "decoder_text": ["Ein Hund rennt."]}, epochs=1, verbose=0)
    for method in (model.evaluate, model.predict):
        with pytest.raises(ValueError, match="got list. To translate sources, call generate"):
            method(TEXTS, verbose=0)
    # A dict with the wrong keys is not sources to translate: no such hint.
    with pytest.raises(ValueError, match="got a dict with keys \\['source'\\]\\.$"):
        model.evaluate({"source": TEXTS}, verbose=0)
    pairs = {"encoder_text": TEXTS, "decoder_text": ["Ein Hund rennt.", "Zwei Männer spielen Fußball."]}
    with pytest.raises(ValueError, match="^fit: validation_data: .*got list as x and targets as y"):
        model.fit(pairs, epochs=1, verbose=0, validation_data=(TEXTS, ["Ein Hund rennt."]))
    with pytest.raises(ValueError, match="^fit: validation_data: encoder_text has 2 texts, decoder_text 1"):
        model.fit(pairs, epochs=1, verbose=0, validation_data={"encoder_text": TEXTS, "decoder_text": ["Ein Hund."]})
    # keras-hub's positional order: x, y, batch_size, sample_weight.
    assert len(model.evaluate(pairs, None, 2, verbose=0)) == 2  # loss and accuracy
    assert model.predict(pairs, 2, verbose=0).shape[:2] == (2, 24)
    history = model.fit(pairs, None, 2, None, pairs, epochs=1, verbose=0)
    assert "val_loss" in history.history
    assert "val_loss" in model.fit(pairs, epochs=1, verbose=0, validation_data=[pairs]).history  # a list, as Keras
    with pytest.raises(ValueError, match="give shuffle by name"):
        model.fit(pairs, None, 2, None, False, epochs=1, verbose=0)


@once
def test_detokenize_names_an_id_outside_the_vocabulary(small_tokenizer):
    size = small_tokenizer.vocabulary_size()
    ids = small_tokenizer.tokenize(TEXTS)
    assert small_tokenizer.detokenize(ids) == TEXTS
    for bad, given in ((size, [[5, size]]), (-1, [-1, 5]), (size + 3, [list(ids[0]), [5, size + 3]])):
        with pytest.raises(ValueError, match=f"Token id {bad} is outside the vocabulary of {size} ids .0 to {size - 1}"):
            small_tokenizer.detokenize(given)


def test_a_sequence_longer_than_the_learned_positions_is_refused():
    # keras-hub's position table gave each backend's own broadcast error.
    import numpy as np

    backbone = TransformerBackbone(
        50, num_layers=1, num_heads=2, d_model=16, d_ff=32, max_sequence_length=8, position_encoding="learned"
    )

    def inputs(length):
        ids = np.ones((1, length), "int32")
        return {"encoder_token_ids": ids, "encoder_padding_mask": ids, "decoder_token_ids": ids,
                "decoder_padding_mask": ids}

    assert tuple(backbone(inputs(8))["decoder_sequence_output"].shape) == (1, 8, 16)
    with pytest.raises(ValueError, match="A sequence of 12 positions is longer than the 8 learned positions"):
        backbone(inputs(12))


@once
def test_an_incomplete_int8_or_ensemble_preset_names_its_missing_file(preset, tmp_path):
    model, _ = preset
    model.set_ensemble_members([model])
    # (The index of an earlier version's int8 archive: tests/legacy_int8.py.)
    save_legacy_preset(model, tmp_path / "int8")
    model.set_ensemble_members([])
    complete = tmp_path / "complete"
    shutil.copytree(tmp_path / "int8", complete)

    def broken(name, change):
        directory = tmp_path / name
        shutil.copytree(complete, directory)
        change(str(directory))
        return directory

    for directory, message in (
        (broken("no-index", lambda d: os.remove(os.path.join(d, "model.weights.json"))),
         "stores its weights in int8 but has no model.weights.json"),
        (broken("index", lambda d: _edit_json(d, "model.weights.json", lambda j: j.update(weights_storage="int3"))),
         "model.weights.json' is corrupt: it gives weights_storage='int3'"),
        (broken("no-metadata", lambda d: os.remove(os.path.join(d, "metadata.json"))),
         "has an ensemble/ folder but no metadata.json"),
        (broken("itself", lambda d: _edit_json(d, "metadata.json", lambda m: m.update(ensemble=["."]))),
         "lists itself \\('.'\\) as one of its ensemble's other models"),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no SHA-256 recorded, without metadata.json
            with pytest.raises(PresetError, match=message):
                TransformerSeq2SeqLM.from_preset(directory)
    assert len(TransformerSeq2SeqLM.from_preset(complete).ensemble_members) == 1


@once
def test_sources_and_targets_must_pair_up(preset):
    model, _ = preset
    with pytest.raises(ValueError, match="encoder_text has 2 texts, decoder_text 1 text: each source needs its target"):
        model.preprocessor({"encoder_text": TEXTS, "decoder_text": TEXTS[:1]})


@once
def test_a_directory_named_as_a_shipped_preset_is_warned_of(tmp_path, monkeypatch):
    from keras_transformer.presets import registry

    name = next(iter(registry.shipped_directories()))
    monkeypatch.chdir(tmp_path)
    os.mkdir(name)
    monkeypatch.setattr(registry, "_warned_shadowed", set())
    with pytest.warns(UserWarning, match=f"names a preset shipped with keras_transformer.*pass '\\./{name}'"):
        assert registry.resolve(name) == registry.shipped_directories()[name]


@once
def test_convert_says_what_its_source_is(preset, tmp_path):
    from keras_transformer.convert import marian

    _, directory = preset
    with pytest.raises(PresetError, match="does not exist: give a Marian checkpoint's directory"):
        marian.convert(str(tmp_path / "missing"), str(tmp_path / "out"))
    with pytest.raises(PresetError, match="is already a preset of keras_transformer"):
        marian.convert(directory, str(tmp_path / "out"))


def _read_json(directory, name):
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        return json.load(f)


def _write_json(directory, name, content):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        json.dump(content, f)


def _set_in_model_configs(directory, key, value):
    """Sets `key` wherever it appears in the backbone's config, in both
    `config.json` and `task.json`: a config edited by hand."""

    def edit(config):
        for item in _dicts(config):
            if key in item:
                item[key] = value

    for name in ("config.json", "task.json"):
        _edit_json(directory, name, edit)


def _edit_json(directory, name, edit):
    content = _read_json(directory, name)
    edit(content)
    _write_json(directory, name, content)


def _dicts(value):
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _dicts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _dicts(item)


# --- Full disks and the user's files ---


def test_a_full_disk_is_said_and_leaves_the_preset_as_it_was(preset, monkeypatch, tmp_path):
    model, directory = preset
    before = {name: os.path.getmtime(os.path.join(directory, name)) for name in os.listdir(directory)}
    for error in (
        OSError(errno.ENOSPC, "No space left on device"),
        # h5py's and TensorFlow's wording, in other exception types.
        RuntimeError("Can't write data (file write failed: errno = 28, error message = 'No space left on device')"),
    ):
        def fail(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(TransformerSeq2SeqLMPreprocessor, "save_to_preset", fail)
        with pytest.raises(DiskFullError, match="^no space left on the device while saving the preset to"):
            model.save_to_preset(directory)
        assert {name: os.path.getmtime(os.path.join(directory, name)) for name in os.listdir(directory)} == before
        assert sorted(os.listdir(tmp_path)) == ["preset"]  # nothing left behind


def _fake_write(model, saved_model, settings, target_prefix=None, jit_compile=False, ensemble=False):
    """What the SavedModel writer writes (test_export.py runs the real
    one): the SavedModel's entries, which say their beam size."""
    for name in ("variables", "assets"):
        os.makedirs(os.path.join(saved_model, name))
    for name in ("saved_model.pb", "fingerprint.pb"):
        with open(os.path.join(saved_model, name), "w") as f:
            f.write(f"beam {settings.beam_size}")


def _fake_tensorflow_export(model, saved_model, staging, search, dtype=None, quantize=None):
    """`_fake_write` as the TensorFlow subprocess of the other backends does it."""
    _fake_write(model, saved_model, **search)


def _child_report(monkeypatch, capsys, error):
    """The stderr of the export's TensorFlow subprocess when it meets `error`."""
    from keras_transformer import export

    def fail(*args):
        raise error

    with monkeypatch.context() as patched:
        patched.setattr(export, "load_for_export", fail)
        with pytest.raises(SystemExit):
            export.main(["preset", "out"])
    return capsys.readouterr().err


def test_export_overwrite_keeps_the_users_files_and_says_disk_full(preset, monkeypatch, tmp_path, capsys):
    from keras_transformer import export

    _, directory = preset
    # What the SavedModel writer writes is faked (test_export.py runs the
    # real one on every backend): what an overwrite replaces and keeps is
    # decided here. TensorFlow writes in this process, the others in a
    # TensorFlow subprocess.
    in_process = keras.config.backend() == "tensorflow"
    if in_process:
        monkeypatch.setattr(export, "write_saved_model", _fake_write)
    else:
        monkeypatch.setattr(export, "_write_in_tensorflow_process", _fake_tensorflow_export)
    out = str(tmp_path / "exported")
    cli.main(["export", "--preset", directory, "--beam-size", "1", out])
    os.makedirs(os.path.join(out, "assets.extra"))
    with open(os.path.join(out, "assets.extra", "tf_serving_warmup_requests"), "wb") as f:
        f.write(b"warm-up")
    with open(os.path.join(out, "NOTES.md"), "w") as f:
        f.write("notes")
    cli.main(["export", "--preset", directory, "--beam-size", "2", "--overwrite", out])
    assert sorted(os.listdir(out)) == ["NOTES.md", "assets", "assets.extra", "fingerprint.pb", "saved_model.pb",
                                       "variables"]
    assert os.path.exists(os.path.join(out, "assets.extra", "tf_serving_warmup_requests"))
    with open(os.path.join(out, "saved_model.pb")) as f:
        assert f.read() == "beam 2"
    if in_process:
        import tensorflow as tf

        def full(*args, **kwargs):
            raise tf.errors.ResourceExhaustedError(None, None, "saved_model.pb; No space left on device")

        monkeypatch.setattr(export, "write_saved_model", full)
    else:
        # The subprocess's report of a full disk, as it writes it.
        stderr = _child_report(monkeypatch, capsys, OSError(errno.ENOSPC, "No space left on device"))
        monkeypatch.undo()  # the real subprocess call, and a subprocess that reports a full disk
        monkeypatch.setattr(
            export.subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, 1, "", stderr)
        )
    with pytest.raises(SystemExit, match="^error: no space left on the device while exporting the SavedModel"):
        cli.main(["export", "--preset", directory, "--overwrite", out])
    assert sorted(os.listdir(tmp_path)) == ["exported", "preset"]
    assert os.path.exists(os.path.join(out, "NOTES.md"))


def test_export_subprocess_errors_are_raised_as_they_were(monkeypatch, capsys):
    """A bad preset found in the export's TensorFlow subprocess is the same
    error in the caller, not its traceback."""
    from keras_transformer import export

    for error in (PresetError("The weights in 'x/model.weights.h5' do not fit"), ValueError("bad setting"),
                  OSError(errno.EACCES, "Permission denied")):
        raised = export._subprocess_error("TensorFlow log line\n" + _child_report(monkeypatch, capsys, error))
        assert str(raised) == str(error)
        if isinstance(error, OSError):  # a full disk, a permission: errno says which
            assert isinstance(raised, OSError) and raised.errno == error.errno
        else:
            assert type(raised) is type(error)
    unexpected = export._subprocess_error("Traceback (most recent call last):\n  ...\nZeroDivisionError: x")
    assert isinstance(unexpected, export.ExportError) and "ZeroDivisionError" in str(unexpected)


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the subprocess is the same from every backend")
def test_export_of_a_bad_preset_from_another_backend_says_what_is_wrong(preset, capsys, tmp_path):
    _, directory = preset
    _set_in_model_configs(directory, "num_layers", 1)
    with pytest.raises(SystemExit) as raised:
        cli.main(["export", "--preset", directory, str(tmp_path / "out")])
    message = str(raised.value)
    assert message.startswith("error: The weights in ") and "do not fit the model" in message
    assert "Traceback" not in message and len(message.splitlines()) == 1
    assert not os.path.exists(tmp_path / "out")


# --- Training data ---


def test_a_failed_train_leaves_no_directory(multi30k_dir, tmp_path):
    with pytest.raises(SystemExit, match="error: Multi30k file train.en.gz is not in"):
        cli.main(["train", "--data-dir", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "run")])
    assert not os.path.exists(tmp_path / "run")
    with pytest.raises(SystemExit, match="error: Unknown preset"):
        cli.main(["train", "--data-dir", multi30k_dir, "--from-preset", str(tmp_path / "no-preset"),
                  "--output-dir", str(tmp_path / "run")])
    assert not os.path.exists(tmp_path / "run")


def test_changed_multi30k_files_are_warned_of(multi30k_dir, tmp_path):
    from keras_transformer.datasets import multi30k

    for name in ("val.en.gz", "val.de.gz"):
        shutil.copy(os.path.join(multi30k_dir, name), tmp_path / name)
    with gzip.open(tmp_path / "val.de.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    with gzip.open(tmp_path / "val.de.gz", "wt", encoding="utf-8") as f:  # one line deleted, one appended
        f.write("\n".join(lines[1:] + ["Ein Satz."]) + "\n")
    with pytest.warns(UserWarning, match="val.de.gz' differs from the published val.de.gz"):
        sources, targets = multi30k.load("val", "en", "de", data_dir=str(tmp_path))
    assert len(sources) == len(targets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        multi30k.load("val", "en", "de", data_dir=str(tmp_path), verify=False)
        multi30k.load("val", "en", "de", data_dir=multi30k_dir)  # the published files


# --- A quiet terminal ---


def test_the_command_line_prints_only_the_translation(preset, tmp_path):
    _, directory = preset
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TF_CPP", "KERAS_TRANSFORMER_NATIVE"))}
    script = shutil.which("keras-transformer", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-c", "from keras_transformer.cli import run; run()"]
    result = subprocess.run(
        [*command, "translate", "--preset", directory, "--beam-size", "1", "A man is riding a bicycle."],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1
    result = subprocess.run([*command, "translate", "--preset", str(tmp_path / "none"), "A dog."],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and result.stderr.startswith("error: Unknown preset")

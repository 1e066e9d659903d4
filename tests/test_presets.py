"""Presets: save and load round trips, fine-tuning, the checks on bad
presets, saves that fail halfway, and the command line."""

import glob
import json
import os

import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer import presets
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.models import TransformerTokenizer
from keras_transformer.presets import PresetError

from helpers import directory_contents
from helpers import once
from helpers import to_numpy

SOURCES = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest."]
TARGETS = ["A dog runs across the meadow.", "Two men play soccer.", "A woman reads."]


def tiny_model(tokenizer):
    backbone = TransformerBackbone(
        tokenizer.vocabulary_size(), num_layers=1, d_model=32, d_ff=64, num_heads=2,
        dropout=0.0, max_sequence_length=48,
    )
    return TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer, 24, 24))


def logits(model, texts):
    inputs, _, _ = model.preprocessor({"encoder_text": texts, "decoder_text": TARGETS[: len(texts)]})
    return to_numpy(model(inputs))


@pytest.fixture
def saved(small_tokenizer, tmp_path):
    model = tiny_model(small_tokenizer)
    model.save_to_preset(tmp_path / "preset", metadata={"languages": {"source": "de", "target": "en"}})
    return model, str(tmp_path / "preset")


def test_round_trip_and_fine_tuning(saved, tmp_path):
    model, directory = saved
    loaded = TransformerSeq2SeqLM.from_preset(directory)
    np.testing.assert_allclose(logits(loaded, SOURCES), logits(model, SOURCES), atol=1e-6)
    assert loaded.generate(SOURCES, sampler="greedy") == model.generate(SOURCES, sampler="greedy")
    with open(os.path.join(directory, "metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["languages"] == {"source": "de", "target": "en"}
    assert metadata["parameter_count"] == model.backbone.count_params()

    # Each part loads on its own.
    backbone = TransformerBackbone.from_preset(directory)
    for mine, theirs in zip(backbone.weights, model.backbone.weights):
        np.testing.assert_array_equal(to_numpy(mine), to_numpy(theirs))
    tokenizer = TransformerTokenizer.from_preset(directory)
    assert to_numpy(tokenizer.tokenize(SOURCES[0])).tolist() == to_numpy(
        model.preprocessor.tokenizer.tokenize(SOURCES[0])
    ).tolist()
    preprocessor = TransformerSeq2SeqLMPreprocessor.from_preset(directory)
    assert preprocessor.encoder_sequence_length == 24

    # Fine-tune, save over the same directory, load: the fine-tuned weights.
    loaded.compile(optimizer=keras.optimizers.Adam(1e-2))
    before = logits(loaded, SOURCES)
    loaded.fit({"encoder_text": SOURCES, "decoder_text": TARGETS}, batch_size=3, epochs=3, verbose=0)
    after = logits(loaded, SOURCES)
    assert np.abs(after - before).max() > 1e-2
    loaded.save_to_preset(directory)
    again = TransformerSeq2SeqLM.from_preset(directory)
    np.testing.assert_allclose(logits(again, SOURCES), after, atol=1e-6)
    assert again.generate(SOURCES) == loaded.generate(SOURCES)


@once
def test_a_saved_copy_keeps_the_languages_and_an_ensemble_loads_from_a_relative_path(saved, tmp_path, monkeypatch):
    model, directory = saved
    terms = "For research and education only."
    model.save_to_preset(directory, metadata={"languages": {"source": "de", "target": "en"}, "data_terms": terms})
    loaded = TransformerSeq2SeqLM.from_preset(directory)
    loaded.set_ensemble_members([tiny_model(model.preprocessor.tokenizer)])
    monkeypatch.chdir(tmp_path)
    loaded.save_to_preset("runs/ensemble")  # a fine-tuned copy, without metadata=
    metadata = presets.preset_metadata("runs/ensemble")
    assert metadata["languages"] == {"source": "de", "target": "en"} and metadata["data_terms"] == terms
    again = TransformerSeq2SeqLM.from_preset("runs/ensemble")
    assert len(again.ensemble_members) == 1
    assert again.generate(SOURCES, sampler="greedy") == loaded.generate(SOURCES, sampler="greedy")


def test_a_preset_assembled_part_by_part(saved, tmp_path):
    # keras-hub's way: the backbone, then the preprocessor (with its
    # tokenizer), each into the same directory; no part removes another.
    model, _ = saved
    directory = str(tmp_path / "parts")
    model.backbone.save_to_preset(directory)
    model.preprocessor.tokenizer.save_to_preset(directory, metadata={"note": "kept"})
    model.preprocessor.save_to_preset(directory)
    with open(os.path.join(directory, "metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["parameter_count"] == model.backbone.count_params()
    assert metadata["note"] == "kept"
    loaded = TransformerSeq2SeqLM.from_preset(directory)
    np.testing.assert_allclose(logits(loaded, SOURCES), logits(model, SOURCES), atol=1e-6)
    # A backbone saved again leaves the tokenizer in place.
    model.backbone.save_to_preset(directory)
    assert TransformerTokenizer.from_preset(directory).vocabulary_size() == model.preprocessor.tokenizer.vocabulary_size()

    # Another backbone saved sharded (150 kB a shard) over it: the
    # whole-file weights go, since keras-hub would load them before the
    # shards; saved whole again, the shards go.
    other = TransformerBackbone.from_config(model.backbone.get_config())
    other.set_weights([w + 1.0 for w in model.backbone.get_weights()])
    other.save_to_preset(directory, max_shard_size=1.5e-4)
    assert len(glob.glob(os.path.join(directory, "model_*.weights.h5"))) > 1
    assert not os.path.exists(os.path.join(directory, "model.weights.h5"))
    for mine, theirs in zip(TransformerBackbone.from_preset(directory).get_weights(), other.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    with open(os.path.join(directory, "metadata.json")) as f:
        recorded = json.load(f)["weights_sha256"]
    assert sorted(recorded) == sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "model_*.weights.h5")))
    model.backbone.save_to_preset(directory)
    assert sorted(os.listdir(directory)) == sorted(
        ["assets", "config.json", "metadata.json", "model.weights.h5", "preprocessor.json", "tokenizer.json"]
    )


def test_unknown_preset_lists_the_shipped_ones():
    with pytest.raises(PresetError, match="Unknown preset 'transformer_multi30k_xx'") as error:
        TransformerSeq2SeqLM.from_preset("transformer_multi30k_xx")
    for name in presets.list_presets():
        assert name in str(error.value)
    with pytest.raises(PresetError, match="keras-transformer presets"):
        TransformerTokenizer.from_preset("no/such/directory")
    with pytest.raises(TypeError, match="a string"):
        TransformerBackbone.from_preset(3)


def test_a_run_directory_points_to_its_model(saved, tmp_path):
    import shutil

    _, directory = saved
    shutil.copytree(directory, tmp_path / "run" / "model")
    with pytest.raises(PresetError, match="is not a preset but holds one in model/"):
        TransformerSeq2SeqLM.from_preset(str(tmp_path / "run"))


@pytest.mark.parametrize(
    "damage, cls, named",
    [
        ("remove config.json", TransformerSeq2SeqLM, "config.json"),
        ("remove model.weights.h5", TransformerSeq2SeqLM, "model.weights.h5"),
        ("remove assets/tokenizer/vocabulary.spm", TransformerSeq2SeqLM, "vocabulary"),
        ("remove tokenizer.json", TransformerSeq2SeqLMPreprocessor, "tokenizer.json"),
        ("corrupt config.json", TransformerSeq2SeqLM, "config.json"),
        ("corrupt task.json", TransformerSeq2SeqLM, "task.json"),
        ("corrupt tokenizer.json", TransformerTokenizer, "tokenizer.json"),
        ("truncate model.weights.h5", TransformerBackbone, "model.weights.h5"),
        ("flip model.weights.h5", TransformerSeq2SeqLM, "model.weights.h5' is corrupt: its SHA-256"),
        ("corrupt assets/tokenizer/vocabulary.spm", TransformerTokenizer, "vocabulary.spm"),
    ],
)
def test_a_damaged_preset_names_the_file(saved, damage, cls, named):
    _, directory = saved
    action, name = damage.split(" ")
    path = os.path.join(directory, name)
    if action == "remove":
        os.remove(path)
    elif action == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif action == "flip":  # bytes inside a tensor: still a readable HDF5 file
        _flip_bytes_in_a_tensor(path)
    else:
        with open(path, "wb") as f:
            f.write(b"\x00{ not json or a model" * 10)
    with pytest.raises(PresetError, match=named.replace(".", r"\.")):
        cls.from_preset(directory)


def _flip_bytes_in_a_tensor(path):
    import h5py

    offsets = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: offsets.append(item.id.get_offset())
                     if isinstance(item, h5py.Dataset) and item.size > 16 else None)
    with open(path, "r+b") as f:
        f.seek(offsets[0] + 4)
        data = f.read(8)
        f.seek(offsets[0] + 4)
        f.write(bytes(b ^ 0xFF for b in data))


def test_a_failed_save_leaves_the_preset_as_it_was(saved, monkeypatch, tmp_path):
    model, directory = saved
    with open(os.path.join(directory, "NOTES.txt"), "w") as f:
        f.write("the user's own file")

    before = directory_contents(directory)
    other = tiny_model(model.preprocessor.tokenizer)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    # Fails after config.json and the weights were written.
    monkeypatch.setattr(TransformerSeq2SeqLMPreprocessor, "save_to_preset", fail)
    with pytest.raises(OSError, match="disk full"):
        other.save_to_preset(directory)
    assert directory_contents(directory) == before
    assert sorted(os.listdir(tmp_path)) == ["preset"]  # no staging left
    monkeypatch.undo()

    # A save that succeeds replaces the preset and keeps the user's file.
    other.save_to_preset(directory)
    after = directory_contents(directory)
    assert after["NOTES.txt"] == before["NOTES.txt"]
    assert after["model.weights.h5"] != before["model.weights.h5"]
    assert sorted(os.listdir(tmp_path)) == ["preset"]
    loaded = TransformerSeq2SeqLM.from_preset(directory)
    np.testing.assert_allclose(logits(loaded, SOURCES), logits(other, SOURCES), atol=1e-6)

    # A backbone saved alone over a task preset: the task's files go.
    other.backbone.save_to_preset(directory)
    assert not os.path.exists(os.path.join(directory, "task.json"))
    assert os.path.exists(os.path.join(directory, "NOTES.txt"))
    with pytest.raises(PresetError, match="is a file"):
        other.save_to_preset(os.path.join(directory, "NOTES.txt"))


@once  # (the command's warning; each backend's evaluate runs in test_training.py)
def test_cli_evaluate_warns_of_other_languages_than_the_models(saved, capsys, multi30k_dir):
    _, directory = saved  # a de-en model
    cli.main(["evaluate", directory, "--data-dir", multi30k_dir, "--split", "val", "--limit", "2", "--beam-size", "1"])
    assert "warning" not in capsys.readouterr().err
    cli.main(["evaluate", directory, "--data-dir", multi30k_dir, "--split", "val", "--limit", "2", "--beam-size", "1",
              "--source", "en", "--target", "de"])
    assert "warning: the model translates de-en; evaluating it on en-de" in capsys.readouterr().err


@once  # (the command's lines and options; each backend's command line: test_bad_input.py, test_tensorflow_free.py)
def test_cli_translate_and_presets(saved, capsys, tmp_path):
    model, directory = saved
    expected = model.generate(SOURCES + [""], beam_size=2, alpha=0.6)
    cli.main(["translate", "--preset", directory, "--beam-size", "2", *SOURCES, ""])
    assert capsys.readouterr().out == "".join(t + "\n" for t in expected)

    source_file, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source_file.write_text("\n".join(SOURCES * 3) + "\n", encoding="utf-8")
    cli.main(["translate", "--preset", directory, "--beam-size", "1", "--batch-size", "2",
              "-i", str(source_file), "-o", str(output)])
    greedy = model.generate(SOURCES, sampler="greedy")
    assert output.read_text(encoding="utf-8").splitlines() == greedy * 3
    # Lines split at newlines only: a form feed or a Unicode line separator
    # inside a line, and Windows line ends, keep one translation a line.
    source_file.write_text(f"Ein Hund\u2028läuft.\r\nZwei\x0cMänner.\r\n{SOURCES[2]}\n", encoding="utf-8")
    cli.main(["translate", "--preset", directory, "--beam-size", "1", "-i", str(source_file), "-o", str(output)])
    translations = output.read_text(encoding="utf-8").split("\n")
    assert len(translations) == 4 and translations[2:] == [greedy[2], ""]


@once  # (the command line's checks, the same on every backend)
def test_cli_translate_refuses_bad_input_and_lists_presets(saved, capsys, tmp_path):
    _, directory = saved
    source_file = tmp_path / "in.txt"
    source_file.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    # An output that cannot be written fails before any translating.
    with pytest.raises(SystemExit, match="error: Cannot write .* does not exist"):
        cli.main(["translate", "--preset", directory, "-i", str(source_file), "-o", str(tmp_path / "no" / "out.txt")])
    # -o forgotten: the output name is not translated in place of the file.
    with pytest.raises(SystemExit, match="error: give TEXT or --input, not both"):
        cli.main(["translate", "--preset", directory, "-i", str(source_file), str(tmp_path / "out.de")])

    with pytest.raises(SystemExit, match="Unknown preset"):
        cli.main(["translate", "--preset", str(tmp_path / "missing"), "Hallo."])
    # A mistyped model path is named as such, not as missing languages.
    with pytest.raises(SystemExit, match="Unknown preset .*missing"):
        cli.main(["evaluate", str(tmp_path / "missing"), "--split", "test_2016_flickr"])
    # Bad input ends with the message, not a traceback.
    with pytest.raises(SystemExit, match="error: A source of .* tokens is longer than .*max_sequence_length=48"):
        cli.main(["translate", "--preset", directory, "Wort " * 60])
    for option, says in (
        (["--beam-size", "0"], "--beam-size: must be 1 or more, got 0"),
        (["--batch-size", "-3"], "--batch-size: must be 1 or more, got -3"),
        (["--alpha", "-1"], "--alpha: must be 0 or more, got -1"),
        (["--alpha", "nan"], "--alpha: must be 0 or more, got nan"),
        (["--beam-size", "four"], "--beam-size: invalid int value: 'four'"),
    ):
        with pytest.raises(SystemExit):
            cli.main(["translate", "--preset", directory, *option, "Hallo."])
        assert says in capsys.readouterr().err

    cli.main(["presets", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert listed.keys() == presets.list_presets().keys()


@once  # (what a process imports before the check: the same on every backend)
def test_a_fresh_process_checks_a_saved_directory_before_loading_any_model(saved):
    """`keras-transformer evaluate RUN/model` checks the preset before it
    imports the models, whose classes register themselves on import: the
    check must know them all the same."""
    import subprocess
    import sys

    _, directory = saved
    script = (
        "import sys\n"
        "from keras_transformer import presets\n"
        "assert 'keras_transformer.models' not in sys.modules\n"
        "presets.check(sys.argv[1], ('config', 'tokenizer'))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, directory], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]

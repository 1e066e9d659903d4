"""Translating on JAX and PyTorch without TensorFlow
(`keras_transformer.utils.tensorflow_free`)."""

import json
import os
import subprocess
import sys

import keras
import pytest

from keras_transformer.datasets import multi30k
from keras_transformer.presets.registry import sentencepiece_presets
from keras_transformer.utils import tensorflow_free

PRESET = "transformer_multi30k_en_de"
# Accents, typographic quotes, a dash, runs of spaces, a word no vocabulary holds.
SENTENCES = [
    "A man rides a bicycle down the street.",
    "Café „naïve“ résumé — ÄÖÜ ß!",
    "  Two   dogs  play in the snow  ",
    "Xylophonists zigzag quizzically.",
]
# Runs a command (`translate`, `evaluate`) and reports, on stderr's last line,
# which of TensorFlow's, JAX's and matplotlib's modules it imported.
COMMAND = (
    "import sys\n"
    "from keras_transformer import cli\n"
    "sys.argv = ['keras-transformer', *sys.argv[1:]]\n"
    "try:\n"
    "    cli.run()\n"
    "finally:\n"
    "    print(sorted(m for m in ('tensorflow', 'tensorflow_text', 'jax', 'matplotlib') if sys.modules.get(m)),\n"
    "          file=sys.stderr)\n"
)


def test_the_sentencepiece_package_gives_tensorflow_texts_ids(multi30k_dir):
    """The claim the skipping rests on: keras-hub's tokenizer without
    tensorflow-text (the `sentencepiece` package) tokenizes as with it."""
    import sentencepiece

    from keras_transformer.models import TransformerTokenizer

    tokenizer = TransformerTokenizer.from_preset(PRESET)
    package = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.proto)
    english, german = multi30k.load("val", "en", "de", multi30k_dir)
    texts = [*SENTENCES, *english[:300], *german[:300]]
    ids = tokenizer(texts)
    ids = ids.to_list() if hasattr(ids, "to_list") else [list(row) for row in ids]
    assert ids == package.Encode(texts)
    assert [tokenizer.detokenize(row) for row in ids[:50]] == package.Decode(ids[:50])


@pytest.mark.skipif(keras.config.backend() == "tensorflow", reason="the TensorFlow backend needs TensorFlow")
def test_translate_leaves_tensorflow_out_and_translates_alike(tmp_path):
    from keras_transformer.models import TransformerSeq2SeqLM

    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = _run_command("translate", "--preset", PRESET, "-i", str(lines))
    # This process imported TensorFlow (the tests' data pipelines do): its
    # tokenizer is tensorflow-text's.
    model = TransformerSeq2SeqLM.from_preset(PRESET)
    expected = model.generate(SENTENCES, beam_size=4, alpha=0.6)
    assert result.stdout.splitlines() == expected


@pytest.mark.skipif(keras.config.backend() == "tensorflow", reason="the TensorFlow backend needs TensorFlow")
def test_evaluate_leaves_tensorflow_out_and_translates_alike(tmp_path, multi30k_dir):
    from keras_transformer.models import TransformerSeq2SeqLM

    output = tmp_path / "hypotheses.de"
    # The first model alone: the translate test above decodes with the
    # ensemble preset's every model.
    _run_command("evaluate", PRESET, "--first-model-only", "--data-dir", multi30k_dir, "--limit", "4",
                 "--output", str(output))
    sources, _ = multi30k.load("test_2016_flickr", "en", "de", multi30k_dir)
    model = TransformerSeq2SeqLM.from_preset(PRESET, load_ensemble=False)
    expected = model.generate(sources[:4], beam_size=4, alpha=0.6)
    assert output.read_text(encoding="utf-8").splitlines() == expected


def _run_command(*argv):
    """Runs `keras-transformer *argv` in a process of its own, and checks
    that it imported no TensorFlow, and on PyTorch no JAX or matplotlib
    (which Keras imports) either."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", COMMAND, *argv], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = "[]" if keras.config.backend() == "torch" else "['jax', 'matplotlib']"
    assert result.stderr.strip().splitlines()[-1] == kept
    return result


def test_only_sentencepiece_presets_go_without_tensorflow(tmp_path):
    assert sentencepiece_presets([PRESET, "transformer_multi30k_de_en"])
    wordpiece = tmp_path / "wordpiece"
    wordpiece.mkdir()
    (wordpiece / "tokenizer.json").write_text(json.dumps({"class_name": "TransformerWordPieceTokenizer"}))
    assert not sentencepiece_presets([PRESET, str(wordpiece)])
    assert not sentencepiece_presets(["hf://Helsinki-NLP/opus-mt-en-de"])
    assert not sentencepiece_presets([str(tmp_path / "missing")])


def test_main_in_a_callers_process_leaves_its_imports_alone(monkeypatch, tmp_path):
    """`cli.main` called from Python (a test, a notebook) must not take
    TensorFlow away from the rest of the process."""
    from keras_transformer import cli

    monkeypatch.setattr(tensorflow_free, "skip_tensorflow", lambda: pytest.fail("skip_tensorflow was called"))
    cli.main(["translate", "--preset", PRESET, "--first-model-only", "--beam-size", "1", SENTENCES[0]])


def _as_if_nothing_was_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)
    for name in tensorflow_free.MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    # Whatever a failing test installs goes with it.
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))


@pytest.mark.skipif(keras.config.backend() == "tensorflow", reason="the TensorFlow backend needs TensorFlow")
def test_left_out_modules_fail_to_import_and_leave_no_trace(monkeypatch):
    import importlib.util

    _as_if_nothing_was_imported(monkeypatch)
    assert tensorflow_free.skip_tensorflow() is True and tensorflow_free.left_out()
    for name in ("tensorflow", "tensorflow_text", "tensorflow.io.gfile"):
        with pytest.raises(ModuleNotFoundError, match="KERAS_TRANSFORMER_WITHOUT_TENSORFLOW=0"):
            importlib.import_module(name)
    # No sys.modules entry (Keras reads one as TensorFlow imported), and a
    # spec without an origin (PyTorch's compiler asks for one).
    assert "tensorflow" not in sys.modules
    assert importlib.util.find_spec("tensorflow").origin is None
    assert tensorflow_free.skip_tensorflow() is True
    assert sum(isinstance(f, tensorflow_free._LeaveOut) for f in sys.meta_path) == 1


def test_the_environment_variable_keeps_tensorflow(monkeypatch):
    _as_if_nothing_was_imported(monkeypatch)
    for value in ("0", "off", "OFF"):
        monkeypatch.setenv(tensorflow_free.ENVIRONMENT_VARIABLE, value)
        assert tensorflow_free.skip_tensorflow() is False
        assert not tensorflow_free.left_out()


def test_nothing_is_skipped_once_tensorflow_or_keras_hub_is_imported(monkeypatch):
    import keras_hub  # noqa: F401 (imported, as in this test process)

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in tensorflow_free.MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert tensorflow_free.skip_tensorflow() is False
    assert not tensorflow_free.left_out()


def test_jax_and_matplotlib_are_left_out_only_before_keras_on_torch(monkeypatch):
    import importlib

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    # Keras is imported in this process: too late.
    assert tensorflow_free.skip_jax_and_matplotlib() is False
    for name in ("keras", *tensorflow_free.UNUSED_ON_TORCH):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for backend in ("jax", "tensorflow"):
        monkeypatch.setenv("KERAS_BACKEND", backend)
        assert tensorflow_free.skip_jax_and_matplotlib() is False
    monkeypatch.delenv("KERAS_BACKEND")  # keras.json's backend is unknown before Keras
    assert tensorflow_free.skip_jax_and_matplotlib() is False
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    monkeypatch.setenv(tensorflow_free.ENVIRONMENT_VARIABLE, "0")
    assert tensorflow_free.skip_jax_and_matplotlib() is False
    monkeypatch.delenv(tensorflow_free.ENVIRONMENT_VARIABLE)
    assert tensorflow_free.skip_jax_and_matplotlib() is True
    assert tensorflow_free.skip_jax_and_matplotlib() is True
    assert sum(isinstance(f, tensorflow_free._LeaveOut) for f in sys.meta_path) == 1
    assert not tensorflow_free.left_out()  # TensorFlow is not among them
    for name in ("jax", "matplotlib"):
        with pytest.raises(ModuleNotFoundError, match="KERAS_TRANSFORMER_WITHOUT_TENSORFLOW=0"):
            importlib.import_module(name)

"""The SavedModel export: the shipped en-de preset, exported from the
backend under test, loaded in a separate process that imports only
tensorflow and tensorflow_text, translates as the package does."""

import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
from helpers import once

from keras_transformer.datasets import multi30k
from keras_transformer.decoding import beam_search
from keras_transformer.export import export_saved_model
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models.transformer.generation import tokenize_sources
from keras_transformer.presets.ensembles import member_paths

PRESET = "transformer_multi30k_en_de"

# Run in a fresh interpreter: tensorflow and tensorflow_text only.
LOADER = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401 (registers the SentencePiece ops)

texts = json.loads(sys.stdin.read())
translator = tf.saved_model.load(sys.argv[1])
strings = translator.signatures["serving_default"](text=tf.constant(texts))["translations"]
ids = translator.signatures["translate_ids"](text=tf.constant(texts))
# The signatures' functions are the module's own too.
as_function = translator.translate(tf.constant(texts[:2]))["translations"]
one = translator.signatures["serving_default"](text=tf.constant(texts[:1]))["translations"]
no_texts = translator.signatures["translate_ids"](text=tf.constant([], tf.string))
try:
    translator.signatures["serving_default"](text=tf.constant(["word " * 300]))
    too_long = "no error"
except tf.errors.InvalidArgumentError as error:
    too_long = error.message
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("keras_transformer", "keras_hub"))
print(json.dumps({
    "translations": [s.decode("utf-8") for s in strings.numpy()],
    "token_ids": ids["token_ids"].numpy().tolist(),
    "lengths": ids["lengths"].numpy().tolist(),
    "scores": ids["scores"].numpy().tolist(),
    "signatures": sorted(translator.signatures),
    "forbidden_modules": loaded,
    "too_long": too_long,
    "as_function": [s.decode("utf-8") for s in as_function.numpy()],
    "one": [s.decode("utf-8") for s in one.numpy()],
    "no_texts": {name: list(value.shape) for name, value in no_texts.items()},
}))
"""


def load_elsewhere(path, texts):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_BACKEND", None)
    result = subprocess.run(
        [sys.executable, "-c", LOADER, path], input=json.dumps(texts), capture_output=True, text=True,
        env=env, cwd=os.path.dirname(path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def texts(multi30k_dir):
    sources, _ = multi30k.load("test_2016_flickr", "en", "de", data_dir=multi30k_dir)
    # Blank texts: empty, ASCII spaces, a no-break and an em space; last, one
    # of more pieces than the model has positions.
    return sources[:12] + ["", "   ", "\u00a0\u2003", "A dog.", "\n" * 300]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("export") / "en-de")
    # The shipped preset is an ensemble: the SavedModel holds its first model.
    models = 1 + len(member_paths(PRESET))
    with pytest.warns(UserWarning, match=f"first of the ensemble's {models} models only"):
        export_saved_model(PRESET, path, beam_size=4, alpha=0.6)
    return path


# From JAX and PyTorch the export runs in a TensorFlow subprocess, the same
# one from either: the full exports run in TensorFlow's and PyTorch's runs.
not_in_jax_run = pytest.mark.skipif(
    keras.config.backend() == "jax", reason="the export's TensorFlow process runs in PyTorch's run"
)


@pytest.fixture(scope="module")
def served(exported, texts):
    return load_elsewhere(exported, texts)


@not_in_jax_run
def test_saved_model_translates_like_the_package(served, texts):
    assert served["forbidden_modules"] == []
    assert served["signatures"] == ["serving_default", "translate_ids"]

    model = TransformerSeq2SeqLM.from_preset(PRESET, load_ensemble=False)  # the model exported
    expected = [best for best, *_ in model.generate(texts, beam_size=4, alpha=0.6, return_scores=True)]
    assert served["translations"] == [text for text, _ in expected]
    assert served["as_function"] == served["translations"][:2]
    assert served["one"] == served["translations"][:1]
    np.testing.assert_allclose(served["scores"], [score for _, score in expected], atol=1e-4)
    # The token ids are those the package's beam search chose.
    found = beam_search(model, tokenize_sources(model, texts), beam_size=4, alpha=0.6)
    pad_id = model.preprocessor.tokenizer.pad_token_id
    for ids, length, result in zip(served["token_ids"], served["lengths"], found):
        assert ids[:length] == (result[0][0] if result else [])
        assert set(ids[length:]) <= {pad_id}
    assert served["lengths"][12:15] == [0, 0, 0] and served["lengths"][16] == 0
    assert "max_sequence_length=256" in served["too_long"]
    assert served["no_texts"] == {"token_ids": [0, 0], "lengths": [0], "scores": [0]}


def _xla_compiled_functions(path):
    """The names of the SavedModel's functions that XLA must compile."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    functions = saved_model.meta_graphs[0].graph_def.library.function
    return [f.signature.name for f in functions if f.attr["_XlaMustCompile"].b]


# (Once, in PyTorch's run: the export from TensorFlow's run is
# `test_saved_model_translates_like_the_package`'s, and what this test adds,
# XLA's compilation in the loading process, is the same from any backend.)
@pytest.mark.skipif(keras.config.backend() != "torch", reason="runs in PyTorch's run, through the export's subprocess")
def test_saved_model_compiled_by_xla_translates_as_the_graph_does(exported, served, texts, tmp_path):
    path = str(tmp_path / "en-de-xla")
    with pytest.warns(UserWarning, match="first of the ensemble"):
        export_saved_model(PRESET, path, beam_size=4, alpha=0.6, jit_compile=True)
    assert _xla_compiled_functions(path) and not _xla_compiled_functions(exported)
    # 15 texts, a long blank one last: chunks of 4 sources sorted by length
    # inside, the last filled up with a copy of its longest (2 texts: one
    # chunk of 2; 1 text: a chunk of 1; no texts: no chunk).
    compiled = load_elsewhere(path, texts[2:])
    assert compiled["forbidden_modules"] == []
    assert compiled["translations"] == served["translations"][2:]
    assert compiled["as_function"] == served["translations"][2:4]
    assert compiled["one"] == served["translations"][2:3]
    assert compiled["lengths"] == served["lengths"][2:]
    for ids, expected, length in zip(compiled["token_ids"], served["token_ids"][2:], compiled["lengths"]):
        assert ids[:length] == expected[:length]
    np.testing.assert_allclose(compiled["scores"], served["scores"][2:], atol=1e-4)
    assert "max_sequence_length=256" in compiled["too_long"]
    assert compiled["no_texts"] == served["no_texts"]


# (Once: through the TensorFlow subprocess, with the flags it is given. In
# graph mode only: XLA's compilation of the search is
# `test_saved_model_compiled_by_xla_translates_as_the_graph_does`'s, and
# of an ensemble's, test_ensemble.py's on TensorFlow; this test compiled by
# XLA, for five models, took three minutes.)
@pytest.mark.skipif(keras.config.backend() != "torch", reason="runs in PyTorch's run, through the export's subprocess")
def test_saved_model_of_an_ensemble_decodes_all_its_models(texts, tmp_path):
    path = str(tmp_path / "en-de-ensemble")
    with warnings.catch_warnings():
        # No warning that the first model stands alone.
        warnings.filterwarnings("error", message=".*first of the ensemble")
        export_saved_model(PRESET, path, beam_size=4, alpha=0.6, ensemble=True)
    assert not _xla_compiled_functions(path)
    chosen = texts[:6] + texts[12:13]  # a blank text among them
    served = load_elsewhere(path, chosen)
    model = TransformerSeq2SeqLM.from_preset(PRESET)  # the preset's five models
    expected = [best for best, *_ in model.generate(chosen, beam_size=4, alpha=0.6, return_scores=True)]
    # (The first model alone translates some of these otherwise.)
    assert model.generate(chosen, ensemble=[]) != [text for text, _ in expected]
    assert served["translations"] == [text for text, _ in expected]
    np.testing.assert_allclose(served["scores"], [score for _, score in expected], atol=1e-4)
    assert served["as_function"] == served["translations"][:2]
    assert served["no_texts"] == {"token_ids": [0, 0], "lengths": [0], "scores": [0]}


# (Once, as the test above. Two tiny untrained models and three texts, not
# the preset's five models and seven texts: the combination of an ensemble
# and XLA is what this test adds, and each layer and each shape of sources
# adds to the export's tracing and XLA's compilations.)
@pytest.mark.skipif(keras.config.backend() != "torch", reason="runs in PyTorch's run, through the export's subprocess")
def test_saved_model_of_an_ensemble_compiled_by_xla_decodes_both_models(small_tokenizer, texts, tmp_path):
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor

    def tiny(seed):
        keras.utils.set_random_seed(seed)
        backbone = TransformerBackbone(small_tokenizer.vocabulary_size(), num_layers=1, d_model=32, d_ff=64,
                                       num_heads=2, max_sequence_length=64)
        return TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(small_tokenizer, 32, 32))

    model = tiny(1)
    model.set_ensemble_members([tiny(2)])
    path = str(tmp_path / "two-xla")
    settings = dict(beam_size=3, alpha=0.6, max_length_offset=8)
    export_saved_model(model, path, ensemble=True, jit_compile=True, **settings)
    assert _xla_compiled_functions(path)
    chosen = texts[:2] + texts[12:13]  # a blank text last
    served = load_elsewhere(path, chosen)
    expected = [best for best, *_ in model.generate(chosen, return_scores=True, **settings)]
    # (The first model alone translates these otherwise.)
    assert model.generate(chosen, ensemble=[], **settings) != [text for text, _ in expected]
    assert served["translations"] == [text for text, _ in expected]
    np.testing.assert_allclose(served["scores"], [score for _, score in expected], atol=1e-4)
    assert served["lengths"][2] == 0
    assert served["no_texts"] == {"token_ids": [0, 0], "lengths": [0], "scores": [0]}


def test_blank_in_the_saved_model_is_blank_in_python():
    import tensorflow as tf

    from keras_transformer.utils.text import BLANK_PATTERN
    from keras_transformer.utils.text import is_blank

    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    blank = tf.strings.regex_full_match(tf.constant(characters), BLANK_PATTERN).numpy()
    assert [c for c, b in zip(characters, blank) if b != is_blank(c)] == []
    texts = ["", " \u00a0\t", " a ", "\u200b\ufeff\u00ad", "\u200ba"]
    assert tf.strings.regex_full_match(texts, BLANK_PATTERN).numpy().tolist() == [True, True, False, True, False]


def test_export_never_overwrites_or_leaves_half_an_export(tmp_path):
    # An earlier export (its files stand for a SavedModel's).
    earlier = tmp_path / "earlier"
    (earlier / "variables").mkdir(parents=True)
    (earlier / "saved_model.pb").write_bytes(b"earlier export")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_saved_model(PRESET, earlier)
    assert sorted(os.listdir(earlier)) == ["saved_model.pb", "variables"]
    assert (earlier / "saved_model.pb").read_bytes() == b"earlier export"

    # A failing export (a preset with a corrupt weights file) leaves nothing,
    # and leaves an earlier export as it was, even with overwrite.
    broken = tmp_path / "broken"
    TransformerSeq2SeqLM.from_preset(PRESET, load_ensemble=False).save_to_preset(broken)
    (broken / "model.weights.h5").write_bytes(b"not hdf5")
    with pytest.raises(Exception, match="model.weights.h5"):
        export_saved_model(str(broken), tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["broken", "earlier"]
    with pytest.raises(Exception, match="model.weights.h5"):
        export_saved_model(str(broken), earlier, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["broken", "earlier"]
    assert (earlier / "saved_model.pb").read_bytes() == b"earlier export"
    # Even with overwrite, a directory that holds no SavedModel (a mistyped
    # path) is never replaced.
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no SavedModel"):
        export_saved_model(PRESET, notes, overwrite=True)
    assert os.listdir(notes) == ["keep.txt"] and sorted(os.listdir(tmp_path)) == ["broken", "earlier", "notes"]


# The export runs in TensorFlow, in PyTorch's run in a TensorFlow process;
# PyTorch's int8 decoding is the cheapest to compare it with.
@pytest.mark.skipif(keras.config.backend() != "torch", reason="runs in PyTorch's run")
def test_overwrite_replaces_an_export_with_a_complete_new_one(exported, texts):
    # Here through `export --quantize int8 --beam-size 1 --overwrite`, the
    # preset loaded and quantized (Keras's int8). Its variables take less
    # than half the float32 export's bytes, and it translates as `generate`
    # of the same int8 model.
    from keras_transformer import cli

    float32_bytes = _variables_size(exported)
    cli.main(["export", "--preset", PRESET, "--quantize", "int8", "--beam-size", "1", "--overwrite", exported])
    assert _variables_size(exported) < 0.5 * float32_bytes
    served = load_elsewhere(exported, texts[:6])
    model = TransformerSeq2SeqLM.from_preset(PRESET, load_ensemble=False)  # the model exported
    model.quantize("int8")
    assert served["translations"] == model.generate(texts[:6], sampler="greedy")


def _variables_size(directory):
    folder = os.path.join(directory, "variables")
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


@once  # (checks made before any model is traced: the same on every backend)
def test_a_model_the_export_cannot_hold_is_refused_before_any_work(tmp_path):
    from keras_transformer.models import TransformerBackbone
    from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
    from keras_transformer.models import TransformerWordPieceTokenizer

    tokenizer = TransformerWordPieceTokenizer(vocabulary=["<pad>", "<unk>", "<s>", "</s>", "a", "dog"])
    backbone = TransformerBackbone(6, num_layers=1, d_model=8, d_ff=16, num_heads=2, max_sequence_length=16)
    model = TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer, 8, 8))
    with pytest.raises(ValueError, match="TransformerWordPieceTokenizer; the SavedModel tokenizes with"):
        export_saved_model(model, tmp_path / "out")
    model.save_to_preset(tmp_path / "wordpiece")
    with pytest.raises(ValueError, match="TransformerWordPieceTokenizer"):
        export_saved_model(str(tmp_path / "wordpiece"), tmp_path / "out")
    with pytest.raises(ValueError, match="preprocessor"):
        export_saved_model(TransformerSeq2SeqLM(backbone), tmp_path / "out")
    with pytest.raises(ValueError, match="max_length_offset must be >= 0, got -5"):
        export_saved_model(PRESET, tmp_path / "out", max_length_offset=-5)
    with pytest.raises(ValueError, match="quantize must be 'int8', got 'int4'"):
        export_saved_model(PRESET, tmp_path / "out", quantize="int4")
    with pytest.raises(ValueError, match="a model object exports in its own precision"):
        export_saved_model(TransformerSeq2SeqLM.from_preset(PRESET), tmp_path / "out", dtype="bfloat16")
    assert sorted(os.listdir(tmp_path)) == ["wordpiece"]
    # A path under a file: the command says so, without a traceback.
    from keras_transformer import cli

    (tmp_path / "file.txt").write_text("mine")
    with pytest.raises(SystemExit, match="^error: .*Not a directory"):
        cli.main(["export", "--preset", PRESET, str(tmp_path / "file.txt" / "x" / "1")])
    assert (tmp_path / "file.txt").read_text() == "mine"

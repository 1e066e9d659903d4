"""Every size a user gives is bounded, a preset's files are read only if
they are regular files of a sensible size, and `fit`, `evaluate` and
`predict` check their texts as `generate` does."""

import os
import shutil
import threading

import pytest

from keras_transformer.decoding.settings import MAX_BEAM_SIZE
from keras_transformer.decoding.settings import DecodingSettings
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor
from keras_transformer.presets import PresetError
from keras_transformer.utils.reading import read_bytes

from helpers import once

TEXTS = ["A dog runs.", "Two men play soccer."]
PAIRS = {"encoder_text": TEXTS, "decoder_text": ["Ein Hund rennt.", "Zwei Männer spielen Fußball."]}


@pytest.fixture
def model(small_tokenizer):
    backbone = TransformerBackbone(
        small_tokenizer.vocabulary_size(), num_layers=1, d_model=16, d_ff=32, num_heads=2,
        dropout=0.0, max_sequence_length=48,
    )
    return TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(small_tokenizer, 12, 12))


@pytest.fixture
def preset(model, tmp_path):
    model.save_to_preset(tmp_path / "preset")
    return str(tmp_path / "preset")


# --- Sizes ---


def test_decoding_sizes_have_upper_bounds():
    for name, value, bound in (("beam_size", 10**9, "most 1024"), ("num_results", 10**9, "most 1024"),
                               ("max_length_offset", 10**30, "most"), ("max_length_offset", -(10**30), "least"),
                               ("top_k", 2**40, "most")):
        with pytest.raises(ValueError, match=f"{name} must be at {bound}"):
            DecodingSettings(**{name: value})
    assert DecodingSettings(beam_size=MAX_BEAM_SIZE).beam_size == MAX_BEAM_SIZE


def test_a_search_larger_than_the_machine_is_refused_up_front(model):
    settings = DecodingSettings(beam_size=MAX_BEAM_SIZE)
    with pytest.raises(MemoryError, match=r"needs about .* GiB .*beam_size=1024, batch_size=4096.*Lower beam_size or batch_size"):
        settings.check_memory(4096, model.backbone, 40, available=16 << 30)
    settings.check_memory(32, model.backbone, 40, available=16 << 30)  # small enough
    with pytest.raises(ValueError, match="batch_size must be at most"):
        model.generate(TEXTS, batch_size=10**9)
    with pytest.raises(ValueError, match="beam_size must be at most 1024, got 1000000000"):
        model.generate(TEXTS, beam_size=10**9)


def test_generate_refuses_a_search_larger_than_the_machine(model, monkeypatch):
    from keras_transformer.decoding import settings

    monkeypatch.setattr(settings, "available_memory", lambda: 1 << 20)  # a machine of 1 MiB
    with pytest.raises(MemoryError, match="more than 80% of the 0.0 GiB this machine has"):
        model.generate(TEXTS * 100, beam_size=64, batch_size=200)


# --- A preset's files ---


@once
def test_a_preset_file_that_is_a_fifo_or_a_device_is_an_error_not_a_hang(preset, tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    for name in ("config.json", os.path.join("assets", "tokenizer", os.listdir(os.path.join(preset, "assets", "tokenizer"))[0])):
        for target, kind in ((fifo, "a FIFO"), ("/dev/zero", "a device")):
            copy = str(tmp_path / "copy")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(preset, copy)
            os.remove(os.path.join(copy, name))
            os.symlink(target, os.path.join(copy, name))
            result = {}

            def load():
                try:
                    TransformerSeq2SeqLM.from_preset(copy)
                except Exception as error:  # noqa: BLE001 - checked below
                    result["error"] = error

            thread = threading.Thread(target=load, daemon=True)
            thread.start()
            thread.join(60)
            assert not thread.is_alive(), f"loading a preset whose {name} is {kind} hangs"
            assert isinstance(result.get("error"), PresetError), result
            assert f"is {kind}, not a regular file (a link to" in str(result["error"])


@once
def test_a_preset_file_larger_than_its_limit_is_refused(tmp_path):
    from keras_transformer.presets import read_metadata

    (tmp_path / "metadata.json").write_bytes(b"{}" + b" " * 100)
    with pytest.raises(ValueError, match="is 102 bytes, more than the 10 bytes such a file may have"):
        read_bytes(tmp_path / "metadata.json", limit=10)
    assert read_metadata(str(tmp_path)) == {}


# --- fit, evaluate and predict check what generate checks ---


def test_fit_refuses_what_generate_refuses(model):
    model.compile()
    bad = b"Ein Hund \xff."
    with pytest.raises(ValueError, match="Text 0 is not valid UTF-8"):
        model.generate([bad])
    for data, error, message in (
        ({"encoder_text": [bad], "decoder_text": ["x"]}, ValueError, "^fit: encoder_text: Text 0 is not valid UTF-8"),
        ({"encoder_text": ["a"], "decoder_text": ["\udcff"]}, ValueError, "^fit: decoder_text: Text 0 holds '.udcff'"),
        ({"encoder_text": [], "decoder_text": []}, ValueError, "^fit: The data holds no sentence pairs"),
        ({"encoder_text": [1, 2], "decoder_text": ["a", "b"]}, TypeError, "^fit: encoder_text takes a string or a list of strings .*item 0 is of type int"),
        ({"encoder_text": None, "decoder_text": ["a"]}, TypeError, "^fit: encoder_text takes .*got NoneType"),
        ({"encoder_text": [["a", "b"]], "decoder_text": [["c", "d"]]}, TypeError, "item 0 is of type list .one string a sentence: a flat list, not a list of lists"),
        (None, ValueError, "^fit: no data: give x"),
    ):
        with pytest.raises(error, match=message):
            model.fit(data, epochs=1, verbose=0)
    for method in (model.evaluate, model.predict):
        with pytest.raises(ValueError, match="Text 0 is not valid UTF-8"):
            method({"encoder_text": [bad], "decoder_text": ["x"]}, verbose=0)
    # A dataset known to be empty, before Keras runs out of data and fails
    # on a missing input.
    import tensorflow as tf

    empty = tf.data.Dataset.from_tensor_slices({"encoder_text": [""], "decoder_text": [""]}).take(0).batch(2)
    for method in (model.fit, model.evaluate, model.predict):
        with pytest.raises(ValueError, match=f"^{method.__name__}: the dataset is empty"):
            method(empty, verbose=0)
    with pytest.raises(ValueError, match="^fit: validation_data: the dataset is empty"):
        model.fit({"encoder_text": ["a"], "decoder_text": ["b"]}, epochs=1, verbose=0, validation_data=empty)


def test_fit_counts_long_pairs_and_names_the_options(model):
    model.compile()
    long = " ".join(["A dog runs through the green park."] * 6)
    pairs = {"encoder_text": TEXTS + [long, long], "decoder_text": PAIRS["decoder_text"] + ["Ein Hund.", long]}
    with pytest.raises(ValueError, match=r"^fit: 2 of 4 pairs are longer than the preprocessor's sequence lengths "
                                         r"\(encoder_sequence_length=12.*the first, pair 2, .*long_pairs='drop'"):
        model.fit(pairs, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"^evaluate: 2 of 4 pairs are longer"):
        model.evaluate(pairs, verbose=0)
    with pytest.raises(ValueError, match="long_pairs must be one of"):
        model.fit(pairs, epochs=1, verbose=0, long_pairs="cut")
    assert model.predict(pairs, verbose=0, long_pairs="drop").shape[0] == 2
    assert model.predict(pairs, verbose=0, long_pairs="truncate").shape[0] == 4
    model.fit(pairs, epochs=1, verbose=0, long_pairs="drop", validation_data=pairs)
    with pytest.raises(ValueError, match=r"^generate|A source of \d+ tokens is longer than the model's max_sequence_length=48"):
        model.generate([long * 3])


@once
def test_a_token_budget_past_its_limit_is_refused_before_batching():
    from keras_transformer.data.batching import MAX_TOKENS_LIMIT
    from keras_transformer.data.batching import TokenBudgetBatches

    pairs = ([[5, 6, 2]] * 4, [[1, 7, 8, 2]] * 4)
    assert len(TokenBudgetBatches(*pairs, max_tokens=MAX_TOKENS_LIMIT)) >= 1
    for budget in (MAX_TOKENS_LIMIT + 1, 0):
        with pytest.raises(ValueError, match=rf"max_tokens={budget} is out of range: a batch holds 1 to 1,048,576"):
            TokenBudgetBatches(*pairs, max_tokens=budget)

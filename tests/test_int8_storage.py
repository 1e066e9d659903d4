"""Int8 storage of preset weights (`save_to_preset(weights_storage="int8")`,
`presets.store_int8`): the stored weights against a NumPy reference of the
quantization, decoding against the float preset, ensemble members, the
errors for damaged files, and saves that fail."""

import json
import os
import warnings
import zipfile

import keras
import numpy as np
import pytest

from keras_transformer import presets
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.presets import PresetError
from keras_transformer.presets import int8

from helpers import directory_contents
from helpers import once
from helpers import to_numpy

INT8_FILE = "model.weights.int8.npz"
START, END = 2, 3


def small_model(seed=0, vocabulary_size=64, d_model=16, num_layers=1):
    """A random model, the same on every backend (NumPy's random weights)."""
    backbone = TransformerBackbone(
        vocabulary_size, num_layers=num_layers, d_model=d_model, d_ff=2 * d_model, num_heads=2,
        dropout=0.0, max_sequence_length=32,
    )
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        shape = tuple(variable.shape)
        if variable.path.endswith("embeddings"):
            # Large random embeddings make the next-token distributions peaked.
            variable.assign(rng.normal(0, 1.5, shape).astype("float32"))
        elif variable.path.endswith("kernel"):  # about the size of Keras's initial kernels
            variable.assign(rng.normal(0, 0.5 * d_model**-0.5, shape).astype("float32"))
    return TransformerSeq2SeqLM(backbone)


def reference_axes(path, rank):
    """The axes each scale spans, as the format says: a column of a Dense
    kernel, a (head, dimension) of the attention's query/key/value kernels
    (d_model, heads, d_k), a column of its output kernel (heads, d_v,
    d_model), a row of the token embedding."""
    if path.endswith("attention_output/kernel"):
        return (0, 1)
    if path.endswith("kernel"):
        return (0,)
    assert path.endswith("embeddings") and rank == 2, path
    return (1,)


def reference_dequantized(path, w):
    """NumPy reference of int8 storage: (dequantized w, scale)."""
    w = np.asarray(w, "float32")
    if w.ndim < 2 or path.endswith("bias"):  # an attention's query bias is (heads, d_k)
        return w, None
    scale = (np.abs(w).max(axis=reference_axes(path, w.ndim), keepdims=True) / np.float32(127)).astype("float32")
    q = np.clip(np.round(w / np.where(scale > 0, scale, 1)), -127, 127)
    return q.astype("float32") * scale, scale


def assert_int8_copy(loaded, original):
    """`loaded` holds the reference's dequantized weights of `original`,
    each within half a quantization step of the original."""
    assert [v.path for v in loaded.weights] == [v.path for v in original.weights]
    quantized = 0
    for mine, theirs in zip(loaded.weights, original.weights):
        w = to_numpy(theirs).astype("float32")
        expected, scale = reference_dequantized(theirs.path, w)
        got = to_numpy(mine)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=theirs.path)
        if scale is not None:
            quantized += 1
            assert np.all(np.abs(got - w) <= scale / 2 * (1 + 1e-5) + 1e-7), theirs.path
    assert quantized == sum(len(v.shape) >= 2 and not v.path.endswith("bias") for v in original.weights) > 0


def token_inputs(rows, vocabulary_size=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, 8), "int32")
    for row in range(rows):
        length = rng.integers(3, 8)
        ids[row, :length] = [START, *rng.integers(4, vocabulary_size, length - 2), END]
    return {"encoder_token_ids": ids, "encoder_padding_mask": (ids != 0).astype("int32")}


def test_round_trip_of_a_task_stored_in_int8(tmp_path):
    model = small_model()
    model.save_to_preset(tmp_path / "int8", weights_storage="int8")
    assert sorted(os.listdir(tmp_path / "int8")) == sorted(
        ["config.json", INT8_FILE, "model.weights.json", "metadata.json", "task.json"]
    )
    metadata = json.loads((tmp_path / "int8" / "metadata.json").read_text())
    assert metadata["weights_storage"] == "int8"
    assert list(metadata["weights_sha256"]) == [INT8_FILE]

    loaded = TransformerSeq2SeqLM.from_preset(tmp_path / "int8")
    assert loaded.backbone.compute_dtype == "float32"
    assert_int8_copy(loaded.backbone, model.backbone)
    assert_int8_copy(TransformerBackbone.from_preset(tmp_path / "int8"), model.backbone)
    # Another precision, as for a float preset.
    half = TransformerBackbone.from_preset(tmp_path / "int8", dtype="bfloat16")
    assert keras.backend.standardize_dtype(half.weights[0].dtype) == "bfloat16"

    # The file as the format says: int8 values, float32 scales per channel.
    with np.load(tmp_path / "int8" / INT8_FILE, allow_pickle=False) as stored:
        for variable in model.backbone.weights:
            if len(variable.shape) >= 2 and not variable.path.endswith("bias"):
                assert stored[variable.path].dtype == np.int8
                expected = list(variable.shape)
                for axis in reference_axes(variable.path, len(expected)):
                    expected[axis] = 1
                assert list(stored[variable.path + ":scale"].shape) == expected
                assert stored[variable.path + ":scale"].dtype == np.float32
            else:
                assert variable.path + ":scale" not in stored.files

    # keras-hub's own loader reads it too, through its index.
    import keras_hub

    for through_keras_hub in (keras_hub.models.Seq2SeqLM.from_preset(str(tmp_path / "int8")),
                              keras_hub.models.Backbone.from_preset(str(tmp_path / "int8"))):
        assert_int8_copy(getattr(through_keras_hub, "backbone", through_keras_hub), model.backbone)

    # Saved again as float over it: the int8 file, its index and its record go.
    loaded.save_to_preset(tmp_path / "int8")
    assert not (tmp_path / "int8" / INT8_FILE).exists()
    assert not (tmp_path / "int8" / "model.weights.json").exists()
    assert "weights_storage" not in json.loads((tmp_path / "int8" / "metadata.json").read_text())
    assert_int8_copy(TransformerBackbone.from_preset(tmp_path / "int8"), model.backbone)


@once
def test_int8_weights_take_little_more_than_half_of_float16_weights(tmp_path):
    model = small_model(vocabulary_size=1024, d_model=128)
    half = TransformerBackbone.from_config({**model.backbone.get_config(), "dtype": "float16"})
    half.set_weights(model.backbone.get_weights())
    half.save_to_preset(tmp_path / "float16")
    model.backbone.save_to_preset(tmp_path / "int8", weights_storage="int8")
    int8_size = (tmp_path / "int8" / INT8_FILE).stat().st_size
    assert int8_size <= 0.55 * (tmp_path / "float16" / "model.weights.h5").stat().st_size
    # About half of the float16 values alone (the HDF5 file has more
    # overhead): int8 values, float32 scales and vectors, headers.
    assert int8_size <= 0.55 * 2 * model.backbone.count_params()
    # The same weights give the same bytes.
    model.backbone.save_to_preset(tmp_path / "again", weights_storage="int8")
    assert (tmp_path / "again" / INT8_FILE).read_bytes() == (tmp_path / "int8" / INT8_FILE).read_bytes()


def test_logits_of_the_int8_preset_are_close_to_the_float_preset(tmp_path):
    model = small_model(seed=3)
    model.save_to_preset(tmp_path / "float")
    model.save_to_preset(tmp_path / "int8", weights_storage="int8")
    as_float = TransformerSeq2SeqLM.from_preset(tmp_path / "float")
    as_int8 = TransformerSeq2SeqLM.from_preset(tmp_path / "int8")
    inputs = token_inputs(4)
    inputs.update(decoder_token_ids=inputs["encoder_token_ids"][:, ::-1].copy(),
                  decoder_padding_mask=inputs["encoder_padding_mask"][:, ::-1].copy())
    expected, got = to_numpy(as_float(inputs)), to_numpy(as_int8(inputs))
    # Each weight moves by at most half a step, 1/254 of its channel's
    # largest value; through one layer of each stack the logits (up to
    # about 30 here) move by under 1% of the largest (0.7-0.95% for seeds
    # 3-6 on PyTorch). 2% leaves room for the backends' arithmetic. (A
    # random model with larger kernels is chaotic: there small changes of
    # any kind grow, and its greedy outputs would say little.)
    assert np.abs(got - expected).max() < 0.02 * np.abs(expected).max()


@once
def test_greedy_translations_of_a_trained_model_stored_in_int8_are_unchanged(tmp_path):
    """A trained model in float32 saved with int8 storage translates as it
    does in float32. (The shipped preset's first model, itself stored in
    int8, moved off the int8 grid by up to 0.45 of a step per weight: float
    weights whose storage is the shipped ones.)"""
    sentences = [
        "A man is riding a bicycle.",
        "Two dogs are playing in the snow.",
        "A woman in a red coat is walking down the street.",
        "Children are playing soccer on a field.",
    ]
    model = TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de", load_ensemble=False)
    rng = np.random.default_rng(0)
    for variable in model.backbone.weights:
        w = to_numpy(variable).astype("float32")
        _, scale = reference_dequantized(variable.path, w)
        if scale is not None:
            variable.assign(w + rng.uniform(-0.45, 0.45, w.shape).astype("float32") * scale)
    model.save_to_preset(tmp_path / "int8", weights_storage="int8")
    stored = TransformerSeq2SeqLM.from_preset(tmp_path / "int8")
    assert stored.generate(sentences, sampler="greedy") == model.generate(sentences, sampler="greedy")


@once
def test_an_ensemble_preset_stores_its_members_in_int8(tmp_path):
    first, second = small_model(seed=1), small_model(seed=2, num_layers=2)
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "float")
    before = {path: (tmp_path / "float" / path).read_bytes() for path in ("model.weights.h5", "ensemble/1/model.weights.h5")}

    # Converted into a new directory: the float preset stays as it was.
    presets.store_int8(tmp_path / "float", tmp_path / "converted")
    assert {path: (tmp_path / "float" / path).read_bytes() for path in before} == before
    # Saved with int8 storage: the same files.
    first.save_to_preset(tmp_path / "saved", weights_storage="int8")
    for directory in ("converted", "saved"):
        for path in ("", "ensemble/1"):
            member = tmp_path / directory / path
            assert (member / INT8_FILE).exists() and not (member / "model.weights.h5").exists()
            metadata = json.loads((member / "metadata.json").read_text())
            assert metadata["weights_storage"] == "int8" and list(metadata["weights_sha256"]) == [INT8_FILE]
        loaded = TransformerSeq2SeqLM.from_preset(tmp_path / directory)
        assert len(loaded.ensemble_members) == 1
        assert_int8_copy(loaded.backbone, first.backbone)
        assert_int8_copy(loaded.ensemble_members[0].backbone, second.backbone)
    options = dict(sampler="greedy", max_length_offset=4)
    assert len(loaded.generate(token_inputs(2), **options)) == 2

    # In place; a preset stored in int8 already is left as it is.
    presets.store_int8(tmp_path / "float")
    assert not (tmp_path / "float" / "model.weights.h5").exists()
    assert (tmp_path / "float" / INT8_FILE).read_bytes() == (tmp_path / "converted" / INT8_FILE).read_bytes()
    presets.store_int8(tmp_path / "float")
    assert (tmp_path / "float" / INT8_FILE).read_bytes() == (tmp_path / "converted" / INT8_FILE).read_bytes()


@pytest.fixture
def int8_preset(tmp_path):
    model = small_model()
    model.save_to_preset(tmp_path / "preset", weights_storage="int8")
    return str(tmp_path / "preset")


def _rewrite(path, change):
    """Writes the archive at `path` again with `change(arrays)` applied."""
    with np.load(path, allow_pickle=False) as stored:
        arrays = {key: stored[key] for key in stored.files}
    change(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _forget_checksums(directory):
    path = os.path.join(directory, "metadata.json")
    with open(path) as f:
        metadata = json.load(f)
    del metadata["weights_sha256"]
    with open(path, "w") as f:
        json.dump(metadata, f)


@once
@pytest.mark.parametrize(
    "damage, named",
    [
        ("truncate", "model.weights.int8.npz' is corrupt: its SHA-256"),
        ("truncate unrecorded", "model.weights.int8.npz' is corrupt or truncated"),
        ("flip unrecorded", "model.weights.int8.npz' is corrupt or truncated"),
        ("remove", "has no weights file model.weights.int8.npz"),
        ("drop a variable", r"weights in .*model.weights.int8.npz' do not fit the model in .*config.json'.*"
                            r"no variable 'encoder_layer_0/feed_forward/inner/kernel'"),
        ("reshape a variable", r"model.weights.int8.npz' do not fit .*'token_embedding/embeddings' has shape"),
        ("add a variable", r"model.weights.int8.npz' do not fit .*variables the model lacks \(1, such as"),
        ("drop the format", r"model.weights.int8.npz' is not int8 weights of keras_transformer"),
    ],
)
def test_a_damaged_int8_file_is_named(int8_preset, damage, named):
    path = os.path.join(int8_preset, INT8_FILE)
    if "unrecorded" in damage or " a " in damage or "format" in damage:
        _forget_checksums(int8_preset)
    if damage.startswith("truncate"):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif damage.startswith("flip"):  # bytes inside an entry: its CRC-32 fails
        with zipfile.ZipFile(path) as archive:
            entry = archive.getinfo("token_embedding/embeddings.npy")
        with open(path, "r+b") as f:
            f.seek(entry.header_offset + 200)
            data = f.read(8)
            f.seek(entry.header_offset + 200)
            f.write(bytes(b ^ 0xFF for b in data))
    elif damage == "remove":
        os.remove(path)
    elif damage == "drop a variable":
        _rewrite(path, lambda a: a.pop("encoder_layer_0/feed_forward/inner/kernel"))
    elif damage == "reshape a variable":
        _rewrite(path, lambda a: a.update({"token_embedding/embeddings": a["token_embedding/embeddings"][:10]}))
    elif damage == "add a variable":
        _rewrite(path, lambda a: a.update({"decoder_layer_1/feed_forward/inner/bias": np.zeros(4, "float32")}))
    else:
        _rewrite(path, lambda a: a.pop("__format__"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a preset that records no SHA-256
        with pytest.raises(PresetError, match=named.replace(".npz", r"\.npz")):
            TransformerSeq2SeqLM.from_preset(int8_preset)


@once
def test_failed_saves_and_conversions_leave_the_files_as_they_were(int8_preset, monkeypatch, tmp_path):
    before = directory_contents(int8_preset)
    other = small_model(seed=9)

    def fail(backbone, path):
        with open(path, "wb") as f:
            f.write(b"half of it")
        raise OSError("disk full")

    monkeypatch.setattr(int8, "write_weights", fail)
    with pytest.raises(OSError, match="disk full"):
        other.save_to_preset(int8_preset, weights_storage="int8")
    assert directory_contents(int8_preset) == before
    assert sorted(os.listdir(tmp_path)) == ["preset"]  # no staging left

    # A conversion that fails on the ensemble's second model.
    first, second = small_model(seed=1), small_model(seed=2, num_layers=2)
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "float")
    floats = directory_contents(tmp_path / "float")
    calls = []
    monkeypatch.undo()
    write_weights = int8.write_weights

    def fail_second(backbone, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        write_weights(backbone, path)

    monkeypatch.setattr(int8, "write_weights", fail_second)
    for output in (None, tmp_path / "converted"):
        calls.clear()
        with pytest.raises(OSError, match="disk full"):
            presets.store_int8(tmp_path / "float", output)
        assert len(calls) == 2
        assert directory_contents(tmp_path / "float") == floats
        assert not (tmp_path / "converted").exists()
    monkeypatch.undo()

    # Not a storage, or not a model with weights: refused before writing.
    with pytest.raises(ValueError, match="`weights_storage` must be one of"):
        other.save_to_preset(tmp_path / "other", weights_storage="float16")
    with pytest.raises(PresetError, match="shipped inside the package: give `output_dir`"):
        presets.store_int8("transformer_multi30k_en_de")
    assert not (tmp_path / "other").exists()


@once
def test_quantize_against_its_error_bound():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (5, 3, 4)).astype("float32") * rng.uniform(0.01, 10, (1, 1, 4)).astype("float32")
    w[:, :, 0] = 0.0  # a channel of zeros: scale 0, values 0
    q, scale = int8.quantize(w, axes=(0, 1))
    assert q.dtype == np.int8 and scale.shape == (1, 1, 4) and scale[0, 0, 0] == 0
    assert np.abs(q).max() == 127 and np.all(np.abs(q).reshape(-1, 4).max(0)[1:] == 127)
    assert np.all(np.abs(int8.dequantize(q, scale) - w) <= scale / 2 * (1 + 1e-6))
    with pytest.raises(ValueError, match="NaN or infinite"):
        int8.quantize(np.array([[1.0, np.nan]]), axes=(1,))

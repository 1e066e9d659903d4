"""Int8 storage of preset weights (`save_to_preset(weights_storage="int8")`,
`presets.store_int8`): the stored weights against a NumPy reference of
Keras' quantization, the file as Keras reads it, decoding against the float
preset, ensemble members, presets of earlier versions (their archive), the
errors for damaged files, and saves that fail."""

import gc
import json
import os
import shutil
import warnings
import zipfile

import h5py
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
from legacy_int8 import save_legacy_preset
from small_models import small_model
from small_models import token_inputs

WEIGHTS = "model.weights.h5"
ARCHIVE = "model.weights.int8.npz"  # earlier versions' int8 weights


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
    """NumPy reference of int8 storage, Keras' abs-max quantization
    (`scale = 127 / max|w|`, `q = round(w * scale)`, with Keras' epsilon):
    (dequantized w, the step 1 / scale)."""
    w = np.asarray(w, "float32")
    if w.ndim < 2 or path.endswith("bias"):  # an attention's query bias is (heads, d_k)
        return w, None
    largest = np.abs(w).max(axis=reference_axes(path, w.ndim), keepdims=True)
    scale = np.float32(127) / (largest + np.float32(keras.config.epsilon()))
    q = np.clip(np.round(w * scale), -127, 127)
    return q.astype("float32") / scale, 1 / scale


def assert_int8_copy(loaded, original):
    """`loaded` holds the reference's dequantized weights of `original`,
    each within half a quantization step of the original."""
    assert [v.path for v in loaded.weights] == [v.path for v in original.weights]
    quantized = 0
    for mine, theirs in zip(loaded.weights, original.weights):
        w = to_numpy(theirs).astype("float32")
        expected, step = reference_dequantized(theirs.path, w)
        got = to_numpy(mine)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=theirs.path)
        if step is not None:
            quantized += 1
            assert np.all(np.abs(got - w) <= step / 2 * (1 + 1e-5) + 1e-7), theirs.path
    assert quantized == sum(len(v.shape) >= 2 and not v.path.endswith("bias") for v in original.weights) > 0


def test_round_trip_of_a_task_stored_in_int8(tmp_path):
    model = small_model()
    model.save_to_preset(tmp_path / "int8", weights_storage="int8")
    assert sorted(os.listdir(tmp_path / "int8")) == ["config.json", "metadata.json", WEIGHTS, "task.json"]
    metadata = json.loads((tmp_path / "int8" / "metadata.json").read_text())
    assert metadata["weights_storage"] == "int8"
    assert list(metadata["weights_sha256"]) == [WEIGHTS]
    # The config is the float model's.
    assert json.loads((tmp_path / "int8" / "config.json").read_text())["config"]["dtype"]["config"]["name"] == "float32"

    loaded = TransformerSeq2SeqLM.from_preset(tmp_path / "int8")
    assert loaded.backbone.compute_dtype == "float32"
    assert not any(layer.quantization_mode for layer in loaded.backbone._flatten_layers())
    assert_int8_copy(loaded.backbone, model.backbone)
    assert_int8_copy(TransformerBackbone.from_preset(tmp_path / "int8"), model.backbone)
    # Another precision, as for a float preset.
    half = TransformerBackbone.from_preset(tmp_path / "int8", dtype="bfloat16")
    assert keras.backend.standardize_dtype(half.weights[0].dtype) == "bfloat16"

    # The file is Keras' own for the model quantized to int8: Keras reads
    # it into such a model, its int8 values and scales Keras' quantization.
    with h5py.File(tmp_path / "int8" / WEIGHTS, "r") as f:
        assert f.attrs["keras_transformer.weights_storage"] == "int8"
    quantized = TransformerBackbone.from_config(model.backbone.get_config())
    gc.freeze()  # (Keras collects garbage at every layer it quantizes: seconds in a test process)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantized.quantize("int8")
    finally:
        gc.unfreeze()
    quantized.load_weights(tmp_path / "int8" / WEIGHTS)
    variables = {v.path: to_numpy(v) for v in quantized.weights}
    for variable in model.backbone.weights:
        w = to_numpy(variable)
        expected, step = reference_dequantized(variable.path, w)
        if step is None:
            np.testing.assert_array_equal(variables[variable.path], w)
            continue
        assert variables[variable.path].dtype == np.int8
        assert variables[variable.path + "_scale"].size == np.prod(step.shape)
        got = variables[variable.path].astype("float32") / variables[variable.path + "_scale"].reshape(step.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=variable.path)

    # keras-hub's own loader reads it too: it hands the file to the backbone.
    import keras_hub

    for through_keras_hub in (keras_hub.models.Seq2SeqLM.from_preset(str(tmp_path / "int8")),
                              keras_hub.models.Backbone.from_preset(str(tmp_path / "int8"))):
        assert_int8_copy(getattr(through_keras_hub, "backbone", through_keras_hub), model.backbone)

    # Saved again as float over it: Keras' float weights, no int8 record.
    loaded.save_to_preset(tmp_path / "int8")
    with h5py.File(tmp_path / "int8" / WEIGHTS, "r") as f:
        assert "keras_transformer.weights_storage" not in f.attrs
    assert "weights_storage" not in json.loads((tmp_path / "int8" / "metadata.json").read_text())
    assert_int8_copy(TransformerBackbone.from_preset(tmp_path / "int8"), model.backbone)


@once
def test_int8_weights_take_little_more_than_half_of_float16_weights(tmp_path):
    model = small_model(vocabulary_size=4096, d_model=128)
    half = TransformerBackbone.from_config({**model.backbone.get_config(), "dtype": "float16"})
    half.set_weights(model.backbone.get_weights())
    half.save_to_preset(tmp_path / "float16")
    model.backbone.save_to_preset(tmp_path / "int8", weights_storage="int8")
    int8_size = (tmp_path / "int8" / WEIGHTS).stat().st_size
    float16_size = (tmp_path / "float16" / WEIGHTS).stat().st_size
    # Half the values' bytes, plus float32 scales and vectors, plus HDF5's
    # headers (a group for every layer, the same in both files: 0.1 MB
    # here, 0.4 MB for a 4+4-layer model, whose file is 0.56 of float16's).
    assert int8_size <= 0.57 * float16_size
    headers = float16_size - 2 * model.backbone.count_params()
    assert int8_size - headers <= 0.55 * 2 * model.backbone.count_params()


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
        _, step = reference_dequantized(variable.path, w)
        if step is not None:
            variable.assign(w + rng.uniform(-0.45, 0.45, w.shape).astype("float32") * step)
    model.save_to_preset(tmp_path / "int8", weights_storage="int8")
    stored = TransformerSeq2SeqLM.from_preset(tmp_path / "int8")
    assert stored.generate(sentences, sampler="greedy") == model.generate(sentences, sampler="greedy")


@once
def test_an_ensemble_preset_stores_its_members_in_int8(tmp_path):
    first, second = small_model(seed=1), small_model(seed=2, num_layers=2)
    first.set_ensemble_members([second])
    first.save_to_preset(tmp_path / "float")
    before = directory_contents(tmp_path / "float")

    # Converted into a new directory: the float preset stays as it was.
    presets.store_int8(tmp_path / "float", tmp_path / "converted")
    assert directory_contents(tmp_path / "float") == before
    # Saved with int8 storage: the same files.
    first.save_to_preset(tmp_path / "saved", weights_storage="int8")
    for directory in ("converted", "saved"):
        for path in ("", "ensemble/1"):
            member = tmp_path / directory / path
            assert int8.storage(str(member)) == "h5"
            metadata = json.loads((member / "metadata.json").read_text())
            assert metadata["weights_storage"] == "int8" and list(metadata["weights_sha256"]) == [WEIGHTS]
        loaded = TransformerSeq2SeqLM.from_preset(tmp_path / directory)
        assert len(loaded.ensemble_members) == 1
        assert_int8_copy(loaded.backbone, first.backbone)
        assert_int8_copy(loaded.ensemble_members[0].backbone, second.backbone)
    options = dict(sampler="greedy", max_length_offset=4)
    assert len(loaded.generate(token_inputs(2), **options)) == 2

    # In place; a preset stored in int8 already is left as it is.
    presets.store_int8(tmp_path / "float")
    assert int8.storage(str(tmp_path / "float")) == "h5"
    converted = directory_contents(tmp_path / "float")
    presets.store_int8(tmp_path / "float")
    assert directory_contents(tmp_path / "float") == converted


@once
def test_presets_of_earlier_versions_still_load(tmp_path):
    """Int8 weights in the archive of earlier versions load as before, by
    this package's loaders and keras-hub's, and `store_int8` writes them in
    model.weights.h5 with the same int8 values. (The shipped presets, an
    ensemble of two such models: tests/test_presets_sharing.py.)"""
    model = small_model(seed=1)
    save_legacy_preset(model, tmp_path / "old")
    assert int8.storage(str(tmp_path / "old")) == "npz"
    import keras_hub

    loaded = TransformerSeq2SeqLM.from_preset(tmp_path / "old")
    by_keras_hub = keras_hub.models.Seq2SeqLM.from_preset(str(tmp_path / "old"))
    for backbone in (loaded.backbone, by_keras_hub.backbone):
        # (The archive's `max|w| / 127` and Keras' `127 / (max|w| + eps)`
        # give the same int8 values; the steps differ by Keras' epsilon.)
        assert_int8_copy(backbone, model.backbone)

    presets.store_int8(tmp_path / "old", tmp_path / "new")
    expected_files = {*os.listdir(tmp_path / "old"), WEIGHTS} - {ARCHIVE, "model.weights.json"}
    assert sorted(os.listdir(tmp_path / "new")) == sorted(expected_files)
    assert int8.storage(str(tmp_path / "new")) == "h5"
    again = TransformerBackbone.from_preset(tmp_path / "new")
    for a, b in zip(again.weights, loaded.backbone.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-6, atol=1e-7, err_msg=a.path)


@pytest.fixture
def int8_preset(tmp_path):
    model = small_model()
    model.save_to_preset(tmp_path / "preset", weights_storage="int8")
    return str(tmp_path / "preset")


@pytest.fixture
def legacy_preset(tmp_path):
    save_legacy_preset(small_model(), tmp_path / "legacy")
    return str(tmp_path / "legacy")


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
def test_a_damaged_archive_of_earlier_versions_is_named(legacy_preset, damage, named):
    int8_preset = legacy_preset
    path = os.path.join(int8_preset, ARCHIVE)
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
@pytest.mark.parametrize(
    "damage, named",
    [
        ("truncate", "model.weights.h5' is corrupt: its SHA-256"),
        ("truncate unrecorded", "model.weights.h5' is corrupt or truncated"),
        ("remove", "has no weights file model.weights.h5"),
        ("unlist the layers", "model.weights.h5' is corrupt: it says it holds weights stored in int8, but not which"),
        ("another model's", r"weights in .*model.weights.h5' do not fit the model in .*config.json'.*"),
    ],
)
def test_a_damaged_int8_file_is_named(int8_preset, damage, named, tmp_path):
    path = os.path.join(int8_preset, WEIGHTS)
    if damage != "truncate":
        _forget_checksums(int8_preset)
    if damage.startswith("truncate"):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif damage == "remove":
        os.remove(path)
    elif damage == "unlist the layers":
        with h5py.File(path, "a") as f:
            del f.attrs["keras_transformer.int8_layers"]
    else:  # the weights of a model of two layers
        small_model(num_layers=2).save_to_preset(tmp_path / "two", weights_storage="int8")
        shutil.copyfile(tmp_path / "two" / WEIGHTS, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a preset that records no SHA-256
        with pytest.raises(PresetError, match=named):
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
def test_zero_channels_and_refusal_of_nan(tmp_path):
    model = small_model()
    kernel = model.backbone.get_layer("encoder_layer_0").feed_forward.inner_dense.kernel
    kernel.assign(keras.ops.where(keras.ops.arange(kernel.shape[1]) == 0, 0.0, kernel))  # a column of zeros
    model.save_to_preset(tmp_path / "zeros", weights_storage="int8")
    assert_int8_copy(TransformerBackbone.from_preset(tmp_path / "zeros"), model.backbone)
    kernel.assign(keras.ops.where(keras.ops.arange(kernel.shape[1]) == 1, np.nan, kernel))
    with pytest.raises(ValueError, match="inner/kernel' holds NaN or infinite values"):
        model.save_to_preset(tmp_path / "nan", weights_storage="int8")
    assert not (tmp_path / "nan").exists()

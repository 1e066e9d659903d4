"""Sharing presets on a hub: every form of preset this package saves
(float, bfloat16, int8 storage, ensembles, a shipped preset) goes through
keras-hub's own upload code, its checks included, up to the hub client's
network call (which records what it would upload), and loads back, from
its directory and by its handle, through this package's loaders and
keras-hub's, translating as the original model did. No test reaches the
network: the hub clients' upload and download calls are replaced by a hub
in a temporary directory."""

import gc
import os
import shutil
import types
import warnings

import huggingface_hub
import kagglehub
import keras
import keras_hub
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer import presets
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM
from keras_transformer.presets import PresetError
from keras_transformer.presets import hub as hub_access
from keras_transformer.presets import int8_legacy

from helpers import directory_contents
from helpers import once
from helpers import to_numpy
from small_models import small_model
from small_models import token_inputs

OPTIONS = dict(sampler="greedy", max_length_offset=3)


class FakeHub:
    """Kaggle and the Hugging Face hub as their clients reach them: what
    keras-hub uploads is recorded and kept under `root`, and downloads are
    served from there."""

    def __init__(self, root):
        self.root = root
        self.uploads = []  # (handle, directory, files)

    def _place(self, handle):
        scheme, repo = handle.split("://")
        if scheme == "kaggle":
            repo = "/".join(repo.split("/")[:4])  # (without a version)
        return os.path.join(self.root, scheme, repo)

    def receive(self, handle, directory):
        self.uploads.append((handle, directory, sorted(directory_contents(directory))))
        shutil.copytree(directory, self._place(handle), dirs_exist_ok=True)

    def send(self, handle, path, missing):
        local = os.path.join(self._place(handle), path)
        if not os.path.isfile(local):
            raise missing
        return local

    def install(self, monkeypatch):
        # keras-hub's `upload_preset` calls, for kaggle://, `kagglehub.model_upload`;
        # for hf://, `create_repo`, `file_exists` (no model card yet: keras-hub
        # writes one) and `upload_folder`. Its `get_file` downloads with
        # `kagglehub.model_download` and `huggingface_hub.hf_hub_download`.
        monkeypatch.setattr(kagglehub, "model_upload", lambda handle, directory, *a, **k: self.receive(
            f"kaggle://{handle}", directory))
        monkeypatch.setattr(huggingface_hub, "create_repo", lambda repo_id, **k: types.SimpleNamespace(repo_id=repo_id))
        monkeypatch.setattr(huggingface_hub, "file_exists", lambda repo_id, filename, **k: False)
        monkeypatch.setattr(huggingface_hub, "upload_folder", lambda repo_id, folder_path, **k: self.receive(
            f"hf://{repo_id}", folder_path))
        monkeypatch.setattr(kagglehub, "model_download", lambda handle, path=None, **k: self.send(
            f"kaggle://{handle}", path, ValueError(f"'{path}' is not present in the model files")))
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo_id, filename, **k: self.send(
            f"hf://{repo_id}", filename, huggingface_hub.utils.EntryNotFoundError(f"{filename} not found")))
        # The hubs are taken as reachable (presets/hub.py checks otherwise).
        monkeypatch.setattr(hub_access, "prepare", lambda handle: None)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub(str(tmp_path / "hub"))
    fake.install(monkeypatch)
    return fake


def _bfloat16(model):
    backbone = TransformerBackbone.from_config({**model.backbone.get_config(), "dtype": "bfloat16"})
    backbone.set_weights(model.backbone.get_weights())
    return TransformerSeq2SeqLM(backbone)


FORMS = {
    # form: (the model to save, weights_storage, the dtype to load it in, the hub to load it from)
    "float": lambda: (small_model(seed=1), "float", None, "kaggle"),
    "bfloat16": lambda: (_bfloat16(small_model(seed=1)), "float", "bfloat16", "hf"),
    "int8": lambda: (small_model(seed=1), "int8", None, "kaggle"),
    "ensemble": lambda: (_ensemble(), "int8", None, "hf"),
    "quantized": lambda: (_quantized(small_model(seed=1)), "float", None, "kaggle"),
}


def _quantized(model):
    """`model` computing in int8 (Keras' `quantize`), its config saying so."""
    gc.freeze()  # (Keras collects garbage at every layer it quantizes: seconds in a test process)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.quantize("int8")
    finally:
        gc.unfreeze()
    return model


def _ensemble():
    first, second = small_model(seed=1), small_model(seed=2, num_layers=2)
    first.set_ensemble_members([second])
    return first


# (An ensemble's files are its models', each as above; a model that Keras
# quantized is saved by Keras alone: their forms run once.)
ONCE = ("ensemble", "quantized")


@pytest.mark.parametrize("form", [pytest.param(form, marks=[once] if form in ONCE else []) for form in FORMS])
def test_every_form_of_preset_goes_up_through_keras_hub_and_comes_back(form, hub, tmp_path):
    model, storage, dtype, source = FORMS[form]()
    directory = str(tmp_path / "preset")
    model.save_to_preset(directory, weights_storage=storage)
    models = ["", *(["ensemble/1"] if model.ensemble_members else [])]
    before = directory_contents(directory)

    # keras-hub's own upload takes the directory as it is, on either hub
    # (for hf://, with the model card it writes beside the files and removes).
    handles = {"kaggle": "kaggle://owner/transformer/keras/tiny", "hf": "hf://owner/tiny"}
    keras_hub.upload_preset(handles["kaggle"], directory)
    presets.upload_preset(handles["hf"], directory)
    assert [(handle, place) for handle, place, _ in hub.uploads] == [
        (handles["kaggle"], directory), (handles["hf"], directory)
    ]
    for _, _, files in hub.uploads:
        assert {f"{path}/model.weights.h5".lstrip("/") for path in models} <= set(files)
    assert "README.md" in hub.uploads[1][2] and "README.md" not in hub.uploads[0][2]
    assert directory_contents(directory) == before

    # Back from the directory, through this package's loader and keras-hub's
    # (which loads an ensemble's first model alone), and by a handle (keras-
    # hub's `get_file` downloading the files, an ensemble's models too).
    # Int8 weights are within half a step of the original's: the same
    # greedy translations here.
    load = {"dtype": dtype} if dtype else {}
    inputs = token_inputs(2)
    loaded = TransformerSeq2SeqLM.from_preset(directory, **load)
    dtypes = [keras.backend.standardize_dtype(b.weights[0].dtype) for b in (loaded.backbone, model.backbone)]
    assert dtypes[0] == dtypes[1]  # (int8 only for a model that Keras quantized)
    assert loaded.generate(inputs, **OPTIONS) == model.generate(inputs, **OPTIONS)
    by_keras_hub = keras_hub.models.Seq2SeqLM.from_preset(directory, **load)
    assert type(by_keras_hub) is TransformerSeq2SeqLM
    first_alone = model.generate(inputs, **OPTIONS, ensemble=[]) if model.ensemble_members else None
    assert by_keras_hub.generate(inputs, **OPTIONS) == (first_alone or model.generate(inputs, **OPTIONS))
    by_handle = TransformerSeq2SeqLM.from_preset(handles[source], **load)
    assert len(by_handle.ensemble_members) == len(loaded.ensemble_members) == len(models) - 1
    for mine, theirs in zip([by_handle, *by_handle.ensemble_members], [loaded, *loaded.ensemble_members]):
        for a, b in zip(mine.backbone.weights, theirs.backbone.weights):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)


@once
def test_a_shipped_preset_goes_up_in_keras_files_with_the_same_weights(hub, tmp_path, capsys):
    """The shipped presets keep their int8 weights in the archive of earlier
    versions, which keras-hub refuses; `keras-transformer upload` sends a
    copy with the same weights in model.weights.h5, and leaves the preset
    as it was."""
    copy = tmp_path / "de-en"
    shutil.copytree(presets.resolve("transformer_multi30k_de_en"), copy)
    before = directory_contents(copy)
    with pytest.raises(FileNotFoundError, match="The weights file is missing"):
        keras_hub.upload_preset("hf://owner/de-en", str(copy))
    assert hub.uploads == []

    assert cli.main(["upload", "--preset", str(copy), "hf://owner/de-en"]) == 0
    assert "Uploaded" in capsys.readouterr().out
    [(handle, uploaded, files)] = hub.uploads
    assert handle == "hf://owner/de-en" and uploaded != str(copy) and not os.path.exists(uploaded)
    assert {"model.weights.h5", "ensemble/1/model.weights.h5", "README.md"} <= set(files)
    assert not [name for name in files if name.endswith(("int8.npz", "model.weights.json"))]
    assert not [name for name in files if name.startswith(".") or "/." in name]  # (no lock or staging files)
    assert directory_contents(copy) == before

    # Back by the handle: the archives' weights (Keras' int8 values are
    # theirs; its scale is the reciprocal of theirs, with Keras' epsilon).
    shared = TransformerSeq2SeqLM.from_preset("hf://owner/de-en")
    assert len(shared.ensemble_members) == 1
    for path, model in zip(("", "ensemble/1"), [shared, *shared.ensemble_members]):
        arrays = int8_legacy.read_arrays(copy / path / "model.weights.int8.npz")
        for variable in model.backbone.weights:
            scale = arrays.get(variable.path + int8_legacy.SCALE_SUFFIX)
            expected = arrays[variable.path] if scale is None else int8_legacy.dequantize(arrays[variable.path], scale)
            np.testing.assert_allclose(to_numpy(variable), expected, rtol=1e-6, atol=1e-7, err_msg=variable.path)
    # keras-hub's loader gives the first model, translating as it does.
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    by_keras_hub = keras_hub.models.Seq2SeqLM.from_preset("hf://owner/de-en")
    assert by_keras_hub.generate(sentences, sampler="greedy") == shared.generate(
        sentences, sampler="greedy", ensemble=[]
    )


@once
def test_nothing_goes_up_from_a_preset_that_fails_a_check(hub, tmp_path):
    model = small_model()
    model.set_ensemble_members([small_model(seed=2)])
    model.save_to_preset(tmp_path / "preset")
    with pytest.raises(PresetError, match="give a Kaggle handle .* or a Hugging Face one"):
        presets.upload_preset("gs://bucket/tiny", tmp_path / "preset")

    # An ensemble model without weights: keras-hub checks the top directory
    # alone, and would upload it.
    os.remove(tmp_path / "preset" / "ensemble" / "1" / "model.weights.h5")
    with pytest.raises(PresetError, match="has no weights file model.weights.h5"):
        presets.upload_preset("hf://owner/tiny", tmp_path / "preset")
    with pytest.raises(PresetError, match="keras-hub would not upload .*weights file is missing"):
        presets.sharing.check_shareable(str(tmp_path / "preset"), ["ensemble/1"])

    # Weights whose bytes changed since they were saved.
    model.save_to_preset(tmp_path / "preset")
    path = tmp_path / "preset" / "model.weights.h5"
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(8)
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(b ^ 0xFF for b in data))
    with pytest.raises(SystemExit, match="error: The weights file .* is corrupt: its SHA-256"):
        cli.main(["upload", "--preset", str(tmp_path / "preset"), "kaggle://owner/transformer/keras/tiny"])
    assert hub.uploads == []

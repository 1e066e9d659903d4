"""Presets with int8 weights as earlier versions of the package saved them
(`model.weights.int8.npz` and its index `model.weights.json`; see
keras_transformer/presets/int8_legacy.py), written the way those versions
wrote them: the package reads them, and writes them no more."""

import hashlib
import json
import os
import zipfile

import keras
import numpy as np

from keras_transformer.presets import int8
from keras_transformer.presets import int8_legacy

ARCHIVE = "model.weights.int8.npz"


def quantize(values, axes):
    """The archive's quantization: `scale = max|w| / 127` over `axes`,
    `q = round(w / scale)`."""
    values = np.asarray(values, dtype="float32")
    scale = (np.max(np.abs(values), axis=tuple(axes), keepdims=True) / 127).astype("float32")
    q = np.round(values / np.where(scale > 0, scale, 1))
    return np.clip(q, -127, 127).astype("int8"), scale


def write_archive(backbone, path):
    axes = int8.channel_axes(backbone)
    arrays = {int8_legacy.FORMAT_KEY: np.array(int8_legacy.FORMAT)}
    for variable in backbone.weights:
        values = keras.ops.convert_to_numpy(variable)
        if variable.path in axes:
            arrays[variable.path], arrays[variable.path + int8_legacy.SCALE_SUFFIX] = quantize(
                values, axes[variable.path]
            )
        else:
            arrays[variable.path] = values.astype("float32")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, array in arrays.items():
            entry = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(entry, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array, order="C"), allow_pickle=False)


def save_legacy_preset(model, directory):
    """Saves `model` (a task, or one with ensemble members) as a preset
    whose every model keeps its weights in the archive, as earlier versions
    saved it with `weights_storage="int8"`."""
    model.save_to_preset(directory)
    members = json.load(open(os.path.join(directory, "metadata.json"))).get("ensemble", [])
    backbones = [model.backbone, *(member.backbone for member in getattr(model, "ensemble_members", []))]
    for path, backbone in zip(["", *members], backbones):
        place = os.path.join(directory, path)
        os.remove(os.path.join(place, "model.weights.h5"))
        write_archive(backbone, os.path.join(place, ARCHIVE))
        with open(os.path.join(place, "model.weights.json"), "w") as f:
            json.dump(int8_legacy.INDEX, f, indent=1)
        with open(os.path.join(place, ARCHIVE), "rb") as f:
            checksum = hashlib.sha256(f.read()).hexdigest()
        metadata_path = os.path.join(place, "metadata.json")
        with open(metadata_path) as f:
            metadata = json.load(f)
        metadata.update(weights_storage="int8", weights_sha256={ARCHIVE: checksum})
        with open(metadata_path, "w") as f:
            json.dump(metadata, f, indent=4)

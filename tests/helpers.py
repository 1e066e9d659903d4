"""Shared test helpers."""

import os

import keras
import pytest


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def assert_config_round_trip(obj):
    """`type(obj).from_config(obj.get_config())`, and Keras's own
    serialization (as `.keras` files and presets store objects), both give
    an object of the same class and the same config. Returns the config."""
    config = obj.get_config()
    clone = type(obj).from_config(config)
    assert type(clone) is type(obj)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))
    assert type(restored) is type(obj), f"Keras deserialized a {type(restored).__name__}"
    assert restored.get_config() == config
    return config


# A test whose subject does not depend on the backend (shapes and counts of
# weights, files written with NumPy, a subprocess that picks its own
# backend) runs once, in PyTorch's run, the quickest of the three: the
# suite runs on every backend, and each backend's run costs minutes.
once = pytest.mark.skipif(
    keras.config.backend() != "torch", reason="the same on every backend: runs in PyTorch's run"
)


def directory_contents(directory):
    """Every file under `directory`, by relative path, with its bytes."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                found[os.path.relpath(os.path.join(root, name), directory)] = f.read()
    return found

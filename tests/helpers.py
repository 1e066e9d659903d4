"""Shared test helpers."""

import keras


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

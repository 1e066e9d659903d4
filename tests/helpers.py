"""Shared test helpers."""

import keras


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)

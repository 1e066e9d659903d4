"""Initial values drawn anew for each weight matrix, or none drawn where
a checkpoint replaces them at once (`initial_values_skipped`)."""

import contextlib
import threading

import keras

_STATE = threading.local()


@contextlib.contextmanager
def initial_values_skipped():
    """Within it, the weight matrices that `independent` initializes start
    as zeros instead of random values: for a model built only to take a
    checkpoint's weights (`keras_transformer.convert`), which then draws
    and drops no random matrices (an embedding of 256,000 tokens drew
    2 GB of them, besides the model's own). Zeros cost no memory until
    written on backends that allocate them so (PyTorch).

    Example:

    >>> with initial_values_skipped():
    ...     values = independent(keras.initializers.GlorotUniform())((2, 2))
    >>> keras.ops.convert_to_numpy(values).tolist()
    [[0.0, 0.0], [0.0, 0.0]]
    """
    before = getattr(_STATE, "skipped", False)
    _STATE.skipped = True
    try:
        yield
    finally:
        _STATE.skipped = before


def unless_skipped(initializer):
    """`initializer`, or zeros within `initial_values_skipped`."""
    return keras.initializers.Zeros() if getattr(_STATE, "skipped", False) else initializer


def independent(initializer):
    """A copy of `initializer` that draws values of its own.

    Keras' random initializers fix their seed when they are made, so one
    instance gives the same values at every call of the same shape: handed
    to the four projections of an attention layer, it would start W^Q, W^K,
    W^V and W^O as one matrix. Each projection and each feed-forward matrix
    gets a copy made from the initializer's config, as Keras' own
    `MultiHeadAttention` and keras-hub's layers do. (An initializer given a
    fixed `seed` keeps it in its copies, and repeats its values, as in
    Keras; a plain function is returned as it is.)

    Example:

    >>> import numpy as np
    >>> shared = keras.initializers.GlorotUniform()
    >>> a, b = independent(shared)((4, 4)), independent(shared)((4, 4))
    >>> bool(np.allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)))
    False
    """
    if getattr(_STATE, "skipped", False):
        return unless_skipped(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    return initializer.__class__.from_config(initializer.get_config())

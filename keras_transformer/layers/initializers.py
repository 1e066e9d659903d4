"""Initial values drawn anew for each weight matrix."""

import keras


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
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    return initializer.__class__.from_config(initializer.get_config())

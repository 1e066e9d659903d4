"""Initial weights of sublayers that share an initializer argument.

Keras' random initializers draw from a seed fixed when the instance is
made (`keras.initializers.GlorotUniform()` picks one at construction), so
every call of one instance gives the same values. A layer that hands its
`kernel_initializer` to several sublayers of one shape would start them
equal: an attention layer's query, key and value projections, for one.
Keras' own `MultiHeadAttention` gives each sublayer a new instance of the
same configuration for this reason, and so does this package.
"""

import keras


def independent(initializer):
    """A new instance of `initializer`, made from its config: with no seed
    in the config (the default), it draws other values than `initializer`;
    an initializer given a seed gives the same values again, as the seed
    asks.

    Example:

    >>> import numpy as np
    >>> shared = keras.initializers.get("glorot_uniform")
    >>> first, second = independent(shared)((4, 4)), independent(shared)((4, 4))
    >>> bool(np.allclose(keras.ops.convert_to_numpy(first), keras.ops.convert_to_numpy(second)))
    False
    """
    return initializer.__class__.from_config(initializer.get_config())

"""Dropout (paper section 5.4), skipped where it does nothing.

Keras's `Dropout` returns its input unless `training` is true and its rate
is above 0. Decoding calls every layer once per output token, and on PyTorch
each Keras layer call costs more than the arithmetic of a one-token step, so
the layers check that rule themselves and call the `Dropout` layer only when
it drops something. Training is unchanged: the same layer, rate and seed.
(The backbone's embedding dropout keeps its plain layer call: that call is a
node of the functional model, made once with symbolic inputs, where
`training` is not known yet.)
"""


def apply_dropout(dropout, x, training=None):
    """`dropout(x, training=training)`, without the layer call when it would
    return `x` as it is.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> x = np.ones((2, 3), "float32")
    >>> apply_dropout(keras.layers.Dropout(0.5), x, training=False) is x
    True
    """
    if training and dropout.rate > 0:
        return dropout(x, training=training)
    return x

"""Position-wise feed-forward network (paper section 3.3).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                              (2)
"""

import keras

from keras_transformer.runtime.direct_layers import Dense
from keras_transformer.runtime.dispatch import DirectCall
from keras_transformer.runtime.direct_layers import Dropout
from keras_transformer.layers.dropout import apply_dropout
from keras_transformer.layers.initializers import independent


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(DirectCall, keras.layers.Layer):
    """Two linear maps with a ReLU between them, applied at every position.

    Section 3.3: the inner layer has `d_ff` units (2048 in the base model);
    the output has the width of the input (d_model).

    Args:
        d_ff: width of the inner layer.
        activation: the non-linearity between the two maps; the paper's is
            `"relu"`.
        dropout: dropout on the inner activations. The paper applies none
            (the default); residual dropout is in the encoder/decoder layers.
        kernel_initializer: initializer of W_1 and W_2.
        bias_initializer: initializer of b_1 and b_2.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, d_model)`.
        training: whether dropout is active.

    Example:

    >>> import numpy as np
    >>> ffn = PositionwiseFeedForward(d_ff=2048)
    >>> tuple(ffn(np.zeros((2, 7, 512), "float32")).shape)
    (2, 7, 512)
    """

    def __init__(
        self,
        d_ff,
        activation="relu",
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_ff = int(d_ff)
        self.activation = keras.activations.get(activation)
        self.dropout = float(dropout)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.inner_dense = Dense(self.d_ff, activation=self.activation, name="inner", **self._dense_arguments())
        self.inner_dropout = Dropout(self.dropout, dtype=self.dtype_policy)
        self.output_dense = Dense(d_model, name="output", **self._dense_arguments())
        self.inner_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.d_ff,))

    def _dense_arguments(self):
        # W_1 and W_2 draw their values each on its own (`initializers.independent`).
        return dict(
            kernel_initializer=independent(self.kernel_initializer),
            bias_initializer=independent(self.bias_initializer),
            dtype=self.dtype_policy,
        )

    def call(self, inputs, training=None):
        hidden = apply_dropout(self.inner_dropout, self.inner_dense(inputs), training)
        return self.output_dense(hidden)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_ff": self.d_ff,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

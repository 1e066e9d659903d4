"""The residual connection around each sub-layer (paper sections 3.1, 5.4).

Post-norm, as the paper: LayerNorm(x + Dropout(Sublayer(x))).
Pre-norm, the common alternative: x + Dropout(Sublayer(LayerNorm(x))); a
stack of pre-norm layers needs one final LayerNorm, which the backbone adds.
"""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.runtime.dispatch import DirectCall
from keras_transformer.runtime.direct_layers import Dropout
from keras_transformer.runtime.direct_layers import LayerNormalization
from keras_transformer.layers.dropout import apply_dropout
from keras_transformer.layers.feed_forward import PositionwiseFeedForward


def residual_connection(x, sublayer, norm, dropout, normalize_first, training=None):
    """Applies `sublayer` to `x` with dropout, the residual sum and `norm`.

    Args:
        x: the sub-layer input `(batch, length, d_model)`.
        sublayer: a callable from a tensor to a tensor.
        norm: the `keras.layers.LayerNormalization` of this sub-layer.
        dropout: the `keras.layers.Dropout` of residual dropout (P_drop).
        normalize_first: pre-norm when True, the paper's post-norm otherwise.
        training: forwarded to `dropout`.
    """
    if normalize_first:
        return x + apply_dropout(dropout, sublayer(norm(x)), training)
    return norm(x + apply_dropout(dropout, sublayer(x), training))


class TransformerLayerBase(DirectCall, keras.layers.Layer):
    """What the encoder and decoder layers share: their hyper-parameters, how
    they make sub-layers, and the residual connection around each one.

    Args:
        num_heads: h.
        d_ff: inner width of the feed-forward network.
        key_dim: d_k; defaults to d_model // num_heads.
        value_dim: d_v; defaults to `key_dim`.
        dropout: P_drop, residual dropout on each sub-layer output.
        attention_dropout: dropout on attention weights (the paper: 0).
        activation: feed-forward non-linearity (the paper: ReLU).
        normalize_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of every LayerNorm.
        kernel_initializer: initializer of every projection matrix.
        **kwargs: base `keras.layers.Layer` arguments.
    """

    def __init__(
        self,
        num_heads,
        d_ff,
        key_dim=None,
        value_dim=None,
        dropout=0.1,
        attention_dropout=0.0,
        activation="relu",
        normalize_first=False,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.d_ff = int(d_ff)
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.activation = keras.activations.get(activation)
        self.normalize_first = bool(normalize_first)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.residual_dropout = Dropout(self.dropout, dtype=self.dtype_policy)

    def _attention(self, name, query_shape, value_shape):
        layer = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.attention_dropout,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )
        layer.build(query_shape, value_shape)
        return layer

    def _feed_forward(self, input_shape):
        layer = PositionwiseFeedForward(
            self.d_ff,
            activation=self.activation,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        layer.build(input_shape)
        return layer

    def _layer_norm(self, name, input_shape):
        layer = LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        layer.build(input_shape)
        return layer

    def output_spec(self, inputs):
        """The spec of the layer's output for symbolic `inputs`: their
        shape, in the compute dtype (each sub-layer ends in a LayerNorm or
        a sum with its input, in the compute dtype).

        A functional model (`TransformerBackbone`) calls each layer once on
        symbolic inputs to learn this. Keras would trace the whole layer
        for it, on PyTorch through its meta tensors: more than half of
        building a 4+4-layer backbone (250 ms against 100 without it), and
        so of loading each model of an ensemble preset.
        `tests/test_layers.py` checks it against Keras' trace."""
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def _residual(self, x, sublayer, norm, training):
        return residual_connection(
            x, sublayer, norm, self.residual_dropout, self.normalize_first, training
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation": keras.activations.serialize(self.activation),
                "normalize_first": self.normalize_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config

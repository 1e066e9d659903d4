"""One encoder layer (paper section 3.1).

Two sub-layers, multi-head self-attention and the position-wise feed-forward
network, each wrapped as LayerNorm(x + Dropout(Sublayer(x))).
"""

import keras

from keras_transformer.layers.residual import TransformerLayerBase


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoderLayer(TransformerLayerBase):
    """An encoder layer: self-attention, then the feed-forward network.

    Section 3.1. Each sub-layer output goes through residual dropout
    (section 5.4), is added to its input and normalized (post-norm), or, with
    `normalize_first=True`, the input is normalized first (pre-norm).

    Args:
        num_heads: h, the number of attention heads.
        d_ff: inner width of the feed-forward network.
        key_dim: d_k; defaults to d_model // num_heads.
        value_dim: d_v; defaults to `key_dim`.
        dropout: P_drop, residual dropout on each sub-layer output.
        attention_dropout: dropout on the attention weights (the paper: 0).
        activation: feed-forward non-linearity (the paper: ReLU).
        normalize_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of both LayerNorms.
        kernel_initializer: initializer of every projection matrix.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, source_length, d_model)`.
        padding_mask: optional `(batch, source_length)`, true or 1 at real
            tokens, false or 0 at padding.
        return_attention_scores: also return the self-attention weights
            `(batch, num_heads, source_length, source_length)`.
        training: whether dropout is active.

    Example:

    >>> import numpy as np
    >>> layer = TransformerEncoderLayer(num_heads=4, d_ff=128)
    >>> x = np.random.rand(2, 6, 32).astype("float32")
    >>> tuple(layer(x, padding_mask=np.ones((2, 6), bool)).shape)
    (2, 6, 32)
    """

    def build(self, input_shape):
        self.self_attention = self._attention("self_attention", input_shape, input_shape)
        self.self_attention_norm = self._layer_norm("self_attention_norm", input_shape)
        self.feed_forward = self._feed_forward(input_shape)
        self.feed_forward_norm = self._layer_norm("feed_forward_norm", input_shape)

    def call(self, inputs, padding_mask=None, return_attention_scores=False, training=None):
        mask = None if padding_mask is None else padding_mask[:, None, :]
        scores = []

        def self_attention(x):
            outputs = self.self_attention(
                x, x, attention_mask=mask,
                return_attention_scores=return_attention_scores, training=training,
            )
            if return_attention_scores:
                scores.append(outputs[1])
                return outputs[0]
            return outputs

        x = self._residual(inputs, self_attention, self.self_attention_norm, training)
        x = self._residual(
            x, lambda y: self.feed_forward(y, training=training), self.feed_forward_norm, training
        )
        return (x, scores[0]) if return_attention_scores else x

    def compute_output_spec(self, inputs, padding_mask=None, return_attention_scores=False, training=None):
        # The output has the input's shape, in the compute dtype
        # (`TransformerLayerBase.output_spec`); Keras traces the layer for
        # the attention weights' spec.
        if return_attention_scores:
            return super().compute_output_spec(inputs, padding_mask, return_attention_scores, training)
        return self.output_spec(inputs)

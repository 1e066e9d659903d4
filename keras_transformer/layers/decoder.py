"""One decoder layer (paper section 3.1).

Three sub-layers: masked multi-head self-attention (a position sees only the
positions before it and itself), multi-head attention over the encoder output,
and the position-wise feed-forward network, each wrapped as
LayerNorm(x + Dropout(Sublayer(x))).
"""

import keras

from keras_transformer.layers.residual import TransformerLayerBase


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderLayer(TransformerLayerBase):
    """A decoder layer: masked self-attention, encoder-decoder attention,
    feed-forward network.

    Section 3.1. Residual dropout, sums and LayerNorms as in
    `TransformerEncoderLayer`.

    For incremental decoding the self-attention reads and writes a key/value
    cache and the encoder-decoder attention reads keys and values computed
    once per source (see `MultiHeadAttention`).

    Args:
        num_heads: h, the number of attention heads.
        d_ff: inner width of the feed-forward network.
        key_dim: d_k; defaults to d_model // num_heads.
        value_dim: d_v; defaults to `key_dim`.
        dropout: P_drop, residual dropout on each sub-layer output.
        attention_dropout: dropout on the attention weights (the paper: 0).
        activation: feed-forward non-linearity (the paper: ReLU).
        normalize_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of the three LayerNorms.
        kernel_initializer: initializer of every projection matrix.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        decoder_sequence: `(batch, target_length, d_model)`.
        encoder_sequence: the encoder output `(batch, source_length, d_model)`.
        decoder_padding_mask: optional `(batch, target_length)` (with a cache:
            `(batch, cache_length)`), true at real tokens.
        encoder_padding_mask: optional `(batch, source_length)`, true at real
            tokens.
        self_attention_cache: optional `(key_cache, value_cache)` of the
            self-attention, `(batch, cache_length, num_heads, d_k | d_v)`.
        self_attention_cache_update_index: where the current positions go in
            `self_attention_cache`.
        cross_attention_cache: optional `(key_heads, value_heads)` of the
            encoder output, from `cross_attention.project_key_value`.
        return_attention_scores: also return a dict with the weights of
            `"self_attention"` and `"cross_attention"`.
        training: whether dropout is active.

    Returns:
        The output `(batch, target_length, d_model)`; then the dict of
        attention weights if asked for; then the updated self-attention cache
        if one was given.

    Example:

    >>> import numpy as np
    >>> layer = TransformerDecoderLayer(num_heads=4, d_ff=128)
    >>> target = np.random.rand(2, 5, 32).astype("float32")
    >>> memory = np.random.rand(2, 7, 32).astype("float32")
    >>> tuple(layer(target, memory).shape)
    (2, 5, 32)
    """

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        encoder_sequence_shape = encoder_sequence_shape or decoder_sequence_shape
        self.self_attention = self._attention(
            "self_attention", decoder_sequence_shape, decoder_sequence_shape
        )
        self.self_attention_norm = self._layer_norm("self_attention_norm", decoder_sequence_shape)
        self.cross_attention = self._attention(
            "cross_attention", decoder_sequence_shape, encoder_sequence_shape
        )
        self.cross_attention_norm = self._layer_norm("cross_attention_norm", decoder_sequence_shape)
        self.feed_forward = self._feed_forward(decoder_sequence_shape)
        self.feed_forward_norm = self._layer_norm("feed_forward_norm", decoder_sequence_shape)

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        _check_memory(encoder_sequence, cross_attention_cache)
        self_mask = None if decoder_padding_mask is None else decoder_padding_mask[:, None, :]
        cross_mask = None if encoder_padding_mask is None else encoder_padding_mask[:, None, :]
        scores, updated = {}, {}

        def self_attention(x):
            outputs = self.self_attention(
                x, x,
                attention_mask=self_mask,
                use_causal_mask=True,
                return_attention_scores=return_attention_scores,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                training=training,
            )
            x, scores["self_attention"], updated["cache"] = _split_attention_outputs(
                outputs, return_attention_scores, self_attention_cache is not None
            )
            return x

        def cross_attention(x):
            outputs = self.cross_attention(
                x, encoder_sequence,
                attention_mask=cross_mask,
                return_attention_scores=return_attention_scores,
                cache=cross_attention_cache,
                training=training,
            )
            x, scores["cross_attention"], _ = _split_attention_outputs(
                outputs, return_attention_scores, cross_attention_cache is not None
            )
            return x

        x = self._residual(decoder_sequence, self_attention, self.self_attention_norm, training)
        x = self._residual(x, cross_attention, self.cross_attention_norm, training)
        x = self._residual(
            x, lambda y: self.feed_forward(y, training=training), self.feed_forward_norm, training
        )
        outputs = (x,)
        if return_attention_scores:
            outputs += (scores,)
        if self_attention_cache is not None:
            outputs += (updated["cache"],)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_spec(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        # The output has the input's shape, in the compute dtype
        # (`TransformerLayerBase.output_spec`); Keras traces the layer for
        # the specs of attention weights and caches.
        if return_attention_scores or self_attention_cache is not None:
            return super().compute_output_spec(
                decoder_sequence, encoder_sequence, decoder_padding_mask, encoder_padding_mask,
                self_attention_cache, self_attention_cache_update_index, cross_attention_cache,
                return_attention_scores, training,
            )
        _check_memory(encoder_sequence, cross_attention_cache)
        return self.output_spec(decoder_sequence)


def _check_memory(encoder_sequence, cross_attention_cache):
    if encoder_sequence is None and cross_attention_cache is None:
        raise ValueError(
            "TransformerDecoderLayer needs the encoder output: pass "
            "`encoder_sequence` or a precomputed `cross_attention_cache`."
        )


def _split_attention_outputs(outputs, with_scores, with_cache):
    """`(output, weights, cache)` of a `MultiHeadAttention` call, which
    returns the output, then the weights if asked for, then the cache if one
    was given; None for what it did not return."""
    if not (with_scores or with_cache):
        return outputs, None, None
    output, *rest = outputs
    weights = rest.pop(0) if with_scores else None
    cache = rest.pop(0) if with_cache else None
    return output, weights, cache

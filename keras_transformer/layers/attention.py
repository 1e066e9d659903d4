"""Multi-head attention (paper section 3.2.2).

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        where head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

with Attention, equation (1), in `layers.scaled_dot_product` (3.2.1).
Illegal connections (padding, future positions) are set to -inf before the
softmax (section 3.2.3), so they receive exactly zero weight.
"""


import keras
from keras import ops

from keras_transformer.layers.scaled_dot_product import head_major_attention
from keras_transformer.layers.scaled_dot_product import scaled_dot_product_attention
from keras_transformer.runtime import beam_cache
from keras_transformer.runtime.backend_choices import attends_head_major
from keras_transformer.runtime.backend_choices import attends_mixed_in_compute_dtype
from keras_transformer.runtime import cache_bits
from keras_transformer.runtime.dispatch import DirectCall
from keras_transformer.runtime.direct_layers import Dropout
from keras_transformer.runtime.direct_layers import EinsumDense
from keras_transformer.runtime.direct_calls import dot_product_attention
from keras_transformer.runtime.direct_calls import write_cache
from keras_transformer.layers.initializers import independent


# Caches hold keys and values head-major, `(batch, heads, positions, d)`:
# the layout in which attention kernels read them (PyTorch's fused kernel
# would otherwise copy the whole cache at every decoding step), and in which
# a position is written with one slice update.
def _head_major(x):
    return ops.transpose(x, (0, 2, 1, 3))


_token_major = _head_major  # the same swap of the positions and heads axes


def _ungroup_weights(weights, query_shape):
    """Attention weights of grouped queries, `(memory_batch, heads, groups *
    target_length, source_length)`, as `(query_batch, heads, target_length,
    source_length)`."""
    memory_batch, heads, _, source_length = ops.shape(weights)
    weights = ops.reshape(weights, (memory_batch, heads, -1, query_shape[1], source_length))
    weights = ops.transpose(weights, (0, 2, 1, 3, 4))
    return ops.reshape(weights, (query_shape[0], heads, query_shape[1], source_length))


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(DirectCall, keras.layers.Layer):
    """Multi-head attention, as in section 3.2.2 of the paper.

    Projects queries and keys to `num_heads` heads of `key_dim` (d_k)
    dimensions and values to `num_heads` heads of `value_dim` (d_v)
    dimensions, applies scaled dot-product attention to each head, concatenates
    the heads and projects them back to the query's width (d_model) with W^O.
    `key_dim` and `value_dim` are independent, which Table 3 rows (A) and (B)
    need.

    Where d_k == d_v, no attention weights are asked for and no attention
    dropout is active, the attention runs through
    `keras.ops.dot_product_attention`, which reaches each backend's fused
    kernel. Otherwise it runs equation (1) step by step.

    The layer can read and write a key/value cache for incremental decoding:
    pass `cache=(key_cache, value_cache)` of shapes
    `(batch, num_heads, max_length, key_dim)` and
    `(batch, num_heads, max_length, value_dim)` (head-major, as attention
    kernels read them). With `cache_update_index`
    the keys and values of the current queries are written into the cache at
    that position first (decoder self-attention); without it the cache is
    used as it is (encoder-decoder attention over a fixed memory). The
    updated cache is returned next to the output.

    A fixed memory may have fewer rows than the queries: with `B` memory
    rows and `B * g` query rows, query rows `i * g` to `i * g + g - 1` read
    memory row `i` (and `attention_mask` has `B` rows). Beam search passes
    each source's encoder keys and values once for its `g` beams, instead
    of `g` copies.

    Args:
        num_heads: h, the number of attention heads.
        key_dim: d_k, the size of each query and key head. Defaults to
            `d_model // num_heads`, which needs `d_model` divisible by
            `num_heads`.
        value_dim: d_v, the size of each value head. Defaults to `key_dim`.
        dropout: dropout rate on the attention weights. The paper uses none
            (the default); residual dropout lives in the encoder and decoder
            layers.
        use_bias: whether the projections have biases.
        kernel_initializer: initializer of the projection matrices.
        bias_initializer: initializer of the biases.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`...).

    Call arguments:
        query: `(batch, target_length, d_model)`.
        value: `(batch, source_length, d_value_in)`.
        key: optional `(batch, source_length, d_key_in)`; defaults to `value`.
        attention_mask: optional boolean `(batch, target_length,
            source_length)` (dimensions of size 1 broadcast); `True` marks
            the pairs that may attend to each other.
        use_causal_mask: whether to forbid attention to later positions
            (decoder self-attention). With a cache, "later" counts from
            `cache_update_index`.
        return_attention_scores: also return the weights
            `(batch, num_heads, target_length, source_length)`.
        cache: optional `(key_cache, value_cache)`, see above.
        cache_update_index: optional int or scalar tensor, see above.
        training: whether dropout is active.

    Returns:
        The output `(batch, target_length, d_model)`, then the weights if
        `return_attention_scores`, then the updated cache if `cache` was given.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=8)
    >>> x = np.random.rand(2, 5, 64).astype("float32")
    >>> padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    >>> out = layer(x, x, attention_mask=padding[:, None, :])
    >>> tuple(out.shape)
    (2, 5, 64)
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(num_heads) < 1:
            raise ValueError(f"`num_heads` must be at least 1, got {num_heads}.")
        self.num_heads = int(num_heads)
        self.key_dim = None if key_dim is None else int(key_dim)
        self.value_dim = None if value_dim is None else int(value_dim)
        self.dropout = float(dropout)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.dropout_layer = Dropout(self.dropout, dtype=self.dtype_policy)
        self.supports_masking = False

    def _head_dims(self, d_model):
        key_dim = self.key_dim
        if key_dim is None:
            if d_model % self.num_heads:
                raise ValueError(
                    f"d_model={d_model} is not divisible by num_heads="
                    f"{self.num_heads}. Pass `key_dim` (d_k) and `value_dim` "
                    "(d_v) explicitly, or choose num_heads dividing d_model."
                )
            key_dim = d_model // self.num_heads
        value_dim = key_dim if self.value_dim is None else self.value_dim
        return key_dim, value_dim

    def _projection(self, name, equation, output_shape, bias_axes):
        return EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=independent(self.kernel_initializer),
            bias_initializer=independent(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        d_model = query_shape[-1]
        self._d_k, self._d_v = self._head_dims(d_model)
        h = self.num_heads
        # W^Q, W^K, W^V: (d_in, h, d_k|d_v); W^O: (h, d_v, d_model).
        self.query_dense = self._projection("query", "btd,dnh->btnh", (None, h, self._d_k), "nh")
        self.key_dense = self._projection("key", "bsd,dnh->bsnh", (None, h, self._d_k), "nh")
        self.value_dense = self._projection("value", "bsd,dnh->bsnh", (None, h, self._d_v), "nh")
        self.output_dense = self._projection("attention_output", "btnh,nhd->btd", (None, d_model), "d")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build((query_shape[0], query_shape[1], h, self._d_v))

    def call(
        self,
        query,
        value,
        key=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        if beam_cache.is_beam_cache(cache):
            return self._call_over_beam_cache(query, cache, cache_update_index, return_attention_scores)
        query_heads = self.query_dense(query)
        if cache is None:
            key_heads, value_heads = self._project(value, key)
        else:
            if cache_update_index is not None:
                start = [0, 0, cache_update_index, 0]
                keys, values = self.project_key_value(value, key)
                cache = tuple(write_cache(c, start, cache_bits.held(x, c)) for c, x in zip(cache, (keys, values)))
            key_heads, value_heads = (_token_major(cache_bits.read(c)) for c in cache)
        query_shape = ops.shape(query_heads)
        end = cache_update_index + query_shape[1] if isinstance(cache_update_index, int) else None
        if use_causal_mask and end is not None and end > 1 and not return_attention_scores:
            # A position known on the host (PyTorch's eager decoding steps):
            # the cache's positions after the queries' are masked anyway, so
            # only the written ones are read (from the second, as Keras
            # warns of a softmax over a single position).
            key_heads, value_heads = key_heads[:, :end], value_heads[:, :end]
            if attention_mask is not None and attention_mask.shape[-1] != 1:
                attention_mask = attention_mask[..., :end]
        # A fixed memory's row may serve several consecutive query rows (the
        # beams of a source share its encoder output): their queries attend
        # as that row's target positions, so the memory is read once, not
        # once per beam.
        shared_memory = cache is not None and cache_update_index is None and not use_causal_mask
        if shared_memory:
            query_heads = ops.reshape(query_heads, (ops.shape(key_heads)[0], -1) + tuple(query_shape[2:]))
        mask = self._attention_mask(
            query_heads, key_heads, attention_mask, use_causal_mask, cache_update_index
        )

        fused = (
            self._d_k == self._d_v
            and not return_attention_scores
            and (self.dropout == 0.0 or not training)
        )
        if shared_memory and fused and attends_head_major(self):
            heads, weights = head_major_attention(query_heads, *map(cache_bits.read, cache), mask), None
        else:
            heads, weights = self._attend(query_heads, key_heads, value_heads, mask, fused, training)
        if shared_memory:
            heads = ops.reshape(heads, tuple(query_shape[:2]) + tuple(ops.shape(heads)[2:]))
            if weights is not None:
                weights = _ungroup_weights(weights, query_shape)
        outputs = [self.output_dense(heads)]
        if return_attention_scores:
            outputs.append(weights)
        if cache is not None:
            outputs.append(cache)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _call_over_beam_cache(self, query, cache, index, return_attention_scores):
        """A decoding step's self-attention over a `beam_cache` (`call` with
        `cache=(keys, values, origins)`): `(output, cache)`."""
        if return_attention_scores or index is None:
            raise ValueError(
                "A beam cache (keys, values, origins) serves decoding steps only: pass cache_update_index, "
                "and no return_attention_scores."
            )
        if query.shape[1] not in (None, 1):
            raise ValueError(
                "A beam cache takes one query position a beam (a decoding step); got queries of shape "
                f"{tuple(query.shape)}."
            )
        keys, values = self.project_key_value(query)
        cache = beam_cache.written(cache, index, keys, values)
        return self.output_dense(beam_cache.attention(self.query_dense(query), cache)), cache

    def _attend(self, query_heads, key_heads, value_heads, mask, fused, training):
        """Equation (1) on the projected heads: `(heads, weights or None)`.

        Under mixed precision (float32 weights, bfloat16 or float16
        computation) the softmax runs in float32, as in every precision,
        and the heads return in the compute dtype. The two products around
        it run in the compute dtype on TensorFlow and on PyTorch's CPU,
        through the explicit equation (`scaled_dot_product_attention`):
        forward and backward of a (256, 16, 8, 64) attention took 7 ms on
        TensorFlow and 11.5 ms on PyTorch that way, against 21 and 25 ms
        with the heads cast to float32 for the fused kernel (PyTorch's CPU
        flash-attention backward is slower still in bfloat16: 108 ms).
        Elsewhere (JAX, whose CPU compiler multiplies bfloat16 at its
        float32 rate; PyTorch's GPUs) the heads are cast to float32 for the
        fused kernel, which keeps no weights for the backward pass.
        """
        mixed = self.compute_dtype != self.variable_dtype
        if mixed and attends_mixed_in_compute_dtype(query_heads):
            heads, weights = scaled_dot_product_attention(
                query_heads, key_heads, value_heads, mask, self.dropout_layer, training
            )
            return heads, (None if fused else weights)
        if mixed:
            query_heads, key_heads, value_heads = (
                ops.cast(x, self.variable_dtype) for x in (query_heads, key_heads, value_heads)
            )
        if fused:
            heads, weights = dot_product_attention(query_heads, key_heads, value_heads, mask), None
        else:
            heads, weights = scaled_dot_product_attention(
                query_heads, key_heads, value_heads, mask, self.dropout_layer, training
            )
        return (ops.cast(heads, self.compute_dtype) if mixed else heads), weights

    def _project(self, value, key=None):
        """K W^K and V W^V, `(batch, source_length, num_heads, d_k | d_v)`."""
        key = value if key is None else key
        return self.key_dense(key), self.value_dense(value)

    def project_key_value(self, value, key=None):
        """The projected `(key_heads, value_heads)` of a memory, as a cache:
        `(batch, num_heads, source_length, d_k | d_v)` each.

        Encoder-decoder attention attends to the same encoder output at every
        decoding step: computing its keys and values once and passing them as
        `cache` (with no `cache_update_index`) saves recomputing them.
        """
        keys, values = self._project(value, key)
        return _head_major(keys), _head_major(values)

    def empty_cache(self, batch_size, length, dtype=None, beams=None):
        """A zeroed self-attention key/value cache of `length` positions:
        `(key_cache, value_cache)`, each `(batch_size, num_heads, length,
        d_k | d_v)`, for `call(..., cache=..., cache_update_index=...)`;
        a bfloat16 cache on TensorFlow's CPU holds the numbers' bits, as
        `uint16` (`runtime.cache_bits`).
        With `beams`, a cache that beam search never reorders
        (`runtime.beam_cache`) for `batch_size` sources of `beams` beams."""
        dtype = dtype or self.compute_dtype
        if beams is not None:
            return beam_cache.empty(batch_size, self.num_heads, beams, length, self._d_k, self._d_v, dtype)
        shape = (batch_size, self.num_heads, length)
        dtype = cache_bits.held_dtype(dtype)
        return ops.zeros(shape + (self._d_k,), dtype), ops.zeros(shape + (self._d_v,), dtype)

    def _attention_mask(self, query_heads, key_heads, attention_mask, causal, offset):
        """Boolean `(batch, 1, target_length, source_length)` mask, or None."""
        mask = None
        if attention_mask is not None:
            if len(attention_mask.shape) != 3:
                raise ValueError(
                    "`attention_mask` must have rank 3, "
                    "(batch, target_length, source_length), with size-1 axes "
                    "broadcasting; got shape "
                    f"{tuple(attention_mask.shape)}. For a padding mask of "
                    "shape (batch, source_length) pass mask[:, None, :]."
                )
            expected = (query_heads.shape[0], query_heads.shape[1], key_heads.shape[1])
            for got, want in zip(attention_mask.shape, expected):
                if got is not None and want is not None and got not in (1, want):
                    raise ValueError(
                        f"`attention_mask` of shape {tuple(attention_mask.shape)} "
                        "does not match (batch, target_length, source_length) = "
                        f"{expected}."
                    )
            mask = ops.expand_dims(ops.cast(attention_mask, "bool"), axis=1)
        target_length, source_length = ops.shape(query_heads)[1], ops.shape(key_heads)[1]
        if causal and isinstance(offset, int) and target_length == 1 and source_length == offset + 1:
            causal = False  # one query at the last position sees every key
        if causal:
            offset = 0 if offset is None else offset
            query_positions = ops.arange(target_length) + offset
            key_positions = ops.arange(source_length)
            causal_mask = key_positions[None, :] <= query_positions[:, None]
            causal_mask = causal_mask[None, None, :, :]
            mask = causal_mask if mask is None else ops.logical_and(mask, causal_mask)
        return mask

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

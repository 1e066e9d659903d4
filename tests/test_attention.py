"""Multi-head attention (section 3.2) against a NumPy implementation."""

import numpy as np
import pytest

from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers import scaled_dot_product_attention

from helpers import assert_config_round_trip
from helpers import to_numpy


def numpy_multi_head_attention(layer, query, value, mask=None, causal=False):
    """Equation (1) and MultiHead(Q, K, V) in NumPy from the layer's weights."""

    def project(dense, x):
        return np.einsum("btd,dnh->btnh", x, to_numpy(dense.kernel)) + to_numpy(dense.bias)

    q, k, v = project(layer.query_dense, query), project(layer.key_dense, value), project(
        layer.value_dense, value
    )
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    allowed = np.ones(scores.shape, bool)
    if mask is not None:
        allowed &= mask[:, None, :, :]
    if causal:
        allowed &= np.tril(np.ones(scores.shape[-2:], bool))
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bnts,bsnh->btnh", weights, v)
    out = np.einsum("btnh,nhd->btd", heads, to_numpy(layer.output_dense.kernel))
    return out + to_numpy(layer.output_dense.bias), weights


def random_bias(layer):
    # Zero-initialized biases would hide a bias mix-up; give them values.
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense):
        dense.bias.assign(np.random.normal(size=dense.bias.shape).astype("float32"))


@pytest.mark.parametrize("key_dim,value_dim", [(None, None), (4, 12), (16, 16)])
def test_matches_numpy_with_padding_mask(key_dim, value_dim):
    layer = MultiHeadAttention(num_heads=4, key_dim=key_dim, value_dim=value_dim)
    query = np.random.normal(size=(2, 5, 32)).astype("float32")
    value = np.random.normal(size=(2, 7, 32)).astype("float32")
    padding = np.ones((2, 7), bool)
    padding[0, 4:] = False
    mask = np.broadcast_to(padding[:, None, :], (2, 5, 7))
    layer(query, value)
    random_bias(layer)
    expected, expected_weights = numpy_multi_head_attention(layer, query, value, mask)
    output, weights = layer(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=1e-6)
    # The fused path (no weights asked for) gives the same output.
    fused = layer(query, value, attention_mask=padding[:, None, :])
    np.testing.assert_allclose(to_numpy(fused), expected, atol=1e-5, rtol=1e-5)
    # Masked keys get exactly zero weight.
    assert np.all(to_numpy(weights)[0, :, :, 4:] == 0.0)


def test_causal_mask_matches_numpy_and_zeroes_the_future():
    layer = MultiHeadAttention(num_heads=2)
    x = np.random.normal(size=(3, 6, 16)).astype("float32")
    layer(x, x)
    random_bias(layer)
    expected, _ = numpy_multi_head_attention(layer, x, x, causal=True)
    output, weights = layer(x, x, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-5, rtol=1e-5)
    future = np.triu(np.ones((6, 6), bool), k=1)
    assert np.all(to_numpy(weights)[..., future] == 0.0)
    np.testing.assert_allclose(
        to_numpy(layer(x, x, use_causal_mask=True)), expected, atol=1e-5, rtol=1e-5
    )


def test_scaled_dot_product_attention_is_equation_1():
    q = np.random.normal(size=(1, 3, 1, 8)).astype("float32")
    k = np.random.normal(size=(1, 4, 1, 8)).astype("float32")
    v = np.random.normal(size=(1, 4, 1, 5)).astype("float32")
    out, weights = scaled_dot_product_attention(q, k, v)
    scores = q[0, :, 0] @ k[0, :, 0].T / np.sqrt(8)
    softmax = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(weights)[0, 0], softmax, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(out)[0, :, 0], softmax @ v[0, :, 0], rtol=1e-5, atol=1e-6)


def test_cache_gives_the_same_output_as_full_attention():
    layer = MultiHeadAttention(num_heads=2, key_dim=8, value_dim=6)
    x = np.random.normal(size=(2, 5, 16)).astype("float32")
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = layer.empty_cache(2, 5)  # (batch, heads, positions, d_k | d_v)
    assert tuple(cache[0].shape) == (2, 2, 5, 8) and tuple(cache[1].shape) == (2, 2, 5, 6)
    steps = []
    for t in range(5):
        out, cache = layer(
            x[:, t : t + 1], x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_update_index=t
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5, rtol=1e-5)
    # A precomputed memory cache (encoder-decoder attention) equals no cache.
    memory = np.random.normal(size=(2, 7, 16)).astype("float32")
    out, _ = layer(x, memory, cache=layer.project_key_value(memory))
    np.testing.assert_allclose(to_numpy(out), to_numpy(layer(x, memory)), atol=1e-6)


def test_attention_dropout_only_in_training():
    layer = MultiHeadAttention(num_heads=2, dropout=0.5)
    x = np.random.normal(size=(2, 4, 8)).astype("float32")
    inference = to_numpy(layer(x, x, training=False))
    np.testing.assert_allclose(inference, to_numpy(layer(x, x)), atol=1e-6)
    assert not np.allclose(to_numpy(layer(x, x, training=True)), inference)


def test_heads_that_do_not_divide_d_model_need_key_dim():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        MultiHeadAttention(num_heads=3)(np.zeros((1, 2, 8), "float32"), np.zeros((1, 2, 8), "float32"))
    layer = MultiHeadAttention(num_heads=3, key_dim=4)
    assert tuple(layer(np.zeros((1, 2, 8), "float32"), np.zeros((1, 2, 8), "float32")).shape) == (1, 2, 8)


def test_mask_of_wrong_shape_is_refused():
    layer = MultiHeadAttention(num_heads=2)
    x = np.zeros((2, 4, 8), "float32")
    with pytest.raises(ValueError, match="rank 3"):
        layer(x, x, attention_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="does not match"):
        layer(x, x, attention_mask=np.ones((2, 4, 5), bool))


def test_config_round_trip():
    layer = MultiHeadAttention(num_heads=4, key_dim=16, value_dim=8, dropout=0.1, name="mha")
    assert_config_round_trip(layer)


@pytest.mark.parametrize("key_dim,value_dim,dropout", [(None, None, 0.0), (4, 12, 0.0), (None, None, 0.5)])
def test_mixed_precision_attends_in_float32(key_dim, value_dim, dropout, monkeypatch):
    """Under mixed_bfloat16 equation (1) runs in float32 on JAX and
    PyTorch's GPUs (fused or not, with attention dropout too); on TensorFlow and PyTorch's CPU its
    products run in bfloat16 and its softmax in float32, not fused. Either
    way the layer returns bfloat16 like its projections, and equals the
    float32 layer to bfloat16's precision; a bfloat16 layer attends in
    bfloat16."""
    import keras

    seen = []
    fused = keras.ops.dot_product_attention

    def spy(query, key, value, **kwargs):
        seen.append(keras.backend.standardize_dtype(query.dtype))
        return fused(query, key, value, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", spy)
    query = np.random.normal(size=(2, 5, 32)).astype("float32")
    reference = MultiHeadAttention(num_heads=4, key_dim=key_dim, value_dim=value_dim)
    reference(query, query)
    random_bias(reference)
    from keras_transformer.runtime.backend_choices import attends_mixed_in_compute_dtype

    # In bfloat16 on TensorFlow and PyTorch's CPU; in float32 on JAX and
    # PyTorch's GPUs (the fused kernel).
    on_device = keras.ops.convert_to_tensor(query)
    mixed_in = "bfloat16" if attends_mixed_in_compute_dtype(on_device) else "float32"
    for policy, attends_in in [("mixed_bfloat16", mixed_in), ("bfloat16", "bfloat16")]:
        layer = MultiHeadAttention(num_heads=4, key_dim=key_dim, value_dim=value_dim, dropout=dropout, dtype=policy)
        layer(query, query)
        layer.set_weights(reference.get_weights())
        output, weights = layer(query, query, use_causal_mask=True, return_attention_scores=True, training=bool(dropout))
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(weights.dtype) == attends_in
        seen.clear()
        output = layer(query, query, use_causal_mask=True, training=bool(dropout))
        expect_fused = key_dim is None and not dropout and (policy == "bfloat16" or mixed_in == "float32")
        assert seen == ([attends_in] if expect_fused else [])
        if not dropout:
            expected, _ = numpy_multi_head_attention(reference, query, query, causal=True)
            # bfloat16 keeps 8 significant bits: about 0.4% of each value.
            np.testing.assert_allclose(to_numpy(output).astype("float32"), expected, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("return_scores", [False, True])
def test_a_fixed_memory_row_serves_consecutive_query_rows(return_scores):
    """Beam search passes a source's encoder keys and values once for its
    beams: query rows i * g .. i * g + g - 1 read memory row i, as if the
    memory were repeated g times."""
    from keras import ops

    from keras_transformer.layers import MultiHeadAttention

    rng = np.random.default_rng(7)
    layer = MultiHeadAttention(num_heads=2)
    sources, beams, length = 3, 4, 5
    query = rng.normal(size=(sources * beams, 2, 8)).astype("float32")
    memory = rng.normal(size=(sources, length, 8)).astype("float32")
    padding = np.ones((sources, length), bool)
    padding[1, 3:] = False
    layer(query, np.repeat(memory, beams, axis=0))  # builds
    shared = layer.project_key_value(memory)
    repeated = tuple(np.repeat(ops.convert_to_numpy(x), beams, axis=0) for x in shared)
    grouped = layer(query, query, attention_mask=padding[:, None, :], cache=shared,
                    return_attention_scores=return_scores)
    expected = layer(query, query, attention_mask=np.repeat(padding, beams, axis=0)[:, None, :], cache=repeated,
                     return_attention_scores=return_scores)
    np.testing.assert_allclose(ops.convert_to_numpy(grouped[0]), ops.convert_to_numpy(expected[0]), atol=1e-5)
    if return_scores:
        weights = ops.convert_to_numpy(grouped[1])
        assert weights.shape == (sources * beams, 2, 2, length)
        np.testing.assert_allclose(weights, ops.convert_to_numpy(expected[1]), atol=1e-6)
        assert np.all(weights[beams : 2 * beams, :, :, 3:] == 0)  # source 1's padding


def test_attention_over_a_fixed_memory_cache_matches_numpy():
    """The encoder-decoder attention of a decoding step (keys and values
    from `project_key_value`, a source's beams grouped over its row; on
    JAX `head_major_attention`) against equation (1) in NumPy."""
    rng = np.random.default_rng(11)
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    sources, beams, length = 3, 4, 6
    query = rng.normal(size=(sources * beams, 1, 16)).astype("float32")
    memory = rng.normal(size=(sources, length, 16)).astype("float32")
    padding = np.ones((sources, length), bool)
    padding[2, 4:] = False
    layer(query, np.repeat(memory, beams, axis=0))  # builds
    random_bias(layer)
    out, _ = layer(query, query, attention_mask=padding[:, None, :], cache=layer.project_key_value(memory))
    expected, _ = numpy_multi_head_attention(
        layer, query, np.repeat(memory, beams, axis=0), np.repeat(padding, beams, axis=0)[:, None, :]
    )
    np.testing.assert_allclose(to_numpy(out), expected, rtol=1e-5, atol=1e-5)


def test_head_major_attention_is_equation_1_and_averages_where_nothing_is_allowed():
    from keras_transformer.layers.scaled_dot_product import head_major_attention

    rng = np.random.default_rng(12)
    q = rng.normal(size=(2, 3, 2, 4)).astype("float32")
    k = rng.normal(size=(2, 2, 5, 4)).astype("float32")
    v = rng.normal(size=(2, 2, 5, 3)).astype("float32")
    mask = np.ones((2, 1, 3, 5), bool)
    mask[0, 0, 1, 2:] = False
    mask[1, 0, 2, :] = False  # nothing allowed: the values' mean
    out = to_numpy(head_major_attention(q, k, v, mask))
    scores = np.einsum("btnh,bnsh->bnts", q, k) / 2.0
    scores = np.where(mask, scores, -np.inf)
    scores[1, :, 2, :] = 0.0
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, np.einsum("bnts,bnsh->btnh", weights, v), rtol=1e-5, atol=1e-6)

"""Feed-forward (3.3), embeddings (3.4), positions (3.5), encoder and
decoder layers (3.1): formulas, configs and saving."""

import itertools

import keras
import numpy as np
import pytest

from keras_transformer import layers
from keras_transformer.models import TransformerBackbone

from helpers import assert_config_round_trip
from helpers import to_numpy


def test_feed_forward_is_equation_2():
    ffn = layers.PositionwiseFeedForward(d_ff=16)
    x = np.random.normal(size=(2, 3, 8)).astype("float32")
    ffn(x)
    ffn.inner_dense.bias.assign(np.random.normal(size=16).astype("float32"))
    w1, b1 = to_numpy(ffn.inner_dense.kernel), to_numpy(ffn.inner_dense.bias)
    w2, b2 = to_numpy(ffn.output_dense.kernel), to_numpy(ffn.output_dense.bias)
    expected = np.maximum(0, x @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(to_numpy(ffn(x)), expected, rtol=1e-5, atol=1e-6)


def test_sinusoids_are_section_3_5():
    d_model, length = 16, 9
    pe = to_numpy(layers.SinusoidalPositionEncoding()(np.zeros((1, length, d_model), "float32")))[0]
    pos = np.arange(length)[:, None]
    i = np.arange(d_model // 2)[None, :]
    angle = pos / 10000 ** (2 * i / d_model)
    np.testing.assert_allclose(pe[:, 0::2], np.sin(angle), atol=1e-5)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(angle), atol=1e-5)
    shifted = layers.SinusoidalPositionEncoding()(np.zeros((1, 2, d_model), "float32"), start_index=3)
    np.testing.assert_allclose(to_numpy(shifted)[0], pe[3:5], atol=1e-5)


def test_learned_positions_are_a_table():
    layer = layers.LearnedPositionEmbedding(sequence_length=10)
    out = to_numpy(layer(np.zeros((2, 4, 6), "float32")))
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_allclose(out[1], table[:4])
    layer.position_embeddings.assign(np.random.default_rng(0).normal(size=table.shape).astype("float32"))
    shifted = to_numpy(layer(np.zeros((1, 2, 6), "float32"), start_index=3))
    np.testing.assert_allclose(shifted[0], to_numpy(layer.position_embeddings)[3:5])


def test_shared_embedding_scales_by_sqrt_d_model_and_projects_with_the_same_matrix():
    embedding = layers.SharedTokenEmbedding(vocabulary_size=11, d_model=4)
    ids = np.array([[3, 7]])
    vectors = to_numpy(embedding(ids))
    table = to_numpy(embedding.embeddings)
    np.testing.assert_allclose(vectors[0], table[[3, 7]] * 2.0, rtol=1e-6)
    hidden = np.random.normal(size=(1, 2, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(embedding(hidden, reverse=True)), hidden @ table.T, rtol=1e-5, atol=1e-6)
    assert len(embedding.weights) == 1


def test_embedding_refuses_float_ids():
    embedding = layers.SharedTokenEmbedding(vocabulary_size=11, d_model=4)
    with pytest.raises(TypeError, match="integer token ids"):
        embedding(np.array([[1.0, 2.0]], "float32"))


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_layer_is_post_norm_residual(normalize_first):
    layer = layers.TransformerEncoderLayer(num_heads=2, d_ff=16, dropout=0.0, normalize_first=normalize_first)
    x = np.random.normal(size=(2, 5, 8)).astype("float32")
    out = to_numpy(layer(x))

    def norm(y, ln):
        mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
        return (y - mean) / np.sqrt(var + ln.epsilon) * to_numpy(ln.gamma) + to_numpy(ln.beta)

    def attention(y):
        return to_numpy(layer.self_attention(y, y))

    def ffn(y):
        return to_numpy(layer.feed_forward(y))

    if normalize_first:
        h = x + attention(norm(x, layer.self_attention_norm))
        expected = h + ffn(norm(h, layer.feed_forward_norm))
    else:
        h = norm(x + attention(x), layer.self_attention_norm)
        expected = norm(h + ffn(h), layer.feed_forward_norm)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_residual_dropout_is_active_in_training_only():
    layer = layers.TransformerEncoderLayer(num_heads=2, d_ff=16, dropout=0.5)
    x = np.random.normal(size=(2, 5, 8)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(x)), to_numpy(layer(x, training=False)))
    assert not np.allclose(to_numpy(layer(x, training=True)), to_numpy(layer(x)))


def test_decoder_layer_is_causal():
    layer = layers.TransformerDecoderLayer(num_heads=2, d_ff=16, dropout=0.0)
    target = np.random.normal(size=(1, 6, 8)).astype("float32")
    memory = np.random.normal(size=(1, 4, 8)).astype("float32")
    out = to_numpy(layer(target, memory))
    changed = target.copy()
    changed[:, 4:] += 1.0
    out_changed = to_numpy(layer(changed, memory))
    np.testing.assert_allclose(out[:, :4], out_changed[:, :4], atol=1e-6)
    assert not np.allclose(out[:, 4:], out_changed[:, 4:])


def test_decoder_layer_cache_equals_full_pass():
    layer = layers.TransformerDecoderLayer(num_heads=2, d_ff=16, key_dim=4, value_dim=6)
    target = np.random.normal(size=(2, 5, 8)).astype("float32")
    memory = np.random.normal(size=(2, 3, 8)).astype("float32")
    memory_mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    full = to_numpy(layer(target, memory, encoder_padding_mask=memory_mask))
    cache = layer.self_attention.empty_cache(2, 5)
    cross = layer.cross_attention.project_key_value(memory)
    steps = []
    for t in range(5):
        out, cache = layer(
            target[:, t : t + 1],
            encoder_padding_mask=memory_mask,
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
            cross_attention_cache=cross,
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_decoder_layer_returns_attention_weights():
    layer = layers.TransformerDecoderLayer(num_heads=2, d_ff=16)
    _, scores = layer(np.zeros((1, 3, 8), "float32"), np.zeros((1, 4, 8), "float32"), return_attention_scores=True)
    assert tuple(scores["self_attention"].shape) == (1, 2, 3, 3)
    assert tuple(scores["cross_attention"].shape) == (1, 2, 3, 4)


LAYER_CASES = {
    "MultiHeadAttention": (lambda: layers.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=6), "pair"),
    "PositionwiseFeedForward": (lambda: layers.PositionwiseFeedForward(d_ff=16), "single"),
    "SinusoidalPositionEncoding": (lambda: layers.SinusoidalPositionEncoding(max_wavelength=500), "single"),
    "LearnedPositionEmbedding": (lambda: layers.LearnedPositionEmbedding(sequence_length=8), "single"),
    "SharedTokenEmbedding": (lambda: layers.SharedTokenEmbedding(vocabulary_size=20, d_model=8), "ids"),
    "TransformerEncoderLayer": (
        lambda: layers.TransformerEncoderLayer(num_heads=2, d_ff=16, normalize_first=True),
        "single",
    ),
    "TransformerDecoderLayer": (lambda: layers.TransformerDecoderLayer(num_heads=2, d_ff=16), "pair"),
}


def _model_around(layer, kind):
    if kind == "ids":
        inputs = keras.Input((5,), dtype="int32")
        return keras.Model(inputs, layer(inputs))
    inputs = keras.Input((5, 8))
    if kind == "pair":
        memory = keras.Input((4, 8))
        return keras.Model([inputs, memory], layer(inputs, memory))
    return keras.Model(inputs, layer(inputs))


def _example_inputs(kind):
    if kind == "ids":
        return np.random.randint(0, 20, size=(2, 5))
    x = np.random.normal(size=(2, 5, 8)).astype("float32")
    return [x, np.random.normal(size=(2, 4, 8)).astype("float32")] if kind == "pair" else x


@pytest.mark.parametrize("name", sorted(LAYER_CASES))
def test_layer_config_and_keras_file_round_trip(name, tmp_path):
    make, kind = LAYER_CASES[name]
    layer = make()
    config = assert_config_round_trip(layer)
    model = _model_around(layer, kind)
    inputs = _example_inputs(kind)
    expected = to_numpy(model(inputs))
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    restored_layer = restored.layers[-1]
    assert type(restored_layer) is type(layer)
    assert restored_layer.get_config() == config
    np.testing.assert_allclose(to_numpy(restored(inputs)), expected, atol=1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "bfloat16", "mixed_float16"])
@pytest.mark.parametrize("normalize_first", [False, True])
def test_layers_give_the_output_spec_keras_traces(policy, normalize_first):
    """The encoder and decoder layers give a functional model their output
    spec without Keras tracing them (`TransformerLayerBase.output_spec`):
    the same shape and dtype as the trace, for every dtype policy."""
    options = dict(num_heads=2, d_ff=16, normalize_first=normalize_first, dtype=policy)
    # In the compute dtype, as `Layer.__call__` casts them before a trace.
    dtype = keras.dtype_policies.get(policy).compute_dtype
    target, memory = keras.KerasTensor((3, None, 8), dtype), keras.KerasTensor((3, 6, 8), dtype)
    mask = keras.KerasTensor((3, 6), dtype="int32")
    cases = [
        (layers.TransformerEncoderLayer(**options), (memory,), {"padding_mask": mask}),
        (layers.TransformerDecoderLayer(**options), (target, memory), {"encoder_padding_mask": mask}),
    ]
    for layer, args, kwargs in cases:
        output = layer(*args, **kwargs)  # builds the layer, with the spec it gives
        traced = keras.layers.Layer.compute_output_spec(layer, *args, **kwargs)
        assert (output.shape, output.dtype) == (traced.shape, traced.dtype), type(layer).__name__
        assert output.dtype == keras.backend.standardize_dtype(layer.compute_dtype)


def test_symbolic_decoder_layer_without_the_encoder_output_is_refused():
    layer = layers.TransformerDecoderLayer(num_heads=2, d_ff=16)
    with pytest.raises(ValueError, match="needs the encoder output"):
        layer(keras.KerasTensor((2, 5, 8)))


def test_every_projection_starts_from_values_of_its_own():
    """W^Q, W^K, W^V, W^O of each attention layer and W_1, W_2 of each
    feed-forward network draw their initial values each on its own (one
    Keras initializer instance repeats its values), the same again under
    the same seed."""

    def kernels():
        keras.utils.set_random_seed(7)
        backbone = TransformerBackbone(100, num_layers=1, d_model=64, d_ff=128, num_heads=4, max_sequence_length=16)
        return {w.path: to_numpy(w.value).ravel() for w in backbone.weights if w.path.endswith("kernel")}

    first = kernels()
    assert len(first) == 16  # encoder: 4 + 2; decoder: 4 + 4 + 2
    for a, b in itertools.combinations(sorted(first), 2):
        size = min(first[a].size, first[b].size)
        correlation = np.corrcoef(first[a][:size], first[b][:size])[0, 1]
        assert abs(correlation) < 0.1, (a, b, correlation)
    second = kernels()
    assert all(np.array_equal(first[path], second[path]) for path in first)

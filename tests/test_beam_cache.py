"""The self-attention cache that beam search never reorders
(`keras_transformer.runtime.beam_cache`), against a plain cache reordered
at every step and against the attention of each beam over its own
history computed in NumPy."""

import keras
import ml_dtypes
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import MultiHeadAttention
from keras_transformer.runtime import beam_cache
from keras_transformer.runtime import cache_bits

SOURCES, BEAMS, HEADS, D_MODEL, LENGTH = 2, 3, 2, 8, 6


def _layer(dtype=None):
    keras.utils.set_random_seed(3)
    layer = MultiHeadAttention(num_heads=HEADS, dtype=dtype)
    layer.build((None, 1, D_MODEL), (None, 1, D_MODEL))
    return layer


def _numpy_attention(layer, history, query):
    """Equation (1) and the output projection in NumPy: `query` `(d_model,)`
    over the inputs `history` `(positions, d_model)` of its beam."""
    weights = {name: ops.convert_to_numpy(ops.cast(getattr(layer, name).kernel, "float32")).astype("float64")
               for name in ("query_dense", "key_dense", "value_dense", "output_dense")}
    biases = {name: ops.convert_to_numpy(ops.cast(getattr(layer, name).bias, "float32")).astype("float64")
              for name in weights}
    q = np.einsum("d,dnh->nh", query, weights["query_dense"]) + biases["query_dense"]
    k = np.einsum("pd,dnh->pnh", history, weights["key_dense"]) + biases["key_dense"]
    v = np.einsum("pd,dnh->pnh", history, weights["value_dense"]) + biases["value_dense"]
    scores = np.einsum("nh,pnh->np", q, k) / np.sqrt(q.shape[-1])
    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
    heads = np.einsum("np,pnh->nh", scores / scores.sum(axis=1, keepdims=True), v)
    return np.einsum("nh,nhd->d", heads, weights["output_dense"]) + biases["output_dense"]


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-5), ("bfloat16", 0.05)])
def test_a_beam_cache_attends_as_a_reordered_cache_and_as_numpy(dtype, atol, monkeypatch):
    monkeypatch.setattr(cache_bits, "HELD_AS_BITS", {})  # (a plain cache of bfloat16 to compare with)
    layer = _layer(dtype)
    rng = np.random.default_rng(0)
    plain = layer.empty_cache(SOURCES * BEAMS, LENGTH)
    held = layer.empty_cache(SOURCES, LENGTH, beams=BEAMS)
    assert tuple(held[0].shape) == (SOURCES, HEADS, BEAMS, D_MODEL // HEADS, LENGTH)
    assert keras.backend.standardize_dtype(held[0].dtype) == dtype
    histories = [np.zeros((0, D_MODEL)) for _ in range(SOURCES * BEAMS)]
    for index in range(LENGTH - 1):
        # Each beam extends one of its source's beams (some twice, some none).
        parents = rng.integers(0, BEAMS, (SOURCES, BEAMS)).astype("int32")
        rows = (np.arange(SOURCES)[:, None] * BEAMS + parents).reshape(-1)
        x = rng.normal(size=(SOURCES * BEAMS, 1, D_MODEL)).astype("float32")
        if dtype == "bfloat16":
            x = x.astype(ml_dtypes.bfloat16).astype("float32")  # (the inputs the layer reads)
        histories = [np.concatenate([histories[row], x[i]]) for i, row in enumerate(rows)]

        plain = tuple(ops.take(c, ops.convert_to_tensor(rows), axis=0) for c in plain)
        expected, plain = layer(x, x, use_causal_mask=True, cache=plain, cache_update_index=index)
        held = beam_cache.reordered(held, ops.convert_to_tensor(parents))
        got, held = layer(x, x, use_causal_mask=True, cache=held, cache_update_index=index)

        assert keras.backend.standardize_dtype(got.dtype) == dtype
        got, expected = (ops.convert_to_numpy(ops.cast(t, "float32")) for t in (got, expected))
        reference = np.stack([_numpy_attention(layer, histories[i], x[i, 0]) for i in range(SOURCES * BEAMS)])
        np.testing.assert_allclose(got[:, 0], reference, atol=atol)
        np.testing.assert_allclose(got, expected, atol=atol)
    # Keys and values stay where they were written: a beam's own row at each step.
    origins = ops.convert_to_numpy(held[2])
    assert origins[:, :, LENGTH - 1].max() == 0 and origins[:, :, : LENGTH - 1].min() >= 1


def test_kept_and_padded_beam_caches_keep_each_beams_history():
    layer = _layer()
    rng = np.random.default_rng(1)
    held = layer.empty_cache(SOURCES, 3, beams=BEAMS)
    x = rng.normal(size=(SOURCES * BEAMS, 1, D_MODEL)).astype("float32")
    _, held = layer(x, x, cache=held, cache_update_index=0)
    # The second source alone, its cache grown to 5 positions.
    held = beam_cache.padded(beam_cache.kept(held, ops.convert_to_tensor([1], "int32")), 5,
                             lambda t, axis, n: ops.pad(t, [(0, 0)] * axis + [(0, n - t.shape[axis])]
                                                        + [(0, 0)] * (len(t.shape) - axis - 1)))
    y = rng.normal(size=(BEAMS, 1, D_MODEL)).astype("float32")
    got, _ = layer(y, y, cache=held, cache_update_index=1)
    reference = np.stack([_numpy_attention(layer, np.concatenate([x[BEAMS + i], y[i]]), y[i, 0]) for i in range(BEAMS)])
    np.testing.assert_allclose(ops.convert_to_numpy(got)[:, 0], reference, atol=1e-5)


def test_a_beam_cache_serves_decoding_steps_only():
    layer = _layer()
    held = layer.empty_cache(SOURCES, 4, beams=BEAMS)
    x = np.zeros((SOURCES * BEAMS, 2, D_MODEL), "float32")
    with pytest.raises(ValueError, match="one query position a beam"):
        layer(x, x, cache=held, cache_update_index=0)
    with pytest.raises(ValueError, match="decoding steps only"):
        layer(x[:, :1], x[:, :1], cache=held)


@pytest.mark.skipif(keras.config.backend() == "torch", reason="PyTorch runs a step a call: no segments")
def test_a_mixed_precision_search_in_segments_with_beam_caches_equals_plain_caches(monkeypatch):
    """Under `mixed_bfloat16` (float32 weights, bfloat16 computation) the
    segments' beam caches hold bfloat16, and the translations are those of
    a row a beam."""
    from keras_transformer.decoding import beam
    from keras_transformer.runtime import backend_choices
    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.decoding.interface import forget_decoding_functions

    from test_beam_search import UNEVEN_SOURCES, tiny_model

    monkeypatch.setattr(beam, "concurrent_parts", lambda: 1)
    model = tiny_model(seed=5, max_sequence_length=128, dtype_policy="mixed_bfloat16")
    sources = UNEVEN_SOURCES
    found = {}
    for held in (False, True):
        monkeypatch.setattr(backend_choices, "SEGMENT_BEAM_CACHES", {keras.config.backend(): held})
        monkeypatch.setattr(cache_bits, "HELD_AS_BITS", {})  # (else TensorFlow's plain caches, held as bits)
        forget_decoding_functions(model)
        found[held] = beam_search(model, sources, beam_size=4, max_length_offset=30)
    assert [r[0][0] for r in found[True]] == [r[0][0] for r in found[False]]
    np.testing.assert_allclose([r[0][1] for r in found[True]], [r[0][1] for r in found[False]], atol=0.05)

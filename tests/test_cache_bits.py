"""A bfloat16 self-attention cache held as its bits
(`keras_transformer.runtime.cache_bits`): the same attention and the same
translations as a cache holding bfloat16, and the keys and values it
holds are those of the inputs written."""

import keras
import ml_dtypes
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import MultiHeadAttention
from keras_transformer.runtime import cache_bits
from keras_transformer.runtime.bfloat16_products import xla_on_cpu

pytestmark = pytest.mark.skipif(
    keras.config.backend() == "torch", reason="PyTorch's caches hold bfloat16 (its decoding step is its own)"
)

BATCH, HEADS, D_MODEL, LENGTH = 3, 2, 8, 5


def _bfloat16_numpy(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def test_held_dtype_is_bits_for_bfloat16_where_held_as_bits(monkeypatch):
    assert cache_bits.held_dtype("float32") == "float32"
    expected = "uint16" if keras.config.backend() == "tensorflow" and xla_on_cpu() else "bfloat16"
    assert cache_bits.held_dtype("bfloat16") == expected
    monkeypatch.setattr(cache_bits, "HELD_AS_BITS", {})
    assert cache_bits.held_dtype("bfloat16") == "bfloat16"


@pytest.mark.skipif(not xla_on_cpu(), reason="bits are held on XLA's CPUs only")
def test_a_cache_of_bits_attends_as_a_bfloat16_cache_and_holds_the_keys_written(monkeypatch):
    monkeypatch.setattr(cache_bits, "HELD_AS_BITS", {keras.config.backend(): True})
    keras.utils.set_random_seed(4)
    layer = MultiHeadAttention(num_heads=HEADS, dtype="bfloat16")
    layer.build((None, 1, D_MODEL), (None, 1, D_MODEL))
    bits = layer.empty_cache(BATCH, LENGTH)
    assert keras.backend.standardize_dtype(bits[0].dtype) == "uint16"
    plain = tuple(ops.zeros(tuple(c.shape), "bfloat16") for c in bits)
    rng = np.random.default_rng(0)
    inputs = []
    for index in range(LENGTH):
        x = ops.cast(rng.normal(size=(BATCH, 1, D_MODEL)), "bfloat16")
        inputs.append(x)
        expected, plain = layer(x, x, use_causal_mask=True, cache=plain, cache_update_index=index)
        got, bits = layer(x, x, use_causal_mask=True, cache=bits, cache_update_index=index)
        assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
        np.testing.assert_array_equal(_bfloat16_numpy(got), _bfloat16_numpy(expected))
    # The bits are those of the keys and values of every input written.
    keys, values = layer.project_key_value(ops.concatenate(inputs, axis=1))
    for held, written in zip(bits, (keys, values)):
        assert keras.backend.standardize_dtype(held.dtype) == "uint16"
        as_numbers = ops.convert_to_numpy(held).view(ml_dtypes.bfloat16).astype("float32")
        np.testing.assert_array_equal(as_numbers, _bfloat16_numpy(written))


@pytest.mark.skipif(not xla_on_cpu(), reason="bits are held on XLA's CPUs only")
@pytest.mark.parametrize("count", [1, 23], ids=["one-loop", "segments"])
def test_a_search_with_caches_of_bits_equals_one_with_bfloat16_caches(count, monkeypatch):
    """The same translations and scores, one sentence (the search in one
    compiled loop) and 23 (segments, whose batch shrinks and whose cache
    grows; a row a beam either way). Segments that could hold
    `beam_cache` caches hold plain ones where those hold bits."""
    from keras_transformer.decoding import beam
    from keras_transformer.decoding import loop
    from keras_transformer.runtime import backend_choices
    from keras_transformer.decoding.beam import beam_search
    from keras_transformer.decoding.interface import forget_decoding_functions

    from test_beam_search import UNEVEN_SOURCES, tiny_model

    monkeypatch.setattr(beam, "concurrent_parts", lambda: 1)
    monkeypatch.setattr(backend_choices, "SEGMENT_BEAM_CACHES", {keras.config.backend(): False})
    model = tiny_model(seed=5, max_sequence_length=128, dtype_policy="bfloat16")
    sources = UNEVEN_SOURCES[-count:]
    found = {}
    for held in (False, True):
        monkeypatch.setattr(cache_bits, "HELD_AS_BITS", {keras.config.backend(): held})
        forget_decoding_functions(model)
        caches = model.empty_self_attention_cache(1, 1)
        assert cache_bits.holds_bits(caches[0][0]) == held
        found[held] = beam_search(model, sources, beam_size=4, num_results=2, max_length_offset=30)
        with monkeypatch.context() as patch:
            patch.setattr(backend_choices, "SEGMENT_BEAM_CACHES", {keras.config.backend(): True})
            assert loop.segment_beam_caches(model) == (not held)
    assert [[ids for ids, *_ in result] for result in found[True]] == [
        [ids for ids, *_ in result] for result in found[False]]
    np.testing.assert_array_equal([[r[1] for r in result] for result in found[True]],
                                  [[r[1] for r in result] for result in found[False]])

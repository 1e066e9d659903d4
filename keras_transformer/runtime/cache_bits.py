"""A bfloat16 key/value cache held as its bits, on TensorFlow's CPU.

Besides reading it, a decoding step moves its self-attention cache:
beam search takes each layer's keys and values to the beams' parents
(`keras.ops.take`), and the step writes its new position
(`keras.ops.slice_update`). The XLA that TensorFlow 2.21 compiles
decoding with on a CPU moves a bfloat16 tensor by converting it to
float32 and back: a whole cache, at every step and layer. Held as
`uint16`, the same 16 bits a number, the cache moves as integers, and
the attention reads it as bfloat16 (a bitcast: the same bytes, no copy).
The translations are the same, bit for bit.

The shipped preset's first model in bfloat16, test_2016_flickr, beam 4,
a 2-core AMD EPYC, alternating passes, medians of two runs
(`benchmarks/beam_caches.py --compare cache-bits`): on TensorFlow, one
sentence at a time (the search in one compiled loop) 1.31x and 1.39x as
fast; 64 at a time 1.05x and 1.02x as fast as its segments were with
`beam_cache` caches (with plain caches of bits they hold those:
`decoding.loop.segment_beam_caches`). On JAX bits ran 0.93-0.95x as fast
one at a time and 0.98-1.00x 64 at a time (its compiled steps lost some
conversions, not their time), so JAX keeps bfloat16 (`HELD_AS_BITS`).

Example:

>>> import keras
>>> cache = keras.ops.zeros((1, 1, 4, 2), held_dtype("float32"))
>>> holds_bits(cache)
False
>>> keras.backend.standardize_dtype(read(cache).dtype)
'float32'
"""

import keras

from keras_transformer.runtime.bfloat16_products import xla_on_cpu

# The backends whose bfloat16 caches are held as bits on a CPU (measured
# above).
HELD_AS_BITS = {"tensorflow": True}


def held_dtype(dtype):
    """The dtype of a plain self-attention cache of layers computing in
    `dtype`: `"uint16"` for bfloat16 where `HELD_AS_BITS` says so, on a
    CPU; else `dtype`."""
    dtype = keras.backend.standardize_dtype(dtype)
    if dtype == "bfloat16" and HELD_AS_BITS.get(keras.config.backend(), False) and xla_on_cpu():
        return "uint16"
    return dtype


def holds_bits(x):
    """Whether the cache tensor `x` holds bfloat16 numbers as their bits."""
    return keras.backend.standardize_dtype(x.dtype) == "uint16"


def held(x, cache):
    """Keys or values `x` as the cache tensor `cache` holds them: their
    bfloat16 bits where it holds bits, else as they are."""
    if not holds_bits(cache):
        return x
    return _bitcast(keras.ops.cast(x, "bfloat16"), "uint16")


def read(x):
    """A cache tensor as bfloat16 where it holds bits, else as it is."""
    return _bitcast(x, "bfloat16") if holds_bits(x) else x


def _bitcast(x, dtype):
    # (Keras has no bitcast op.)
    if keras.config.backend() == "jax":
        import jax

        return jax.lax.bitcast_convert_type(x, dtype)
    import tensorflow as tf

    return tf.bitcast(x, dtype)

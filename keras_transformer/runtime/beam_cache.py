"""A self-attention cache that beam search never reorders.

In beam search (paper section 6.1) each step's beams descend from the
last step's: a plain key/value cache, one row a beam, is reordered to the
beams' parents at every step (`keras.ops.take` of every layer's keys and
values), so that each row holds its beam's history. That copy of the
whole cache cost as much as a decoder layer's products: in a search 64
sentences at a time on JAX (the shipped preset's first model, beam 4, a
part of 32 sentences, a 32-position cache, one core of a 2-core AMD EPYC)
the reorders and the copies that XLA made of them took 0.7-1.2 of each
step's 4.1 ms.

Here a beam's keys and values stay in the row where they were written,
and the cache records for each beam and position which of its source's
rows holds that position of the beam's history (its *origins*). A step
reorders only the origins (a few integers a position) and writes each
beam's new position into its own row: positions are written once, at
their step, so no beam's history is overwritten. A beam's query then
attends over the positions of all its source's beams, masked to its own
history: the softmax over those masked positions is the softmax over its
history, and so the attention is that of a reordered cache (with beam 4,
four times the scores, a small part of a step's products). TensorFlow's
search in segments holds such caches (`runtime.backend_choices.SEGMENT_BEAM_CACHES`,
where the measurements are).

The cache of a layer is `(keys, values, origins)`: keys `(sources,
heads, beams, d_k, positions)` and values `(sources, heads, beams,
positions, d_v)`, as the attention's products read them, and origins int32
`(sources, beams, positions)`, 1 + the beam whose row holds the position
(0: not written yet). `MultiHeadAttention` takes it as its `cache` with a
`cache_update_index`, one query position a beam.

Example:

>>> import numpy as np
>>> keys, values, origins = empty(sources=2, heads=4, beams=3, length=8, key_dim=16, value_dim=16)
>>> tuple(keys.shape), tuple(origins.shape)
((2, 4, 3, 16, 8), (2, 3, 8))
"""

from keras import ops


def empty(sources, heads, beams, length, key_dim, value_dim, dtype="float32"):
    """A zeroed cache of `length` positions: `(keys, values, origins)`,
    keys and values in `dtype`."""
    return (
        ops.zeros((sources, heads, beams, key_dim, length), dtype),
        ops.zeros((sources, heads, beams, length, value_dim), dtype),
        ops.zeros((sources, beams, length), "int32"),
    )


def is_beam_cache(cache):
    """Whether a layer's self-attention `cache` is this module's (three
    tensors) rather than a plain `(keys, values)` one."""
    return cache is not None and len(cache) == 3


def reordered(cache, parents):
    """The cache for beams that descend from `parents`, `(sources, beams)`
    int32: the beam of the same source each new beam extends. Only the
    origins move; keys and values stay where they are."""
    keys, values, origins = cache
    length = ops.shape(origins)[2]
    parents = ops.broadcast_to(parents[:, :, None], ops.shape(parents) + (length,))
    return keys, values, ops.take_along_axis(origins, parents, axis=1)


def written(cache, index, keys, values):
    """The cache with each beam's `keys` and `values` of position `index`,
    `(sources * beams, heads, 1, d_k | d_v)` head-major (as
    `MultiHeadAttention.project_key_value` gives them), written into its
    own row."""
    key_cache, value_cache, origins = cache
    sources, heads, beams = ops.shape(key_cache)[:3]

    def beam_major(x):  # (sources, heads, beams, 1, d)
        x = ops.reshape(x, (sources, beams, heads, 1, ops.shape(x)[-1]))
        return ops.transpose(x, (0, 2, 1, 3, 4))

    own = ops.broadcast_to(ops.arange(1, beams + 1, dtype="int32")[None, :, None], (sources, beams, 1))
    keys = ops.transpose(beam_major(keys), (0, 1, 2, 4, 3))
    return (
        ops.slice_update(key_cache, [0, 0, 0, 0, index], ops.cast(keys, key_cache.dtype)),
        ops.slice_update(value_cache, [0, 0, 0, index, 0], ops.cast(beam_major(values), value_cache.dtype)),
        ops.slice_update(origins, [0, 0, index], own),
    )


def attention(query_heads, cache):
    """Equation (1) of each beam's query over its own history in `cache`.

    Args:
        query_heads: `(sources * beams, 1, heads, d_k)`, one position a
            beam (a decoding step).
        cache: `(keys, values, origins)`, with the step's position
            written (`written`).

    Returns:
        `(sources * beams, 1, heads, d_v)`, in the queries' dtype. The
        softmax runs in float32, the products in the cache's dtype.
    """
    keys, values, origins = cache
    sources, heads, beams = ops.shape(keys)[:3]
    depth = ops.shape(query_heads)[-1]
    # Every beam i's query against every row j of its source, as products
    # of matrices that the cache holds as they are multiplied (keys
    # `(d_k, positions)`, values `(positions, d_v)`): scores `(sources,
    # heads, row j, beam i, position)`.
    query = ops.reshape(query_heads, (sources, beams, heads, depth)) * ops.cast(depth ** -0.5, query_heads.dtype)
    query = ops.transpose(query, (0, 2, 1, 3))[:, :, None]
    scores = ops.matmul(ops.broadcast_to(ops.cast(query, keys.dtype), (sources, heads, beams, beams, depth)), keys)
    # Beam i reads position p from row j where its origins say j + 1.
    rows = ops.arange(1, beams + 1, dtype="int32")
    own = ops.transpose(origins[:, :, None, :] == rows[None, None, :, None], (0, 2, 1, 3))[:, None]
    scores = ops.where(own, ops.cast(scores, "float32"), float("-inf"))
    # The softmax over the rows and positions together.
    scores = scores - ops.max(scores, axis=(2, 4), keepdims=True)
    weights = ops.exp(scores)
    weights = weights / ops.sum(weights, axis=(2, 4), keepdims=True)
    heads_out = ops.sum(ops.matmul(ops.cast(weights, values.dtype), values), axis=2)  # (sources, heads, i, d_v)
    heads_out = ops.cast(ops.transpose(heads_out, (0, 2, 1, 3)), query_heads.dtype)
    return ops.reshape(heads_out, (sources * beams, 1, heads, ops.shape(heads_out)[-1]))


def kept(cache, sources):
    """The cache of the sources `sources` (int32 indices) only."""
    return tuple(ops.take(x, sources, axis=0) for x in cache)


def padded(cache, length, pad):
    """The cache with `length` positions, zeros after the old ones (no
    beam's origin: unwritten); `pad(x, axis, length)` zero-pads an axis."""
    keys, values, origins = cache
    return pad(keys, 4, length), pad(values, 3, length), pad(origins, 2, length)

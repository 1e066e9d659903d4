"""Calling built layers without Keras' per-call work, for PyTorch.

`keras.layers.Layer.__call__` does more than run the layer's `call`: it
converts and checks the inputs, binds them to the call signature, resolves
`training` and masks from the calls around it, and opens a name scope and an
autocast scope. A decoding step of this package's models calls about fifty
layers, each for a few small matrix products, and a training step of the
6+6-layer model about two hundred. JAX and TensorFlow trace that work once
into compiled code; PyTorch runs eagerly and pays it on every call, and it
took longer than the arithmetic: with direct calls, PyTorch translates one
sentence at a time (beam 4) 1.95x as fast, and 64 at a time 1.44x
(docs/benchmarks.md); a training step whose arithmetic is small takes
0.65-0.67x the time in float32 and 0.73-0.77x in mixed precision
(`benchmarks/step_overhead.py`). `torch.compile` (PyTorch 2.13) does not
replace them: the Keras layer calls compiled broke into 40 graphs and ran
one sentence's step 12-23x slower than these calls, after 1.3-2.5 minutes
of compiling (`benchmarks/decoding_step.py --compile`, docs/benchmarks.md).

Inside `direct_calls()`, the layers of this package (and the Keras layers
they hold, from the subclasses below) run `call` directly, or
`quantized_call` once quantized, as `Layer.__call__` would, where doing so
changes nothing:

- the layer is built (so no `build` is due);
- a layer that computes in the dtype of its variables, with no Keras
  autocast scope open, is called as it is: its caller passes tensors of the
  right dtypes. Otherwise (mixed precision) its inputs are cast and its
  autocast scope opened as `Layer.__call__` does it;
- the caller passes `training` explicitly (a Keras model passes it to every
  layer; it is dropped for layers whose `call` takes none), reads no Keras
  masks and registers no PyTorch forward hooks (which only `__call__` runs),
  as this package's models do.

Keras offers no such path; it is kept here, small and opt-in, rather than
patching `keras.layers.Layer`. Decoding (`keras_transformer.runtime.compiled`)
and the training and validation steps of `TransformerSeq2SeqLM` enter it on
PyTorch.

Inside `direct_calls()` on PyTorch, the float (not quantized, not LoRA)
`Dense`, `EinsumDense` (where its equation is a matrix product) and
`LayerNormalization` layers of a model that computes in the dtype of its
weights go further: each is one PyTorch call (`linear`, with its bias in
the same product, and `layer_norm`), not the few Keras ops of its `call`,
each of which converts and checks its inputs. So is the attention kernel
(`dot_product_attention`). (The search reorders and grows its caches
through `keras_transformer.runtime.array_ops`.) So are the token
embedding's lookup and output projection (`linear`, with the logits bias),
and the sinusoidal encoding reads its rows from a table computed once. A
decoder layer's cached step (one new position, no dropout) is plain
PyTorch calls on its weights throughout (`torch_decoding_step`). These
calls round differently from Keras' einsum and bias add (by about 1e-7 of a
float32 value). Models in mixed precision keep Keras' calls.

`in_place_cache_writes()` is the same kind of saving for the key/value
cache: `keras.ops.slice_update` is functional, so on PyTorch it copies the
whole cache to write one position into it, at every decoding step and in
every layer. Decoding's step reorders the caches into new tensors first
(each beam takes its parent's), so it owns them and may write in place.
"""

import contextlib
import threading

import keras


_state = threading.local()


@contextlib.contextmanager
def _thread_flag(name):
    """Sets `name` in this thread's state for the context, then restores it
    (the contexts nest)."""
    previous = getattr(_state, name, False)
    setattr(_state, name, True)
    try:
        yield
    finally:
        setattr(_state, name, previous)


@contextlib.contextmanager
def direct_calls():
    """Within this context (in this thread), built layers of this package
    run `call` directly (see the module docstring).

    Example:

    >>> import numpy as np
    >>> from keras_transformer.runtime.direct_layers import Dense
    >>> layer = Dense(4)
    >>> x = np.ones((2, 3), "float32")
    >>> expected = keras.ops.convert_to_numpy(layer(x))
    >>> with direct_calls():
    ...     direct = keras.ops.convert_to_numpy(layer(keras.ops.convert_to_tensor(x)))
    >>> bool(np.allclose(direct, expected))
    True
    """
    with _thread_flag("active"):
        yield


@contextlib.contextmanager
def in_place_cache_writes():
    """Within this context (in this thread), on PyTorch inside
    `direct_calls()`, `write_cache` writes into the cache it is given
    instead of a copy of it: for callers that hold the only reference to the
    caches they pass (decoding's step, which has just reordered them into
    new tensors).
    """
    with _thread_flag("in_place"):
        yield


@contextlib.contextmanager
def unchanged_weights():
    """Within this context (in this thread), no layer's weights are
    replaced or written: what a PyTorch step holds of them (its
    `torch_step_weights.step_weights`) is checked against the weights
    once, not at every step. Decoding's searches run their steps in it (no
    other code runs between the steps of one search); at one sentence's
    beams the checks, for every layer at every step, took 4% of a
    translation's time.
    """
    previous = getattr(_state, "unchanged_since", None)
    _state.unchanged_since = object()  # a new scope: held forms are checked once in it
    try:
        yield
    finally:
        _state.unchanged_since = previous


def unchanged_scope():
    """The current `unchanged_weights()` scope (an object), or None."""
    return getattr(_state, "unchanged_since", None)


def write_cache(cache, start, update):
    """`keras.ops.slice_update(cache, start, update)`, written into `cache`
    itself within `in_place_cache_writes()` and `direct_calls()` on
    PyTorch.

    Example:

    >>> import numpy as np
    >>> cache = keras.ops.zeros((1, 1, 4, 2))
    >>> update = keras.ops.ones((1, 1, 1, 2))
    >>> written = write_cache(cache, [0, 0, 2, 0], update)
    >>> keras.ops.convert_to_numpy(written)[0, 0, :, 0].tolist()
    [0.0, 0.0, 1.0, 0.0]
    >>> float(keras.ops.sum(cache))  # the cache given is unchanged
    0.0
    """
    if getattr(_state, "in_place", False) and torch_direct():
        cache[tuple(slice(begin, begin + size) for begin, size in zip(start, update.shape))] = update
        return cache
    return keras.ops.slice_update(cache, start, update)


def write_position(cache, index, update):
    """`write_cache(cache, [0, 0, index, 0], update)`: one position of a
    `(rows, heads, length, depth)` cache, written in place where
    `write_cache` would write it (one `narrow` and one `copy_`, half the
    time of indexing with slices at a decoding step's sizes)."""
    if getattr(_state, "in_place", False) and torch_direct():
        cache.narrow(2, index, 1).copy_(update)
        return cache
    return write_cache(cache, [0, 0, index, 0], update)


def direct_calls_active():
    """Whether this thread is inside `direct_calls()`."""
    return getattr(_state, "active", False)


def torch_direct():
    return getattr(_state, "active", False) and keras.config.backend() == "torch"


def dot_product_attention(query, key, value, mask=None):
    """`keras.ops.dot_product_attention(query, key, value, mask=mask)`:
    within `direct_calls()` on PyTorch, PyTorch's fused kernel called
    directly, with the boolean mask turned into the additive one Keras
    passes it (so that a row with every position masked averages uniformly,
    as through Keras, instead of giving NaN).

    Args:
        query, key, value: `(batch, length, heads, d)`, token-major as
            Keras takes them.
        mask: optional boolean, broadcastable to `(batch, heads,
            query_length, key_length)`; `True` where attention is allowed.
    """
    if not torch_direct():
        return keras.ops.dot_product_attention(query, key, value, mask=mask)
    from torch.nn.functional import scaled_dot_product_attention

    if mask is not None:
        mask = additive_mask(mask, query)
    heads = scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=mask
    )
    return heads.transpose(1, 2)


def additive_mask(allowed, like):
    """A boolean attention mask (true where attention is allowed) as the
    additive mask Keras gives PyTorch's fused kernel: 0 where allowed,
    Keras' large negative (0.7 times the dtype's largest finite value)
    elsewhere, in the dtype and on the device of the tensor `like`."""
    import torch

    largest = 65500.0 if like.dtype == torch.float16 else 3.38953e38
    return torch.full(allowed.shape, -0.7 * largest, dtype=like.dtype, device=like.device).masked_fill_(allowed, 0.0)


def derived_once(layer, name, source, make):
    """`make()`, kept on `layer` under `name` until the tensor `source` is
    replaced or written to (PyTorch counts a tensor's in-place writes)."""
    held = layer.__dict__.get(name)
    if held is not None and held[0] is source and held[1] == source._version:
        return held[2]
    value = make()
    object.__setattr__(layer, name, (source, source._version, value))
    return value



def activated(layer, outputs):
    """`layer.activation(outputs)`, as its PyTorch function where there is
    one."""
    import torch

    activation = {keras.activations.relu: torch.relu, keras.activations.linear: None}.get(
        layer.activation, layer.activation
    )
    return outputs if activation is None else activation(outputs)

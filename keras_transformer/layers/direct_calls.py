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
(`benchmarks/step_overhead.py`).

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
patching `keras.layers.Layer`. Decoding (`keras_transformer.decoding.compiled`)
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
import functools
import math
import threading

import keras

# Keras has no public accessor for the autocast scope its layer calls open.
from keras.src.backend import AutocastScope
from keras.src.backend import get_autocast_scope

from keras_transformer.layers.bfloat16_products import EXACT_INT8_INPUTS
from keras_transformer.layers.bfloat16_products import bfloat16_product
from keras_transformer.layers.bfloat16_products import bfloat16_products_in_float32
from keras_transformer.layers.bfloat16_products import int8_product_in_float32
from keras_transformer.layers.bfloat16_products import int8_products_in_float32
from keras_transformer.layers.bfloat16_products import rounded_to_bfloat16
from keras_transformer.utils import processor

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
    `torch_decoding_step.step_weights`) is checked against the weights
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


class DirectCall:
    """Mixin for `keras.layers.Layer` subclasses: inside `direct_calls()`,
    calling a built layer runs its `call` (or `quantized_call`) directly,
    with the input casts and autocast scope that `Layer.__call__` would
    give it; otherwise `Layer.__call__`."""

    def __call__(self, *args, **kwargs):
        if not (getattr(_state, "active", False) and self.built):
            return super().__call__(*args, **kwargs)
        if "training" in kwargs and not self._call_has_training_arg:
            # Keras models pass `training` to every layer they call.
            kwargs = {key: value for key, value in kwargs.items() if key != "training"}
        call = self.call if self.quantization_mode is None else self.quantized_call
        current = get_autocast_scope()
        if current is None and self.compute_dtype == self.variable_dtype:
            # The caller passes the right dtypes.
            torch_call = torch_call_of(self)
            if torch_call is not None:
                if not getattr(self, "_torch_call_takes_training", False):
                    kwargs.pop("training", None)  # (it changes nothing in these layers)
                return torch_call(*args, **kwargs)
            return call(*args, **kwargs)
        # Mixed precision: `Layer.__call__`'s input casts and scope (its
        # steps 1 and 7), for layers that compute in another dtype than
        # their variables or run inside one that does.
        if self._convert_input_args:
            args = tuple(_converted(self, value) for value in args)
            kwargs = {key: _converted(self, value) for key, value in kwargs.items()}
        if getattr(self, "_torch_call_takes_mixed_dtypes", False):
            torch_call = torch_call_of(self)
            if torch_call is not None:
                kwargs.pop("training", None)
                return torch_call(*args, **kwargs)
        scope = _autocast_scope(self, current)
        if scope is None:
            return call(*args, **kwargs)
        with scope:
            return call(*args, **kwargs)


def torch_call_of(layer):
    """The layer's PyTorch call where it has one for its state, or None:
    `_torch_call` for float weights, `_torch_int8_call` for Keras' int8
    weights with quantized inputs; none with LoRA. Whether the layer's
    structure allows one is decided at its first direct call
    (`_torch_plan`)."""
    plan = getattr(layer, "_torch_plan_cache", None)
    if plan is None:
        plan = keras.config.backend() == "torch" and hasattr(layer, "_torch_plan") and layer._torch_plan()
        # Tracked attributes would be saved: set it past Keras' tracker.
        object.__setattr__(layer, "_torch_plan_cache", plan)
    if not plan or getattr(layer, "lora_enabled", False):
        return None
    mode = layer.quantization_mode
    if mode is None:
        return getattr(layer, "_torch_call", None)
    if mode == "int8" and getattr(layer, "inputs_quantizer", None) is not None and _has_int_mm():
        return getattr(layer, "_torch_int8_call", None)
    return None


def _has_int_mm():
    import torch

    return hasattr(torch, "_int_mm")


def int8_product(quantizer, inputs, contracted, kernel, kernel_scale, dtype, float_kernel=None):
    """Keras' int8 product of `inputs` and an int8 `kernel`, computed as
    Keras computes it, in fewer calls: the inputs quantized as `quantizer`
    does (`keras.quantizers.abs_max_quantize` over their last `contracted`
    axes), their exact int32 product with the `(K, N)` kernel, and that
    divided by the product of the inputs' and the kernel's `(N,)` scales.

    Keras' PyTorch backend multiplies int8 matrices on the CPU as int32
    ones, which made int8 translation 6x slower than float32;
    `torch._int_mm` (which Keras itself calls on CUDA) multiplies them as
    int8, with AMX where the processor has it, for any shape on the CPU
    (on CUDA it takes only some, so there Keras' `matmul` chooses), where
    the processor has int8 dot-product instructions (`_int8_dot_products`);
    on one without them, float32 products of the quantized values
    (`integer_product_in_float32`). The integer product is exact every
    way, so the result is Keras'.

    `float_kernel`, the kernel's values in float32 (`exact_float_kernel`),
    makes products of a few rows (up to
    `_FLOAT32_PRODUCT` multiplications) float32 products of the quantized
    inputs' values: at most 1,040 products of two int8 values sum to less
    than 2**24 in magnitude, so float32 holds every partial sum exactly,
    and the result is the integer product's. At 4 x 128 by 128 x 384, 24
    against 40 us (2-core Intel Xeon with AMX): the int8 product's own
    calls cost more than its arithmetic there.
    """
    import torch

    kept = inputs.shape[: inputs.dim() - contracted]
    rows = inputs.reshape(math.prod(kept), -1)
    low, high = quantizer.value_range
    # (In place where a step's own new tensor is written: fewer calls,
    # each of which costs more than its arithmetic at a few rows.)
    scale = torch.div(high, rows.abs().amax(-1, keepdim=True).add_(quantizer.epsilon)).to(rows.dtype)
    quantized = (rows * scale).round_().clamp_(low, high)
    if float_kernel is not None and quantized.numel() * kernel.shape[1] <= _FLOAT32_PRODUCT:
        outputs = torch.matmul(quantized.float(), float_kernel)  # (integers: exact in any float)
    elif quantized.device.type == "cpu" and _int8_dot_products():
        outputs = torch._int_mm(quantized.to(torch.int8), kernel)
    elif quantized.device.type == "cpu":
        outputs = integer_product_in_float32(quantized, kernel)
    else:  # Keras' own product: `_int_mm` only where CUDA's shape rules allow
        outputs = keras.ops.matmul(quantized.to(torch.int8), kernel)
    return outputs.to(dtype).div_(scale * kernel_scale).view(*kept, -1)


def integer_product_in_float32(quantized, kernel):
    """The exact product of `quantized`, rows of integers from -127 to 127
    held in a float dtype, and an int8 `kernel`, from float32 products of
    the same values: over at most `EXACT_INT8_INPUTS` inputs each, whose
    sums float32 holds exactly, added as int32 where more inputs are
    contracted.

    For a processor without int8 dot-product instructions, where
    `torch._int_mm` takes 30x the time of a float32 product of the same
    shape (2-core AMD EPYC of family 25, AVX2 only, PyTorch 2.13: 256 x
    256 by 256 x 8,000 in 214 ms against 7.1 ms, converting the kernel to
    float32 0.13 ms of it) and Keras' int32 product 6.9x."""
    import torch

    size = EXACT_INT8_INPUTS
    if kernel.shape[0] <= size:
        return torch.matmul(quantized.float(), kernel.float())
    parts = [
        torch.matmul(rows.float(), columns.float()).to(torch.int32)
        for rows, columns in zip(quantized.split(size, dim=-1), kernel.split(size, dim=0))
    ]
    return functools.reduce(torch.add, parts)


def _int8_dot_products():
    """Whether `torch._int_mm` multiplies on the CPU: where the processor
    has int8 dot-product instructions (`processor.has_int8_dot_products`).
    Measured: fast with AVX512_VNNI (AMD EPYC of family 26) and AMX (Intel
    Xeon); 30x slower than float32 with AVX2 alone, where
    `integer_product_in_float32` multiplies. Where the flags are unknown,
    float32 products too, which are never far from float32's speed."""
    return processor.has_int8_dot_products()


def exact_float_kernel(kernel):
    """The float32 values of an int8 `kernel` for `int8_product`'s
    products of a few rows, or None: a CPU kernel of at most
    `EXACT_INT8_INPUTS` rows (where float32 sums the products exactly) and
    `_FLOAT32_WEIGHTS` entries (a copy four times the kernel's size)."""
    small = kernel.numel() <= _FLOAT32_WEIGHTS and kernel.shape[0] <= EXACT_INT8_INPUTS
    return kernel.float() if small and kernel.device.type == "cpu" else None


def prepacked_product(weight):
    """`(x, bias=None) -> torch.nn.functional.linear(x, weight, bias)` for
    inference with bfloat16 weights on a CPU with bfloat16 matrix units, or
    with a large float32 matrix on an AMD processor
    (`_float32_products_prepacked`), the weights reordered once into
    oneDNN's layout for them; None elsewhere (other dtypes, sizes and
    devices, or no such units: then `linear` is the call).

    `linear` hands each bfloat16 product to oneDNN as it comes, and oneDNN
    reorders the weight matrix for its matrix units at every call: at a
    decoding step's few rows, that is most of the product's time (2-core
    Intel Xeon with AMX, microseconds: 256 x 128 by 128 x 384 in 50
    against 71, 4 x 128 by 128 x 8,000 in 69 against 105). Prepacked, the
    bfloat16 model translated 64 sentences at a time 1.05x as fast (nine
    runs, each against the other alternately). It holds a second copy of
    the weights it packs. These are the calls PyTorch's compiler
    (Inductor, with frozen weights) makes for a CPU linear layer; Keras
    has none. MKL's packed float32 products gained nothing within a
    search, so float32 stays with `linear`. The product reads the weights
    as they were when packed; where PyTorch records gradients, it is
    `linear` (the packed call has none). Products of a few rows with a
    small matrix are float32 products of the same values instead, against
    a float32 copy of the matrix (`_FLOAT32_PRODUCT`): one sentence at a
    time, the bfloat16 model translated 28.9 against 22.4 sentences/s
    (four passes each, alternating in one process).

    Example:

    >>> import torch
    >>> weight, bias = torch.randn(6, 4).bfloat16(), torch.randn(6).bfloat16()
    >>> product = prepacked_product(weight)
    >>> x = torch.randn(3, 4).bfloat16()
    >>> expected = torch.nn.functional.linear(x, weight, bias)
    >>> product is None or bool(torch.allclose(product(x, bias), expected, atol=0.05))
    True
    """
    import torch

    if weight.device.type != "cpu" or weight.dim() != 2:
        return None
    if weight.dtype == torch.float32:
        if weight.numel() < _PREPACKED_FLOAT32_WEIGHTS or not _float32_products_prepacked():
            return None
    elif not (
        weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    ):
        return None
    # (The rows given are a hint for the layout; any number of rows works.)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 64)
    outputs, inputs = weight.shape
    # A float32 copy of a small bfloat16 matrix, for products of a few rows.
    small = weight.dtype == torch.bfloat16 and outputs * inputs <= _FLOAT32_WEIGHTS
    exact = weight.detach().float() if small else None
    biases = [None, None]  # the last bias given, and its float32 copy

    def product(x, bias=None):
        if torch.is_grad_enabled():  # (a gradient flows through `linear` only)
            return torch.nn.functional.linear(x, weight, bias)
        if exact is not None and x.numel() * outputs <= _FLOAT32_PRODUCT:
            if bias is not None and biases[0] is not bias:
                biases[:] = [bias, bias.float()]
            return torch.nn.functional.linear(x.float(), exact, None if bias is None else biases[1]).to(x.dtype)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return product


# Float32 matrices of at least this many entries are prepacked on AMD
# processors (`_float32_products_prepacked`): an output projection over a
# vocabulary, and the layers' projections from d_model 512 up.
_PREPACKED_FLOAT32_WEIGHTS = 2**17


@functools.lru_cache(maxsize=1)
def _float32_products_prepacked():
    """Whether large float32 products run faster prepacked in oneDNN than
    through `linear`: on an AMD processor with oneDNN. PyTorch's float32
    `linear` on a CPU is MKL's product, and MKL runs its fastest code on
    Intel's processors only.

    On a 2-core AMD EPYC (AVX-512, PyTorch 2.13), microseconds a product at
    4 / 16 / 64 / 256 rows, `linear` against prepacked oneDNN (the same
    values; matrices as inputs x outputs): 128 x 8,000 (the presets'
    output projection) 219 / 309 / 851 / 3,136 against 78 / 179 / 634 /
    2,690; 2,048 x 512 323 / 417 / 945 / 3,001 against 65 / 196 / 626 /
    2,525; 512 x 512 57 / 108 / 210 / 694 against 33 / 69 / 182 / 614;
    256 x 512 30 / 40 / 104 / 358 against 23 / 36 / 93 / 326. Matrices of
    the presets' decoder layers (d_model 128) were as fast or faster
    through `linear` up to 16 rows (128 x 128 at 4 rows: 8 against 22),
    hence the size threshold. Translations ran
    1.05-1.39x as fast one sentence at a time and 1.12-1.24x 64 at a time
    (the presets), 2.4-2.6x and 1.5-1.9x one and 16 at a time (an opus-mt
    sized model): `benchmarks/products.py` measures both ways on the
    machine at hand. Intel's processors keep `linear` (not measured
    there)."""
    import torch

    return torch.backends.mkldnn.is_available() and processor.vendor() == "AuthenticAMD"


# A oneDNN bfloat16 product costs about 25-35 us a call at any size up to a
# few hundred thousand multiplications (2-core Intel Xeon with AMX: 4 x 128
# by 128 x 384 in 28 us, 16 x 128 by 128 x 128 in 30), a float32 one 6-12
# at those sizes. So the bfloat16 products of up to `_FLOAT32_PRODUCT`
# multiplications, of matrices of up to `_FLOAT32_WEIGHTS` entries, are
# float32 products of the same values: bfloat16 numbers are exact in
# float32, and oneDNN also sums in float32, so the two differ only in the
# order of the sums, before the result is rounded to bfloat16.
_FLOAT32_PRODUCT = 2**20
_FLOAT32_WEIGHTS = 2**18


def derived_once(layer, name, source, make):
    """`make()`, kept on `layer` under `name` until the tensor `source` is
    replaced or written to (PyTorch counts a tensor's in-place writes)."""
    held = layer.__dict__.get(name)
    if held is not None and held[0] is source and held[1] == source._version:
        return held[2]
    value = make()
    object.__setattr__(layer, name, (source, source._version, value))
    return value


def _converted(layer, value):
    """`value` as `Layer.__call__` converts an input: float tensors (also
    inside lists, tuples and dicts) cast to the layer's input dtype."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    convert = lambda x: layer.dtype_policy.convert_input(x, layer.autocast, layer.input_dtype)  # noqa: E731
    if isinstance(value, (list, tuple, dict)):
        return keras.tree.map_structure(convert, value)
    return convert(value)


def _autocast_scope(layer, current):
    """The autocast scope `Layer.__call__` opens for `layer` inside the
    `current` one (None: it keeps `current`)."""
    if current is not None:
        if not layer.autocast or not keras.backend.is_float_dtype(layer.compute_dtype):
            return AutocastScope(None)
        return AutocastScope(layer.compute_dtype) if current.dtype != layer.compute_dtype else None
    return AutocastScope(layer.compute_dtype) if layer.compute_dtype != layer.variable_dtype else None


# The Keras layers this package's layers hold, with the mixin. They add no
# weights and no configuration: saved weights and presets are unchanged.


def activated(layer, outputs):
    """`layer.activation(outputs)`, as its PyTorch function where there is
    one."""
    import torch

    activation = {keras.activations.relu: torch.relu, keras.activations.linear: None}.get(
        layer.activation, layer.activation
    )
    return outputs if activation is None else activation(outputs)


def _biased_and_activated(layer, outputs):
    """`outputs` plus the layer's bias, activated: the end of Keras'
    `Dense` and `EinsumDense` calls."""
    if layer.bias is not None:
        outputs = keras.ops.add(outputs, layer.bias)
    return outputs if layer.activation is None else layer.activation(outputs)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dense(DirectCall, keras.layers.Dense):
    """`keras.layers.Dense` that honours `direct_calls()`: on PyTorch its
    product and bias are one `torch.nn.functional.linear` call (an addmm)."""

    def call(self, inputs, training=None):
        if not bfloat16_products_in_float32(self, inputs, self._kernel):
            return super().call(inputs, training=training)
        return rounded_to_bfloat16(self, bfloat16_product(inputs, self._kernel.value))

    def _int8_call(self, inputs, training=None):
        if not int8_products_in_float32(self, self._kernel.shape[0]):
            return super()._int8_call(inputs, training=training)
        # Keras' int8 call, its product in float32 (`int8_product_in_float32`).
        quantized, inputs_scale = self.inputs_quantizer(inputs, axis=-1)
        outputs = keras.ops.cast(int8_product_in_float32(quantized, self._kernel), self.compute_dtype)
        outputs = keras.ops.divide(outputs, keras.ops.multiply(self.kernel_scale, inputs_scale))
        return _biased_and_activated(self, outputs)

    def _torch_plan(self):
        return True

    def _torch_call(self, inputs):
        from torch.nn.functional import linear

        outputs = linear(inputs, self._kernel_matrix().t(), None if self.bias is None else self.bias.value)
        return activated(self, outputs)

    def _kernel_matrix(self):
        """The kernel, `(inputs, outputs)` (as `EinsumDense._kernel_matrix`)."""
        return self._kernel.value

    def _int8_kernel_scale(self):
        """The int8 kernel's `(outputs,)` scales (as
        `EinsumDense._int8_kernel_scale`)."""
        return self.kernel_scale.value

    def _torch_int8_call(self, inputs):
        outputs = int8_product(
            self.inputs_quantizer, inputs, 1, self._kernel.value, self._int8_kernel_scale(), inputs.dtype
        )
        if self.bias is not None:
            outputs = outputs + self.bias.value
        return activated(self, outputs)

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses only when they opt in; this one changes
        # how the layer is called, not what it computes.
        super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package="keras_transformer")
class EinsumDense(DirectCall, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` that honours `direct_calls()`: on PyTorch,
    where its equation is a matrix product (the input's last axes contract
    with the kernel's first ones, as the attention projections' `btd,dnh->btnh`
    and `btnh,nhd->btd`) and its bias has the kernel's other axes, the
    product and bias are one `torch.nn.functional.linear` call."""

    def call(self, inputs, training=None):
        contracted = self._contracted_axes() if bfloat16_products_in_float32(self, inputs, self._kernel) else None
        if contracted is None:
            return super().call(inputs, training=training)
        return rounded_to_bfloat16(self, bfloat16_product(inputs, self._kernel.value, contracted))

    def _int8_call(self, inputs, training=None):
        contracted = self._contracted_axes()
        size = None if contracted is None else math.prod(self._kernel.shape[:contracted])
        if contracted is None or not int8_products_in_float32(self, size):
            return super()._int8_call(inputs, training=training)
        # Keras' int8 call, its product in float32 (`int8_product_in_float32`).
        quantized, inputs_scale = self.inputs_quantizer(inputs, axis=self.quantization_axis)
        inputs_scale = self._adjust_scale_for_quant(inputs_scale, "input")
        outputs = keras.ops.cast(int8_product_in_float32(quantized, self._kernel, contracted), self.compute_dtype)
        outputs = keras.ops.divide(outputs, keras.ops.multiply(inputs_scale, self.kernel_scale))
        return _biased_and_activated(self, outputs)

    def _contracted_axes(self):
        """How many of the input's last axes contract with the kernel's
        first ones, where the equation is such a product with a bias of the
        kernel's other axes (`_torch_plan`); None otherwise."""
        if "_contracted_axes_cache" not in self.__dict__:
            # (Past Keras' tracker, as `_torch_plan_cache`.)
            object.__setattr__(self, "_contracted_axes_cache", self._torch_contracted if self._torch_plan() else None)
        return self._contracted_axes_cache

    def _torch_plan(self):
        inputs, outputs = self.equation.split("->")
        if inputs.count(",") != 1:
            return False
        x, kernel = inputs.split(",")
        contracted = sum(1 for axis in x if axis not in outputs)
        kept = x[: len(x) - contracted]
        product = (
            contracted > 0
            and kernel[:contracted] == x[len(kept):]
            and outputs == kept + kernel[contracted:]
            and len(set(x + kernel)) == len(kept) + len(kernel)
        )
        bias_fits = self.bias is None or tuple(self.bias.shape) == tuple(self._kernel.shape[contracted:])
        if product and bias_fits:
            object.__setattr__(self, "_torch_contracted", contracted)
        return product and bias_fits

    def _torch_call(self, inputs):
        from torch.nn.functional import linear

        bias = None if self.bias is None else self.bias.value.flatten()
        outputs = linear(inputs.flatten(inputs.dim() - self._torch_contracted), self._kernel_matrix().t(), bias)
        return activated(self, self._unflattened(outputs, inputs))

    def _torch_int8_call(self, inputs):
        outputs = int8_product(
            self.inputs_quantizer, inputs, self._torch_contracted, self._kernel_matrix(),
            self._int8_kernel_scale(), inputs.dtype,
        )
        if self.bias is not None:
            outputs = outputs + self.bias.value.flatten()
        return activated(self, self._unflattened(outputs, inputs))

    def _kernel_matrix(self):
        """The kernel as a `(contracted size, output size)` matrix."""
        kernel = self._kernel.value
        return kernel.reshape(math.prod(kernel.shape[: self._torch_contracted]), -1)

    def _int8_kernel_scale(self):
        """The int8 kernel's scales as a `(output size,)` vector in the
        order of `_kernel_matrix`'s columns, laid out as Keras divides the
        kernel by them (size 1 on the contracted axes); kept until the
        scales are written."""
        return derived_once(
            self, "_torch_int8_scale", self.kernel_scale.value,
            lambda: self._adjust_scale_for_dequant(self.kernel_scale.value).reshape(-1),
        )

    def _unflattened(self, outputs, inputs):
        """A product's `(..., output size)` rows with the output's axes."""
        contracted = self._torch_contracted
        return outputs.view(*inputs.shape[: inputs.dim() - contracted], *self._kernel.shape[contracted:])

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses only when they opt in; this one changes
        # how the layer is called, not what it computes.
        super().quantize(mode, type_check=False, config=config)


# The devices whose `layer_norm` kernel takes bfloat16 or float16 inputs
# with float32 weights. CUDA's wants one dtype ("expected scalar type
# BFloat16 but found Float", on an H100 with PyTorch 2.11).
LAYER_NORM_MIXED_DTYPE_DEVICES = ("cpu",)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(DirectCall, keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` that honours `direct_calls()`: on
    PyTorch, over the last axis, one `torch.nn.functional.layer_norm` call,
    in float32 for lower precisions as Keras computes it: PyTorch's CPU
    kernel takes bfloat16 or float16 inputs with float32 weights and
    computes in float32 (forward and backward 2.7 ms for a (256, 16, 512)
    bfloat16 input, against 4.5 ms with the input cast to float32 and the
    output back); its CUDA kernel wants inputs and weights of one dtype, so
    there the input is cast to float32 and the output back. Under mixed
    precision too, where the other layers run Keras' `call`."""

    # `_torch_call` takes compute-dtype inputs with float32 weights.
    _torch_call_takes_mixed_dtypes = True

    def _torch_plan(self):
        return not self.rms_scaling and self.axis in (-1, [-1]) and self.center and self.scale

    def _torch_call(self, inputs):
        import torch
        from torch.nn.functional import layer_norm

        gamma, beta = self.gamma.value, self.beta.value
        if (
            inputs.dtype in (torch.bfloat16, torch.float16) and gamma.dtype == beta.dtype == torch.float32
            and inputs.device.type in LAYER_NORM_MIXED_DTYPE_DEVICES
        ):
            return layer_norm(inputs, inputs.shape[-1:], gamma, beta, self.epsilon)
        dtype = inputs.dtype
        wide = dtype in (torch.float32, torch.float64)
        outputs = layer_norm(
            inputs if wide else inputs.float(), inputs.shape[-1:],
            gamma if wide else gamma.float(), beta if wide else beta.float(), self.epsilon,
        )
        return outputs if wide else outputs.to(dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(DirectCall, keras.layers.Dropout):
    """`keras.layers.Dropout` that honours `direct_calls()` (its `call`
    returns the input unless `training` is true), and draws its mask
    faster on JAX and on PyTorch's CPU.

    Without a seed, Keras drops with `torch.nn.functional.dropout`, which on
    the CPU draws one random number per element (`bernoulli_`): 11 ms for
    2.1 million elements on 2 cores, 0.3 s of a 2.6 s mixed-precision
    training step of the 6+6-layer model. Here each element gets 16 random
    bits, four to a 64-bit draw (3.5 ms), and is kept when they reach a
    threshold: with probability `1 - round(rate * 2**16) / 2**16`, within
    2**-17 of `1 - rate` (at least 2**-16: one of the 2**16 values is
    always kept), and scaled by one over that probability, so that the
    expectation is the input. With a seed (Keras' own seeded mask), a
    `noise_shape`, or on another device, it is Keras' dropout.

    On JAX, Keras draws the mask with `jax.random.bernoulli`, a Threefry
    generator written in JAX operations: 15 ms for 2.1 million elements on
    2 cores. Here the layer's seed generator keys XLA's own Threefry
    generator (`jax.lax.rng_bit_generator`, 3.3 ms) for 32 random bits an
    element; an element is kept with probability
    `1 - round(rate * 2**32) / 2**32` and scaled by one over it (a float32
    training step of the 3+3-layer model: 1.80 s with Keras' mask, 1.65 s
    with this one). The mask follows from the layer's seed as Keras' does,
    seeded or not, but is not the same mask.
    """

    def call(self, inputs, training=False):
        if training and 0.0 < self.rate < 1.0 and self.noise_shape is None:
            backend = keras.config.backend()
            if backend == "jax":
                return _jax_dropout(inputs, self.rate, self.seed_generator.next())
            if (
                backend == "torch"
                and self.seed is None
                and inputs.device.type == "cpu"
            ):
                return _torch_cpu_dropout(inputs, self.rate)
        return super().call(inputs, training=training)


def _torch_cpu_dropout(inputs, rate):
    """`inputs` with elements dropped at `rate` (see `Dropout`), from 16
    random bits an element."""
    import torch

    # Of the 2**16 values 16 bits can take; one is always kept.
    dropped = min(round(rate * 65536), 65535)
    count = inputs.numel()
    # `random_(-2**63, None)`: every 64-bit value (`random_()` leaves the
    # sign bit 0).
    draws = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    bits = draws.view(torch.int16)[:count].view(inputs.shape)
    return inputs * (bits >= dropped - 32768) * (65536 / (65536 - dropped))


def _jax_dropout(inputs, rate, seed):
    """`inputs` with elements dropped at `rate` (see `Dropout`), from 32
    random bits an element of XLA's Threefry generator keyed by `seed`
    (Keras' two 32-bit words)."""
    import jax
    import jax.numpy as jnp

    # XLA's generator takes 128 bits of key: Keras' 64, and the same 64
    # bits with a constant mixed in.
    key = jnp.concatenate([seed, seed ^ jnp.uint32(0x9E3779B9)])
    _, bits = jax.lax.rng_bit_generator(
        key, inputs.shape, dtype=jnp.uint32,
        algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY,
    )
    dropped = min(round(rate * 2**32), 2**32 - 1)
    scale = jnp.asarray(2**32 / (2**32 - dropped), inputs.dtype)
    return jnp.where(
        bits >= jnp.uint32(dropped), inputs * scale, jnp.zeros((), inputs.dtype)
    )

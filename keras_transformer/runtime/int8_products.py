"""Keras' int8 and bfloat16 products on PyTorch, in fewer calls.

The products that `runtime.direct_calls`' layers and PyTorch's decoding
step (`runtime.torch_decoding_step`) call on PyTorch: int8 products as
Keras computes them (`int8_product`), and products whose weight is packed
once for oneDNN (`prepacked_product`).
"""

import functools
import math

import keras

from keras_transformer.runtime.bfloat16_products import EXACT_INT8_INPUTS
from keras_transformer.utils import processor


def has_int_mm():
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



"""XLA's fast bfloat16 matrix products on a CPU: bfloat16 operands into
float32 results.

XLA's CPU code multiplies bfloat16 matrices at about twice its float32
rate on a processor with bfloat16 instructions, but only into a float32
result: a product into bfloat16 (what Keras' `matmul` and `einsum` of
bfloat16 tensors ask for) converts both operands to float32 first and runs
slower than float32 throughout. So, on a CPU:

- on JAX, this package's `Dense` and `EinsumDense` layers (and the tied
  output projection, `SharedTokenEmbedding`) multiply bfloat16 inputs by
  bfloat16 kernels into float32 (`bfloat16_product`, whose gradient keeps
  bfloat16 operands too), then round to bfloat16 once, after the bias
  (`rounded_to_bfloat16`): in training and inference alike;
- on TensorFlow, the same inside `xla_decoding()`, the functions that
  decoding compiles with XLA (TensorFlow's own CPU kernels have no such
  product outside XLA);
- `bound_output_columns` hands a decoding function traced for XLA the
  transposed copy of the embeddings that its output projection reads;
- inside `xla_decoding()`, Keras' int8 layers multiply their quantized
  inputs by their int8 kernels as a bfloat16 product into float32 (a
  float32 product on a processor without bfloat16 instructions:
  `int8_product_in_float32`), which gives Keras' int8 results exactly.
"""

import contextlib
import functools
import math
import threading

import keras

from keras_transformer.utils import processor

_state = threading.local()


@contextlib.contextmanager
def bound_output_columns(columns):
    """Within this context (in this thread), the layers keyed in `columns`
    (by `id`) read their output projection's matrix from it: for a
    decoding function traced for XLA, the tensor it takes in place of the
    copy `SharedTokenEmbedding.output_columns` made
    (`keras_transformer.runtime.compiled.compile_for_models`)."""
    previous = getattr(_state, "output_columns", {})
    _state.output_columns = {**previous, **columns}
    try:
        yield
    finally:
        _state.output_columns = previous


def output_columns_of(layer):
    """The tensor `bound_output_columns` binds to `layer`, or None."""
    return getattr(_state, "output_columns", {}).get(id(layer))


@contextlib.contextmanager
def xla_decoding():
    """Within this context (in this thread), decoding functions are traced
    for XLA on a CPU (`keras_transformer.runtime.compiled`): this
    package's `Dense` and `EinsumDense` layers multiply bfloat16 inputs by
    bfloat16 kernels into float32 (`bfloat16_product`), rounded to
    bfloat16 after the bias, and `SharedTokenEmbedding` projects bfloat16
    outputs into float32 logits. Only for functions that XLA compiles:
    TensorFlow's CPU kernels have no such product outside XLA. (JAX's
    layers multiply so on a CPU anywhere, training included:
    `bfloat16_products_in_float32`.) Keras' int8 layers multiply their
    quantized inputs as such a product too (`int8_product_in_float32`).
    """
    previous = getattr(_state, "xla_decoding", False)
    _state.xla_decoding = True
    try:
        yield
    finally:
        _state.xla_decoding = previous


def bfloat16_products_in_float32(layer, inputs, kernel):
    """Whether `layer`'s product of `inputs` by `kernel` goes through
    `bfloat16_product`: bfloat16 inputs and kernel (also a float32 kernel
    cast in mixed precision), no quantization or LoRA, on a CPU, on JAX
    (training and inference) or inside `xla_decoding()` on TensorFlow."""
    return (
        (getattr(_state, "xla_decoding", False) or keras.config.backend() == "jax")
        and layer.quantization_mode is None
        and not getattr(layer, "lora_enabled", False)
        and keras.backend.standardize_dtype(inputs.dtype) == "bfloat16"
        and keras.backend.standardize_dtype(kernel.dtype) == "bfloat16"
        and xla_on_cpu()
    )


def bfloat16_product(x, kernel, contracted=1):
    """The product of bfloat16 `x`'s last `contracted` axes with bfloat16
    `kernel`'s first ones, in float32 (shape `x.shape[:-contracted] +
    kernel.shape[contracted:]`), on JAX or in a function TensorFlow
    compiles with XLA: one product whose float32 sums are not rounded to
    bfloat16 (XLA's `preferred_element_type`; TensorFlow's
    `BatchMatMulV3` with a float32 `Tout`, which its CPU kernels lack
    outside XLA).

    XLA's CPU code runs such a product at about twice its float32 speed
    on a processor with bfloat16 instructions, but a product into
    bfloat16 (Keras' layers' `matmul` and `einsum` of bfloat16 tensors)
    slower than float32: it converts both operands to float32 first
    (`float32_product`). The bfloat16 preset's translations with every
    projection of the encoder and the decoding steps so (test_2016_flickr,
    512 sentences 64 at a time, beam 4, 2-core AMD EPYC with avx512_bf16,
    alternating passes): TensorFlow 1.29x as fast (median of five), JAX
    1.04x and 1.09x (medians of five and seven; JAX's output projection
    was so already, `SharedTokenEmbedding.output_columns`).
    """
    rows = len(x.shape) - contracted
    if keras.config.backend() == "jax":
        return _jax_bfloat16_product()(x, kernel, contracted)
    import tensorflow as tf

    size = math.prod(kernel.shape[:contracted])
    product = tf.raw_ops.BatchMatMulV3(
        x=tf.reshape(x, (-1, size)), y=tf.reshape(kernel, (size, -1)), Tout=tf.float32
    )
    return tf.reshape(product, tf.concat([tf.shape(x)[:rows], kernel.shape[contracted:]], 0))


@functools.cache
def _jax_bfloat16_product():
    """`bfloat16_product` on JAX, `(x, kernel, contracted)`, with a gradient
    of the same kind of products (for mixed-precision training).

    JAX's own gradient of a product into float32 multiplies the float32
    gradient by a bfloat16 operand: XLA converts that operand to float32
    and multiplies at its float32 rate. Here the gradient is rounded to
    bfloat16 first (as a product into bfloat16, Keras' mixed precision,
    would have rounded it) and both gradient products are bfloat16 into
    float32 too. XLA's CPU code multiplies bfloat16 at the fast rate only
    where the left operand contracts its last axis and the right one its
    first: each gradient product reads one operand transposed, as rows
    gathered from the transpose, a copy XLA cannot fold back into the
    product as it folds a transpose. The input's gradient reads the
    kernel's transpose so (folded, XLA converted both operands to float32:
    4,095 x 1,024 by 1,024 x 256 in 20 ms, 110 GFLOP/s, where the forward
    products ran at 360-400; a training step of the small model 1.12x as
    fast with the copy, median of alternating steps). The kernel's gradient
    copies the narrower of `x` and the gradient: `x` transposed times the
    gradient, or the gradient transposed times `x`, transposed back as
    32-bit pairs of bfloat16 (`paired_transpose`). XLA gathers slowly
    (about 10 ms for 4,096 x 1,024, 1 for 4,096 x 256), yet for wide inputs
    too the copy and a fast product beat XLA's float32 product of `x` as it
    is (forward and backward together, 2-core AMD EPYC with avx512_bf16,
    4,096 rows: 256 x 1,024 13.2 ms against 21.8 in float32, 256 x 8,000
    90 against 164); copying the gradient of the feed-forward network's
    second layer instead of its input made a training step 1.05-1.08x as
    fast again. Products with other copies of the transpose (a dynamic
    slice or update of it, the kernel's gradient transposed back as it is)
    failed in XLA's CPU runtime ("Unsupported element type for DotThunk":
    it had planned them as bfloat16 products); these ran for every shape
    tried: 88 products (rows 1 to 4,096, inputs 8 to 4,096, outputs 1 to
    32,000; gradients equal to NumPy's) and 18 networks of three layers.
    """
    import jax
    import jax.numpy as jnp

    def product(x, kernel, contracted):
        rows = x.ndim - contracted
        axes = ((tuple(range(rows, x.ndim)), tuple(range(contracted))), ((), ()))
        return jax.lax.dot_general(x, kernel, axes, preferred_element_type=jnp.float32)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def bfloat16_product(x, kernel, contracted):
        return product(x, kernel, contracted)

    def forward(x, kernel, contracted):
        return product(x, kernel, contracted), (x, kernel)

    def backward(contracted, saved, gradient):
        x, kernel = saved
        size = math.prod(kernel.shape[:contracted])
        x_rows = x.reshape(-1, size)  # (rows, size)
        matrix = kernel.reshape(size, -1)  # (size, outputs)
        outputs = matrix.shape[1]
        gradient = gradient.astype(jnp.bfloat16).reshape(x_rows.shape[0], outputs)
        x_gradient = product(gradient, copied_transpose(matrix), 1)
        if size > outputs and outputs % 2 == 0:
            # The narrower operand is copied: (gradient^T x)^T.
            kernel_gradient = paired_transpose(
                product(copied_transpose(gradient), x_rows, 1).astype(jnp.bfloat16)
            )
        else:
            kernel_gradient = product(copied_transpose(x_rows), gradient, 1)
        return (
            x_gradient.reshape(x.shape).astype(x.dtype),
            kernel_gradient.reshape(kernel.shape).astype(kernel.dtype),
        )

    def copied_transpose(matrix):
        # Rows gathered from the transpose: a copy that XLA does not fold
        # back into the product as it folds a transpose.
        return jnp.take(matrix.T, jnp.arange(matrix.shape[1]), axis=0)

    def paired_transpose(matrix):
        # A bfloat16 (2n, k) matrix transposed as n x k 32-bit words of two
        # rows each. XLA would fold a plain transpose of a product's result
        # into the product by swapping its operands, into one that its CPU
        # runtime does not run ("Unsupported element type for DotThunk").
        rows, columns = matrix.shape
        pairs = jnp.swapaxes(matrix.reshape(rows // 2, 2, columns), 1, 2)
        words = jax.lax.bitcast_convert_type(pairs, jnp.uint32)  # (rows / 2, columns)
        return jax.lax.bitcast_convert_type(words.T, matrix.dtype).reshape(columns, rows)

    bfloat16_product.defvjp(forward, backward)
    return bfloat16_product


# The most inputs whose int8 products float32 sums exactly: 1,040 x 127**2 < 2**24.
EXACT_INT8_INPUTS = 1040


def int8_products_in_float32(layer, contracted_size):
    """Whether `layer`'s int8 product (Keras' int8 kernel, its inputs
    quantized to int8) goes through `int8_product_in_float32`: inside
    `xla_decoding()` on a CPU, with inputs quantized, no LoRA, and at most
    `EXACT_INT8_INPUTS` inputs contracted (`contracted_size`), where the
    float32 sums are exact."""
    return (
        getattr(_state, "xla_decoding", False)
        and layer.quantization_mode == "int8"
        and getattr(layer, "inputs_quantizer", None) is not None
        and not getattr(layer, "lora_enabled", False)
        and contracted_size <= EXACT_INT8_INPUTS
        and xla_on_cpu()
    )


def int8_product_in_float32(quantized, kernel, contracted=1):
    """The product of int8 `quantized`'s last `contracted` axes with int8
    `kernel`'s first ones, as float32 values: those of Keras' int32
    product exactly, where at most `EXACT_INT8_INPUTS` inputs are
    contracted (`int8_products_in_float32`).

    Integers of up to 8 bits are exact in bfloat16, their products exact
    in float32, and sums of up to 1,040 of them stay below 2**24, where
    float32 holds every integer: so, on a processor with bfloat16
    instructions (`processor.has_bfloat16_products`), this is one
    `bfloat16_product`, which XLA's CPU code runs at its bfloat16 rate.
    XLA's own int8 product (Keras' `preferred_element_type=int32`) is as
    fast alone, yet the en-de preset's first model quantized to int8
    translated at 0.57-0.84x of its float32 speed with it. With this
    product (2-core AMD EPYC of family 26, avx512_bf16, beam 4,
    alternating passes, medians, the same translations): JAX 1.28x as fast
    one sentence at a time and 1.31x 64 at a time, TensorFlow 1.38x and
    1.37x, about float32's speed.

    Without bfloat16 instructions, XLA runs a bfloat16 product at half its
    float32 rate or less (2-core AMD EPYC of family 25, AVX2 only: 256 x
    128 by 128 x 8,000 in 6.2 ms against 3.5), so there this is a float32
    product of the same values, as exact. The en-de preset's first model
    in int8 then translated 512 sentences 64 at a time (beam 4, medians of
    three warm passes) in 2.18 s against 2.66 on JAX (float32 weights:
    1.79 s; Keras' own int8 product: 2.86 s) and in 2.24 s against 3.03 on
    TensorFlow (float32 weights: 2.18 s).
    """
    if processor.has_bfloat16_products():
        return bfloat16_product(keras.ops.cast(quantized, "bfloat16"), keras.ops.cast(kernel, "bfloat16"), contracted)
    return keras.ops.tensordot(keras.ops.cast(quantized, "float32"), keras.ops.cast(kernel, "float32"), contracted)


def float32_product(x, y):
    """`x @ y` as float32: for bfloat16 `x` and `y` on JAX (and on
    TensorFlow inside `xla_decoding()`), one product whose float32 results
    are not rounded to bfloat16 (`bfloat16_product`); `keras.ops.matmul`
    otherwise.

    XLA's CPU code multiplies bfloat16 matrices at twice its float32 rate
    only into a float32 result; into a bfloat16 one it converts both to
    float32 first. 128 x 128 by 128 x 8,000, compiled, one core of an AMD
    EPYC with avx512_bf16: 1,310 us into float32, 3,062 into bfloat16,
    2,591 in float32 throughout.
    """
    standardize = keras.backend.standardize_dtype
    xla = keras.config.backend() == "jax" or getattr(_state, "xla_decoding", False)
    if xla and standardize(x.dtype) == standardize(y.dtype) == "bfloat16":
        return bfloat16_product(x, y)
    return keras.ops.matmul(x, y)


def xla_on_cpu():
    """Whether the backend compiles with XLA (JAX, TensorFlow) and computes
    on the CPU (no GPU or other accelerator)."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_logical_devices("GPU")
    return False


def rounded_to_bfloat16(layer, product):
    """A layer's float32 `product` (`bfloat16_product`) plus its bias,
    rounded to bfloat16 once, then activated."""
    if layer.bias is not None:
        product = product + keras.ops.cast(layer.bias, "float32")
    outputs = keras.ops.cast(product, "bfloat16")
    return outputs if layer.activation is None else layer.activation(outputs)

"""The Keras layers this package's paper layers hold, with the
`runtime.direct_calls.DirectCall` mixin: on PyTorch inside `direct_calls()`
each is one PyTorch call; `Dropout` draws its mask faster on JAX and on
PyTorch's CPU. They add no weights and no configuration: saved weights and
presets are unchanged.
"""

import math

import keras

from keras_transformer.runtime.bfloat16_products import bfloat16_product
from keras_transformer.runtime.bfloat16_products import bfloat16_products_in_float32
from keras_transformer.runtime.bfloat16_products import int8_product_in_float32
from keras_transformer.runtime.bfloat16_products import int8_products_in_float32
from keras_transformer.runtime.bfloat16_products import rounded_to_bfloat16
from keras_transformer.runtime.dispatch import DirectCall
from keras_transformer.runtime.direct_calls import activated
from keras_transformer.runtime.direct_calls import derived_once
from keras_transformer.runtime.int8_products import int8_product


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

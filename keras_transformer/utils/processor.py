"""What the x86 processor computes fast, by `/proc/cpuinfo`.

Some products run at very different speeds from one processor to the
next, and the fastest way to compute one exactly depends on the
instructions at hand: an int8 product is fast where the processor has int8
dot-product instructions and 30x slower than float32 where it has not
(PyTorch's `torch._int_mm`, AVX2 alone); a bfloat16 product into float32
twice float32's rate with bfloat16 instructions and half of it without
(XLA's CPU code). The layers choose by these answers
(`keras_transformer.layers.direct_calls`,
`keras_transformer.layers.bfloat16_products`).

Example:

>>> from keras_transformer.utils import processor
>>> isinstance(processor.has_bfloat16_products(), bool)
True
"""

import functools


@functools.lru_cache(maxsize=1)
def vendor():
    """The processor's vendor string ("GenuineIntel", "AuthenticAMD"), or
    "" where unknown."""
    return _cpu_info("vendor_id")


@functools.lru_cache(maxsize=1)
def flags():
    """The processor's feature flags, a frozenset; empty where unknown."""
    return frozenset(_cpu_info("flags").split())


def has_int8_dot_products():
    """Whether the processor has int8 dot-product instructions: AVX512_VNNI
    or AVX_VNNI (in vector registers) or AMX_INT8 (Intel's matrix units).
    False where unknown."""
    return bool(flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def has_bfloat16_products():
    """Whether the processor has bfloat16 dot-product instructions:
    AVX512_BF16 or AMX_BF16. False where unknown."""
    return bool(flags() & {"avx512_bf16", "amx_bf16"})


def _cpu_info(field):
    """The first processor's `field` in `/proc/cpuinfo`, or "" where
    unknown (no such file: not Linux, or not x86)."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""

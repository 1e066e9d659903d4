"""What the x86 processor computes fast, by `/proc/cpuinfo`.

Some products run at very different speeds from one processor to the
next, and the fastest way to compute one exactly depends on the
instructions at hand: an int8 product is fast where the processor has int8
dot-product instructions and 30x slower than float32 where it has not
(PyTorch's `torch._int_mm`, AVX2 alone); a bfloat16 product into float32
twice float32's rate with bfloat16 instructions and half of it without
(XLA's CPU code). The layers choose by these answers
(`keras_transformer.runtime.direct_calls`,
`keras_transformer.runtime.bfloat16_products`).

Example:

>>> from keras_transformer.utils import processor
>>> isinstance(processor.has_bfloat16_products(), bool)
True
>>> "int8 dot products: " in processor.describe()  # the line benchmarks print
True
"""

import functools
import os
import platform

# Linux's description of the processors, one block of "field : value"
# lines for each.
CPUINFO = "/proc/cpuinfo"


@functools.lru_cache(maxsize=1)
def vendor():
    """The processor's vendor string ("GenuineIntel", "AuthenticAMD"), or
    "" where unknown."""
    return _cpu_info("vendor_id")


@functools.lru_cache(maxsize=1)
def flags():
    """The processor's feature flags, a frozenset; empty where unknown."""
    return frozenset(_cpu_info("flags").split())


@functools.lru_cache(maxsize=1)
def model_name():
    """The processor's model name as `lscpu` gives it ("AMD EPYC",
    "Intel(R) Xeon(R) Platinum 8488C"), else Python's `platform` name of
    it, else "unknown"."""
    return _cpu_info("model name") or platform.processor() or platform.machine() or "unknown"


def has_amx():
    """Whether the processor has Intel's matrix units (AMX tiles)."""
    return bool(flags() & {"amx_tile", "amx_bf16", "amx_int8"})


def describe():
    """One line for a benchmark's table: the model name, the core count and
    the instructions by which the layers choose their products, e.g. "AMD
    EPYC, 2 cores, AMX: no, bfloat16 products: yes, int8 dot products:
    yes"."""
    answer = {True: "yes", False: "no"}
    return (f"{model_name()}, {os.cpu_count()} cores, AMX: {answer[has_amx()]}, "
            f"bfloat16 products: {answer[has_bfloat16_products()]}, "
            f"int8 dot products: {answer[has_int8_dot_products()]}")


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
    """The first processor's `field` in `CPUINFO`, or "" where unknown (no
    such file: not Linux; no such field: not x86)."""
    try:
        with open(CPUINFO) as file:
            for line in file:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""

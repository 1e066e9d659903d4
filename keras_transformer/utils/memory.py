"""Keeping freed memory for reuse: a training step's large buffers.

A training step on a CPU allocates and frees the same large buffers at
every step: the logits and their gradient, `(tokens, vocabulary)`, 131 MB in
float32 for a 4,096-token batch and an 8,000-word vocabulary, and the
activations of every layer. glibc's `malloc` serves each allocation above
its mmap threshold (at most 32 MB) with a fresh `mmap` and gives it back to
the system on `free`, so every step touches those pages anew, and each first
touch is a page fault. On a virtual machine that is slow: a bfloat16 matmul
that writes a new (4,095, 8,000) output ran at 513 GFLOP/s against 2,260
into a buffer it had already written, and zeroing a new 131 MB tensor took
35 ms against 9.

`reuse_freed_memory()` tells glibc to serve large allocations from its heap
and to keep what is freed there for the next step (mallopt's `M_MMAP_MAX` 0
and a high `M_TRIM_THRESHOLD`), and to give every thread the one main heap
(`M_ARENA_MAX` 1): the setting that
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=... MALLOC_ARENA_MAX=1` gives a
process from its start. The last matters for the backends' own threads:
glibc gives a thread that allocates a heap of its own (an arena) of at most
64 MB, and maps anything larger afresh whatever `M_MMAP_MAX` says. XLA
allocates the workspace of JAX's compiled training step (620 MB for the
3+3-layer model in mixed precision, a 4,096-token batch) in its own
threads, so each step faulted all of it in anew: with one heap, a
mixed-precision `train_on_batch` of that model took 722 against 871 ms
(medians of six, three real batches, 2-core AMD EPYC). A thread keeps the
heap it has, so the call belongs at the start of a process, before the
backend starts its threads. The process then holds its peak memory until
it exits, as PyTorch's and TensorFlow's own GPU allocators do, and some
more: on PyTorch, training the 3+3-layer, d_model-256 model in mixed
precision on 40 Multi30k batches twice ran 1.12x as fast (4,072 against
3,633 target tokens/s) with a peak resident memory of 3,884 MB against
3,446. Decoding allocates the logits of
every beam at each step: PyTorch translated 64 sentences at a time (beam 4)
1.18x as fast with it. `keras-transformer train`, `translate` and `evaluate`
call it; `benchmarks/train.py` and `benchmarks/decode.py` call it for every
engine they time.
"""

import contextlib
import ctypes
import gc
import sys

# mallopt's parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def reuse_freed_memory():
    """Makes this process keep freed memory for its next allocations.

    Does nothing (and returns False) where the C library is not glibc
    (macOS, Windows, musl); returns True once glibc has taken the setting.
    Threads that have allocated memory before the call keep their own heaps:
    call it at the start of the process (the `keras-transformer` command
    does), or set `MALLOC_ARENA_MAX=1` in the environment.

    Example:

    >>> reuse_freed_memory() in (True, False)
    True
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        # The C library this process already runs on: no search for it.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt in this process's C library
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # M_TRIM_THRESHOLD takes an int: the largest, 2 GiB - 1.
    return (
        bool(mallopt(_M_MMAP_MAX, 0))
        and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
        and bool(mallopt(_M_ARENA_MAX, 1))
    )


@contextlib.contextmanager
def one_garbage_collection():
    """Keras collects garbage after each variable that quantization
    replaces (`Layer.__delattr__`), 49 full collections for a 3+3-layer
    model and seconds in a process holding TensorFlow and a backend; one
    collection afterwards frees the same float32 buffers."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def give_back_freed_memory():
    """Returns the memory that the C library holds freed to the system
    (glibc's `malloc_trim`): loading a checkpoint replaces every weight of
    a model built with initial values, a module at a time, and the freed
    holes between live arrays would otherwise stay in the process (on JAX,
    whose new arrays do not fill the holes that the old ones leave, a load
    of 1x the weights peaked at 2.0x them; with this after each module,
    1.5x: `convert.marian_weights.assign_checkpoint_weights`). Does
    nothing where the C library is not glibc.

    >>> give_back_freed_memory()
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


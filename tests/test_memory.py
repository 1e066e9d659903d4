"""reuse_freed_memory: large buffers come from glibc's heap, not from a
fresh mmap each time (checked with glibc's own accounting, mallinfo2)."""

import ctypes
import subprocess
import sys

import pytest

CHILD = """
import ctypes, sys
import numpy as np
from keras_transformer.utils.memory import reuse_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "reuse":
    assert reuse_freed_memory() is True
mapped = libc.mallinfo2().hblkhd
x = np.ones(16 << 20, np.float32)  # 64 MiB, above glibc's largest mmap threshold
print(libc.mallinfo2().hblkhd - mapped)
"""


def _glibc_with_mallinfo2():
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc 2.33 or newer")
def test_large_allocations_stay_in_the_heap_once_asked():
    def mapped_bytes(mode):
        run = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1])

    assert mapped_bytes("default") >= 64 << 20  # glibc maps it, and unmaps it when freed
    assert mapped_bytes("reuse") == 0

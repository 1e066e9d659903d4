"""reuse_freed_memory: large buffers come from glibc's heap, not from a
fresh mmap each time, in the main thread and in threads started after it
(checked with glibc's own accounting, mallinfo2)."""

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
if sys.argv[2] == "main":
    x = np.ones(16 << 20, np.float32)  # 64 MiB, above glibc's largest mmap threshold
    print(libc.mallinfo2().hblkhd - mapped)
else:
    # 128 MiB in a new thread: more than a thread's own heap (an arena)
    # holds, which glibc maps whatever M_MMAP_MAX says.
    import threading
    seen = []
    def allocate():
        x = np.ones(32 << 20, np.float32)
        seen.append(libc.mallinfo2().hblkhd - mapped)
    thread = threading.Thread(target=allocate)
    thread.start()
    thread.join()
    print(seen[0])
"""


def _glibc_with_mallinfo2():
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc 2.33 or newer")
def test_large_allocations_stay_in_the_heap_once_asked():
    def mapped_bytes(mode, thread):
        run = subprocess.run([sys.executable, "-c", CHILD, mode, thread], capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1])

    assert mapped_bytes("default", "main") >= 64 << 20  # glibc maps it, and unmaps it when freed
    assert mapped_bytes("reuse", "main") == 0
    assert mapped_bytes("default", "thread") >= 128 << 20
    assert mapped_bytes("reuse", "thread") == 0

"""Keras ops' names made as NumPy calls, for the search's state where
PyTorch decodes on the CPU (`array_ops.search_state_ops`): the same
arguments and results as `keras.ops` for what the search passes them
(int32, float32 and bool arrays; non-negative indices), integer sums kept
in their own dtype as Keras keeps them.

The search's bookkeeping of a step is some sixty operations on arrays of a
few dozen numbers: NumPy makes each in about a microsecond, PyTorch's
eager dispatch in several. One `search.advance` of one sentence's 4 beams
(8,000 tokens, 2-core AMD EPYC, both timed in one run on a busy machine)
took 314 us here against 1,054 us in `TorchOps`.
"""

import numpy as np


def _array(x, dtype=None):
    if type(x) is np.ndarray:
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    if hasattr(x, "numpy") and not isinstance(x, np.generic):
        x = x.numpy()  # (a CPU tensor of the backend: its memory, through its own `.numpy()`)
    return np.asarray(x, dtype)


class NumpyOps:
    """The search's ops on the host, as NumPy arrays."""

    @staticmethod
    def asarray(x, dtype):
        return _array(x, dtype)

    @staticmethod
    def convert_to_tensor(x, dtype=None):
        return _array(x, dtype)

    @staticmethod
    def cast(x, dtype):
        return _array(x, dtype)

    @staticmethod
    def arange(n, dtype="int32"):
        return np.arange(n, dtype=dtype)

    @staticmethod
    def full(shape, value, dtype):
        return np.full(tuple(shape), value, dtype)

    @staticmethod
    def zeros(shape, dtype="float32"):
        return np.zeros(tuple(shape), dtype)

    @staticmethod
    def where(condition, x, y):
        return np.where(condition, x, y)

    @staticmethod
    def may_hold_true(x):
        """Whether the boolean array `x` holds a true value (known here)."""
        return bool(x.any())

    @staticmethod
    def shape(x):
        return tuple(np.shape(x))

    @staticmethod
    def reshape(x, shape):
        return np.reshape(x, shape)

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(x, shape)

    @staticmethod
    def take(x, indices, axis=0):
        return np.take(x, indices, axis=axis)

    @staticmethod
    def take_along_axis(x, indices, axis):
        if axis == 1 and x.ndim == indices.ndim == 2:
            # (Indexing by rows and indices: NumPy's `take_along_axis`
            # builds these index arrays in Python at each call.)
            return x[np.arange(len(x))[:, None], indices]
        if axis == 1 and x.ndim == indices.ndim == 3:
            return x[np.arange(len(x))[:, None, None], indices, np.arange(x.shape[2])[None, None, :]]
        return np.take_along_axis(x, indices, axis=axis)

    @staticmethod
    def top_k(x, k):
        """The `k` largest values of each row and their indices, largest
        first, the lower index first among equal values (as `keras.ops.top_k`
        and PyTorch's `topk` order them)."""
        indices = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype("int32")
        return np.take_along_axis(x, indices, axis=-1), indices

    @staticmethod
    def cumsum(x, axis):
        return np.cumsum(x, axis, dtype=x.dtype)

    @staticmethod
    def sum(x, axis=None):
        return np.sum(x, axis, dtype=x.dtype if x.dtype.kind in "iu" else None)

    @staticmethod
    def max(x, axis):
        return np.max(x, axis)

    @staticmethod
    def minimum(x, y):
        return np.minimum(x, y)

    @staticmethod
    def all(x):
        return np.all(x)

    @staticmethod
    def concatenate(xs, axis):
        return np.concatenate(list(xs), axis)

    @staticmethod
    def isfinite(x):
        return np.isfinite(x)

    @staticmethod
    def scatter(indices, values, shape):
        """Zeros of `shape` with `values` added at `indices` (`(n, rank)`)."""
        out = np.zeros(tuple(shape), np.asarray(values).dtype)
        np.add.at(out, tuple(np.asarray(indices).T), values)
        return out

    @staticmethod
    def pad_to(x, axis, length):
        """`x` with zeros after its entries along `axis`, to `length`."""
        padding = [(0, 0)] * np.ndim(x)
        padding[axis] = (0, length - np.shape(x)[axis])
        return np.pad(x, padding)


NUMPY_OPS = NumpyOps()

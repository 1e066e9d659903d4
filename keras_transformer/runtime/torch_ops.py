"""Keras ops' names made as PyTorch calls, for the search's eager steps
(`array_ops`): the same arguments and results as `keras.ops` for what the
search passes them (int32, float32 and bool tensors; non-negative
indices), without Keras' conversion of each input."""

import functools

import torch

_DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32, "float64": torch.float64,
           "bool": torch.bool}


class TorchOps:
    """The search's ops on one device (`TorchOps.on(device)`)."""

    def __init__(self, device):
        self.device = device

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def on(device):
        return TorchOps(device)

    def _tensor(self, x, dtype=None):
        return torch.as_tensor(x, dtype=_DTYPES[dtype] if dtype else None, device=self.device)

    def asarray(self, x, dtype):
        return self._tensor(x, dtype)

    def convert_to_tensor(self, x, dtype=None):
        return self._tensor(x, dtype)

    def cast(self, x, dtype):
        dtype = _DTYPES[dtype]
        if not isinstance(x, torch.Tensor):
            return torch.as_tensor(x, dtype=dtype, device=self.device)
        return x if x.dtype == dtype else x.to(dtype)

    def arange(self, n, dtype="int32"):
        return torch.arange(n, dtype=_DTYPES[dtype], device=self.device)

    def full(self, shape, value, dtype):
        return torch.full(tuple(shape), value, dtype=_DTYPES[dtype], device=self.device)

    def zeros(self, shape, dtype="float32"):
        return torch.zeros(tuple(shape), dtype=_DTYPES[dtype], device=self.device)

    def where(self, condition, x, y):
        return torch.where(condition, x, y)

    @staticmethod
    def may_hold_true(x):
        """Whether the boolean tensor `x` holds a true value (eager: known)."""
        return bool(x.any())

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def reshape(x, shape):
        return x.reshape(shape)

    @staticmethod
    def broadcast_to(x, shape):
        return x.expand(shape)

    @staticmethod
    def take(x, indices, axis=0):
        return x.index_select(axis, indices)

    @staticmethod
    def take_along_axis(x, indices, axis):
        return torch.gather(x, axis, indices.long())

    @staticmethod
    def top_k(x, k):
        values, indices = torch.topk(x, k)
        return values, indices

    @staticmethod
    def cumsum(x, axis):
        return torch.cumsum(x, axis, dtype=x.dtype)

    @staticmethod
    def sum(x, axis=None):
        return x.sum() if axis is None else x.sum(axis, dtype=x.dtype)

    @staticmethod
    def max(x, axis):
        return x.amax(axis)

    @staticmethod
    def minimum(x, y):
        return torch.minimum(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else min(x, y)

    @staticmethod
    def all(x):
        return x.all()

    @staticmethod
    def concatenate(xs, axis):
        return torch.cat(list(xs), axis)

    @staticmethod
    def isfinite(x):
        return torch.isfinite(x)

    @staticmethod
    def logsumexp(x, axis, keepdims=False):
        return torch.logsumexp(x, axis, keepdim=keepdims)

    @staticmethod
    def exp(x):
        return torch.exp(x)

    @staticmethod
    def log(x):
        return torch.log(x)

    @staticmethod
    def bitwise_and(x, y):
        return torch.bitwise_and(x, y)

    @staticmethod
    def bitwise_xor(x, y):
        return torch.bitwise_xor(x, y)

    @staticmethod
    def right_shift(x, y):
        return torch.bitwise_right_shift(x, y)

    def scatter(self, indices, values, shape):
        """Zeros of `shape` with `values` added at `indices` (`(n, rank)`)."""
        out = torch.zeros(tuple(shape), dtype=values.dtype, device=self.device)
        return out.index_put_(tuple(indices.long().unbind(-1)), values, accumulate=True)

    @staticmethod
    def pad_to(x, axis, length):
        """`x` with zeros after its entries along `axis`, to `length`."""
        from torch.nn.functional import pad

        # (`pad` lists the axes from the last, two numbers an axis.)
        return pad(x, (0, 0) * (x.dim() - 1 - axis % x.dim()) + (0, length - x.shape[axis]))


def cpu_numpy(x):
    """A NumPy copy of a CPU tensor of a dtype NumPy has; else None."""
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and not x.requires_grad:
        try:
            return x.numpy().copy()
        except (TypeError, RuntimeError):  # a dtype NumPy lacks (bfloat16)
            return None
    return None

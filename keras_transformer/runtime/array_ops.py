"""The array namespace that the search runs on, chosen per backend.

The search (`keras_transformer.decoding.search`) is written once, against
a namespace of Keras ops' names (`where`, `take_along_axis`, `top_k`, ...).
Where JAX and TensorFlow run it, they trace it into compiled code, and
that namespace is `keras.ops` itself. PyTorch runs it eagerly, a step at a
time between decoder steps, where Keras' conversion and checks of each
op's inputs cost more than the op: the search's bookkeeping of one step
took 750 us in Keras ops and 300 us in the same calls made to PyTorch
directly (one sentence's 4 beams, 2-core CPU), against a decoder step of
about 1,100 us. There `TorchOps` makes them.
"""

import keras
import numpy as np

from keras_transformer.runtime.numpy_ops import NUMPY_OPS


class KerasOps:
    """`keras.ops`, with `asarray(x, dtype)` (a cast) for the formulas
    of `decoding.rules` that also run on NumPy."""

    def __getattr__(self, name):
        return getattr(keras.ops, name)

    @staticmethod
    def asarray(x, dtype):
        return keras.ops.cast(x, dtype)

    @staticmethod
    def may_hold_true(x):
        """Whether the boolean tensor `x` may hold a true value: here,
        where it may be traced, always (work that only true values change
        runs)."""
        return True

    @staticmethod
    def pad_to(x, axis, length):
        """`x` with zeros after its entries along `axis`, to `length`."""
        padding = [(0, 0)] * len(keras.ops.shape(x))
        padding[axis] = (0, length - keras.ops.shape(x)[axis])
        return keras.ops.pad(x, padding)


KERAS_OPS = KerasOps()


def array_ops(like=None):
    """The namespace for the search's arrays: on PyTorch, NumPy's for a
    NumPy `like` (a state of `search_state_ops`), else `TorchOps` on the
    device of the tensor `like`; elsewhere `keras.ops` (as `KERAS_OPS`)."""
    if keras.config.backend() == "torch":
        from keras_transformer.runtime.torch_ops import TorchOps

        if isinstance(like, np.ndarray):
            return NUMPY_OPS

        return TorchOps.on(getattr(like, "device", None))
    return KERAS_OPS


def search_state_ops(like=None):
    """The namespace that a search's state (its beams' tokens, scores and
    finished hypotheses: not the caches) is made in, beside the tensor
    `like` (a cache): NumPy's where PyTorch decodes on the CPU, which runs
    the search's bookkeeping a step at a time between decoder steps, and
    there NumPy's calls on a few dozen numbers cost less than PyTorch's
    (`runtime.numpy_ops`). Elsewhere
    `array_ops(like)`: a GPU's tensors stay on it, and JAX and TensorFlow
    trace the search into compiled code."""
    if keras.config.backend() == "torch" and getattr(getattr(like, "device", None), "type", "cpu") == "cpu":
        return NUMPY_OPS
    return array_ops(like)


def to_numpy(x):
    """`keras.ops.convert_to_numpy(x)` of one tensor `x`: on PyTorch, for a
    CPU tensor of a dtype NumPy has, a copy of its memory through its own
    `.numpy()` (Keras' conversion, made for any nest of tensors, took 5 us
    a tensor where this takes 2)."""
    if keras.config.backend() == "torch":
        from keras_transformer.runtime.torch_ops import cpu_numpy

        found = cpu_numpy(x)
        if found is not None:
            return found
    return keras.ops.convert_to_numpy(x)


def id_list(ids, dtype=None):
    """One sequence of token ids (a list, an array, or a tensor on any
    device: NumPy reads only the CPU's) as a list of Python numbers, cast
    to `dtype` first where given."""
    return np.asarray(to_numpy(ids) if keras.ops.is_tensor(ids) else ids, dtype).reshape(-1).tolist()

"""A transformers checkpoint's tensors, read one at a time.

Loading a checkpoint holds the model's weights and, beside them, one
tensor of the checkpoint at a time: `CheckpointTensors` reads a tensor of
`model.safetensors` when it is asked for (`safetensors.safe_open`, opened
anew for each tensor, so that the file's pages do not stay mapped into
the process), and the converters hand the backbone its weights a module at
a time (`marian_weights.assign_checkpoint_weights`), the embeddings a
block of rows at a time (`RowBlocks`, `runtime.variable_rows`). A
`pytorch_model.bin` is memory-mapped (`torch.load(mmap=True)`): its pages
are the operating system's file cache, which it reclaims.
"""

import collections.abc

import numpy as np

# Rows read at a time of a large tensor (embeddings: assigned, or compared
# with a tied copy).
COMPARED_ROWS = 1024


class CheckpointTensors(collections.abc.Mapping):
    """The tensors of a `model.safetensors` or `pytorch_model.bin` file by
    name, `model.` prefixes dropped, each read when asked for, as a
    float32 NumPy array.

    Args:
        path: the file.

    Example:

    ```python
    state = CheckpointTensors("opus-mt-en-de/model.safetensors")
    state["shared.weight"].shape  # (58101, 512), read now
    ```
    """

    def __init__(self, path):
        self.path = path
        self.safetensors = path.endswith(".safetensors")
        if self.safetensors:
            from safetensors import safe_open

            with safe_open(path, "numpy") as f:
                stored = list(f.keys())
                # NumPy has no bfloat16: such files are read through PyTorch.
                self.framework = "pt" if any(f.get_slice(name).get_dtype() == "BF16" for name in stored) else "numpy"
        else:
            import torch

            self.tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            stored = list(self.tensors)
        self.names = {name.removeprefix("model."): name for name in stored}

    def __getitem__(self, name):
        return self.rows(name)

    def __contains__(self, name):  # (Mapping's would read the tensor)
        return name in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def rows(self, name, start=None, stop=None):
        """Rows `start:stop` of tensor `name` (all of it by default)."""
        stored = self.names[name]
        if not self.safetensors:
            return _float32(self.tensors[stored][start:stop])
        from safetensors import safe_open

        # (A slice is read into one new array; `get_tensor` made two.)
        with safe_open(self.path, self.framework) as f:
            tensor = f.get_slice(stored)
            if stop is not None:  # (safetensors' slices do not stop at the end)
                stop = min(stop, tensor.get_shape()[0])
            return _float32(tensor[start:stop])


    def shape(self, name):
        """The shape of tensor `name`, read from the file's header."""
        stored = self.names[name]
        if not self.safetensors:
            return tuple(self.tensors[stored].shape)
        from safetensors import safe_open

        with safe_open(self.path, self.framework) as f:
            return tuple(f.get_slice(stored).get_shape())


class RowBlocks:
    """A large 2-D tensor of a checkpoint, given a block of rows at a time
    (`runtime.variable_rows.assign_rows` writes a variable so), each block
    through `transform(start, rows)` if given.

    Args:
        state: a dict of arrays or `CheckpointTensors`.
        name: the tensor's name.
        transform: a function of `(start, rows)` that returns the rows
            to assign (Marian's d_model order), or None.
    """

    def __init__(self, state, name, transform=None):
        self.state, self.name, self.transform = state, name, transform
        self.shape = state.shape(name) if isinstance(state, CheckpointTensors) else tuple(state[name].shape)

    def __iter__(self):
        for start in range(0, self.shape[0], COMPARED_ROWS):
            if isinstance(self.state, CheckpointTensors):
                rows = self.state.rows(self.name, start, start + COMPARED_ROWS)
            else:
                rows = np.array(self.state[self.name][start : start + COMPARED_ROWS], "float32")
            yield start, rows if self.transform is None else self.transform(start, rows)


def _float32(value):
    if hasattr(value, "numpy"):  # a PyTorch tensor
        value = value.float().numpy()
    return np.asarray(value, "float32")


def tensors_equal(state, first, second):
    """Whether tensors `first` and `second` of `state` (a dict or
    `CheckpointTensors`) are equal, compared a block of rows at a time."""
    if not isinstance(state, CheckpointTensors):
        return np.array_equal(state[first], state[second])
    start = 0
    while True:
        a, b = state.rows(first, start, start + COMPARED_ROWS), state.rows(second, start, start + COMPARED_ROWS)
        if a.shape != b.shape or not np.array_equal(a, b):
            return False
        if len(a) < COMPARED_ROWS:
            return True
        start += COMPARED_ROWS

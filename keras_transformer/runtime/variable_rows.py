"""Writing a large variable (an embedding matrix) a block of rows at a
time, so that loading a checkpoint never holds a second copy of it beside
the model: in place where the backend's variables can be written so
(PyTorch's tensors, TensorFlow's variables); on JAX, whose arrays do not
change, into one new array that each block updates in place (the old one
donated to the update), which takes the variable's place at the end.

`keras_transformer.convert` assigns a checkpoint's embeddings with it
(`marian_weights.assign_checkpoint_weights`).
"""

import functools

import keras
import numpy as np


def assign_rows(variable, blocks):
    """Assigns a 2-D `variable` the rows of `blocks`, an iterable of
    `(start, rows)` (NumPy arrays) that covers it, a block at a time: the
    same as `variable.assign(np.concatenate(...))`.

    Example:

    >>> import keras, numpy as np
    >>> variable = keras.Variable(np.zeros((5, 2), "float32"))
    >>> assign_rows(variable, [(0, np.ones((3, 2))), (3, np.full((2, 2), 2.0))])
    >>> keras.ops.convert_to_numpy(variable)[:, 0].tolist()
    [1.0, 1.0, 1.0, 2.0, 2.0]
    """
    backend = keras.config.backend()
    if backend == "torch":
        import torch

        with torch.no_grad():
            target = variable.value
            for start, rows in blocks:
                target[start : start + len(rows)].copy_(torch.from_numpy(np.ascontiguousarray(rows)))
    elif backend == "tensorflow":
        import tensorflow as tf

        target = variable.value
        for start, rows in blocks:
            target[start : start + len(rows)].assign(tf.cast(rows, target.dtype))
    elif backend == "jax":
        import jax.numpy as jnp

        value = variable.value
        for start, rows in blocks:
            value = _put_rows()(value, jnp.asarray(rows, value.dtype), start)
        variable.assign(value)
    else:
        variable.assign(np.concatenate([rows for _, rows in blocks]))


@functools.lru_cache(maxsize=1)
def _put_rows():
    import jax

    @functools.partial(jax.jit, donate_argnums=0)
    def put(array, rows, start):
        return jax.lax.dynamic_update_slice(array, rows, (start, 0))

    return put

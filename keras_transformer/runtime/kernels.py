"""The backend's own versions of functions that the paper's code and the
search call, chosen here, in one place.

A function with a faster version for one backend asks `backend_kernel`
for it by name and, where there is none, runs its own Keras ops.
"""

import importlib

import keras

# By backend: the modules that hold its own versions, by function name.
_KERNEL_MODULES = {
    "torch": (
        "keras_transformer.runtime.torch_ranking",
        "keras_transformer.runtime.torch_ensemble_step",
        "keras_transformer.runtime.torch_adam",
    ),
}


def backend_kernel(name):
    """The current backend's own version of the function `name`, or None."""
    for module in _KERNEL_MODULES.get(keras.config.backend(), ()):
        kernel = getattr(importlib.import_module(module), name, None)
        if kernel is not None:
            return kernel
    return None

"""How a built layer is called inside `direct_calls()`: the `DirectCall`
mixin, and the choice of each layer's PyTorch call.

Inside `direct_calls()` (see `runtime.direct_calls`) a built layer of this
package runs its `call` directly, with the input casts and autocast scope
`Layer.__call__` would give it. On PyTorch, where a layer has a PyTorch call
for its state, that runs instead: the Keras layers' own (`_torch_plan`,
`_torch_call`, `_torch_int8_call` in `runtime.direct_layers`), or, for the
paper layers, which know nothing of PyTorch, the calls registered for them
in `runtime.torch_layer_calls` (chosen in `runtime.layer_calls`).
"""

import keras

# Keras has no public accessor for the autocast scope its layer calls open.
from keras.src.backend import AutocastScope
from keras.src.backend import get_autocast_scope

from keras_transformer.runtime.direct_calls import direct_calls_active
from keras_transformer.runtime.layer_calls import chosen
from keras_transformer.runtime.layer_calls import torch_call_of

# The paper layers' PyTorch calls, registered at import (`layer_calls.register`).
from keras_transformer.runtime import torch_layer_calls  # noqa: F401


class DirectCall:
    """Mixin for `keras.layers.Layer` subclasses: inside `direct_calls()`,
    calling a built layer runs its `call` (or `quantized_call`) directly,
    with the input casts and autocast scope that `Layer.__call__` would
    give it; otherwise `Layer.__call__`."""

    def __call__(self, *args, **kwargs):
        if not (direct_calls_active() and self.built):
            return super().__call__(*args, **kwargs)
        if "training" in kwargs and not self._call_has_training_arg:
            # Keras models pass `training` to every layer they call.
            kwargs = {key: value for key, value in kwargs.items() if key != "training"}
        call = self.call if self.quantization_mode is None else self.quantized_call
        current = get_autocast_scope()
        if current is None and self.compute_dtype == self.variable_dtype:
            # The caller passes the right dtypes.
            torch_call = torch_call_of(self)
            if torch_call is not None:
                if not chosen(self).takes_training:
                    kwargs.pop("training", None)  # (it changes nothing in these layers)
                return torch_call(*args, **kwargs)
            return call(*args, **kwargs)
        # Mixed precision: `Layer.__call__`'s input casts and scope (its
        # steps 1 and 7), for layers that compute in another dtype than
        # their variables or run inside one that does.
        if self._convert_input_args:
            args = tuple(_converted(self, value) for value in args)
            kwargs = {key: _converted(self, value) for key, value in kwargs.items()}
        if chosen(self).takes_mixed_dtypes:
            torch_call = torch_call_of(self)
            if torch_call is not None:
                kwargs.pop("training", None)
                return torch_call(*args, **kwargs)
        scope = _autocast_scope(self, current)
        if scope is None:
            return call(*args, **kwargs)
        with scope:
            return call(*args, **kwargs)


def _converted(layer, value):
    """`value` as `Layer.__call__` converts an input: float tensors (also
    inside lists, tuples and dicts) cast to the layer's input dtype."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    convert = lambda x: layer.dtype_policy.convert_input(x, layer.autocast, layer.input_dtype)  # noqa: E731
    if isinstance(value, (list, tuple, dict)):
        return keras.tree.map_structure(convert, value)
    return convert(value)


def _autocast_scope(layer, current):
    """The autocast scope `Layer.__call__` opens for `layer` inside the
    `current` one (None: it keeps `current`)."""
    if current is not None:
        if not layer.autocast or not keras.backend.is_float_dtype(layer.compute_dtype):
            return AutocastScope(None)
        return AutocastScope(layer.compute_dtype) if current.dtype != layer.compute_dtype else None
    return AutocastScope(layer.compute_dtype) if layer.compute_dtype != layer.variable_dtype else None

"""Which PyTorch call a built layer runs inside `direct_calls()`, chosen in
this one place.

The Keras layers of `runtime.direct_layers` carry their own PyTorch calls
(`_torch_plan`, `_torch_call`, `_torch_int8_call`). The paper layers
(`keras_transformer.layers`) know nothing of PyTorch: their PyTorch calls
are registered here under their Keras registered names, by
`runtime.torch_layer_calls`. `runtime.dispatch.DirectCall` asks
`torch_call_of` at each direct call.
"""

import functools

import keras

from keras_transformer.runtime.int8_products import has_int_mm


class LayerCall:
    """A layer's PyTorch calls.

    Args:
        call: `call(layer, *args, **kwargs)` for float weights, as the
            layer's `call` with those arguments; None for no call.
        int8_call: the same for Keras' int8 weights, or None.
        plan: `plan(layer)`: whether the layer's structure allows the calls,
            asked once a layer.
        takes_training: whether the calls take `training` (else it is
            dropped: it changes nothing in them).
        takes_mixed_dtypes: whether the float call also serves a layer that
            computes in another dtype than its weights (mixed precision).
    """

    def __init__(self, call, int8_call=None, plan=None, takes_training=False, takes_mixed_dtypes=False):
        self.call, self.int8_call, self.plan = call, int8_call, plan
        self.takes_training, self.takes_mixed_dtypes = takes_training, takes_mixed_dtypes

    def bound_to(self, layer):
        """`(float call, int8 call)` of `layer` where its plan allows them,
        each None where there is none."""
        if self.plan is not None and not self.plan(layer):
            return None, None
        return tuple(None if call is None else functools.partial(call, layer) for call in (self.call, self.int8_call))


# Registered name of a paper layer's class -> its `LayerCall`.
REGISTERED_CALLS = {}


def register(cls_name, layer_call):
    """Gives the layers of the Keras registered name `cls_name` (e.g.
    "keras_transformer>TransformerDecoderLayer") and their subclasses the
    PyTorch calls `layer_call`."""
    REGISTERED_CALLS[cls_name] = layer_call


class _Chosen:
    """What a layer runs on PyTorch, chosen once (held on the layer)."""

    def __init__(self, layer_call, layer):
        self.call, self.int8_call = (None, None) if layer_call is None else layer_call.bound_to(layer)
        self.takes_training = layer_call is not None and layer_call.takes_training
        self.takes_mixed_dtypes = layer_call is not None and layer_call.takes_mixed_dtypes


def chosen(layer):
    """`layer`'s calls (a `_Chosen`), chosen at its first direct call: the
    ones registered for its class or a base class, else its own `_torch_*`
    methods; none on other backends."""
    held = layer.__dict__.get("_torch_calls")
    if held is None:
        layer_call = None
        if keras.config.backend() == "torch":
            layer_call = _registered(type(layer)) or _own(type(layer))
        held = _Chosen(layer_call, layer)
        # Tracked attributes would be saved: set it past Keras' tracker.
        object.__setattr__(layer, "_torch_calls", held)
    return held


def torch_call_of(layer):
    """The layer's PyTorch call for its state, or None: its float call for
    float weights, its int8 call for Keras' int8 weights with quantized
    inputs; none with LoRA or other quantization modes."""
    calls = chosen(layer)
    if getattr(layer, "lora_enabled", False):
        return None
    mode = layer.quantization_mode
    if mode is None:
        return calls.call
    if mode == "int8" and getattr(layer, "inputs_quantizer", None) is not None and has_int_mm():
        return calls.int8_call
    return None


def registered_as(layer, cls_name):
    """Whether `layer`'s class or a base class has the Keras registered
    name `cls_name` (the layers below `keras_transformer.layers` cannot
    import those classes to ask `isinstance`)."""
    return cls_name in _registered_names(type(layer))


def _registered_names(cls):
    return [keras.saving.get_registered_name(base) for base in cls.__mro__ if base not in (object,)]


def _registered(cls):
    for name in _registered_names(cls):
        layer_call = REGISTERED_CALLS.get(name)
        if layer_call is not None:
            return layer_call
    return None


def _own(cls):
    if not hasattr(cls, "_torch_plan"):
        return None
    return LayerCall(
        call=getattr(cls, "_torch_call", None),
        int8_call=getattr(cls, "_torch_int8_call", None),
        plan=cls._torch_plan,
        takes_mixed_dtypes=getattr(cls, "_torch_call_takes_mixed_dtypes", False),
    )

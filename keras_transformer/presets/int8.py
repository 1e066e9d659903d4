"""Int8 storage of a preset's weights: about half the size of float16
weights, in Keras' own `model.weights.h5`, loading as an ordinary float
model.

This is a way of storing weights, not of computing with them (for that,
see `TransformerSeq2SeqLM.quantize`, Keras's int8 computation). A backbone
saved with `save_to_preset(..., weights_storage="int8")`, or converted by
`store_int8`, keeps its float config (`config.json`, `task.json`) and its
weights in `model.weights.h5` exactly as Keras writes them for the model
quantized to int8 (`keras.Model.quantize("int8")`, then `save_weights`):
each layer that Keras quantizes (the token embedding, every `Dense` and
`EinsumDense` projection) holds int8 values `q` and a float32 scale per
output channel (a row of the embedding; a column of a kernel; for an
attention's `(d_model, heads, d_k)` query kernel, each head and
dimension), Keras's abs-max quantization:

    scale = 127 / max |w|  (over the axes a channel spans)
    q = round(w * scale)   (in -127..127)
    w ~= q / scale         (|w - q / scale| <= 0.5 / scale)

Biases and LayerNorm weights are stored in float32. The file's root
attributes say so (`STORAGE_ATTRIBUTE`, and `LAYERS_ATTRIBUTE`: the paths
of the quantized layers) and `metadata.json` records
`"weights_storage": "int8"` with the file's SHA-256.

`from_preset` builds the float model from the config as usual (float32
unless `dtype=...` asks for another precision); its `load_weights` reads
the file into a copy of the model whose layers are int8 (Keras checks the
file against it, layer by layer) and assigns `q / scale` to the float
model. keras-hub's own loader, which calls the backbone's `load_weights`,
and `keras_hub.upload_preset`, which checks for `model.weights.h5`, take
such a preset as any other; a model quantized with `quantize("int8")`
reads the file with Keras' own `load_weights`.

Presets saved by earlier versions keep their int8 weights in
`model.weights.int8.npz` (`keras_transformer.presets.int8_legacy`): they
load as before, and `store_int8` writes them in this format.
"""

import contextlib
import gc
import json
import os
import warnings

import numpy as np

from keras_transformer.presets import int8_legacy
from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import WEIGHTS_ENTRIES
from keras_transformer.presets.layout import WEIGHTS_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.layout import weights_do_not_fit
from keras_transformer.utils.files import matching

STORAGES = ("float", "int8")
# The root attributes of model.weights.h5 stored in int8: "int8", and the
# JSON list of the paths of the layers that hold int8 values.
STORAGE_ATTRIBUTE = "keras_transformer.weights_storage"
LAYERS_ATTRIBUTE = "keras_transformer.int8_layers"
SCALE_SUFFIX = "_scale"  # Keras' int8 layers: `kernel` and `kernel_scale`


def channel_axes(backbone):
    """The axes that each weight's scales span, by variable path, for the
    float weights of `backbone` of two or more axes but for biases (an
    attention's query bias is `(heads, d_k)`): the axes a `Dense` or
    `EinsumDense` kernel sums over, all axes but the first of anything
    else (a row of the token embedding)."""
    import keras

    kernels, biases = {}, set()
    for layer in backbone._flatten_layers(include_self=False):
        if not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            continue
        kernel = getattr(layer, "_kernel", None)
        if kernel is not None and isinstance(layer, keras.layers.EinsumDense):
            kernels[id(kernel)] = _summed_axes(layer.equation, len(kernel.shape))
        elif kernel is not None:
            kernels[id(kernel)] = (0,)
        if getattr(layer, "bias", None) is not None:
            biases.add(id(layer.bias))
    axes = {}
    for variable in backbone.weights:
        if len(variable.shape) >= 2 and _is_float(variable.dtype) and id(variable) not in biases:
            axes[variable.path] = kernels.get(id(variable), tuple(range(1, len(variable.shape))))
    return axes


def _summed_axes(equation, rank):
    """The axes of an `EinsumDense` kernel that its equation sums over
    (those missing from the output); all but the last if unclear."""
    inputs, output = equation.split("->")
    kernel = inputs.split(",")[-1].strip()
    if "." in kernel or len(kernel) != rank:
        return tuple(range(rank - 1))
    summed = tuple(i for i, letter in enumerate(kernel) if letter not in output)
    return summed or tuple(range(rank - 1))


def _is_float(dtype):
    import keras

    return "float" in keras.backend.standardize_dtype(dtype)


def check_storage(weights_storage):
    if weights_storage not in STORAGES:
        raise ValueError(
            f"`weights_storage` must be one of {STORAGES}, got {weights_storage!r}: \"float\" stores the "
            "weights as the model holds them, \"int8\" in about half the size (both in model.weights.h5)."
        )


def check_storable(backbone):
    """Refuses a model that Keras already quantized (its int8 weights are
    stored as such in model.weights.h5)."""
    quantized = _quantized_layers(backbone)
    if quantized:
        raise ValueError(
            f"This model computes with quantized weights (`quantize`, layer {quantized[0]!r}); "
            "`weights_storage=\"int8\"` stores the weights of a float model. Save it with the default "
            "`weights_storage=\"float\"`: its int8 weights are stored as they are."
        )


def _quantized_layers(model):
    return [
        layer.path for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "quantization_mode", None)
    ]


def write_weights(backbone, path):
    """Writes the weights of `backbone` into `path` (a `.weights.h5`) as
    Keras writes them for the model quantized to int8 (see the module's
    docstring)."""
    import h5py
    import keras

    values = [keras.ops.convert_to_numpy(variable) for variable in backbone.weights]
    for variable, value in zip(backbone.weights, values):
        if _is_float(variable.dtype) and not np.all(np.isfinite(value.astype("float32"))):
            raise ValueError(
                f"Cannot store the weights in int8: {variable.path!r} holds NaN or infinite values. "
                "Save weights from before training diverged."
            )
    # A float32 copy of the model, quantized by Keras.
    twin = type(backbone).from_config({**backbone.get_config(), "dtype": "float32"})
    for variable, value in zip(twin.weights, values):
        variable.assign(value.astype("float32") if _is_float(variable.dtype) else value)
    with _few_collections(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (layers that Keras does not quantize, such as inputs)
        twin.quantize("int8")
    layers = _quantized_layers(twin)
    # What the file holds reads back within half a step of each weight:
    # Keras' scales have the channels' shape this module reads them in.
    axes = channel_axes(backbone)
    stored = _float_values(twin, axes, path)
    for variable, value in zip(backbone.weights, values):
        value = value.astype("float32")
        step = np.abs(value).max(axis=axes.get(variable.path, ()), keepdims=True) / 127
        if np.any(np.abs(stored[variable.path] - value) > step / 2 * (1 + 1e-4) + 1e-7):
            raise RuntimeError(f"Keras {keras.__version__} quantized {variable.path!r} in a layout this version "
                               "of keras_transformer does not read: store the weights as float.")
    twin.save_weights(path)
    with h5py.File(path, "a") as f:
        f.attrs[STORAGE_ATTRIBUTE] = "int8"
        f.attrs[LAYERS_ATTRIBUTE] = json.dumps(layers)


@contextlib.contextmanager
def _few_collections():
    """Keras collects garbage each time it replaces a layer's weights by
    quantized ones (49 times for a 3+3-layer model, half a second each with
    TensorFlow and PyTorch loaded): the objects there are before are left
    out of those collections."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _float_values(twin, axes, path):
    """The float32 values of the int8 model `twin`'s weights, `q / scale`
    for its int8 values, by variable path."""
    import keras

    variables = {variable.path: variable for variable in twin.weights}
    values = {}
    for name, variable in variables.items():
        value = keras.ops.convert_to_numpy(variable)
        if value.dtype != np.int8:
            base = variables.get(name.removesuffix(SCALE_SUFFIX)) if name.endswith(SCALE_SUFFIX) else None
            if base is None or keras.backend.standardize_dtype(base.dtype) != "int8":
                values[name] = value  # (not the scale of int8 values)
            continue
        scale = keras.ops.convert_to_numpy(variables[name + SCALE_SUFFIX]).astype("float32")
        shape = [1 if axis in axes.get(name, ()) else n for axis, n in enumerate(value.shape)]
        if name not in axes or scale.size != np.prod(shape) or not np.all(np.isfinite(scale) & (scale > 0)):
            raise PresetError(
                f"The weights file {path!r} is corrupt: the int8 weights {name!r} {value.shape} have scales "
                f"{scale.shape} that are not one positive number per output channel. Copy the preset again "
                "or save the model again."
            )
        values[name] = value.astype("float32") / scale.reshape(shape)
    return values


def stored_layers(path):
    """The paths of the layers whose int8 values the weights file `path`
    holds, if it holds weights stored in int8 (see the module's
    docstring); None for any other file."""
    import h5py

    path = os.fspath(path)
    if not path.endswith(".weights.h5") or not os.path.isfile(path):
        return None
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get(STORAGE_ATTRIBUTE) != "int8":
                return None
            layers = json.loads(f.attrs.get(LAYERS_ATTRIBUTE, "null"))
    except (OSError, ValueError, TypeError):  # not HDF5 (checks.py names it), or a damaged attribute
        layers = None
    if not isinstance(layers, list) or not all(isinstance(layer, str) for layer in layers):
        raise PresetError(
            f"The weights file {path!r} is corrupt: it says it holds weights stored in int8, but not which "
            f"layers hold them ({LAYERS_ATTRIBUTE!r}). Copy the preset again or save the model again."
        )
    return layers


def load_weights(backbone, path, directory):
    """Assigns the weights stored in int8 in `path` to the float model
    `backbone`, as floats of its variables' dtype (see the module's
    docstring).

    Raises:
        PresetError: the file is corrupt, or its weights are not exactly
            those of `backbone` (the config in `directory` is another
            model's).
    """
    import h5py
    import keras

    policies = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
    for layer in stored_layers(path):
        policies[layer] = keras.dtype_policies.QuantizedDTypePolicy("int8", "float32")
    twin = type(backbone).from_config({**backbone.get_config(), "dtype": policies})
    try:
        keras.Model.load_weights(twin, path)
    except (ValueError, KeyError, TypeError) as error:
        raise weights_do_not_fit(directory, f"{type(error).__name__}: {error}", path) from error
    with h5py.File(path, "r") as f:
        count = []
        f.visititems(lambda name, item: count.append(name) if isinstance(item, h5py.Dataset) else None)
    if len(count) != len(twin.weights):
        # Keras skips the layers of the file that the model lacks.
        raise weights_do_not_fit(
            directory,
            f"they hold {len(count)} variables, the model built from the config has {len(twin.weights)} "
            f"stored in int8 (num_layers: {getattr(backbone, 'num_layers', '?')})",
            path,
        )
    values = _float_values(twin, channel_axes(backbone), path)
    for variable in backbone.weights:
        value = values.get(variable.path)
        if value is None or value.shape != tuple(variable.shape):
            details = f"they hold no variable {variable.path!r} {tuple(variable.shape)}"
            raise weights_do_not_fit(directory, details, path)
    for variable in backbone.weights:
        variable.assign(values[variable.path])


def storage(directory, metadata=None):
    """How the preset in `directory` (a local directory, or a handle whose
    `metadata` is given) stores its weights in int8: `"h5"` (this module),
    `"npz"` (`int8_legacy`), or None (as the model holds them)."""
    if metadata is None:
        from keras_transformer.presets.registry import preset_metadata

        metadata = preset_metadata(directory)
    if "://" in directory:
        return "h5" if metadata.get(STORAGE_KEY) == "int8" else None
    if int8_legacy.stored_in_archive(directory):
        return "npz"
    if metadata.get(STORAGE_KEY) == "int8":
        return "h5"
    # metadata.json lost or rewritten by hand: the file says it.
    weights = os.path.join(directory, WEIGHTS_FILE)
    try:
        return "h5" if stored_layers(weights) is not None else None
    except PresetError:
        return "h5"  # (its loading names the damage)


def stored_in_int8(directory, metadata=None):
    """Whether the preset in `directory` keeps its weights in int8, in
    either format (see `storage`)."""
    return storage(directory, metadata) is not None


def store_backbone(backbone, directory):
    """Puts the weights of `backbone`, stored in int8, in place of the
    weights files that a save wrote into `directory`."""
    write_weights(backbone, os.path.join(directory, WEIGHTS_FILE))
    for name in matching(directory, WEIGHTS_ENTRIES) - {WEIGHTS_FILE}:
        os.remove(os.path.join(directory, name))


def load_preset_weights(backbone, filepath):
    """Loads the weights file `filepath` of a preset stored in int8 into
    the float model `backbone` and returns True; False for any other file
    (Keras' `load_weights` reads it). `filepath` is what keras-hub's loader
    passes: `model.weights.h5`, or `model.weights.json` for the index of
    the archive of earlier versions."""
    filepath = os.fspath(filepath)
    directory = os.path.dirname(filepath)
    if int8_legacy.is_index(filepath):
        int8_legacy.load_weights(backbone, os.path.join(directory, INT8_WEIGHTS_FILE), directory)
        return True
    if _quantized_layers(backbone) or stored_layers(filepath) is None:
        return False  # (a quantized model reads int8 weights as Keras wrote them)
    load_weights(backbone, filepath, directory)
    return True

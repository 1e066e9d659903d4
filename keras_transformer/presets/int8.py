"""Int8 storage of a preset's weights: about half the size of float16
weights, loading as an ordinary float model.

This is a way of storing weights, not of computing with them (for that,
see `TransformerSeq2SeqLM.quantize`, Keras's int8 computation). A backbone
saved with `save_to_preset(..., weights_storage="int8")`, or converted by
`store_int8`, keeps its weights in `model.weights.int8.npz` instead of
`model.weights.h5`; `from_preset` builds the model from its config as
usual (float32 unless `dtype=...` asks for another precision), turns the
stored integers back into floats and assigns them. The loaded model is an
ordinary float model: training, decoding and its fast paths run exactly
as they do for a preset stored in float16, on weights that differ from the
saved ones by at most half a quantization step.

Each float weight of two or more axes (embedding tables, kernels) is
stored as int8 `q` with a float32 scale per output channel, symmetric
(no zero point):

    scale = max |w| / 127  (over the axes a channel spans)
    q = round(w / scale)   (in -127..127)
    w ~= q * scale         (|w - q * scale| <= scale / 2)

An output channel is a column of a `Dense` kernel `(d_in, d_out)`; of an
`EinsumDense` kernel, each position on the axes that its equation does
not sum over (an attention's query kernel `(d_model, heads, d_k)` has a
scale per head and dimension); of anything else, such as the token
embedding `(vocabulary, d_model)`, a row: the embedding is looked up by
row, and as the tied output projection its row is an output token's.
Biases and weights of fewer axes (LayerNorm's gamma and beta) are stored
as the model holds them (float16 or float32, bfloat16 as float32): they
are a small part of the file.

The file is a compressed NumPy `.npz` archive (read with `numpy.load`, no
pickles):
for each variable, `<variable.path>` holds its int8 values (or the vector
itself) and `<variable.path>:scale` its scales, with the weight's number
of axes (size 1 on the summed axes) so that `q * scale` broadcasts;
`__format__` names the format. `metadata.json` records
`"weights_storage": "int8"` and the file's SHA-256 in `weights_sha256`,
which loading checks as it does for `model.weights.h5`.
"""

import io
import json
import os
import zipfile

import numpy as np

from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import SHARDED_WEIGHTS_INDEX
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import WEIGHTS_ENTRIES
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.layout import weights_do_not_fit
from keras_transformer.utils.files import matching
from keras_transformer.utils.reading import read_json

FORMAT_KEY = "__format__"
FORMAT = "keras_transformer int8 weights, version 1"
SCALE_SUFFIX = ":scale"
# model.weights.json of a preset stored in int8 (see `write_index`).
INDEX = {STORAGE_KEY: "int8", "weight_map": {"*": INT8_WEIGHTS_FILE}}
STORAGES = ("float", "int8")
# The entries' date in the archive: fixed, so that the same weights give
# the same bytes (and SHA-256) at every save.
_DATE = (1980, 1, 1, 0, 0, 0)


def quantize(values, axes):
    """Symmetric int8 quantization of `values` with one scale per slice
    along the axes not in `axes`.

    Args:
        values: a float array.
        axes: the axes each scale spans (those reduced by the max).

    Returns:
        `(q, scale)`: int8 values in -127..127 and float32 scales with
        `values`' number of axes (size 1 on `axes`); `q * scale` is within
        `scale / 2` of `values`. A slice of zeros has scale 0.

    Example:

    >>> q, scale = quantize(np.array([[0.6, -1.0], [0.25, 0.02]]), axes=(1,))
    >>> q.tolist(), [round(float(s), 5) for s in scale.ravel()]
    ([[76, -127], [127, 10]], [0.00787, 0.00197])
    """
    values = np.asarray(values, dtype="float32")
    if not np.all(np.isfinite(values)):
        raise ValueError("Cannot store weights holding NaN or infinite values in int8.")
    scale = (np.max(np.abs(values), axis=tuple(axes), keepdims=True) / 127).astype("float32")
    q = np.round(values / np.where(scale > 0, scale, 1))
    return np.clip(q, -127, 127).astype("int8"), scale


def dequantize(q, scale):
    """The float32 weights `q * scale` that `quantize` stored."""
    return q.astype("float32") * scale


def channel_axes(backbone):
    """The axes that each weight's scales span, by variable path, for the
    weights of `backbone` stored in int8: floats of two or more axes, but
    for biases (an attention's query bias is `(heads, d_k)`)."""
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
            "weights as the model holds them (model.weights.h5), \"int8\" in about half the size "
            f"({INT8_WEIGHTS_FILE})."
        )


def check_storable(backbone):
    """Refuses a model that Keras already quantized (its int8 weights are
    stored as such in model.weights.h5)."""
    quantized = [
        layer.name for layer in backbone._flatten_layers()
        if getattr(getattr(layer, "dtype_policy", None), "quantization_mode", None)
    ]
    if quantized:
        raise ValueError(
            f"This model computes with quantized weights (`quantize`, layer {quantized[0]!r}); "
            "`weights_storage=\"int8\"` stores the weights of a float model. Save it with the default "
            "`weights_storage=\"float\"`: its int8 weights are stored as they are."
        )


def write_weights(backbone, path):
    """Writes the weights of `backbone` into `path` as int8 (see the
    module's docstring for the format)."""
    import keras

    axes = channel_axes(backbone)
    arrays = {FORMAT_KEY: np.array(FORMAT)}
    for variable in backbone.weights:
        values = keras.ops.convert_to_numpy(variable)
        if variable.path in axes:
            if not np.all(np.isfinite(values)):
                raise ValueError(
                    f"Cannot store the weights in int8: {variable.path!r} holds NaN or infinite values. "
                    "Save weights from before training diverged."
                )
            arrays[variable.path], arrays[variable.path + SCALE_SUFFIX] = quantize(values, axes[variable.path])
        elif _is_float(variable.dtype) and values.dtype not in (np.float16, np.float32, np.float64):
            arrays[variable.path] = values.astype("float32")  # bfloat16, which NumPy cannot store
        else:
            arrays[variable.path] = values
    # Compressed as `numpy.savez_compressed` does: int8 values of a trained
    # model are not uniform, and deflate takes about a tenth more off.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, array in arrays.items():
            entry = zipfile.ZipInfo(key + ".npy", date_time=_DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(entry, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array, order="C"), allow_pickle=False)


def store_backbone(backbone, directory):
    """Puts the int8 weights of `backbone` in place of the float weights
    files that a save wrote into `directory`, with their index."""
    write_weights(backbone, os.path.join(directory, INT8_WEIGHTS_FILE))
    for name in matching(directory, WEIGHTS_ENTRIES) - {INT8_WEIGHTS_FILE}:
        os.remove(os.path.join(directory, name))
    write_index(directory)


def write_index(directory):
    """Writes the index of the int8 weights in `directory`.

    keras-hub's own loader (`keras_hub.models.Seq2SeqLM.from_preset`,
    which has no hook for another weights format) reads a preset without
    `model.weights.h5` as sharded: it fetches the files that
    `model.weights.json` maps to (downloading them for a `kaggle://` or
    `hf://` handle) and passes the index to the backbone's `load_weights`,
    which reads this one as int8 weights (`TransformerBackbone.load_weights`).
    """
    with open(os.path.join(directory, SHARDED_WEIGHTS_INDEX), "w") as f:
        json.dump(INDEX, f, indent=1)


def is_index(path):
    """Whether `path` is the index of int8 weights that `write_index` wrote."""
    if os.path.basename(os.fspath(path)) != SHARDED_WEIGHTS_INDEX or not os.path.isfile(path):
        return False
    try:
        return read_json(path).get(STORAGE_KEY) == "int8"
    except (OSError, ValueError, AttributeError):
        return False


def stored_in_int8(directory, metadata=None):
    """Whether the preset in `directory` (a local directory, or a handle
    whose `metadata` is given) keeps its weights in int8."""
    if metadata is None:
        from keras_transformer.presets.registry import preset_metadata

        metadata = preset_metadata(directory)
    if metadata.get(STORAGE_KEY) == "int8":
        return True
    # metadata.json lost or rewritten by hand: the files say it.
    if "://" in directory or not os.path.isfile(os.path.join(directory, INT8_WEIGHTS_FILE)):
        return False
    others = matching(directory, WEIGHTS_ENTRIES) - {INT8_WEIGHTS_FILE}
    if is_index(os.path.join(directory, SHARDED_WEIGHTS_INDEX)):
        others -= {SHARDED_WEIGHTS_INDEX}
    return not others


def _corrupt(path, error):
    return PresetError(
        f"The weights file {path!r} is corrupt or truncated ({type(error).__name__}: {error}). "
        "Copy the preset again or save the model again."
    )


def check_file(path):
    """A readable int8 weights file: every entry's checksum (CRC-32) holds
    and it names its format."""
    read_arrays(path)


def read_arrays(path):
    """The arrays of an int8 weights file, each entry's checksum (CRC-32)
    checked as it is read, its format checked, the format entry left out.

    (`numpy.load` stops reading an entry at the array's last byte, before
    zipfile checks its checksum: entries are read whole here instead, so
    that one pass both checks the file and reads it.)

    Raises:
        PresetError: the file is corrupt or truncated, or not this
            package's int8 weights.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            arrays = {
                name.removesuffix(".npy"): np.lib.format.read_array(io.BytesIO(archive.read(name)), allow_pickle=False)
                for name in archive.namelist()
            }
    except Exception as error:  # zipfile's, zlib's and NumPy's errors of a damaged archive
        raise _corrupt(path, error) from error
    found = arrays.pop(FORMAT_KEY).item() if FORMAT_KEY in arrays else None
    if found != FORMAT:
        raise PresetError(
            f"The weights file {path!r} is not int8 weights of keras_transformer (its {FORMAT_KEY!r} is "
            f"{found!r}, expected {FORMAT!r}): it was made by hand or by another version. Save the model "
            "again, or convert the preset again with `keras_transformer.presets.store_int8`."
        )
    return arrays


def load_weights(backbone, path, directory):
    """Assigns the int8 weights in `path` to `backbone`'s variables, as
    floats of the variables' dtype.

    Raises:
        PresetError: `path` is corrupt, or its variables are not exactly
            those of `backbone` (the config in `directory` is another
            model's).
    """
    arrays = read_arrays(path)
    values = {}
    for variable in backbone.weights:
        shape = tuple(variable.shape)
        if variable.path not in arrays:
            raise weights_do_not_fit(directory, f"they hold no variable {variable.path!r} {shape}", path)
        value = arrays.pop(variable.path)
        scale = arrays.pop(variable.path + SCALE_SUFFIX, None)
        if value.shape != shape:
            raise weights_do_not_fit(
                directory, f"{variable.path!r} has shape {value.shape} there, {shape} in the model", path
            )
        if scale is not None:
            fits = scale.ndim == value.ndim and all(s in (1, n) for s, n in zip(scale.shape, shape))
            if value.dtype != np.int8 or not fits or not np.all(np.isfinite(scale)):
                raise _corrupt(path, ValueError(
                    f"{variable.path!r} is stored as {value.dtype} {value.shape} with scales {scale.dtype} "
                    f"{scale.shape}; expected int8 with finite scales that broadcast"
                ))
            value = dequantize(value, scale)
        values[variable.path] = value
    if arrays:
        extra = sorted(key for key in arrays if not key.endswith(SCALE_SUFFIX)) or sorted(arrays)
        raise weights_do_not_fit(
            directory,
            f"they hold variables the model lacks ({len(extra)}, such as {extra[0]!r}; the model has "
            f"num_layers {getattr(backbone, 'num_layers', '?')})",
            path,
        )
    for variable in backbone.weights:
        variable.assign(values[variable.path])

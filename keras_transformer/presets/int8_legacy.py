"""Weights stored in int8 by earlier versions of keras_transformer, before
their presets kept them in `model.weights.h5` (`keras_transformer.presets.int8`): read, never
written, so that every preset saved so (the shipped presets among them)
still loads.

Such a backbone keeps its weights in `model.weights.int8.npz`, a NumPy
archive (read with `numpy.load`, no pickles): for each variable,
`<variable.path>` holds its int8 values `q` (or a vector, stored as the
model held it) and `<variable.path>:scale` its float32 scales `s`, with the
weight's number of axes (size 1 on the axes a channel spans), so that
`q * s` broadcasts (`s = max|w| / 127` per output channel, `q = round(w /
s)`); `__format__` names the format. Beside it, `model.weights.json`
(`INDEX`) maps the weights to the archive for keras-hub's own loader, which
reads a preset without `model.weights.h5` as sharded and hands the index to
`TransformerBackbone.load_weights`. `metadata.json` records
`"weights_storage": "int8"` and the archive's SHA-256.

keras-hub's `upload_preset` refuses such a preset (its check wants
`model.weights.h5`): `keras_transformer.presets.upload_preset` and
`store_int8` write it again in the format of today, the same int8 values.
"""

import io
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
# The model.weights.json beside the archive.
INDEX = {STORAGE_KEY: "int8", "weight_map": {"*": INT8_WEIGHTS_FILE}}


def dequantize(q, scale):
    """The float32 weights `q * scale` of an archive's int8 values and scales."""
    return q.astype("float32") * scale


def is_index(path):
    """Whether `path` is the index (`INDEX`) of weights stored in the archive."""
    if os.path.basename(os.fspath(path)) != SHARDED_WEIGHTS_INDEX or not os.path.isfile(path):
        return False
    try:
        return read_json(path).get(STORAGE_KEY) == "int8"
    except (OSError, ValueError, AttributeError):
        return False


def stored_in_archive(directory):
    """Whether the preset directory `directory` keeps its weights in the
    archive: its index is there, or the archive alone (no other weights)."""
    if is_index(os.path.join(directory, SHARDED_WEIGHTS_INDEX)):
        return True
    others = matching(directory, WEIGHTS_ENTRIES) - {INT8_WEIGHTS_FILE, SHARDED_WEIGHTS_INDEX}
    return os.path.isfile(os.path.join(directory, INT8_WEIGHTS_FILE)) and not others


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

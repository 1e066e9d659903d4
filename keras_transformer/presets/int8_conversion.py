"""`store_int8`: a preset's weights converted to int8 storage
(`keras_transformer.presets.int8`), in place or into another directory."""

import os
import shutil

from keras_transformer.presets import int8
from keras_transformer.presets.checks import check
from keras_transformer.presets.classes import config_class
from keras_transformer.presets.ensembles import member_paths
from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import PRESET_ENTRIES
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.registry import resolve
from keras_transformer.presets.registry import shipped_directories
from keras_transformer.presets.saving import record
from keras_transformer.presets.saving import saving
from keras_transformer.utils.reading import read_json


def store_int8(preset, output_dir=None):
    """Converts a preset's weights to int8 storage, in place or into
    `output_dir`.

    The preset's backbone weights, and those of each model of an ensemble
    preset (`ensemble/1`, ...), are stored in int8 in `model.weights.h5`
    (about half the size of float16 weights); every other file is kept as
    it is, and `metadata.json` records `"weights_storage": "int8"` and the
    new file's SHA-256. Loading such a preset gives a float model, as
    before: see `keras_transformer.presets.int8` for the format and the
    error bound. Models already stored so are left as they are; those that
    earlier versions stored in `model.weights.int8.npz` are written in
    `model.weights.h5` with the same int8 values (which
    `keras_hub.upload_preset` takes).

    The conversion is written into a fresh directory and moved into place
    at the end: if it fails, `preset` and `output_dir` are left as they
    were.

    Args:
        preset: a preset directory, or the name of a shipped preset (then
            with `output_dir`: the package's own files are not changed).
        output_dir: where to write the converted preset; `None` converts
            `preset` in place.

    Returns:
        The directory of the converted preset.

    Example:

    ```python
    from keras_transformer import presets
    from keras_transformer.models import TransformerSeq2SeqLM

    presets.store_int8("transformer_multi30k_en_de", "en-de-int8")
    model = TransformerSeq2SeqLM.from_preset("en-de-int8")  # a float32 model
    # The same, when saving a model:
    model.save_to_preset("en-de-int8", weights_storage="int8")
    ```
    """
    preset = os.fspath(preset)
    if "://" in preset:
        raise PresetError(
            f"Cannot convert {preset!r} where it is: download the preset and give its directory (and "
            "`output_dir` for the converted copy)."
        )
    if output_dir is None and preset in shipped_directories():
        raise PresetError(
            f"{preset!r} is a preset shipped inside the package: give `output_dir` for the converted copy."
        )
    check(preset)
    source = os.path.abspath(resolve(preset))
    members = member_paths(source)
    for path in members:
        check(os.path.join(source, path))
    with saving(output_dir or source, {STORAGE_KEY: "int8"}, PRESET_ENTRIES) as staging:
        for name in os.listdir(source):
            if name.startswith("."):  # another save's staging, or the user's hidden files
                continue
            copy = shutil.copytree if os.path.isdir(os.path.join(source, name)) else shutil.copy2
            copy(os.path.join(source, name), os.path.join(staging, name))
        for path in ["", *members]:
            directory = os.path.join(staging, path)
            # (The archive of earlier versions is read and written again:
            # Keras' quantization of its weights gives back its int8 values.)
            if int8.storage(directory) != "h5":
                int8.store_backbone(_float_backbone(os.path.join(source, path)), directory)
            if path:  # the top directory's metadata is recorded by `saving`
                record(directory, {STORAGE_KEY: "int8"})
    return os.path.abspath(output_dir or source)


def _float_backbone(directory):
    """The float32 backbone of the preset in `directory`, with its weights
    (checked as `from_preset` checks them)."""
    cls = config_class(read_json(os.path.join(directory, CONFIG_FILE)))
    return cls.from_preset(directory, dtype="float32")

"""The files of a preset directory, and the errors for a preset that cannot
be found or read."""

import os

PRESETS_DIR = os.path.dirname(os.path.abspath(__file__))  # the shipped presets

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "model.weights.h5"
SHARDED_WEIGHTS_INDEX = "model.weights.json"
SHARDED_WEIGHTS_FILES = "model_*.weights.h5"  # the shards the index names
# A backbone's weights stored in int8 (presets/int8.py), in place of the others.
INT8_WEIGHTS_FILE = "model.weights.int8.npz"
# A backbone's weights, whole, sharded or in int8: a save of one replaces
# the others, since keras-hub reads a whole `model.weights.h5` before an index.
WEIGHTS_ENTRIES = (WEIGHTS_FILE, SHARDED_WEIGHTS_INDEX, SHARDED_WEIGHTS_FILES, INT8_WEIGHTS_FILE)
TASK_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
PREPROCESSOR_FILE = "preprocessor.json"
TOKENIZER_FILE = "tokenizer.json"
ASSETS_DIR = "assets"
# An ensemble preset's other models (presets/ensembles.py), listed in
# metadata.json under ENSEMBLE_KEY.
ENSEMBLE_DIR = "ensemble"
ENSEMBLE_KEY = "ensemble"
# metadata.json records the SHA-256 of each weights file a save writes.
CHECKSUMS_KEY = "weights_sha256"
# metadata.json says "int8" for weights stored in INT8_WEIGHTS_FILE.
STORAGE_KEY = "weights_storage"
# Everything a save writes: what an earlier save left and a new one does not
# write again is removed, so that a directory never mixes two presets.
PRESET_ENTRIES = (
    CONFIG_FILE, METADATA_FILE, *WEIGHTS_ENTRIES, TASK_FILE,
    TASK_WEIGHTS_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE, ASSETS_DIR, ENSEMBLE_DIR,
)


class PresetError(ValueError):
    """A preset that cannot be found or read; the message says which file."""


def weights_do_not_fit(directory, details, weights=None):
    """The error for weights (`weights`, by default the directory's
    model.weights.h5) that another model's config would read."""
    return PresetError(
        f"The weights in {weights or os.path.join(directory, WEIGHTS_FILE)!r} do not fit the model in "
        f"{os.path.join(directory, CONFIG_FILE)!r}: {details}. The config was edited or belongs "
        "to another model: copy the preset again or save the model again."
    )

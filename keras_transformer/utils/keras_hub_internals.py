"""The parts of keras-hub's internals (`keras_hub.src`) that this package
uses, in one place.

keras-hub (0.32) exports no public alias for them: when one of them moves,
this module is the one to change. Importing it imports keras-hub (and with
it TensorFlow, where installed): modules that must not import keras-hub
when they load import this one inside the function that needs it.
"""

# The shipped presets in keras-hub's registry of built-in presets, so that
# keras-hub resolves their names (with no network) like its own presets.
from keras_hub.src.utils.preset_utils import register_presets  # noqa: F401

# One file of a preset or `hf://` / `kaggle://` handle, downloaded into
# keras-hub's cache like the other files of a preset.
from keras_hub.src.utils.preset_utils import get_file  # noqa: F401

# The decorator that runs a tokenizer's or preprocessor's call in TensorFlow
# and converts its outputs for the backend, as keras-hub's own do.
from keras_hub.src.utils.tensor_utils import preprocessing_function  # noqa: F401

# The check `keras_hub.upload_preset` runs on a preset directory before it
# uploads it (a config.json that parses, and model.weights.h5 or shards),
# run by `keras_transformer.presets.upload_preset` on each model of an
# ensemble preset too.
from keras_hub.src.utils.preset_utils import _validate_backbone as validate_backbone  # noqa: F401, E402

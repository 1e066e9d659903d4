"""keras_transformer: the Transformer of "Attention Is All You Need" for Keras 3.

Runs the same code on JAX, TensorFlow and PyTorch. Modules follow the paper:
`layers` (sections 3.1-3.5), `models` (section 3 and Table 3), `data` and
`datasets` (section 5.1), `schedules` (section 5.3), `losses` (section 5.4),
`decoding`, `callbacks` and `metrics` (section 6.1); `documents` splits texts
and HTML pages into the sentences to translate. `presets` lists the
pretrained models shipped with the package; `export` writes a TensorFlow
SavedModel that translates strings; `convert` reads and writes Marian
(opus-mt) checkpoints and reads M2M100 and NLLB-200 ones.

The modules are imported on first use (`keras_transformer.models`, or
`from keras_transformer import models`): importing the package alone imports
neither Keras nor a backend, so that the command line starts fast and sets up
logging first. Import `keras_transformer.models` (or any class of it) before
`keras.saving.load_model` of a `.keras` file that holds its models.
"""

import importlib

from keras_transformer.version import __version__

_MODULES = (
    "callbacks", "convert", "data", "datasets", "decoding", "distribution", "documents", "export", "layers",
    "losses", "metrics", "models", "presets", "schedules", "training", "visualization",
)

# The presets (`presets/`) sit below the models and the converters and name
# neither: what they need from above them is listed here, imported on first
# use. `CLASS_MODULES`: the modules that register with Keras the classes a
# preset's config names (`presets/classes.py`). `FORMAT_MODULES`: those of
# other libraries' checkpoint formats, which `from_preset` converts on
# loading; each registers its loader when imported (`presets/formats.py`).
CLASS_MODULES = ("keras_transformer.models",)
FORMAT_MODULES = ("keras_transformer.convert.marian", "keras_transformer.convert.m2m100")


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"keras_transformer.{name}")
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_MODULES})

"""Checkpoint formats of other libraries that `from_preset` reads,
converting them on loading (Marian's: `keras_transformer.convert.marian`).

keras-hub's loader has no public hook for another checkpoint format (it
raises "no converter" for a Marian checkpoint). A converter registers here
how to recognize its checkpoints and how to load one as a class of this
package; `from_preset` asks the registered formats before keras-hub reads a
preset. The converters sit above the models they build, and the presets
name none of them: the package lists their modules
(`keras_transformer.FORMAT_MODULES`), imported here when a preset is first
looked up.
"""

import importlib

import keras_transformer

# The registered formats, by name: `(recognizes, load)`.
_FORMATS = {}


def register_format(name, recognizes, load):
    """Registers another library's checkpoint format for `from_preset`.

    Args:
        name: the format's name; registering a name again replaces it.
        recognizes: `recognizes(preset)`, whether a preset (a directory or
            a handle) holds a checkpoint of this format.
        load: `load(cls, preset, **kwargs)`, what `cls.from_preset(preset,
            **kwargs)` returns for such a checkpoint.
    """
    _FORMATS[name] = (recognizes, load)


def loader_of(preset):
    """The `load` of the registered format that holds `preset`; None for a
    preset of this package and any other that keras-hub reads."""
    for module in keras_transformer.FORMAT_MODULES:
        importlib.import_module(module)
    for recognizes, load in _FORMATS.values():
        if recognizes(preset):
            return load
    return None

"""Translating on JAX or PyTorch without importing TensorFlow.

keras-hub imports TensorFlow and tensorflow-text whenever they are
installed, for its `tf.data` preprocessing: 4-5 s of a command's start on
2 CPU cores, more than loading and running the model for one sentence. A
translation on JAX or PyTorch needs neither: keras-hub's SentencePiece
tokenizer runs on the `sentencepiece` package where tensorflow-text is not
importable, with the same pieces and ids (both wrap the same SentencePiece
library). `keras-transformer translate` and `evaluate` therefore keep
TensorFlow out of the process for presets whose tokenizer is a
`TransformerTokenizer` (SentencePiece). Presets with other tokenizers
(WordPiece, Marian's) and the TensorFlow backend import it as before, as
does `KERAS_TRANSFORMER_WITHOUT_TENSORFLOW=0`.

Python has its own switch for this: a module whose `sys.modules` entry is
`None` fails to import with `ModuleNotFoundError`, as if not installed, and
`importlib.util.find_spec` finds nothing, which is what keras-hub, Keras and
PyTorch check for.
"""

import os
import sys

# The modules kept out: TensorFlow and the tensorflow-text ops.
MODULES = ("tensorflow", "tensorflow_text")
# Set to "0" (or "off") to import TensorFlow as before.
ENVIRONMENT_VARIABLE = "KERAS_TRANSFORMER_WITHOUT_TENSORFLOW"


def skip_tensorflow():
    """Makes TensorFlow and tensorflow-text unimportable in this process,
    as if they were not installed, before keras-hub imports them.

    Does nothing on the TensorFlow backend, where TensorFlow or keras-hub
    is already imported (keras-hub would already hold TensorFlow's
    tokenizers), or where `KERAS_TRANSFORMER_WITHOUT_TENSORFLOW` is "0" or
    "off".

    Returns:
        Whether TensorFlow is now kept out.

    Example:

    >>> import keras
    >>> import sys
    >>> skipped = skip_tensorflow()
    >>> skipped == (sys.modules.get("tensorflow", 0) is None)
    True
    """
    import keras

    if os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in ("0", "off"):
        return False
    if keras.config.backend() == "tensorflow":
        return False
    if any(sys.modules.get(name) is not None for name in (*MODULES, "keras_hub")):
        return False
    for name in MODULES:
        sys.modules[name] = None
    return True


def sentencepiece_presets(presets):
    """Whether every preset (a shipped name or a directory) has a
    `TransformerTokenizer`, which translates without tensorflow-text; hub
    handles and unreadable presets count as not."""
    from keras_transformer.presets import TOKENIZER_FILE
    from keras_transformer.presets import read_preset_file

    for preset in presets:
        if "://" in str(preset):
            return False
        try:
            config = read_preset_file(preset, TOKENIZER_FILE)
        except (OSError, ValueError):
            return False
        if config.get("class_name") != "TransformerTokenizer":
            return False
    return True

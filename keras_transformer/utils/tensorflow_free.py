"""Translating on JAX or PyTorch without importing TensorFlow (and, on
PyTorch, without JAX and matplotlib).

keras-hub imports TensorFlow and tensorflow-text whenever they are
installed, for its `tf.data` preprocessing: 4-5 s of a command's start on
2 CPU cores, more than loading and running the model for one sentence. A
translation on JAX or PyTorch needs neither: keras-hub's SentencePiece
tokenizer runs on the `sentencepiece` package where tensorflow-text is not
importable, with the same pieces and ids (both wrap the same SentencePiece
library). `keras-transformer translate` and `evaluate` therefore keep
TensorFlow out of the process for presets whose tokenizer is a
`TransformerTokenizer` (SentencePiece:
`keras_transformer.presets.registry.sentencepiece_presets`). Presets with other tokenizers
(WordPiece, Marian's) and the TensorFlow backend import it as before, as
does `KERAS_TRANSFORMER_WITHOUT_TENSORFLOW=0`.

The modules are left out by a finder at the head of `sys.meta_path` whose
loader refuses them: `import tensorflow` raises `ModuleNotFoundError`, as
if it were not installed, which keras-hub and Keras catch. Nothing is put
in `sys.modules` (Keras takes a `tensorflow` entry there as TensorFlow
imported), and `importlib.util.find_spec` still answers, without an origin,
as PyTorch's compiler expects when it lists libraries to skip.

Keras itself imports JAX (for its Orbax checkpoint callback) and
matplotlib (for its image gallery) on every backend, if installed, and
goes on without them if not; keras-hub imports grain (a data loader, which
imports JAX) the same way. On PyTorch a translation uses neither: the
command leaves both out too (`skip_jax_and_matplotlib`), when
`KERAS_BACKEND=torch` says so before Keras is imported (a backend chosen in
`keras.json` is only known once Keras is).
"""

import importlib.abc
import importlib.machinery
import os
import sys

# The modules kept out: TensorFlow and the tensorflow-text ops.
MODULES = ("tensorflow", "tensorflow_text")
# What Keras and keras-hub import on the PyTorch backend without using it
# there (keras-hub's optional data loader, grain, would import JAX's
# profiler).
UNUSED_ON_TORCH = ("jax", "jaxlib", "matplotlib", "grain")
# Set to "0" (or "off") to import TensorFlow (and JAX, matplotlib) as before.
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

    Example, at the start of a script that translates on PyTorch (not
    run here: it would take TensorFlow from the rest of this process):

    ```python
    import os
    os.environ["KERAS_BACKEND"] = "torch"
    from keras_transformer.utils.tensorflow_free import skip_tensorflow
    skip_tensorflow()  # True: keras-hub will tokenize without TensorFlow
    from keras_transformer.models import TransformerSeq2SeqLM
    TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de").generate(["A dog runs."])
    ```
    """
    import keras

    if os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in ("0", "off"):
        return False
    if keras.config.backend() == "tensorflow":
        return False
    if any(sys.modules.get(name) is not None for name in (*MODULES, "keras_hub")):
        return False
    if not left_out():
        sys.meta_path.insert(0, _LeaveOut(MODULES))
    return True


def skip_jax_and_matplotlib():
    """On the PyTorch backend, makes JAX and matplotlib unimportable in
    this process before Keras imports them, as `skip_tensorflow` does
    TensorFlow.

    Does nothing unless the `KERAS_BACKEND` environment variable is
    "torch" and Keras is not imported yet, or where
    `KERAS_TRANSFORMER_WITHOUT_TENSORFLOW` is "0" or "off".

    Returns:
        Whether JAX and matplotlib are now kept out.
    """
    if os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in ("0", "off"):
        return False
    if _finder(UNUSED_ON_TORCH) is not None:
        return True
    if os.environ.get("KERAS_BACKEND") != "torch" or "keras" in sys.modules:
        return False
    if any(sys.modules.get(name) is not None for name in UNUSED_ON_TORCH):
        return False
    sys.meta_path.insert(0, _LeaveOut(UNUSED_ON_TORCH))
    return True


def left_out():
    """Whether TensorFlow is kept out of this process (`skip_tensorflow`)."""
    return _finder(MODULES) is not None


def _finder(names):
    """The `_LeaveOut` finder in `sys.meta_path` that refuses `names`, or None."""
    return next(
        (f for f in sys.meta_path if isinstance(f, _LeaveOut) and f.names == frozenset(names)), None
    )


class _LeaveOut(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules named (and their submodules) and refuses to load them."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=None)

    def create_module(self, spec):
        raise ModuleNotFoundError(
            f"No module named {spec.name!r}: keras_transformer translates without it in this process "
            f"({ENVIRONMENT_VARIABLE}=0 imports it).",
            name=spec.name,
        )

    def exec_module(self, module):  # never reached: create_module refuses
        raise ModuleNotFoundError(module.__name__)

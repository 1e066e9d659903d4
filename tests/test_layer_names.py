"""No layer of the package shadows a method that Keras or PyTorch calls.

On PyTorch every Keras layer is a `torch.nn.Module`, and Keras' `fit`
calls `torch.nn.Module.train(True)` on every sublayer: a tokenizer that
defined a `train` classmethod (to learn its vocabulary) broke `fit` after
keras-hub's split preprocessing (`task.preprocessor = None`, then set
back; `TypeError: 'bool' object is not iterable`). The same name breaks
nothing on JAX or TensorFlow, so the rule is checked on the classes, on
every backend, not by running `fit` on PyTorch alone (that is
`test_keras_hub_harness.py`'s `run_task_test`).
"""

import importlib
import pkgutil
import types

import keras
import pytest

import keras_transformer

torch = pytest.importorskip("torch")


def _package_layers():
    """Every `keras.Layer` subclass that the package defines (layers,
    tokenizers, preprocessors, backbones, tasks), every module imported."""
    for module in pkgutil.walk_packages(keras_transformer.__path__, "keras_transformer."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as error:  # an extra's dependency (serve, documents, plot)
            if (error.name or "").split(".")[0] == "keras_transformer":
                raise
    found, todo = set(), [keras.Layer]
    while todo:
        for subclass in todo.pop().__subclasses__():
            if subclass not in found:
                found.add(subclass)
                todo.append(subclass)
    return sorted((c for c in found if _ours(c)), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _ours(cls):
    return cls.__module__.split(".")[0] == "keras_transformer"


def _keras(cls):
    """A class of Keras or keras-hub written for every backend (not Keras'
    backend layer, which on PyTorch is the `torch.nn.Module` adapter)."""
    return cls.__module__.split(".")[0] in ("keras", "keras_hub") and not cls.__module__.startswith(
        "keras.src.backend."
    )


def _kind(value):
    for kind in (classmethod, staticmethod, property):
        if isinstance(value, kind):
            return kind.__name__
    return "method" if isinstance(value, types.FunctionType) else "attribute"


def _defined(cls):
    """`(name, value, class)` for what the package's classes in `cls`'s MRO
    define."""
    return [(name, value, base) for base in cls.__mro__ if _ours(base) for name, value in vars(base).items()]


def test_layers_were_found():
    names = {cls.__name__ for cls in _package_layers()}
    assert {"TransformerBackbone", "TransformerSeq2SeqLM", "TransformerSeq2SeqLMPreprocessor", "TransformerTokenizer",
            "TransformerWordPieceTokenizer", "MarianTokenizer", "MultiHeadAttention"} <= names


def test_no_layer_shadows_a_torch_module_method():
    """The package's classes define no name of `torch.nn.Module`'s
    (`train`, `eval`, `apply`, `to`, `parameters`, `modules`, `children`,
    `forward`, `state_dict`...) unless Keras or keras-hub, in their
    backend-independent classes, define it too (`compile`), which makes it
    theirs to keep compatible: the package overrides it as Keras does
    (see the next test). Checked on the classes, so on every backend."""
    torch_names = {name for name in dir(torch.nn.Module) if not name.startswith("__")}
    shadowing = []
    for cls in _package_layers():
        keras_names = {name for base in cls.__mro__ if _keras(base) for name in vars(base)}
        for name, _, base in _defined(cls):
            if name in torch_names and name not in keras_names:
                shadowing.append(f"{base.__module__}.{base.__qualname__}.{name}")
    shadowing = sorted(set(shadowing))
    assert not shadowing, f"These shadow torch.nn.Module methods, which Keras calls on layers on PyTorch: {shadowing}"


def test_overrides_keep_the_kind_of_what_they_override():
    """A name that the package's class shares with a Keras or keras-hub
    class above it is of the same kind there: a method for a method, a
    classmethod for a classmethod, a property for a property (a classmethod
    `compile`, or an attribute named `call`, would break Keras' callers)."""
    wrong = []
    for cls in _package_layers():
        for name, value, base in _defined(cls):
            if name.startswith("__"):
                continue
            theirs = next((b for b in cls.__mro__ if _keras(b) and name in vars(b)), None)
            if theirs is not None and _kind(vars(theirs)[name]) != _kind(value):
                wrong.append(
                    f"{base.__qualname__}.{name} ({_kind(value)}) overrides "
                    f"{theirs.__module__}.{theirs.__qualname__}.{name} ({_kind(vars(theirs)[name])})"
                )
    wrong = sorted(set(wrong))
    assert not wrong, wrong

"""Argument checks: argparse types that refuse out-of-range values with
"must be ...", for the command line and the settings it generates
(`TrainConfig`), and the keyword check of the models' constructors."""

import argparse
import difflib
import inspect
import math


def bounded(convert, accepts, says):
    """An argparse `type`: `convert` the text, refuse values `accepts` does
    not take with "must be <says>" (NaN is refused by every bound)."""

    def parse(text):
        value = convert(text)
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {says}, got {text}")
        return value

    parse.__name__ = convert.__name__  # argparse's "invalid int value: 'x'"
    return parse


def finite(convert):
    """`convert`, refusing infinities ("must be finite, got inf")."""

    def parse(text):
        value = convert(text)
        if math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text}")
        return value

    parse.__name__ = convert.__name__
    return parse


positive_int = bounded(int, lambda value: value >= 1, "1 or more")
non_negative_int = bounded(int, lambda value: value >= 0, "0 or more")
positive_float = bounded(finite(float), lambda value: value > 0, "more than 0")
non_negative_float = bounded(finite(float), lambda value: value >= 0, "0 or more")
probability = bounded(float, lambda value: 0 <= value < 1, "in [0, 1)")


def constructor_keywords(cls):
    """The keyword names that some `__init__` of `cls`'s hierarchy takes
    (keras-hub's `Task` takes `compile`, Keras' `Layer` `trainable`...)."""
    known = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            known.update(
                name for name, parameter in inspect.signature(init).parameters.items()
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            )
    known.discard("self")
    return known


def check_model_keywords(cls, kwargs, renamed=None):
    """Refuses a keyword that no constructor of `cls`'s hierarchy takes:
    `keras.Model`'s functional constructor drops such a keyword without a
    word. The error names the argument meant: `renamed` maps other
    libraries' names (keras-hub's `hidden_dim`) to this package's, and a
    typo gets the closest known name."""
    known = constructor_keywords(cls)
    unknown = sorted(set(kwargs) - known)
    if not unknown:
        return
    name = unknown[0]
    meant = (renamed or {}).get(name) or next(iter(difflib.get_close_matches(name, sorted(known), n=1)), None)
    own = [parameter for parameter in inspect.signature(cls.__init__).parameters if parameter not in ("self", "kwargs")]
    raise TypeError(
        f"{cls.__name__}() got an unexpected keyword argument {name!r}"
        + (f"; did you mean {meant!r}?" if meant else f"; it takes {', '.join(own)}.")
    )

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


# What `keras.Model`'s functional constructor takes besides inputs and
# outputs. It drops any other keyword without a word, so the models built
# on it check their `**kwargs` themselves (`check_model_keywords`).
MODEL_KEYWORDS = ("name", "trainable", "dtype")


def check_model_keywords(cls, kwargs, renamed=None):
    """Refuses a keyword that neither `cls.__init__` nor `keras.Model`
    takes, naming the argument meant: `renamed` maps other libraries'
    names (keras-hub's `hidden_dim`) to this package's, and a typo gets
    the closest known name."""
    renamed = renamed or {}
    unknown = sorted(set(kwargs) - set(MODEL_KEYWORDS))
    if not unknown:
        return
    name = unknown[0]
    known = [
        parameter for parameter in inspect.signature(cls.__init__).parameters
        if parameter not in ("self", "kwargs")
    ]
    meant = renamed.get(name) or next(iter(difflib.get_close_matches(name, known, n=1)), None)
    raise TypeError(
        f"{cls.__name__}() got an unexpected keyword argument {name!r}"
        + (f"; did you mean {meant!r}?" if meant else f"; it takes {', '.join(known)}.")
    )

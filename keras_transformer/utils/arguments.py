"""argparse types that refuse out-of-range values with "must be ...", for
the command line and the settings it generates (`TrainConfig`)."""

import argparse
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

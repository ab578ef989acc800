"""argparse types shared by the command lines (``python -m ms_accum.check`` and the model zoo's train.py): a bad
value ends with "argument --flag: must be ..., but got '...'" and exit code 2."""
import argparse
import math


def positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, but got {text!r}")
    return value


def positive_float(text):
    """argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, but got {text!r}")
    return value


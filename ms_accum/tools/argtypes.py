"""argparse types and the parser shared by the command lines (``python -m ms_accum.check`` and the model zoo's
scripts): a bad value ends with one line, "prog: error: argument --flag: must be ..., but got '...' (see --help)",
and exit code 2."""
import argparse
import math


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line on stderr, exit code 2, as the scripts' own
    errors are: argparse's own printed the whole usage first (25 lines for train.py) above the line that says what
    is wrong."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message.rstrip('.')} (see --help)\n")


def _int_at_least(text, low):
    """`text` as an int >= `low`, or the argparse error that says so."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"must be an int >= {low}, but got {text!r}")
    return value


def non_negative_int(text):
    """argparse type: an int >= 0."""
    return _int_at_least(text, 0)


def positive_int(text):
    """argparse type: an int >= 1."""
    return _int_at_least(text, 1)


def positive_float(text):
    """argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, but got {text!r}")
    return value


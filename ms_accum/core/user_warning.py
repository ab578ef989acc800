"""Warnings shown where the user's code called ms_accum."""
import os
import sys
import warnings

from .own_code import is_own


def _mindspore():
    """MindSpore's directory (its ``Model.train`` calls ms_accum's callbacks), as a tuple; empty before it is
    imported."""
    mindspore = sys.modules.get("mindspore")
    if mindspore is None or not getattr(mindspore, "__file__", None):
        return ()
    return (os.path.dirname(os.path.abspath(mindspore.__file__)) + os.sep,)


def warn(message, category=UserWarning):
    """
    Issue `message` as a warning of `category`, attributed to the innermost caller outside ms_accum and MindSpore:
    the user's line that called a trainer, a cell or a function, however deep in ms_accum (or in MindSpore's
    ``Model.train``, which calls ``Model_ACCU``'s callbacks) the warning arose. Where every frame is theirs (a
    script of the package run as ``python -m``), the outermost frame.

    Args:
        message (str): The warning's text.
        category (type): A subclass of ``Warning``. Default: ``UserWarning``.
    """
    mindspore = _mindspore()
    frame, level = sys._getframe(1), 2  # pylint: disable=protected-access
    while frame.f_back is not None and is_own(frame.f_code.co_filename, mindspore):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)

"""Warnings shown where the user's code called ms_accum."""
import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _libraries():
    """The directories of ms_accum and of MindSpore (whose ``Model.train`` calls ms_accum's callbacks)."""
    found = [_PACKAGE]
    mindspore = sys.modules.get("mindspore")
    if mindspore is not None and getattr(mindspore, "__file__", None):
        found.append(os.path.dirname(os.path.abspath(mindspore.__file__)) + os.sep)
    return tuple(found)


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
    libraries = _libraries()
    frame, level = sys._getframe(1), 2  # pylint: disable=protected-access
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(libraries):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)

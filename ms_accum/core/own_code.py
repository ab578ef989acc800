"""Whether a file is ms_accum's own code: for errors raised by its checks inside a compiled graph
(:func:`compiled.own_graph_error`) and for warnings shown at the user's line (:func:`user_warning.warn`)."""
import os

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_own(path, others=()):
    """Whether the file `path` lies in ms_accum's package, or under one of the directories `others` (each ending
    with a separator)."""
    return os.path.abspath(path).startswith((PACKAGE,) + tuple(others))

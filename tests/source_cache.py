"""Each function's source read once a test process, where MindSpore's parser reads it again at every compilation.

MindSpore compiles a graph by parsing every function and method it calls, and its parser (``Parser.parse`` in
MindSpore 2.7 to 2.10) asks ``inspect.getsourcelines`` for each of them each time: Python stats the function's file
and tokenizes its block again, though the source is the same. The suite compiles thousands of graphs from a few
hundred functions (ms_accum's, the tests' networks, MindSpore's own layers and functional ops), so it paid that
read thousands of times over: tests/test_accu_cells.py alone in one process, 2026-12-07, took 115.8 and 124.5 s of
CPU without :func:`install` and 98.6 and 111.1 s with it, the two in turn.

:func:`install` makes ``inspect.getsourcelines`` keep what it found for a function (a method's function, the
function a decorator wrapped) by its code object, which stands for one place in one file, and hand back a copy of
it; anything else (a class, a module, a frame) is read as before. The source is what Python read the first time it
was asked in this process: the suite does not edit a module it has imported (MindSpore would compile the edited
source against the loaded code either way). ``tests/conftest.py`` installs it in every test process,
``tests/script_server.py`` in the process its scripts' copies are forked from, and the tests' msrun workers
(``dp_worker.py``, ``elastic_worker.py``, ``goodput_dp_worker.py``, ``planner_dp_worker.py``) in themselves; the
compile cache's worker does not, as MindSpore's compile cache is what it tests, nor do the scripts, benchmarks and
model zoo runs the tests start in fresh interpreters, which run as a user's would.
"""
import inspect

_READ = inspect.getsourcelines
_KNOWN = {}  # code object: (lines, first line's number), as Python read them


def _code_of(obj):
    """The code object `obj`'s source is found by, as ``inspect.getsourcelines`` finds it, or None."""
    try:
        target = inspect.unwrap(obj)
    except ValueError:  # a cycle of __wrapped__: read as before, which raises the same
        return None
    target = getattr(target, "__func__", target)  # a bound method: its function's source
    return target.__code__ if inspect.isfunction(target) else None


def cached_getsourcelines(obj):
    """``inspect.getsourcelines(obj)``, read once per function: a copy of the lines and the first line's number."""
    code = _code_of(obj)
    if code is None:
        return _READ(obj)
    found = _KNOWN.get(code)
    if found is None:
        found = _KNOWN[code] = _READ(obj)
    return list(found[0]), found[1]


def install():
    """Make ``inspect.getsourcelines`` :func:`cached_getsourcelines` in this process (again: no change)."""
    inspect.getsourcelines = cached_getsourcelines

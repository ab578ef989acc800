"""Each function's source read once a test process, and each parsed node's location worked out once, where
MindSpore's parser reads and works them out again at every compilation.

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

The parser keeps each source's syntax tree (``Parser.ast_cache``, by the source's hash, for the process), but asks
its ``get_location`` again for each node at every compilation, which slices the node's text out of the source and
searches each of its lines for ``# @jit`` comments: 619,266 calls and 6.5 of 113 s of profiled CPU in
tests/test_accu_cells.py. :func:`install` keeps what it answered for a node of a function at its place in its file
(the parser's file, first line and indent, and the node: the same tree for the same source) and hands back a copy.
The memo holds the node as well, so that its ``id`` stays its own.
"""
import functools
import importlib
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


def parser_class():
    """MindSpore's ``Parser``: in ``mindspore.graph._parse.parser`` on 2.10.0, ``mindspore._extends.parse.parser``
    on 2.7.0 (the first of the two that imports)."""
    for name in ("mindspore.graph._parse.parser", "mindspore._extends.parse.parser"):
        try:
            return importlib.import_module(name).Parser
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError("MindSpore's parser is in neither mindspore.graph._parse nor mindspore._extends.parse")


def cached_get_location(read):
    """``Parser.get_location`` (`read`), worked out once per node of a function at its place in its file."""
    known = {}  # (file, first line, indent, lines, start node's id, end node's id): (start, end, location)

    @functools.wraps(read)
    def get_location(self, node):
        ends = (node[0], node[-1]) if isinstance(node, (list, tuple)) and node else (node, node)
        key = (self.filename, self.line_offset, self.col_offset, len(self.lines), id(ends[0]), id(ends[1]))
        found = known.get(key)
        if found is None:
            found = known[key] = ends + (read(self, node),)
        return list(found[2])
    get_location.cached = True
    return get_location


def install():
    """Make ``inspect.getsourcelines`` :func:`cached_getsourcelines` and MindSpore's ``Parser.get_location``
    :func:`cached_get_location` in this process (again: no change). Imports MindSpore: call it after the settings
    that must precede that import."""
    inspect.getsourcelines = cached_getsourcelines
    parser = parser_class()
    if not getattr(parser.get_location, "cached", False):
        parser.get_location = cached_get_location(parser.get_location)

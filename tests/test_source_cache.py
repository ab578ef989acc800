"""source_cache.py: each function's source read once a test process, the same source as Python's own read."""
import functools
import inspect

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

import source_cache
from helpers import ROOT, run_python


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


@_logged
def _first(x):
    return x + 1


@_logged
def _second(x):
    return x * 2


def _closure(k):
    def scaled(x):
        return x * k
    return scaled


class _Holder:
    def method(self, x):
        return x - 1


def _counting_reads(monkeypatch):
    """The name of each object the cache reads from here on, in order, with an empty cache."""
    reads, python_read = [], source_cache._READ

    def read(obj):
        reads.append(getattr(obj, "__name__", None))
        return python_read(obj)
    monkeypatch.setattr(source_cache, "_READ", read)
    monkeypatch.setattr(source_cache, "_KNOWN", {})
    return reads


def test_the_suite_runs_with_the_cache_and_it_gives_pythons_own_source():
    """Installed by conftest.py; for a function, a bound method, two functions one decorator wrapped (one wrapper's
    code), two closures of one definition, a class and a module, the same lines and line number as Python's own
    read: the decorated functions each their own, not their wrapper's."""
    assert inspect.getsourcelines is source_cache.cached_getsourcelines
    objects = [_first, _second, _Holder().method, _closure(2), _closure(3), _Holder, source_cache]
    for obj in objects:
        for _ in range(2):
            assert source_cache.cached_getsourcelines(obj) == source_cache._READ(obj), obj
    assert source_cache.cached_getsourcelines(_first)[0][1].strip() == "def _first(x):"
    assert source_cache.cached_getsourcelines(_second)[0][1].strip() == "def _second(x):"


def test_a_function_is_read_once_and_everything_else_each_time(monkeypatch):
    reads = _counting_reads(monkeypatch)
    for _ in range(3):
        source_cache.cached_getsourcelines(_first)
        source_cache.cached_getsourcelines(_closure(2))
        source_cache.cached_getsourcelines(_closure(5))  # the same code as _closure(2)'s: already read
        source_cache.cached_getsourcelines(_Holder().method)
        source_cache.cached_getsourcelines(_Holder)
    assert reads == ["_first", "scaled", "method", "_Holder", "_Holder", "_Holder"], reads


def test_a_copy_of_the_lines_is_handed_out():
    lines, _ = source_cache.cached_getsourcelines(_first)
    lines.clear()
    assert source_cache.cached_getsourcelines(_first)[0], "a caller's change reached the cache"


def test_mindspores_parser_reads_each_source_and_works_out_each_location_once(monkeypatch):
    """Compiling two graphs that call one helper reads the helper's source once (MindSpore's parser asks
    inspect.getsourcelines at every compilation: if a release stopped asking it through ``inspect``, the cache
    would no longer apply, and this test says so) and works out the location of each of the helper's nodes once
    (the second compilation's are the first's, found again); every location the parser is given is the one its own
    ``get_location`` gives for that node: file, lines, columns, text and ``# @jit`` comments."""
    reads = _counting_reads(monkeypatch)
    parser = source_cache.parser_class()
    assert getattr(parser.get_location, "cached", False), "conftest.py did not install the location cache"
    original = parser.get_location.__wrapped__
    worked_out, given = [], []

    def counting(self, node):
        worked_out.append(tuple(original(self, node)[:6]))
        return original(self, node)
    cached = source_cache.cached_get_location(counting)

    def checked(self, node):
        location = cached(self, node)
        given.append((location, original(self, node)))
        return location
    monkeypatch.setattr(parser, "get_location", checked)
    ms.set_context(mode=ms.GRAPH_MODE)

    def shared_helper(x):
        y = ops.square(x)  # @jit comments are read with the location: none here
        return y + 1

    @ms.jit
    def one(x):
        return shared_helper(x) * 2

    @ms.jit
    def two(x):
        return shared_helper(x) - 3

    x = Tensor(np.arange(3, dtype=np.float32))
    np.testing.assert_allclose(one(x).asnumpy(), (np.arange(3) ** 2 + 1) * 2)
    np.testing.assert_allclose(two(x).asnumpy(), np.arange(3) ** 2 - 2)
    assert reads.count("one") == 1 and reads.count("two") == 1, reads
    assert reads.count("shared_helper") == 1, f"the helper read at each compilation: {reads}"
    first_line = shared_helper.__code__.co_firstlineno
    helper = [place for place in worked_out if place[0] == __file__ and first_line <= place[1] <= first_line + 2]
    assert helper and len(helper) == len(set(helper)), f"a node of the helper worked out twice: {helper}"
    assert any("ops.square(x)" in place[5] for place in helper), helper
    assert len(given) > len(worked_out), "the second compilation found no location again"
    assert all(location == truth for location, truth in given), [pair for pair in given if pair[0] != pair[1]][:3]


def test_a_script_server_copy_runs_with_the_cache(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import inspect\nprint(inspect.getsourcelines.__module__, inspect.getsourcelines.__name__)\n")
    done = run_python([script], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["source_cache", "cached_getsourcelines"], done.stdout

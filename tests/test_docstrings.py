"""Every Examples section in ms_accum's docstrings runs as written, with the output it shows (doctest)."""
import doctest
import importlib
import pkgutil
import sys
import types

import pytest

import ms_accum


def _docstring_tests():
    finder = doctest.DocTestFinder()
    found = []
    for module in pkgutil.walk_packages(ms_accum.__path__, prefix="ms_accum."):
        found += [test for test in finder.find(importlib.import_module(module.name)) if test.examples]
    return found


TESTS = _docstring_tests()


def test_the_public_api_has_examples():
    names = {test.name.rsplit(".", 1)[-1] for test in TESTS}
    missing = [name for name in ms_accum.__all__ if callable(getattr(ms_accum, name)) and name not in names]
    assert not missing, f"public classes and functions without an Examples section: {missing}"


@pytest.mark.parametrize("test", TESTS, ids=[test.name for test in TESTS])
def test_docstring_example_runs(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files (telemetry's runs/) write here
    # MindSpore's compiler resolves a jit function's globals by importing its module, so the example's names
    # live in a module of their own, as a user's script's do.
    name = "ms_accum_example_" + test.name.replace(".", "_")
    module = types.ModuleType(name)
    module.__dict__.update(test.globs)
    module.__name__ = name
    monkeypatch.setitem(sys.modules, name, module)
    test.globs = module.__dict__
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)

"""The package's folders are its layers, and its imports point only downward.

compat < core < cells < trainers < tools: a module may import from its own layer and the layers below, never
above (the engine knows nothing of cells, the cells nothing of training loops). A built wheel holds every
subpackage, and ``import ms_accum`` exposes the public API.
"""
import ast
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import ms_accum
from conftest import ROOT

LAYERS = ("compat", "core", "cells", "trainers", "tools")
PACKAGE = os.path.join(ROOT, "ms_accum")


def _layer_of(module):
    """The layer of 'ms_accum.<layer>.<...>' (None for the package's top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _imports(path, module):
    """The ms_accum modules imported by the file at `path` (module `module`), resolved from relative imports."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "ms_accum":
                found += [f"{target}.{alias.name}" if not node.module else target for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "ms_accum"]
    return found


def _modules():
    for base, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(base, name)
                relative = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield path, relative[:-len(".__init__")] if relative.endswith(".__init__") else relative


def test_every_module_lives_in_a_layer():
    loose = [module for _, module in _modules() if _layer_of(module) is None and module not in
             ("ms_accum", "ms_accum.check")]
    assert not loose, f"modules outside the layers {LAYERS}: {loose}"


def test_imports_point_only_downward():
    upward = []
    for path, module in _modules():
        layer = _layer_of(module)
        if layer is None:  # the package's __init__ and the check command re-export the layers
            continue
        for target in _imports(path, module):
            target_layer = _layer_of(target)
            if target_layer is not None and LAYERS.index(target_layer) > LAYERS.index(layer):
                upward.append(f"{module} imports {target}")
    assert not upward, upward


def test_the_layer_scan_sees_an_upward_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from ..cells.parallel import TrainAccuStepsCell\nfrom . import window\n")
    assert _imports(str(sample), "ms_accum.core.engine") == ["ms_accum.cells.parallel", "ms_accum.core.window"]


def test_import_ms_accum_exposes_the_public_api():
    for name in ms_accum.__all__:
        assert getattr(ms_accum, name, None) is not None, name
    for name in ("Accumulator", "GradientAccumulation", "Model_ACCU", "TrainAccuStepsCell", "TrainForwardBackward",
                 "TrainOptim", "TrainClear", "TrainAccuStepsWithLossScaleCell", "AdaptiveAccumulation"):
        assert name in ms_accum.__all__


@pytest.mark.slow
def test_a_built_wheel_holds_every_subpackage(tmp_path):
    """An editable install hides a package list that misses a subpackage; the wheel shows it. Built from a copy,
    so that setuptools' build/ folder is not left in the working tree."""
    source = tmp_path / "source"
    shutil.copytree(PACKAGE, source / "ms_accum", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(source)], check=True, capture_output=True, text=True)
    [wheel] = [name for name in os.listdir(tmp_path / "wheel") if name.endswith(".whl")]
    names = set(zipfile.ZipFile(tmp_path / "wheel" / wheel).namelist())
    expected = {os.path.relpath(path, ROOT).replace(os.sep, "/") for path, _ in _modules()}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"

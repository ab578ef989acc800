"""The supported MindSpore range: declared once, checked at import, and every private MindSpore name in one module."""
import ast
import importlib
import importlib.metadata
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import mindspore as ms
from mindspore import nn
from mindspore.train import Model

import ms_accum
from ms_accum import compat as _compat
from helpers import numpy_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE_TEXT = "MindSpore 2.7.0 to 2.10.x"


@pytest.mark.parametrize("version, release", [("2.7.0", (2, 7, 0)), ("2.10.0", (2, 10, 0)), ("2.7.0rc1", (2, 7, 0)),
                                              ("2.9", (2, 9, 0)), ("2.8.0.dev20250101", (2, 8, 0))])
def test_supported_releases_import_quietly(version, release):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compat.check_release(version) == release
        assert _compat.untested_release(version) is None


@pytest.mark.parametrize("version", ["2.6.0", "2.5.0", "1.10.1", "2.6.0rc1"])
def test_an_older_release_is_refused_with_the_supported_range(version):
    with pytest.raises(ImportError, match=rf"ms_accum supports {RELEASE_TEXT}, but MindSpore {version} is installed\. "
                                          r"Install a supported release: pip install 'mindspore>=2\.7\.0,<2\.11'"):
        _compat.check_release(version)


@pytest.mark.parametrize("version", ["2.11.0", "3.0.0"])
def test_a_newer_release_is_named_with_the_supported_range(version):
    assert _compat.check_release(version) >= (2, 11, 0)
    assert _compat.untested_release(version) == f"ms_accum supports {RELEASE_TEXT} and was not tested on MindSpore " \
                                                f"{version}; if it fails, install a supported release: pip install " \
                                                f"'mindspore>=2.7.0,<2.11'"


@pytest.mark.parametrize("statement", ["import ms_accum", "from ms_accum.core.schedule import AccumulationSchedule"])
def test_import_on_a_newer_release_warns_once_at_the_users_import_line(statement, tmp_path):
    """The whole import path, in a fresh process whose MindSpore reports 2.11.0: one RuntimeWarning, shown at the
    line of the user's script that imported ms_accum (not inside ms_accum), and the import completes."""
    script = tmp_path / "user_script.py"
    script.write_text(f"import mindspore\nmindspore.__version__ = '2.11.0'\n{statement}\nprint('IMPORTED')\n",
                      encoding="utf-8")
    done = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", str(script)], capture_output=True,
                          text=True, timeout=120, check=False, cwd=ROOT)
    assert done.returncode == 0 and "IMPORTED" in done.stdout, done.stderr[-3000:]
    shown = [line for line in done.stderr.splitlines() if "RuntimeWarning: ms_accum supports" in line]
    assert len(shown) == 1, done.stderr[-3000:]
    assert shown[0].startswith(f"{script}:3: RuntimeWarning: ms_accum supports {RELEASE_TEXT} and was not tested on "
                               f"MindSpore 2.11.0"), shown


def test_an_unreadable_version_is_refused():
    with pytest.raises(ImportError, match=r"could not read the installed MindSpore's version 'unknown'"):
        _compat.check_release("unknown")


def test_import_on_an_older_release_names_the_supported_range():
    """The whole import path, in a fresh process whose MindSpore reports 2.6.0."""
    code = "import mindspore; mindspore.__version__ = '2.6.0'\ntry:\n    import ms_accum\nexcept ImportError as e:\n" \
           "    print('REFUSED', e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=ROOT).stdout
    assert f"REFUSED ms_accum supports {RELEASE_TEXT}, but MindSpore 2.6.0 is installed." in out


def test_the_declared_dependency_is_the_checked_range_and_admits_this_mindspore():
    requirements = [Requirement(r) for r in importlib.metadata.requires("ms_accum")]
    mindspore = [r for r in requirements if r.name == "mindspore" and r.marker is None]
    assert len(mindspore) == 1, requirements
    spec = mindspore[0].specifier
    lowest, beyond = ".".join(map(str, _compat.LOWEST)), ".".join(map(str, _compat.BEYOND[:2]))
    assert str(spec) in (f">={lowest},<{beyond}", f"<{beyond},>={lowest}")
    assert Version(ms.__version__) in spec
    assert Version(lowest) in spec and Version(f"{beyond}.0") not in spec


def test_pip_check_finds_no_conflict_with_the_installed_mindspore():
    """What `pip install --no-deps -e .` followed by `pip check` must show in any supported release."""
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    conflicts = [line for line in proc.stdout.splitlines() if "ms-accum" in line.lower() or "ms_accum" in line]
    assert not conflicts, proc.stdout


def test_a_missing_name_names_every_place_looked_and_the_range():
    with pytest.raises(ImportError, match=rf"ms_accum supports {RELEASE_TEXT}: MindSpore .* has no widget \(looked "
                                          r"for mindspore\.no_such_module:x, mindspore:_no_such_name\)"):
        _compat._first("widget", "mindspore.no_such_module:x",  # pylint: disable=protected-access
                       "mindspore:_no_such_name")


def test_the_executors_come_from_the_release_s_own_module():
    module = "mindspore.graph.api" if _compat.RELEASE >= (2, 9, 0) else "mindspore.common.api"
    api = importlib.import_module(module)
    assert _compat.cell_graph_executor is api._cell_graph_executor  # pylint: disable=protected-access
    assert _compat.pynative_executor is api._pynative_executor  # pylint: disable=protected-access


def test_the_mode_reader_follows_set_context():
    before = ms.get_context("mode")
    try:
        for mode in (ms.GRAPH_MODE, ms.PYNATIVE_MODE):
            ms.set_context(mode=mode)
            assert _compat.get_mode() == mode == ms.get_context("mode")
    finally:
        ms.set_context(mode=before)


class _ModelWithout(Model):
    """A Model whose release lost a method Model_ACCU overrides."""
    _flush_from_cache = None


class _ModelChanged(Model):
    """A Model whose release added a parameter to a method Model_ACCU overrides."""

    def _train_process(self, epoch, train_dataset, list_callback=None, cb_params=None, initial_epoch=0,
                       valid_infos=None, initial_step=0):  # pylint: disable=arguments-differ
        raise AssertionError("never called")


class _ModelFitReordered(Model):
    """A Model whose release reordered fit's parameters, which Model_ACCU.fit passes by position."""

    def fit(self, epoch, train_dataset, valid_dataset=None, callbacks=None, valid_frequency=1,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1,
            initial_epoch=0):  # pylint: disable=arguments-differ,arguments-renamed
        raise AssertionError("never called")


def test_a_reordered_fit_is_refused_at_import():
    with pytest.raises(ImportError, match=r"Model\.fit\(epoch, train_dataset, valid_dataset, valid_frequency, "
                                          r"callbacks, .*but MindSpore .* has \['epoch', 'train_dataset', "
                                          r"'valid_dataset', 'callbacks', 'valid_frequency'"):
        _compat.check_model_internals(_ModelFitReordered)


def test_model_internals_of_this_release_are_the_ones_model_accu_was_written_for():
    _compat.check_model_internals(Model)


def test_a_missing_model_method_is_refused_at_import():
    with pytest.raises(ImportError, match=r"Model_ACCU overrides or calls mindspore\.train\.Model\._flush_from_cache"
                                          r"\(cb_params\), but MindSpore .* has no such method"):
        _compat.check_model_internals(_ModelWithout)


def test_a_changed_model_method_is_refused_at_import():
    with pytest.raises(ImportError, match=r"Model\._train_process\(epoch, train_dataset, list_callback, cb_params, "
                                          r"initial_epoch, valid_infos\), but MindSpore .* has \['epoch', .*"
                                          r"'initial_step'\]"):
        _compat.check_model_internals(_ModelChanged)


def _private_mindspore_imports(path):
    """(line, text) of every import of a private MindSpore module or name in the file at `path`."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mindspore":
            private_module = any(part.startswith("_") for part in node.module.split("."))
            names = [alias.name for alias in node.names if alias.name.startswith("_")]
            if private_module or names:
                found.append((node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mindspore" and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
    return found


def _python_files(*folders):
    for folder in folders:
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(base, name)


def test_no_module_but_compat_imports_a_private_mindspore_name():
    offenders = {}
    for path in _python_files("ms_accum", "model_zoo_lenet", "benchmarks", "tests"):
        if os.path.relpath(path, ROOT).startswith(os.path.join("ms_accum", "compat")):
            continue
        found = _private_mindspore_imports(path)
        if found:
            offenders[os.path.relpath(path, ROOT)] = found
    assert not offenders, f"import these through ms_accum/compat: {offenders}"


def test_the_private_import_scan_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from mindspore.train._utils import x\nfrom mindspore.graph.api import _pynative_executor\n"
                      "import mindspore._c_expression\nfrom mindspore import nn\n")
    assert [line for line, _ in _private_mindspore_imports(str(sample))] == [1, 2, 3]


def _mindspore_private_attributes():
    """The private attribute and method names of the MindSpore objects ms_accum builds on (classes and instances
    of Cell, the training cells, optimizers, Model, loss-scale cells, Parameter, Tensor)."""
    net = nn.Dense(2, 2)
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    objects = [nn.Cell(), net, optimizer, loss_net, nn.TrainOneStepCell(loss_net, optimizer),
               nn.TrainOneStepWithLossScaleCell(loss_net, optimizer, ms.Tensor(1.0)),
               Model(net, nn.MSELoss(), optimizer), nn.DynamicLossScaleUpdateCell(2.0, 2, 10),
               ms.Parameter(ms.Tensor(1.0), name="p"), ms.Tensor(1.0)]
    names = set()
    for obj in objects:
        for cls in type(obj).__mro__:
            if cls.__module__.startswith("mindspore"):
                names |= {name for name in vars(cls) if name.startswith("_") and not name.startswith("__")}
        names |= {name for name in getattr(obj, "__dict__", {}) if name.startswith("_") and not name.startswith("__")}
    return names


def _private_mindspore_attributes(path, names):
    """(line, name) of every use of a MindSpore private attribute in the file at `path`: read or set (``x._name``),
    or overridden by a method of the same name (but the Model methods Model_ACCU overrides on purpose, which
    compat checks at import)."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ClassDef):
            found += [(item.lineno, f"def {item.name}") for item in node.body
                      if isinstance(item, ast.FunctionDef) and item.name in names
                      and item.name not in _compat.MODEL_METHODS]
    return found


def test_no_module_but_compat_touches_a_private_mindspore_attribute():
    names = _mindspore_private_attributes()
    offenders = {}
    for path in _python_files("ms_accum", "model_zoo_lenet", "benchmarks"):
        if os.path.relpath(path, ROOT).startswith(os.path.join("ms_accum", "compat")):
            continue
        found = _private_mindspore_attributes(path, names)
        if found:
            offenders[os.path.relpath(path, ROOT)] = found
    assert not offenders, f"read, set or override these through ms_accum/compat: {offenders}"


def test_the_private_attribute_scan_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("cell = model._train_network\nmodel._current_step_num = 0\nok = model.train\n"
                      "class A:\n    def _run_construct(self):\n        pass\n"
                      "    def _train_process(self):\n        pass\n")
    names = _mindspore_private_attributes()
    assert sorted(_private_mindspore_attributes(str(sample), names)) == [
        (1, "_train_network"), (2, "_current_step_num"), (5, "def _run_construct")]


def test_model_accu_resets_operator_ids_once_per_epoch_where_the_release_does(monkeypatch):
    """2.7's Model resets MindRT operator ids at every epoch's end under msrun; Model_ACCU's loop must do the same
    there (faked here: one CPU process has no distributed MindRT), and nothing where the release does not."""
    calls = []
    monkeypatch.setattr(_compat, "_reset_op_id", lambda: calls.append("reset"))
    monkeypatch.setattr(_compat, "_enable_distributed_mindrt", lambda: True)
    net = nn.Dense(3, 2)
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, accumulation_steps=2)
    data = [(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))] * 4
    ms_accum.Model_ACCU(cell).train(3, numpy_dataset(data))
    assert calls == ["reset"] * 3
    monkeypatch.setattr(_compat, "_enable_distributed_mindrt", lambda: False)
    calls.clear()
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(data))
    assert not calls


def test_the_sink_attributes_are_the_ones_the_installed_model_sets():
    """Model_ACCU tells a dataset its sink totals through compat, in the private attributes MindSpore's own Model
    sets: read from the installed Model's source, so that a release that renames them fails here."""
    import inspect  # pylint: disable=import-outside-toplevel
    from mindspore.train.model import Model  # pylint: disable=import-outside-toplevel
    source = inspect.getsource(Model)
    assert "train_dataset.__total_batch__ = epoch * sink_size" in source
    assert "dataset.__loop_size__ = 1" in source

    class Dataset:  # pylint: disable=too-few-public-methods
        pass
    dataset = Dataset()
    _compat.set_sink_total(dataset, 12)
    _compat.set_sink_loop_size(dataset, 3)
    assert (dataset.__total_batch__, dataset.__loop_size__) == (12, 3)  # pylint: disable=no-member

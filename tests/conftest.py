"""Test set-up: CPU speed settings before MindSpore loads, PYNATIVE mode, each function's source read once
(source_cache.py), and the model zoo on sys.path."""
import gc
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "model_zoo_lenet")
DOC_PAGES = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "README_CN.md")] + \
    sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))  # the READMEs, then every docs page
DOC_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)  # a fenced block: its language and its code
sys.path.insert(0, ZOO)
sys.path.append(os.path.join(ROOT, "benchmarks"))  # after the tests' own modules: its harness, not its scripts

from src.cpu_speed import apply_env_defaults, set_mode  # noqa: E402  (no MindSpore import)
import source_cache  # noqa: E402  (tests/, on the path as the tests' folder)
from harness import rss_mib  # noqa: E402  (benchmarks/harness/, no MindSpore import)

apply_env_defaults()  # MS_ACCUM_CPU_DEFAULTS=mindspore runs the suite on MindSpore's own defaults instead
source_cache.install()  # MindSpore's parser reads each function's source once, not at every compilation

import mindspore as ms  # noqa: E402
import pytest  # noqa: E402

ms.set_device("CPU")
set_mode("pynative")  # with synchronous kernel launches on CPU (faster there: see README, Performance)


@pytest.fixture(autouse=True)
def _pynative_by_default():
    """Every test starts in PYNATIVE mode; a graph-mode test switches and is switched back."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(params=["pynative", "graph"])
def exec_mode(request):
    """Run the test once in PYNATIVE_MODE and once in GRAPH_MODE."""
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    return request.param


def recycle_limit_mb():
    """The resident memory above which a test process has MindSpore release its compiled graphs at a test file's
    end: ``MS_ACCUM_TEST_RECYCLE_MB`` if set (0: never), else the machine's memory shared among the test processes
    and one more (6 GiB for each of pytest-xdist's three workers on 24 GiB)."""
    given = os.environ.get("MS_ACCUM_TEST_RECYCLE_MB")
    if given is not None:
        if not given.isdigit():
            raise pytest.UsageError(f"MS_ACCUM_TEST_RECYCLE_MB must be an int >= 0 (MiB; 0: never), but got {given!r}")
        return int(given)
    total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 ** 20
    return total_mb // (int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) + 1)


RECYCLE_LIMIT_MB = recycle_limit_mb()


@pytest.fixture(autouse=True, scope="module")
def _collect_once_a_module():
    """The module's objects released for good when it ends (see :func:`_freeze_what_earlier_tests_left`). MindSpore
    keeps every Cell that a compiled graph ran and its graphs for the process's life (docs/tests.md, Memory): where
    the process has grown past :func:`recycle_limit_mb`, ``ms.ms_memory_recycle()`` then releases the graphs, so that
    the workers together stay within the machine's memory (later files compile again what they share with earlier
    ones, which cost the 2.7.0 leg a third more CPU at half this limit, so it is kept for a process that outgrew its
    share)."""
    yield
    gc.unfreeze()
    gc.collect()
    if RECYCLE_LIMIT_MB and rss_mib() > RECYCLE_LIMIT_MB:
        ms.ms_memory_recycle()
        gc.collect()


@pytest.fixture(autouse=True)
def _freeze_what_earlier_tests_left(_collect_once_a_module):
    """MindSpore runs a full ``gc.collect()`` before it compiles each graph, and in a worker that has run hundreds
    of tests each collection walks every object they left alive: 0.1-0.2 s a compilation (test_single_device.py and
    test_accu_cells.py took 228 s in one process, 35 s of it in those collections; 201 s with this fixture). Each
    test starts with the previous test's garbage collected and what is still alive frozen (``gc.freeze``): the
    compilations' collections then walk the current test's objects only. Frozen objects that a module fixture
    releases later are collected when the module ends."""
    gc.collect()
    gc.freeze()


# The files that take longest, longest first (test time of a CI run, 2026-11-28): scripts/run_tests.sh hands whole
# files to its workers in collection order (--no-loadscope-reorder; pytest-xdist otherwise orders them by their
# count of tests), so a long file starts early and the short ones fill the end, instead of one worker running a
# long file alone at the end while the other waits.
LONGEST_FIRST = ("test_benchmarks.py", "test_ecosystem_mindcv.py", "test_lenet_zoo.py", "test_two_nodes.py",
                 "test_resume.py", "test_data_parallel.py", "test_elastic.py", "test_out_of_memory.py",
                 "test_planner_data_parallel.py", "test_paths.py", "test_accu_cells.py",
                 "test_weighting.py", "test_docs.py", "test_check.py", "test_mixed_precision.py", "test_functional.py",
                 "test_noise_scale.py", "test_clipping.py", "test_nonfinite.py", "test_single_device.py")


# The parameters that vary the numbers a test trains on, not what ms_accum builds: which MindSpore optimizer, N, the
# micro-batches' sizes, where a run stops or updates, the learning rate. With --data-cases=first each test runs
# the first value of each (every path, mode, trainer and feature case still runs): .ci/run runs the oldest
# MindSpore release so, and the newest every case (docs/tests.md, CI).
DATA_PARAMETERS = ("optimizer", "sizes", "steps", "stop_after", "update", "lr")


def pytest_addoption(parser):
    parser.addoption("--data-cases", choices=("all", "first"), default="all",
                     help="all (default): every case of a parametrized test; first: only the first value of the "
                          "parameters that vary a test's numbers, not what it builds (" + ", ".join(DATA_PARAMETERS)
                          + ")")


def first_data_case(item):
    """Whether `item` takes the first value of each of :data:`DATA_PARAMETERS` that it is parametrized by on its
    own (a parameter listed with others, as in ``parametrize("steps, error, message", ...)``, names a case of its
    own on each row, and every row runs)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return True
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0].split(",") if isinstance(mark.args[0], str) else list(mark.args[0])
        name = names[0].strip()
        if len(names) == 1 and name in DATA_PARAMETERS and name in callspec.params:
            first = mark.args[1][0]
            first = first.values[0] if hasattr(first, "values") and hasattr(first, "marks") else first
            if callspec.params[name] != first:
                return False
    return True


def pytest_collection_modifyitems(config, items):
    """Order the collected tests by file, :data:`LONGEST_FIRST` first, keeping each file's own order; with
    ``--data-cases=first`` deselect the other data cases (:func:`first_data_case`)."""
    if config.getoption("--data-cases") == "first":
        dropped = [item for item in items if not first_data_case(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if first_data_case(item)]
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))

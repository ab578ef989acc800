"""conftest.py's bound on a test process's memory: past a limit, MindSpore's compiled graphs are released when a test
file ends (docs/tests.md, Memory)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import conftest
from conftest import ROOT


def test_the_limit_is_the_variable_given_or_the_memory_shared_among_the_workers_and_one_more(monkeypatch):
    monkeypatch.setenv("MS_ACCUM_TEST_RECYCLE_MB", "2048")
    assert conftest.recycle_limit_mb() == 2048
    monkeypatch.setenv("MS_ACCUM_TEST_RECYCLE_MB", "0")
    assert conftest.recycle_limit_mb() == 0
    monkeypatch.delenv("MS_ACCUM_TEST_RECYCLE_MB")
    total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 ** 20
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    assert conftest.recycle_limit_mb() == total_mb // 4
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    assert conftest.recycle_limit_mb() == total_mb // 2


@pytest.mark.parametrize("given", ["-1", "3.5", "lots", ""])
def test_a_limit_that_is_not_a_count_of_mib_is_refused(monkeypatch, given):
    monkeypatch.setenv("MS_ACCUM_TEST_RECYCLE_MB", given)
    with pytest.raises(pytest.UsageError, match=f"MS_ACCUM_TEST_RECYCLE_MB must be an int >= 0 .*but got {given!r}"):
        conftest.recycle_limit_mb()


def test_the_resident_memory_read_grows_with_what_this_process_touches():
    """The reading the limit is compared with (benchmarks/harness's ``rss_mib``): 256 MiB written raise it by
    about as much."""
    before = conftest.rss_mib()
    block = np.ones(256 * 2 ** 20 // 8)  # float64: every page written
    grown = conftest.rss_mib() - before
    assert 240 < grown < 300 and block[-1] == 1.0, grown


COMPILES = """
    import numpy as np
    import mindspore as ms

    @ms.jit
    def double(x):
        return x * 2

    def test_compiles():
        assert double(ms.Tensor(np.ones(3, np.float32))).asnumpy().tolist() == [2.0, 2.0, 2.0]
    """
READS = """
    import sys
    import mindspore as ms

    def test_reads():
        api = sys.modules[ms.ms_memory_recycle.__module__]  # mindspore.graph.api (2.10), mindspore.common.api (2.7)
        print("graphs kept after the first file:", len(api.ms_compile_cache))
    """


@pytest.mark.slow
@pytest.mark.parametrize("limit, kept", [("1", 0), ("0", 1), ("1000000", 1)])
def test_past_the_limit_a_test_files_end_releases_the_graphs_mindspore_kept(tmp_path, limit, kept):
    """Two test files in one process on conftest.py: the first compiles an ``ms.jit`` function, the second reads
    MindSpore's cache of compiled functions. Past the limit (1 MiB) it was released at the first file's end; with
    the limit off (0) or not reached it is kept."""
    (tmp_path / "test_a.py").write_text(textwrap.dedent(COMPILES), encoding="utf-8")
    (tmp_path / "test_b.py").write_text(textwrap.dedent(READS), encoding="utf-8")
    env = dict(os.environ, MS_ACCUM_TEST_RECYCLE_MB=limit,
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "conftest",
                           "test_a.py", "test_b.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"graphs kept after the first file: {kept}\n" in done.stdout, done.stdout

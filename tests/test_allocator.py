"""tests/allocator.py and scripts/run_tests.sh: the tests run on mimalloc where the test extra installs it, the
benchmarks a test starts on the C library's malloc."""
import os
import platform
import subprocess
import sys

import pytest

import allocator
from conftest import ROOT

MAPPED = "import sys; sys.path.insert(0, {tests!r}); import allocator; print(allocator.mapped({library!r}))"


def test_mimalloc_path_is_the_library_cmeel_mimalloc_installed(tmp_path):
    assert allocator.mimalloc_path(str(tmp_path)) is None
    lib = tmp_path / "cmeel.prefix" / "lib"
    lib.mkdir(parents=True)
    (lib / "libmimalloc.so").write_bytes(b"")  # the unversioned link is for linking, not for LD_PRELOAD
    assert allocator.mimalloc_path(str(tmp_path)) is None
    for name in ("libmimalloc.so.3.4", "libmimalloc.so.3"):
        (lib / name).write_bytes(b"")
    assert allocator.mimalloc_path(str(tmp_path)) == str(lib / "libmimalloc.so.3")


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                    reason="the test extra installs cmeel-mimalloc on x86-64 Linux only")
def test_the_test_extra_installs_mimalloc_here():
    """Without it scripts/run_tests.sh falls back to the C library's malloc, and the suite takes a fifth more CPU."""
    library = allocator.mimalloc_path()
    assert library is not None and os.path.isfile(library)


def test_user_env_takes_the_tests_allocator_out_of_ld_preload_only():
    library = "/venv/cmeel.prefix/lib/libmimalloc.so.3"
    env = {"LD_PRELOAD": f"{library}:/opt/other.so", allocator.ENV: library, "PATH": "/bin"}
    assert allocator.user_env(env) == {"LD_PRELOAD": "/opt/other.so", "PATH": "/bin"}
    assert allocator.user_env({"LD_PRELOAD": library, allocator.ENV: library}) == {}
    assert allocator.user_env({"LD_PRELOAD": "/opt/other.so"}) == {"LD_PRELOAD": "/opt/other.so"}
    assert env[allocator.ENV] == library  # the caller's copy is left as it was


def test_run_tests_refuses_an_unknown_allocator():
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "run_tests.sh"), "--version"], cwd=ROOT,
                          env=dict(os.environ, TEST_ALLOCATOR="jemalloc"), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "TEST_ALLOCATOR must be 'mimalloc' (the default) or 'system', but got 'jemalloc'" in done.stderr


@pytest.mark.skipif(allocator.ENV not in os.environ, reason="run through scripts/run_tests.sh, which preloads it")
def test_run_tests_preloads_mimalloc_into_the_tests_and_their_processes_but_not_the_benchmarks():
    library = os.environ[allocator.ENV]
    assert allocator.mapped(library)
    assert "MIMALLOC_PURGE_DELAY" in os.environ  # 0 unless the caller chose: tests read resident memory
    code = MAPPED.format(tests=os.path.join(ROOT, "tests"), library=library)
    for env, expected in ((os.environ, "True"), (allocator.user_env(os.environ), "False")):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                              check=True)
        assert done.stdout.strip() == expected, done.stderr

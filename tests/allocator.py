"""The memory allocator of the tests' processes: mimalloc where the test extra installed it (the cmeel-mimalloc
package, on x86-64 Linux), else the C library's malloc.

MindSpore's graph compiler spends much of its time in malloc and free: ``perf record`` of tests/test_weighting.py's
GRAPH_MODE cases put about a fifth of the process's samples in glibc's allocator (``_int_malloc``,
``malloc_consolidate``, ``unlink_chunk``, ``_int_free``). With mimalloc preloaded tests/test_schedule.py took 12 to
28% less CPU on MindSpore 2.10.0 and 4 to 12% less on 2.7.0 (docs/tests.md). scripts/run_tests.sh preloads it
(``LD_PRELOAD``) into the test processes, and so into the processes they start (msrun's workers, the script server's
copies), unless ``TEST_ALLOCATOR=system``; it names the library in :data:`ENV`, and sets ``MIMALLOC_PURGE_DELAY=0``
so that freed memory goes back to the system at once, as a large block does on glibc (with mimalloc's default
delay, tests/test_planner.py's in-process measurement of 8 MiB after 64 read the 64). A benchmark a test runs starts
without it (:func:`user_env`): its memory and timings are the figures the docs quote, measured as a user's process
runs. Run as a script, prints the library's path, or nothing.
"""
import glob
import os
import sysconfig

ENV = "MS_ACCUM_TEST_ALLOCATOR"  # the library scripts/run_tests.sh preloaded, if it did


def mimalloc_path(purelib=None):
    """The mimalloc shared library that cmeel-mimalloc installed under `purelib` (default: this environment's
    site-packages), or None."""
    purelib = sysconfig.get_paths()["purelib"] if purelib is None else purelib
    found = sorted(glob.glob(os.path.join(purelib, "cmeel.prefix", "lib", "libmimalloc.so.*")))
    return found[0] if found else None


def mapped(path, pid="self"):
    """Whether the shared library `path` is mapped into process `pid` (Linux's /proc/<pid>/maps)."""
    real = os.path.realpath(path)
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        return any(line.rstrip("\n").endswith(real) or line.rstrip("\n").endswith(path) for line in maps)


def user_env(env):
    """A copy of the environment `env` without the tests' allocator in ``LD_PRELOAD`` (and without :data:`ENV`):
    the environment of a process that should run as a user's would."""
    env = dict(env)
    library = env.pop(ENV, None)
    if library is not None and "LD_PRELOAD" in env:
        kept = [entry for entry in env["LD_PRELOAD"].split(":") if entry and entry != library]
        if kept:
            env["LD_PRELOAD"] = ":".join(kept)
        else:
            del env["LD_PRELOAD"]
    return env


if __name__ == "__main__":
    print(mimalloc_path() or "")

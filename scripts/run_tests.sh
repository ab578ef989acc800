#!/usr/bin/env bash
# Set up (if needed) and run the test suite on one MindSpore release. Extra arguments go to pytest:
#   bash scripts/run_tests.sh                                # everything, on MindSpore 2.10.0
#   bash scripts/run_tests.sh -m "not slow"                  # the quick subset (no subprocesses, msrun or MindCV)
#   MINDSPORE=2.7.0 bash scripts/run_tests.sh -m "not slow"  # the quick subset on 2.7.0, in its own .venv-mindspore-2.7.0
#   TEST_ALLOCATOR=system bash scripts/run_tests.sh          # on the C library's malloc instead of mimalloc
# Test files run on TEST_WORKERS processes (default: the cores plus one, as the msrun, kill and subprocess tests
# wait on other processes for part of their time; each file whole in one process, so its module fixtures are built
# once and the two-host tests' network namespaces are never shared); TEST_WORKERS=0 runs them in this process, in
# order.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests' processes allocate with mimalloc where the test extra installed it (tests/allocator.py: MindSpore's
# compiler then takes a fifth less CPU); TEST_ALLOCATOR=system runs them on the C library's malloc.
ALLOCATOR=${TEST_ALLOCATOR:-mimalloc}
if [ "$ALLOCATOR" != "mimalloc" ] && [ "$ALLOCATOR" != "system" ]; then
    echo "run_tests: TEST_ALLOCATOR must be 'mimalloc' (the default) or 'system', but got '$ALLOCATOR'" >&2
    exit 2
fi
PY=$(bash scripts/setup.sh)
if [ "$ALLOCATOR" = "mimalloc" ]; then
    LIBRARY=$("$PY" tests/allocator.py)
    if [ -n "$LIBRARY" ]; then
        export LD_PRELOAD="$LIBRARY${LD_PRELOAD:+:$LD_PRELOAD}" MS_ACCUM_TEST_ALLOCATOR="$LIBRARY"
        # Freed memory goes back to the system at once, as glibc gives back a large block: the tests that read a
        # process's resident memory (the planner's in-process measurement) read it as they would on glibc.
        export MIMALLOC_PURGE_DELAY=${MIMALLOC_PURGE_DELAY:-0}
    else
        echo "run_tests: mimalloc is not installed in $(dirname "$(dirname "$PY")") (the test extra installs it on" \
            "x86-64 Linux); the tests run on the C library's malloc, more slowly" >&2
    fi
fi
WORKERS=${TEST_WORKERS:-$(( $(nproc) + 1 ))}
if [ "$WORKERS" = "0" ]; then
    exec "$PY" -m pytest "$@"
fi
exec "$PY" -m pytest -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"

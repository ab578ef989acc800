#!/usr/bin/env bash
# Set up (if needed) and run the test suite on one MindSpore release. Extra arguments go to pytest:
#   bash scripts/run_tests.sh                                # everything, on MindSpore 2.10.0
#   bash scripts/run_tests.sh -m "not slow"                  # the quick subset (no subprocesses, msrun or MindCV)
#   MINDSPORE=2.7.0 bash scripts/run_tests.sh -m "not slow"  # the quick subset on 2.7.0, in its own .venv-mindspore-2.7.0
# Test files run on TEST_WORKERS processes (default: the cores plus one, as the msrun, kill and subprocess tests
# wait on other processes for part of their time; each file whole in one process, so its module fixtures are built
# once and the two-host tests' network namespaces are never shared); TEST_WORKERS=0 runs them in this process, in
# order.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/setup.sh)
WORKERS=${TEST_WORKERS:-$(( $(nproc) + 1 ))}
if [ "$WORKERS" = "0" ]; then
    exec "$PY" -m pytest "$@"
fi
exec "$PY" -m pytest -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"

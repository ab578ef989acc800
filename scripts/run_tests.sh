#!/usr/bin/env bash
# Set up (if needed) and run the test suite on one MindSpore release. Extra arguments go to pytest:
#   bash scripts/run_tests.sh                                # everything, on MindSpore 2.10.0 (about 25 minutes on 2 cores)
#   bash scripts/run_tests.sh -m "not slow"                  # the quick subset (about 6 minutes)
#   MINDSPORE=2.7.0 bash scripts/run_tests.sh -m "not slow"  # the quick subset on 2.7.0, in its own .venv-mindspore-2.7.0
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/setup.sh)
exec "$PY" -m pytest "$@"

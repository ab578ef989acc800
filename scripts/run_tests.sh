#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest:
#   bash scripts/run_tests.sh                 # everything (about 15 minutes on 2 cores)
#   bash scripts/run_tests.sh -m "not slow"   # the quick subset (about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"

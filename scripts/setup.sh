#!/usr/bin/env bash
# Create .venv (if missing) and install ms_accum with its pinned MindSpore 2.10.0, numpy<2 and pytest.
# Idempotent: a second run only checks that the install is complete.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import mindspore, pytest, ms_accum" >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[test]"
fi
.venv/bin/python -c "import mindspore, numpy; print(f'setup: MindSpore {mindspore.__version__}, numpy {numpy.__version__}')" 2>/dev/null

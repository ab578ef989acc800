#!/usr/bin/env bash
# Create a virtual environment (if missing) with one MindSpore release, numpy<2, ms_accum (editable), pytest,
# matplotlib, mimalloc (the tests' allocator, on x86-64 Linux: tests/allocator.py) and MindCV 0.3.0 (the ecosystem
# tests' models). Prints the environment's python on standard output (what it did goes to standard error):
# PY=$(bash scripts/setup.sh).
#   bash scripts/setup.sh                      # MindSpore 2.10.0 in .venv
#   MINDSPORE=2.7.0 bash scripts/setup.sh      # MindSpore 2.7.0 in .venv-mindspore-2.7.0 (any release 2.7.0-2.10.x)
# Idempotent: a second run only checks that the install is complete, of the asked release, and made from the
# current pyproject.toml (its dependencies may have changed since).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MINDSPORE=${MINDSPORE:-2.10.0}
if [ "$MINDSPORE" = "2.10.0" ]; then VENV=${VENV:-.venv}; else VENV=${VENV:-.venv-mindspore-$MINDSPORE}; fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PY=$VENV/bin/python
CHECK="import mindspore, pytest, xdist, matplotlib, mindcv, ms_accum; assert mindspore.__version__ == '$MINDSPORE'"
STAMP=$VENV/.ms_accum-pyproject.sha256
if ! "$PY" -c "$CHECK" >/dev/null 2>&1 || ! sha256sum --status -c "$STAMP" 2>/dev/null; then
    # A release takes about 1 GB to download and 2.7 GB installed, and pip unpacks it in TMPDIR: say so before pip
    # fails half-way with "No space left on device". (Not when only ms_accum's own dependencies are to install.)
    NEED_MB=${SETUP_NEED_MB:-4096}
    if ! "$PY" -c "import mindspore; assert mindspore.__version__ == '$MINDSPORE'" >/dev/null 2>&1; then
        for dir in "$VENV" "${TMPDIR:-/tmp}"; do
            free_mb=$(df -Pm "$dir" | awk 'NR == 2 {print $4}')
            if [ "$free_mb" -lt "$NEED_MB" ]; then
                echo "setup: installing MindSpore $MINDSPORE needs about $NEED_MB MB free where $dir lies, but" \
                    "$free_mb MB is free; free some space (old virtual environments or clones, pytest's" \
                    "/tmp/pytest-of-$(id -un)) or set VENV= or TMPDIR= to a larger disk." >&2
                exit 1
            fi
        done
    fi
    echo "setup: installing MindSpore $MINDSPORE and ms_accum into $VENV (about 1 GB to download)" >&2
    "$PY" -m pip install --quiet --no-cache-dir --upgrade pip >&2
    # MindSpore first and pinned, so that nothing installed after it can replace it.
    "$PY" -m pip install --quiet --no-cache-dir "mindspore==$MINDSPORE" "numpy<2" >&2
    "$PY" -m pip install --quiet --no-cache-dir -c <(echo "mindspore==$MINDSPORE") -e ".[test,ecosystem]" >&2
    sha256sum pyproject.toml > "$STAMP"
fi
"$PY" -c "import mindspore, numpy; print(f'setup: MindSpore {mindspore.__version__}, numpy {numpy.__version__} in $VENV')" \
    >&2 2>/dev/null
echo "$PY"

"""MindSpore's compile cache (MS_COMPILER_CACHE_ENABLE=1): every ms_accum Cell path compiles, stores its graphs,
and on the second run loads them and trains to the same parameters as plain large-batch training.

A `raise` in a graph (the window's checks) is a PyExecute node, which the cache cannot store ("Cannot export a
PyExecute CNode in MindIR" at the first window's end); with the cache on, the checks are MindSpore's Assert
(ms_accum/core/runtime_checks.py). Each run is a fresh process (tests/cache_worker.py).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import assert_params_close, micro_batches, reference_train
from conftest import ROOT

WORKER = os.path.join(ROOT, "tests", "cache_worker.py")
SIZES, STEPS = (3, 5, 4, 4, 2, 6), 3


def run_worker(path, out, cache):
    env = dict(os.environ, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=str(cache))
    done = subprocess.run([sys.executable, WORKER, path, str(out)], capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with np.load(out) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))], done


@pytest.mark.slow
@pytest.mark.parametrize("path", ["three-cells", "driver", "model-accu"])
def test_a_second_run_loads_the_cached_graphs_and_trains_alike(path, tmp_path):
    batches = micro_batches(SIZES, seed=5)
    want = list(reference_train("momentum", [batches[:STEPS], batches[STEPS:]]).values())
    first, _ = run_worker(path, tmp_path / "first.npz", tmp_path / "cache")
    assert_params_close(dict(enumerate(first)), dict(enumerate(want)),
                        context=f"{path}, first run (compiling and storing)")
    assert os.listdir(tmp_path / "cache"), "nothing was stored in the compile cache"
    second, _ = run_worker(path, tmp_path / "second.npz", tmp_path / "cache")
    assert_params_close(dict(enumerate(second)), dict(enumerate(want)), context=f"{path}, second run (from the cache)")


@pytest.mark.slow
def test_with_the_cache_a_window_without_items_still_stops_before_the_update(tmp_path):
    """The check survives as an Assert: the optimizer is not stepped."""
    for run in ("first", "second"):
        _, done = run_worker("zero-items", tmp_path / f"{run}.npz", tmp_path / "cache")
        assert "STOPPED: assert failed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        assert "For 'Assert' condition is false." in done.stdout + done.stderr
        assert "UNCHANGED" in done.stdout, f"{run} run: the optimizer stepped on a window without items"

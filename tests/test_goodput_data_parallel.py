"""A GoodputAccumulation that calibrates, in DATA_PARALLEL across two real processes on CPU (msrun, 127.0.0.1), down
to N = 1 (min_steps=1, which data parallel allows: each window still holds a micro-batch a device).

The ranks run goodput_dp_worker.py, whose windows report (0.01 N + 0.05) x (1 + rank) seconds: rank 1 is the slow
device. Every rank must calibrate from the slowest device's times, freeze the same constants, and choose the same
N window after window (a rank choosing otherwise would wait alone at the gradient reduction); a run resumed from
its state file, inside the calibration or after it, decides as the uninterrupted run.
"""
import os

import numpy as np
import pytest

from goodput_dp_worker import T_END, T_MICRO
from helpers import run_local

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = ("graph:full", "graph:cut3", "graph:resume3", "graph:cut8", "graph:resume8", "pynative:full")


@pytest.fixture(scope="module")
def goodput_runs(tmp_path_factory):
    """Every run of goodput_dp_worker.py in one msrun job of two workers; {run: [rank 0's arrays, rank 1's]}."""
    out = tmp_path_factory.mktemp("goodput_dp")
    run_local(out, os.path.join(HERE, "goodput_dp_worker.py"), out, *RUNS, timeout=600)
    return {run: [dict(np.load(out / f"{run.replace(':', '_')}_rank_{rank}.npz")) for rank in (0, 1)]
            for run in RUNS}


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_every_rank_freezes_the_slowest_devices_constants_and_chooses_the_same_n(goodput_runs, mode):
    ranks = goodput_runs[f"{mode}:full"]
    slowest = (2 * T_MICRO, 2 * T_END)  # rank 1's: a rank calibrating from its own clock would hold rank 0's
    for rank, arrays in enumerate(ranks):
        np.testing.assert_allclose(arrays["policy_constants"], slowest, rtol=1e-6, err_msg=f"rank {rank}")
        np.testing.assert_allclose(arrays["device_constants"], slowest, rtol=1e-6, err_msg=f"rank {rank}")
    steps = [arrays["steps"].tolist() for arrays in ranks]
    assert steps[0] == steps[1], steps
    assert steps[0][:4] == [1, 1, 2, 2] and len(set(steps[0][4:])) > 1, steps[0]  # calibration, then decisions
    assert len(steps[0]) > 8 and all(1 <= n <= 8 for n in steps[0]), steps[0]
    # min_steps=1 in data parallel: every window, N = 1's too, holds one micro-batch a device and an estimate
    for rank, arrays in enumerate(ranks):
        assert np.isfinite(arrays["noise_trace"]).all(), (rank, arrays["noise_trace"], steps[0])
    for name in (key for key in ranks[0] if key.startswith("param:")):
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=f"{name} differs between ranks")


def test_pynative_and_graph_mode_choose_the_same_n(goodput_runs):
    assert goodput_runs["pynative:full"][0]["steps"].tolist() == goodput_runs["graph:full"][0]["steps"].tolist()


@pytest.mark.parametrize("cut", [3, 8])  # inside the calibration (windows 0-3), after it
def test_a_resumed_run_decides_as_the_uninterrupted_one(goodput_runs, cut):
    full = goodput_runs["graph:full"]
    for rank in (0, 1):
        before = goodput_runs[f"graph:cut{cut}"][rank]["steps"].tolist()
        after = goodput_runs[f"graph:resume{cut}"][rank]["steps"].tolist()
        assert len(before) == cut and before + after == full[rank]["steps"].tolist(), (before, after)
        np.testing.assert_allclose(goodput_runs[f"graph:resume{cut}"][rank]["policy_constants"],
                                   full[rank]["policy_constants"], rtol=1e-6)
        for name in (key for key in full[rank] if key.startswith("param:")):
            np.testing.assert_allclose(goodput_runs[f"graph:resume{cut}"][rank][name], full[rank][name], rtol=1e-5,
                                       atol=1e-6, err_msg=f"rank {rank}, {name}")

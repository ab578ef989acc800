"""The planner's own plan trained on two devices: plan_micro_batch, on two msrun CPU processes (DATA_PARALLEL,
127.0.0.1) whose measured peaks differ, plans a global batch that no one micro-batch holds under the budget, so
N > 1; Model_ACCU trains with the plan it returned (tests/planner_dp_worker.py), and both ranks end with the
parameters of one process's large-batch steps on each window's global batch, built without ms_accum."""
import os
from functools import partial

import numpy as np
import pytest

from helpers import assert_equals_large_batch, reference_train, run_local
from planner_dp_worker import BUDGET_MIB, GLOBAL_BATCH, PEAKS_MIB, WINDOWS, global_windows

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's plan, parameters and optimizer step, from one msrun job of two workers."""
    out = tmp_path_factory.mktemp("planned")
    run_local(out, os.path.join(HERE, "planner_dp_worker.py"), out, timeout=300)
    return [dict(np.load(out / f"rank_{rank}.npz")) for rank in range(WORLD)]


def test_both_devices_take_the_plan_of_the_larger_peaks_with_n_above_1(ranks):
    """The largest micro-batch b dividing the global batch's share of a device whose peak fits the budget on both
    ranks (rank 1's peaks are the larger), N the rest of the share: 4 x 4 x 2 devices = 32."""
    share = GLOBAL_BATCH // WORLD
    fits = [b for b in range(1, share + 1)
            if share % b == 0 and max(fixed + per_sample * b for fixed, per_sample in PEAKS_MIB.values()) <= BUDGET_MIB]
    want = [max(fits), share // max(fits), WORLD, GLOBAL_BATCH]
    assert want[1] > 1, f"the budget must leave the plan more than one micro-batch a window: {want}"
    for rank, arrays in enumerate(ranks):
        assert list(arrays["plan"]) == want, f"rank {rank} planned (b, N, devices, G) {list(arrays['plan'])}"


def test_the_planned_run_on_two_devices_equals_the_large_batch(ranks):
    """One optimizer step a window on both ranks, parameters identical across ranks, and the update equal to
    nn.TrainOneStepCell's on each window's 32 samples at once (helpers.assert_equals_large_batch)."""
    windows = [[window] for window in global_windows()]
    trained = [{k[len("param:"):]: v for k, v in arrays.items() if k.startswith("param:")} for arrays in ranks]
    for rank, arrays in enumerate(ranks):
        assert int(arrays["global_step"][0]) == WINDOWS, f"rank {rank}: {arrays['global_step']} optimizer steps"
        for name, value in trained[rank].items():
            np.testing.assert_array_equal(value, trained[0][name], err_msg=f"{name} differs between ranks")
        assert_equals_large_batch(trained[rank], partial(reference_train, "momentum"), windows,
                                  context=f"rank {rank}, the planned run on two devices")

"""One rank of tests/test_planner_data_parallel.py, launched by msrun on two CPU processes (DATA_PARALLEL):
plan_micro_batch plans the micro-batch on both ranks, and Model_ACCU trains with the plan it returned.

    msrun ... tests/planner_dp_worker.py OUT

Each rank measures its own peaks (:data:`PEAKS_MIB`) and plans GLOBAL_BATCH samples an update under BUDGET_MIB
with world=2; it then takes its share of every window of the global stream (:func:`global_windows`), batches it
at the plan's micro-batch and trains through ``Model_ACCU.train(..., plan=plan)``. It saves the plan and its
parameters to OUT/rank_<r>.npz.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo_lenet"))

import source_cache  # noqa: E402  (tests/, this file's folder)
from src.cpu_speed import apply_env_defaults, set_mode  # noqa: E402

apply_env_defaults()
source_cache.install()  # each function's source read once, as in the test processes

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init, release  # noqa: E402

import ms_accum  # noqa: E402
from helpers import build, micro_batches  # noqa: E402

GLOBAL_BATCH, WINDOWS, BUDGET_MIB = 32, 3, 200
PEAKS_MIB = {0: (100, 10), 1: (100, 14)}  # (fixed, per sample) by rank: rank 1's micro-batches cost more


def measure_on(rank):
    """Rank `rank`'s measure: a peak of fixed + per sample x b MiB (no device here reports its own)."""
    fixed, per_sample = PEAKS_MIB[rank]
    return lambda b: ms_accum.Measurement(b, (fixed + per_sample * b) * 2 ** 20)


def global_windows():
    """The global stream: WINDOWS windows of GLOBAL_BATCH samples, each one (images, labels) pair."""
    return micro_batches([GLOBAL_BATCH] * WINDOWS, seed=11)


def rank_share(rank, world):
    """Rank `rank`'s samples: its contiguous 1/world of every window, window after window."""
    share = GLOBAL_BATCH // world
    windows = global_windows()
    return tuple(np.concatenate([part[rank * share:(rank + 1) * share] for part in parts]) for parts in zip(*windows))


def main():
    out = sys.argv[1]
    ms.set_device("CPU")
    set_mode("graph")
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True, device_num=world)
    plan = ms_accum.plan_micro_batch(measure_on(rank), GLOBAL_BATCH, f"{BUDGET_MIB}MiB", devices=world, world=world,
                                     verbose=False)
    print(f"rank {rank}/{world} planned {plan}", flush=True)
    images, labels = rank_share(rank, world)
    data = ds.NumpySlicesDataset({"x": images, "y": labels}, shuffle=False).batch(plan.micro_batch)
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt)
    ms_accum.Model_ACCU(cell).train(1, data, dataset_sink_mode=False, plan=plan)
    arrays = {f"param:{p.name}": p.asnumpy() for p in net.get_parameters()}
    arrays["plan"] = np.array([plan.micro_batch, plan.steps, plan.devices, plan.global_batch_size])
    arrays["global_step"] = opt.global_step.asnumpy()
    np.savez(os.path.join(out, f"rank_{rank}.npz"), **arrays)
    print(f"rank {rank}/{world} done", flush=True)
    release()


if __name__ == "__main__":
    main()

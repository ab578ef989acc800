"""A calibrating GoodputAccumulation in data parallel: one msrun rank, ``goodput_dp_worker.py OUT RUN [RUN ...]``.

Each RUN is ``MODE:ROLE`` (MODE graph or pynative), run one after another in the same processes (one launch):
ROLE ``full`` trains the whole run, ``cutK`` the same run stopped after K updates (its state written at every
update), ``resumeK`` the run resumed from that cut run's state file. Each saves to OUT/<mode>_<role>_rank_<r>.npz
the N of every window (``steps``, from telemetry), the constants the policy froze and the device holds, and the
final parameters.

Each window's time is reported as (T_MICRO x N + T_END) x (1 + rank), not its wall time: rank 1 is the slow
device, and a device that calibrated from its own times would freeze constants other than rank 1's. The wall time
of this tiny model is noise, and no timing belongs in a test; what is tested is that every rank reports the
slowest device's times, freezes the same constants and chooses the same N.
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

import ms_accum  # noqa: E402
from ms_accum.core.engine import WindowEngine  # noqa: E402
from helpers import StopAt  # noqa: E402

SAMPLES, FEATURES, MICRO, EPOCHS = 512, 6, 4, 1
T_MICRO, T_END = 0.01, 0.05
DATA_SEED, NET_SEED = 11, 3


def policy():
    """Windows 0-1 at N = 1, 2-3 at N = 2 (the calibration), then a decision every 2 windows in [1, 8]. N = 1 is
    allowed in data parallel: a window holds one micro-batch a device, two in all, and so a noise estimate."""
    return ms_accum.GoodputAccumulation(min_steps=1, max_steps=8, interval=2, calibration_windows=2)


def report_times(rank):
    """Each window's time as rank `rank`'s clock would give it here: see the module's docstring."""
    def report(cell, micro_batches):
        if micro_batches is not None:
            seconds = (T_MICRO * micro_batches + T_END) * (1 + rank)
            cell.observe_window(int(cell.accu_windows.asnumpy()) - 1, micro_batches, seconds)
    WindowEngine._time_window = report  # pylint: disable=protected-access


def dataset(rank, world):
    """A noisy regression shared out by MindSpore's sampler, one order for every run."""
    ds.config.set_seed(DATA_SEED)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=(FEATURES, 2))) + rng.normal(scale=0.5, size=(SAMPLES, 2))).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=world, shard_id=rank).batch(MICRO)


def train(rank, world, state_path, role, resume_from=None):
    """One run; what it saves (see the module's docstring)."""
    ms.set_seed(NET_SEED)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.Tanh(), nn.Dense(16, 2))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    goodput = policy()
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, noise_scale=True,
                                       gradient_accumulation_steps=goodput)
    model = ms_accum.Model_ACCU(cell, state_path=state_path, save_state_every=1)
    telemetry = ms_accum.WindowTelemetry()
    callbacks = [telemetry] + ([StopAt(int(role[len("cut"):]))] if role.startswith("cut") else [])
    model.train(EPOCHS, dataset(rank, world), callbacks=callbacks, resume_from=resume_from, dataset_sink_mode=False)
    arrays = {f"param:{p.name}": p.asnumpy() for p in net.trainable_params()}
    arrays["steps"] = np.array([r.accumulation_steps for r in telemetry.records], np.int32)
    arrays["micro_batches"] = np.array([r.micro_batches for r in telemetry.records], np.int32)
    arrays["noise_scale"] = np.array([r.noise_scale for r in telemetry.records], np.float64)
    arrays["noise_trace"] = np.array([r.noise_trace for r in telemetry.records], np.float64)
    arrays["policy_constants"] = np.array(goodput.device_constants, np.float64)
    arrays["device_constants"] = cell.accu_goodput_constants.asnumpy()
    return arrays


def main(out, *runs):
    from mindspore.communication import get_group_size, get_rank, init, release  # pylint: disable=C0415
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    report_times(rank)
    for run in runs:
        mode, role = run.split(":")
        set_mode(mode)
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=world)
        state = os.path.join(out, f"{mode}_{role}", f"rank_{rank}", "state.ckpt")
        resume_from = None
        if role.startswith("resume"):
            resume_from = os.path.join(out, f"{mode}_cut{role[len('resume'):]}", f"rank_{rank}", "state.ckpt")
        arrays = train(rank, world, state, role, resume_from)
        np.savez(os.path.join(out, f"{mode}_{role}_rank_{rank}.npz"), **arrays)
        print(f"rank {rank}/{world}: {run} done", flush=True)
    release()


if __name__ == "__main__":
    main(*sys.argv[1:])

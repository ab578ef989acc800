"""Elastic resume through the API: Model_ACCU (or the driver) with a global batch, on msrun ranks or on one device.

As a script, one msrun rank: ``elastic_worker.py OUT ROLE [ROLE ...]``, the roles run one after another in the
same processes (one launch); ROLE ``full`` trains the whole run, ``cut`` the same run stopped by a callback after
CUT_AT updates (its state written at that boundary), ``resume=RESUME`` the run resumed from the state file RESUME;
``full@RULE`` and ``cut@RULE`` train with the learning-rate rule RULE and G0 = RULE_REFERENCE (:func:`train`);
``driver-full`` and ``driver-cut`` train as ``full`` and ``cut`` with ``GradientAccumulation.train_process``.
Each saves its final parameters to OUT/<role>_rank_<r>.npz. The test module
imports the same pieces to run them on one device (test_elastic.py).

The data is one shuffled data set sharded with MindSpore's distributed sampler (num_shards/shard_id, one device
included), 248 samples: with a micro-batch of 4 and a global batch of 16, 2 devices run N = 2 over 31
micro-batches an epoch and 1 device N = 4 over 62; both see 15 windows and drop the tail.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo_lenet"))

import source_cache  # noqa: E402  (tests/, this file's folder)
from src.cpu_speed import apply_env_defaults  # noqa: E402

apply_env_defaults()
source_cache.install()  # each function's source read once, as in the test processes

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.train import Callback  # noqa: E402

import ms_accum  # noqa: E402
from helpers import StopAt  # noqa: E402

SAMPLES, FEATURES, MICRO, GLOBAL, EPOCHS, CUT_AT = 248, 6, 4, 16, 2, 20
UPDATES = SAMPLES // GLOBAL * EPOCHS
RULE_REFERENCE = GLOBAL // 2  # G0 of the runs with a rule: each window of G is 2 reference steps
DATA_SEED, NET_SEED = 11, 3


def samples():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(FEATURES, 2))).astype(np.float32)
    return x, y


def dataset(rank, world):
    """The run's data on rank `rank` of `world`: one order of every epoch, shared out by MindSpore's sampler."""
    ds.config.set_seed(DATA_SEED)
    x, y = samples()
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=world, shard_id=rank).batch(MICRO)


def network():
    ms.set_seed(NET_SEED)
    return nn.SequentialCell(nn.Dense(FEATURES, 16), nn.Tanh(), nn.Dense(16, 2))


def learning_rates(count=UPDATES):
    """One rate per update (per reference step with a rule: `count` of them), so that a resume that miscounted
    updates, or progress, would show."""
    return [0.2 * (1.0 - 0.5 * u / count) for u in range(count)]


def rule_steps():
    """The reference steps of a run with a rule that Model_ACCU asks a rate for: every sample over G0, the tail
    that partial_window="drop" leaves out included."""
    return SAMPLES * EPOCHS // RULE_REFERENCE


class LossLog(Callback):
    """Each update's reported loss (the window's mean over every device's samples)."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))


def train(rank, world, state_path=None, save_state_every=0, resume_from=None, stop_at=None, rule=None,
          trainer="model_accu"):
    """One run of Model_ACCU (`trainer` "model_accu") or of the driver ("driver") with global_batch_size=GLOBAL;
    its network's parameters, and under "losses" the loss of every update. With `rule` (a learning-rate rule) G0
    is RULE_REFERENCE and the rates are laid out over the run's reference steps; "progress" and "applied_rate" are
    saved too."""
    net = network()
    steps = rule_steps() if rule else UPDATES
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=learning_rates(steps), momentum=0.9)
    scaling = dict(lr_scaling=rule, reference_batch=RULE_REFERENCE) if rule else {}
    log = LossLog()
    callbacks = [log] + ([StopAt(stop_at)] if stop_at else [])
    if trainer == "driver":
        driver = ms_accum.GradientAccumulation(net, nn.MSELoss(), optimizer, **scaling)
        cell = driver.cell
        driver.train_process(EPOCHS, dataset(rank, world), callbacks=callbacks, partial_window="drop",
                             ckpt_path=None, log_every=0, state_path=state_path, save_state_every=save_state_every,
                             resume_from=resume_from, global_batch_size=GLOBAL)
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, **scaling)
        model = ms_accum.Model_ACCU(cell, state_path=state_path, save_state_every=save_state_every)
        model.train(EPOCHS, dataset(rank, world), callbacks=callbacks, resume_from=resume_from,
                    partial_window="drop", global_batch_size=GLOBAL)
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    params["losses"] = np.array(log.losses)
    if rule:
        params["progress"] = np.array(cell.lr_state.progress)
        params["applied_rate"] = cell.accu_lr_applied.asnumpy()
    return params


def main(out, *roles):
    from mindspore.communication import get_group_size, get_rank, init, release  # noqa: E402
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    for argument in roles:
        role, _, resume = argument.partition("=")
        name, _, rule = role.partition("@")
        state = os.path.join(out, role, f"rank_{rank}", "state.ckpt")
        trainer, _, name = name.rpartition("-")
        params = train(rank, world, state_path=state, save_state_every=1, resume_from=resume or None,
                       stop_at=CUT_AT if name == "cut" else None, rule=rule or None, trainer=trainer or "model_accu")
        np.savez(os.path.join(out, f"{role}_rank_{rank}.npz"), **params)
        print(f"rank {rank}/{world}: {role} done", flush=True)
    release()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Writes driver_schedule_format4.ckpt and driver_adaptive_format4.ckpt: exact states of GradientAccumulation as
ms_accum wrote them before the driver drove one engine cell (state format 4, commit 39231fe), written inside a
window. tests/test_resume.py resumes them with the current code. Run with that commit's ms_accum on the path:
    PYTHONPATH=<checkout of 39231fe> python tests/data/make_driver_states_format4.py
"""
import os
import shutil
import tempfile

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

import ms_accum

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = {  # file: (trainer arguments, train_process arguments)
    "driver_schedule_format4.ckpt": ({}, dict(gradient_accumulation_steps={0: 2, 2: 3})),
    "driver_adaptive_format4.ckpt": (dict(noise_scale=True), dict(
        gradient_accumulation_steps=ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=4, interval=1,
                                                                  initial_steps=2))),
}


def data():
    """40 samples of 6 features, 3 targets, in micro-batches of 4: 10 an epoch."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 6)).astype(np.float32), rng.normal(size=(40, 3)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)


def trainer(**kwargs):
    """Dense(6, 3), MSE, Momentum, its weights from seed 0."""
    ms.set_seed(0)
    net = nn.Dense(6, 3)
    return net, ms_accum.GradientAccumulation(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                              **kwargs)


if __name__ == "__main__":
    for name, (built, run) in RUNS.items():
        scratch = tempfile.mkdtemp()
        path = os.path.join(scratch, "state.ckpt")
        _, t = trainer(**built)
        # written every 7 micro-batches: the newest at 14, the first micro-batch of a window of epoch 2
        t.train_process(2, data(), ckpt_path=None, log_every=0, state_path=path, save_state_every=7, **run)
        shutil.copyfile(path, os.path.join(HERE, name))
        shutil.rmtree(scratch)
        print("wrote", name)

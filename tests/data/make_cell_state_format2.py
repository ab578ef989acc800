"""Writes cell_format2.ckpt: the exact state of a TrainAccuStepsCell as ms_accum 0.2.0 wrote it (state format 2,
commit 943aee3), inside a window of N = 2 after its first micro-batch of 4 samples (x = rows 0-3 of `data()`).
tests/test_resume.py resumes it with the current code. Run with that commit's ms_accum on the path:
    PYTHONPATH=<checkout of 943aee3> python tests/data/make_cell_state_format2.py
"""
import os

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

import ms_accum

HERE = os.path.dirname(os.path.abspath(__file__))


def data():
    """8 samples of 4 features and 2 targets: two micro-batches of 4."""
    rng = np.random.default_rng(2)
    return rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)


def main():
    ms.set_seed(0)
    net = nn.Dense(4, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       accumulation_steps=2)
    x, y = data()
    cell.set_train(True)
    cell(Tensor(x[:4]), Tensor(y[:4]))
    print(ms_accum.__version__, ms_accum.save_training_state(cell, os.path.join(HERE, "cell_format2.ckpt"),
                                                             micro_steps_done=1, updates_done=1))


if __name__ == "__main__":
    main()

"""Real dataset sink mode on a GPU: Model_ACCU's two sunk graphs against large-batch training on the same GPU
(helpers.assert_equals_large_batch: the update, at float32's rounding, and a wrong window failing).

Run by test_model_accu.py::test_real_sink_mode_on_gpu when MindSpore can use a GPU; prints
'sink equivalence ok' and the largest relative difference, or exits non-zero.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

import ms_accum  # noqa: E402
from helpers import assert_equals_large_batch, build, micro_batches, numpy_dataset, params_of, reference_train  # noqa

ms.set_device("GPU")
ms.set_context(mode=ms.GRAPH_MODE)
N, BATCHES = 4, micro_batches((8,) * 16)
net, loss, opt = build("momentum")
cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=N)
ms_accum.Model_ACCU(cell).train(2, numpy_dataset(BATCHES), dataset_sink_mode=True, sink_size=8)
windows = [BATCHES[i:i + N] for i in range(0, 16, N)]
assert_equals_large_batch(params_of(net), lambda part: reference_train("momentum", part), windows, context="GPU sink")
assert opt.global_step.asnumpy()[0] == 4, opt.global_step.asnumpy()
print("sink equivalence ok")

"""Train through one ms_accum path in a fresh process, for tests/test_compile_cache.py (run it with
MS_COMPILER_CACHE_ENABLE=1 and MS_COMPILER_CACHE_PATH set): two windows of unequal micro-batches, then the
parameters saved to OUT (.npz).

    python tests/cache_worker.py {three-cells,driver,driver-clip,model-accu,zero-items} OUT

driver-clip is the driver clipping every window's gradient to norm 0.05.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

import ms_accum  # noqa: E402
from helpers import accumulate_train, build, micro_batches, numpy_dataset, params_of  # noqa: E402

SIZES = (3, 5, 4, 4, 2, 6)  # two windows of three micro-batches
STEPS = 3


class _NoItems(nn.Cell):
    """A loss network reporting no items for its micro-batches: a mistake the window's end must stop at."""

    def __init__(self, net, loss):
        super().__init__()
        self.net, self.loss = net, loss

    def construct(self, x, y):
        return self.loss(self.net(x), y), ops.zeros((), ms.float32)


def main(path, out):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    batches = micro_batches(SIZES[::-1] if path == "driver-sizes" else SIZES, seed=5)  # another first micro-batch
    windows = [batches[:STEPS], batches[STEPS:]]
    if path == "three-cells":
        params, _ = accumulate_train("momentum", windows)
    elif path == "zero-items":
        net, loss, opt = build("momentum")
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(_NoItems(net, loss), opt, grad_sum)
        optim = ms_accum.TrainOptim(opt, grad_sum)
        for x, y in windows[0]:
            forward_backward(Tensor(x), Tensor(y))
        before = params_of(net)
        try:
            optim()
        except RuntimeError as error:
            print(f"STOPPED: {str(error).strip().splitlines()[0]}")
            after = params_of(net)
            print("UNCHANGED" if all(np.array_equal(after[k], v) for k, v in before.items()) else "CHANGED")
            np.savez(out, *after.values())
            return
        raise AssertionError("the window's end did not stop at a micro-batch with no items")
    else:
        net, loss, opt = build("momentum")
        if path in ("driver", "driver-clip", "driver-sizes"):
            clip_norm = 0.05 if path == "driver-clip" else None
            ms_accum.GradientAccumulation(net, loss, opt, clip_norm=clip_norm).train_process(
                1, numpy_dataset(batches), STEPS, ckpt_path=None, log_every=0)
        else:
            cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, gradient_accumulation_steps=STEPS)
            ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches), dataset_sink_mode=False)
        params = params_of(net)
    np.savez(out, *params.values())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

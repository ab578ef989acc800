"""Loss scaling on one device: the three cells and the driver with a scale Tensor or a loss-scale update cell."""
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from helpers import assert_equals_large_batch, build, micro_batches, numpy_dataset, params_of, reference_train

N = 3
SCALES = {
    "dynamic": lambda: nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 100),
    "fixed_cell": lambda: nn.FixedLossScaleUpdateCell(2.0 ** 10),
    "tensor": lambda: Tensor(2.0 ** 10, ms.float32),
}


def three_cells(scale_sense, optimizer="momentum"):
    net, loss, opt = build(optimizer)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum,
                                                     scale_sense=scale_sense)
    return net, opt, forward_backward, ms_accum.TrainOptim(opt, grad_sum, scale_sense=scale_sense), \
        ms_accum.TrainClear(grad_sum)


def poisoned(batches, index):
    out = [(x.copy(), y) for x, y in batches]
    out[index][0][0, 0, 0, 0] = np.inf
    return out


@pytest.mark.parametrize("kind", sorted(SCALES))
def test_clean_windows_equal_the_large_batch(kind, exec_mode):
    batches = micro_batches((4, 3, 4, 2, 4, 4), seed=5)
    windows = [batches[:N], batches[N:]]
    net, opt, forward_backward, optim, clear = three_cells(SCALES[kind]())
    for window in windows:
        for x, y in window:
            forward_backward(Tensor(x), Tensor(y))
        loss, overflow, scale = optim()
        clear()
        assert not bool(overflow.asnumpy()) and float(scale.asnumpy()) == 1024.0
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), windows,
                              context=f"{kind}, {exec_mode}")


@pytest.mark.parametrize("kind", ["dynamic", "tensor"])
def test_overflow_in_any_micro_batch_skips_the_whole_window(kind, exec_mode):
    batches = micro_batches((4,) * 6, seed=6)
    net, opt, forward_backward, optim, clear = three_cells(SCALES[kind]())
    params_before = params_of(net)
    state_before = {p.name: p.asnumpy().copy() for p in opt.get_parameters()}
    for x, y in poisoned(batches[:N], 1):
        forward_backward(Tensor(x), Tensor(y))
    _, overflow, scale = optim()
    clear()
    expected_scale = 512.0 if kind == "dynamic" else 1024.0
    assert bool(overflow.asnumpy()) and float(scale.asnumpy()) == expected_scale
    for name, value in params_of(net).items():
        np.testing.assert_array_equal(value, params_before[name], err_msg=f"{name} moved in a skipped window")
    for param in opt.get_parameters():
        np.testing.assert_array_equal(param.asnumpy(), state_before[param.name],
                                      err_msg=f"optimizer state {param.name} changed in a skipped window")
    for x, y in batches[N:]:
        forward_backward(Tensor(x), Tensor(y))
    _, overflow, scale = optim()
    assert not bool(overflow.asnumpy()) and float(scale.asnumpy()) == expected_scale, "scale updated twice"
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[N:]],
                              context="window after overflow")


def test_driver_skips_overflowing_windows_and_counts_them(tmp_path, exec_mode):
    batches = poisoned(micro_batches((4,) * 6, seed=7), 4)  # the second window overflows
    net, loss, opt = build("momentum")
    telemetry = ms_accum.WindowTelemetry()
    trainer = ms_accum.GradientAccumulation(net, loss, opt, scale_sense=SCALES["dynamic"]())
    trainer.train_process(1, numpy_dataset(batches), N, callbacks=[telemetry], ckpt_path=str(tmp_path / "f.ckpt"),
                          log_every=0)
    assert [(r.overflow, r.loss_scale) for r in telemetry.records] == [(False, 1024.0), (True, 512.0)]
    assert telemetry.skipped == 1 and opt.global_step.asnumpy()[0] == 1
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[:N]],
                              context="driver, skipped")
    saved = ms.load_checkpoint(str(tmp_path / "f.ckpt"))
    assert float(saved["scale_sense"].asnumpy()) == 512.0, "the loss scale belongs in the checkpoint"


def test_cells_on_one_grad_sum_must_share_the_scale():
    net, loss, opt = build("momentum")
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum, scale_sense=SCALES["dynamic"]())
    with pytest.raises(ValueError, match=r"For 'TrainOptim', 'scale_sense' must match the other cells built on this "
                                         r"grad_sum \(a DynamicLossScaleUpdateCell object\), but got None. Pass the "
                                         r"same 'scale_sense' object"):
        ms_accum.TrainOptim(opt, grad_sum)
    with pytest.raises(ValueError, match=r"\(a DynamicLossScaleUpdateCell object\), but got another "
                                         r"DynamicLossScaleUpdateCell object, not the same one. Pass the same"):
        ms_accum.TrainOptim(opt, grad_sum, scale_sense=SCALES["dynamic"]())


STARTS = "the loss scale of 'scale_sense' must be a finite number > 0, but it starts at "


@pytest.mark.parametrize("bad, error, message", [
    ("1024", TypeError, "'scale_sense' must be a loss-scale update cell"),
    (Tensor(np.ones((2,), np.float32)), ValueError, r"'scale_sense' must be a Tensor of shape \(\) or \(1,\)"),
    (Tensor(0.0, ms.float32), ValueError, r"the loss scale of 'scale_sense' must be a finite number > 0, but it "
                                          r"starts at 0.0. Start from a power of 2 such as 2\*\*12"),
    (Tensor([np.nan], ms.float32), ValueError, STARTS + "nan"),
    (Tensor(-8, ms.int32), ValueError, STARTS + "-8.0"),
    (nn.DynamicLossScaleUpdateCell(float("inf"), 2, 100), ValueError, STARTS + "inf"),
    (nn.FixedLossScaleUpdateCell(0.0), ValueError, STARTS + "0.0"),
    (ms.amp.DynamicLossScaler(float("nan"), 2, 100), ValueError, STARTS + "nan"),
])
def test_scale_sense_is_checked(bad, error, message):
    """A scale that is no loss-scale form, or whose form starts from 0, a negative number, inf or NaN (every window
    would overflow, and a dynamic scale never leaves inf)."""
    net, loss, opt = build("momentum")
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    with pytest.raises(error, match=f"For 'TrainForwardBackward', {message}"):
        ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum, scale_sense=bad)


def test_the_parallel_loss_scale_cell_names_a_wrong_scale_sense():
    net, loss, opt = build("momentum")
    with pytest.raises(TypeError, match=r"For 'TrainAccuStepsWithLossScaleCell', 'scale_sense' must be a loss-scale "
                                        r"update cell .*StaticLossScaler\) or a scale Tensor, but got Dense"):
        ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt, nn.Dense(2, 2))
    # None is refused, so the message does not offer it
    with pytest.raises(TypeError, match=r"For 'TrainAccuStepsWithLossScaleCell', 'scale_sense' must be a loss-scale "
                                        r"update cell, a mindspore.amp.LossScaler or a scale Tensor, but got None"):
        ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt, None)
    with pytest.raises(TypeError, match=r"For 'GradientAccumulation', 'scale_sense' must be a loss-scale update cell"):
        ms_accum.GradientAccumulation(net, loss, opt, scale_sense=1024)
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation', the loss scale of 'scale_sense' must be a "
                                         r"finite number > 0, but it starts at inf"):
        ms_accum.GradientAccumulation(net, loss, opt, scale_sense=Tensor(np.inf, ms.float32))
    with pytest.raises(ValueError, match=r"For 'TrainAccuStepsWithLossScaleCell', the loss scale of 'scale_sense' "
                                         r"must be a finite number > 0, but it starts at 0.0"):
        ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt,
                                                 nn.DynamicLossScaleUpdateCell(0.0, 2, 10))

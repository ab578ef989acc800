"""clip_norm: the window's gradient is clipped once, by its global norm, as the large batch's would be."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

import ms_accum
import paths
from helpers import assert_equals_large_batch, build, functional_reference, large_batch, micro_batches, params_of

pytestmark = pytest.mark.slow  # every path in both modes: about a minute
N = 4


def windows():
    batches = micro_batches((5, 3, 4, 2) * 2, seed=11)
    return [batches[:N], batches[N:]]


@pytest.fixture(scope="module")
def window_norm():
    """The first window's large-batch gradient norm, from the initial parameters."""
    return functional_reference("momentum", windows()[:1])[1][0]


# the paths (tests/paths.py); Model_ACCU over the loss-scale cell, whose window's end unscales before clipping
PATHS = ("three_cells", "driver", "accu_steps", "accu_steps_loss_scale", "model_accu_loss_scale", "accumulator")


@pytest.mark.parametrize("active, exec_mode", [(True, "pynative"), (True, "graph"), (False, "pynative")],
                         ids=["clipping-pynative", "clipping-graph", "below_the_limit-pynative"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_window_gradient_is_clipped_like_the_large_batch_gradient(path, active, exec_mode, window_norm):
    ms.set_context(mode=ms.GRAPH_MODE if exec_mode == "graph" else ms.PYNATIVE_MODE)
    clip_norm = window_norm * (0.2 if active else 5.0)
    net, loss, opt = build("momentum")
    trained = paths.train(path, nn.WithLossCell(net, loss), opt, sum(windows(), []), N, clip_norm=clip_norm)
    got, records = params_of(net), [(window.grad_norm, window.clipped) for window in trained.windows]
    assert_equals_large_batch(got, large_batch("momentum", clip_norm), windows(),
                              context=f"{path}, clip_norm {clip_norm:.3g}, {exec_mode}")
    norms = functional_reference("momentum", windows(), clip_norm)[1]
    unclipped, _ = functional_reference("momentum", windows())
    moved = max(np.abs(got[k] - unclipped[k]).max() / np.abs(unclipped[k]).max() for k in got)
    assert (moved > 1e-3) == active, f"clipping {'did not change' if active else 'changed'} the update ({moved:.2g})"
    assert [r[0] for r in records] == pytest.approx(norms, rel=1e-4), "telemetry must record the norm before clipping"
    assert [r[1] for r in records] == [n > clip_norm for n in norms]


@pytest.mark.parametrize("path", sorted(PATHS))
def test_with_average_false_the_raw_sum_is_clipped(path):
    """``average=False`` hands the optimizer the window's raw sum of micro-batch gradients (the tutorial's): that sum
    is what is clipped, by its own norm (a new user's trial found it so; no test had said it). The reference sums the
    micro-batches' gradients, written with value_and_grad, and clips with ops.clip_by_global_norm."""
    raw_norms = functional_reference("momentum", windows(), average=False)[1]
    clip_norm = raw_norms[0] * 0.2
    net, loss, opt = build("momentum")
    trained = paths.train(path, nn.WithLossCell(net, loss), opt, sum(windows(), []), N, clip_norm=clip_norm,
                          average=False)
    assert_equals_large_batch(params_of(net), large_batch("momentum", clip_norm, average=False), windows(),
                              context=f"{path}, raw sum clipped at {clip_norm:.3g}")
    norms = functional_reference("momentum", windows(), clip_norm, average=False)[1]
    assert [window.grad_norm for window in trained.windows] == pytest.approx(norms, rel=1e-4)
    assert all(window.clipped for window in trained.windows), norms


def test_clip_norm_is_checked():
    net, loss, opt = build("momentum")
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    for bad, error in ((0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), ("1", TypeError),
                       (True, TypeError)):
        with pytest.raises(error, match=rf"For 'TrainOptim', 'clip_norm' must be a finite number > 0, or None "
                                        rf"for no clipping, but got {bad!r}"):
            ms_accum.TrainOptim(opt, grad_sum, clip_norm=bad)
    with pytest.raises(ValueError, match="For 'GradientAccumulation', 'clip_norm' must be a finite number > 0"):
        ms_accum.GradientAccumulation(net, loss, opt, clip_norm=0.0)
    with pytest.raises(ValueError, match="For 'TrainAccuStepsCell', 'clip_norm' must be a finite number > 0"):
        ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=2, clip_norm=0.0)
    with pytest.raises(ValueError, match="For 'Accumulator', 'clip_norm' must be a finite number > 0"):
        ms_accum.Accumulator(opt, 2, clip_norm=-3)

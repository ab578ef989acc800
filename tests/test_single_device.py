"""TrainForwardBackward / TrainOptim / TrainClear: walked through by hand, and equal to the large batch."""
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

import ms_accum
from helpers import (OPTIMIZERS, accumulate_train, assert_equals_large_batch, build, concat, micro_batches, params_of,
                     reference_train)


class LinearLoss(nn.Cell):
    """loss = mean over the batch of x @ w, so the gradient is the batch's mean row of x."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.array([1.0, 2.0], np.float32)), name="w")

    def construct(self, x):
        return ops.mean(ops.matmul(x, self.w))


def _cells(average=True, learning_rate=1.0):
    net = LinearLoss()
    opt = nn.SGD(net.trainable_params(), learning_rate=learning_rate)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    cells = (ms_accum.TrainForwardBackward(net, opt, grad_sum, average=average),
             ms_accum.TrainOptim(opt, grad_sum, average=average), ms_accum.TrainClear(grad_sum))
    return net, opt, grad_sum, cells


def test_three_micro_steps_walked_through_by_hand(exec_mode):
    net, opt, grad_sum, (forward_backward, optim, clear) = _cells()
    state = grad_sum._ms_accum_window  # pylint: disable=protected-access
    xs = [np.array([[1.0, 0.0], [3.0, 2.0]], np.float32),   # mean row (2, 1), 2 samples
          np.array([[0.0, 4.0]], np.float32),               # mean row (0, 4), 1 sample
          np.array([[2.0, 2.0], [2.0, 0.0], [2.0, 1.0]], np.float32)]  # mean row (2, 1), 3 samples
    expected_sum = np.zeros(2, np.float32)
    for step, x in enumerate(xs, start=1):
        forward_backward(Tensor(x))
        # each micro-batch adds (its size) * (its mean gradient), relative to the first micro-batch's size (2)
        expected_sum += x.sum(axis=0) / len(xs[0])
        np.testing.assert_allclose(net.w.asnumpy(), [1.0, 2.0], err_msg=f"micro-step {step} moved the weights")
        np.testing.assert_allclose(grad_sum[0].asnumpy(), expected_sum, rtol=1e-6, err_msg=f"micro-step {step}")
        assert state.micro_steps.asnumpy() == step
        assert state.items.asnumpy() == sum(len(v) for v in xs[:step])
        assert opt.global_step.asnumpy()[0] == 0, f"micro-step {step} advanced the optimizer"
    mean_loss = optim()
    all_x = np.concatenate(xs)
    np.testing.assert_allclose(net.w.asnumpy(), [1.0, 2.0] - all_x.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(mean_loss.asnumpy(), (all_x @ np.array([1.0, 2.0])).mean(), rtol=1e-6)
    assert opt.global_step.asnumpy()[0] == 1
    # optim divides the buffers in place (no copy beside them) and does not clear: they hold the applied gradient
    np.testing.assert_allclose(grad_sum[0].asnumpy(), all_x.mean(axis=0), rtol=1e-6)
    assert clear().asnumpy() == 3
    np.testing.assert_array_equal(grad_sum[0].asnumpy(), [0.0, 0.0])
    assert state.micro_steps.asnumpy() == 0 and state.items.asnumpy() == 0
    assert state.loss_sum.asnumpy() == 0
    before = net.w.asnumpy().copy()
    forward_backward(Tensor(xs[1]))
    optim()
    np.testing.assert_allclose(net.w.asnumpy(), before - xs[1].mean(axis=0), rtol=1e-6)
    assert opt.global_step.asnumpy()[0] == 2


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("sizes", [(4, 4, 4, 4), (5, 3, 4, 2)], ids=["equal", "unequal"])
@pytest.mark.parametrize("steps", [4, 2, 1])  # N = 4 first: the case of --data-cases=first (conftest.py)
def test_window_equals_one_large_batch_step(optimizer, sizes, steps, exec_mode):
    batches = micro_batches(sizes[:steps] * 2, seed=steps)
    windows = [batches[:steps], batches[steps:]]
    got, opt = accumulate_train(optimizer, windows)
    assert_equals_large_batch(got, partial(reference_train, optimizer), windows,
                              context=f"{optimizer}, N={steps}, sizes {sizes[:steps]}, {exec_mode}")
    assert opt.global_step.asnumpy()[0] == 2


def test_raw_sum_reproduces_the_tutorial():
    """average=False applies the sum of micro-batch mean gradients: N equal micro-batches = lr*N large batch."""
    batches = micro_batches((4, 4, 4))
    got, _ = accumulate_train("sgd", [batches], average=False)

    def n_times_the_rate(windows):
        net, loss, _ = build("sgd")
        for window in windows:
            step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.SGD(net.trainable_params(), 0.1 * len(window)))
            step(*map(Tensor, concat(window)))
        return params_of(net)
    assert_equals_large_batch(got, n_times_the_rate, [batches], context="raw sum")


def test_learning_rate_schedule_advances_once_per_window():
    net, opt, grad_sum, _ = _cells()
    opt = nn.SGD(net.trainable_params(), learning_rate=[1.0, 0.5, 0.25])
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(net, opt, grad_sum)
    optim, clear = ms_accum.TrainOptim(opt, grad_sum), ms_accum.TrainClear(grad_sum)
    x = np.array([[1.0, 1.0]], np.float32)
    w = net.w.asnumpy().copy()
    for window, lr in enumerate([1.0, 0.5, 0.25], start=1):
        for _ in range(3):
            forward_backward(Tensor(x))
        optim()
        clear()
        w = w - lr * x[0]
        np.testing.assert_allclose(net.w.asnumpy(), w, rtol=1e-6, err_msg=f"window {window}")
        assert opt.global_step.asnumpy()[0] == window


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss_scale"])
def test_an_empty_window_updates_nothing(scaled, exec_mode):
    """optim() once more after a window was applied and cleared (a loop flushing at every epoch's end, whose
    windows were whole) moved the parameters by momentum and counted a step."""
    net = LinearLoss()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9, weight_decay=0.01)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 8, 2, 1) if scaled else None
    forward_backward = ms_accum.TrainForwardBackward(net, opt, grad_sum, scale_sense=scale, noise_scale=True)
    optim = ms_accum.TrainOptim(opt, grad_sum, scale_sense=scale, noise_scale=True)
    clear = ms_accum.TrainClear(grad_sum)
    rng = np.random.default_rng(0)
    for _ in range(2):
        forward_backward(Tensor(rng.normal(size=(4, 2)).astype(np.float32)))
    optim()
    clear()
    kept = {"w": net.w.asnumpy().copy(), "moments": [m.asnumpy().copy() for m in opt.moments],
            "records": [r.asnumpy().copy() for r in optim.noise_records],
            "last": [p.asnumpy().copy() for p in (optim.accu_last_items, optim.accu_last_grad_norm)],
            "scale": optim.accu_scale.asnumpy().copy() if scaled else None}
    out = optim()
    if scaled:
        loss, overflow, next_scale = out
        assert not bool(overflow.asnumpy())
        np.testing.assert_array_equal(optim.accu_scale.asnumpy(), kept["scale"])
        assert float(next_scale.asnumpy()) == float(kept["scale"].reshape(()))
    else:
        loss = out
    assert float(loss.asnumpy()) == 0.0
    assert opt.global_step.asnumpy()[0] == 1
    np.testing.assert_array_equal(net.w.asnumpy(), kept["w"])
    for got, want in zip(opt.moments, kept["moments"]):
        np.testing.assert_array_equal(got.asnumpy(), want)
    for got, want in zip(optim.noise_records, kept["records"]):
        np.testing.assert_array_equal(got.asnumpy(), want)
    for got, want in zip((optim.accu_last_items, optim.accu_last_grad_norm), kept["last"]):
        np.testing.assert_array_equal(got.asnumpy(), want)


def test_a_window_applied_and_not_cleared_is_refused_before_it_is_added_to_or_applied_again(exec_mode):
    """A loop that forgot TrainClear added the next window into the applied sums and applied them again: the
    second update was the sum of both windows' gradients. Refused now, the parameters untouched, until cleared."""
    net, opt, grad_sum, (forward_backward, optim, clear) = _cells()
    x = np.array([[1.0, 3.0], [1.0, 1.0]], np.float32)
    forward_backward(Tensor(x))
    optim()
    applied = net.w.asnumpy().copy()
    sums = [p.asnumpy().copy() for p in grad_sum]
    for owner, call in (("TrainForwardBackward", lambda: forward_backward(Tensor(x))), ("TrainOptim", optim)):
        with pytest.raises(ValueError, match=rf"For '{owner}', the buffers 'grad_sum' must be cleared after the "
                                             r"window TrainOptim applied.*Call TrainClear\(grad_sum\)\(\)"):
            call()
    np.testing.assert_array_equal(net.w.asnumpy(), applied)
    for got, want in zip(grad_sum, sums):
        np.testing.assert_array_equal(got.asnumpy(), want)
    assert opt.global_step.asnumpy()[0] == 1
    clear()
    forward_backward(Tensor(x))
    optim()
    np.testing.assert_allclose(net.w.asnumpy(), applied - x.mean(axis=0), rtol=1e-6)


def test_sens_scales_the_applied_gradient_like_train_one_step_cell():
    net, opt, grad_sum, _ = _cells()
    forward_backward = ms_accum.TrainForwardBackward(net, opt, grad_sum, sens=2.0)
    optim = ms_accum.TrainOptim(opt, grad_sum)
    x = np.array([[1.0, 3.0], [1.0, 1.0]], np.float32)
    forward_backward(Tensor(x[:1]))
    forward_backward(Tensor(x[1:]))
    optim()
    np.testing.assert_allclose(net.w.asnumpy(), [1.0, 2.0] - 2.0 * x.mean(axis=0), rtol=1e-6)


def test_clear_needs_no_copy_of_the_parameters_and_accepts_the_tutorial_zeros():
    _, opt, grad_sum, (forward_backward, _, _) = _cells()
    zeros = opt.parameters.clone(prefix="zeros", init="zeros")
    clear = ms_accum.TrainClear(grad_sum, zeros)
    assert {p.name for p in clear.get_parameters()} == {  # the buffers and the window's scalars; no "zeros" copy
        "grad_sum.w", "grad_sum.items", "grad_sum.micro_steps", "grad_sum.loss_sum", "grad_sum.min_items",
        "grad_sum.items_unit", "grad_sum.last_items", "grad_sum.last_grad_norm", "grad_sum.last_clipped",
        "grad_sum.skipped_windows", "grad_sum.nonfinite_streak", "grad_sum.skip_history"}
    forward_backward(Tensor(np.ones((2, 2), np.float32)))
    clear()
    np.testing.assert_array_equal(grad_sum[0].asnumpy(), [0.0, 0.0])


def test_tutorial_construction_shares_one_window_between_the_cells():
    net, opt, grad_sum, (forward_backward, optim, clear) = _cells()
    assert forward_backward.accu_items is optim.accu_items is clear.accu_items
    assert {p.name for p in forward_backward.get_parameters()} >= {"w", "grad_sum.w", "grad_sum.items"}


def test_graph_mode_recompiles_nothing_per_step():
    """The same micro-batch shape reuses one compiled forward-backward graph."""
    ms.set_context(mode=ms.GRAPH_MODE)
    _, _, _, (forward_backward, optim, clear) = _cells()
    for _ in range(3):
        forward_backward(Tensor(np.ones((2, 2), np.float32)))
    optim()
    clear()
    assert len(forward_backward.compile_cache) == 1


class TestBadInput:
    def test_loss_must_be_a_scalar(self, exec_mode):
        net = nn.Dense(2, 2)
        opt = nn.SGD(net.trainable_params(), 0.1)
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        loss_net = nn.WithLossCell(net, nn.MSELoss(reduction="none"))
        cell = ms_accum.TrainForwardBackward(loss_net, opt, grad_sum)
        with pytest.raises(ValueError, match=r"For 'TrainForwardBackward', the loss network must return one scalar "
                                             r"loss.*reduction='mean'.*but it returned shape \(3, 2\)"):
            cell(Tensor(np.ones((3, 2), np.float32)), Tensor(np.ones((3, 2), np.float32)))

    @pytest.mark.parametrize("cell_class", ["TrainForwardBackward", "TrainAccuStepsCell",
                                            "TrainAccuStepsWithLossScaleCell"])
    def test_a_call_the_loss_network_cannot_take_is_refused_naming_the_fix(self, cell_class, exec_mode):
        """A new user's trial: a network without its loss, called with the data and the label (and a loss network
        returning a dict), failed in MindSpore naming neither the cell nor the fix. Refused before anything runs:
        the same cell then trains on a right call, its buffers untouched."""
        def make(network, opt):
            if cell_class == "TrainForwardBackward":
                return ms_accum.TrainForwardBackward(network, opt, opt.parameters.clone(prefix="grad_sum",
                                                                                       init="zeros"))
            if cell_class == "TrainAccuStepsCell":
                return ms_accum.TrainAccuStepsCell(network, opt, gradient_accumulation_steps=2)
            return ms_accum.TrainAccuStepsWithLossScaleCell(network, opt, Tensor(1.0, ms.float32),
                                                            gradient_accumulation_steps=2)

        class DictLoss(nn.Cell):
            def __init__(self, net):
                super().__init__()
                self.net, self.loss = net, nn.MSELoss()

            def construct(self, x, y):
                return {"loss": self.loss(self.net(x), y), "num_items": x.shape[0]}

        x, y = Tensor(np.ones((3, 2), np.float32)), Tensor(np.ones((3, 2), np.float32))
        net = nn.Dense(2, 2)
        opt = nn.SGD(net.trainable_params(), 0.1)
        with pytest.raises(TypeError, match=rf"^For '{cell_class}', a call's inputs are passed to the loss network, "
                                            r"Dense.construct\(x\), which takes 1 input, but the call gave 2\. .*"
                                            r"pass nn.WithLossCell\(net, loss_fn\)\.$"):
            make(net, opt)(x, y)
        cell = make(nn.WithLossCell(net, nn.MSELoss()), opt)
        with pytest.raises(TypeError, match=r"WithLossCell.construct\(data, label\), which takes 2 inputs, but the "
                                            r"call gave 1\."):
            cell(x)
        cell(x, y)
        assert any(np.abs(buffer.asnumpy()).max() > 0 for buffer in cell.accu_grads)
        with pytest.raises(TypeError, match=rf"^For '{cell_class}', the loss network must return a loss or '\(loss, "
                                            r"num_items\)', but it returned a dict\. Return its entries as a tuple"):
            make(DictLoss(net), nn.SGD(net.trainable_params(), 0.1))(x, y)

    def test_grad_sum_must_be_a_parameter_tuple(self):
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        with pytest.raises(TypeError, match=r"For 'TrainForwardBackward', 'grad_sum' must be a ParameterTuple.*"
                                            r"but got list"):
            ms_accum.TrainForwardBackward(net, opt, list(opt.parameters))

    def test_grad_sum_must_match_the_optimizer(self):
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        other = nn.SGD(nn.Dense(3, 3).trainable_params(), 0.1).parameters.clone(prefix="g", init="zeros")
        with pytest.raises(ValueError, match=r"For 'TrainOptim', 'grad_sum' must match the optimizer's "
                                             r"parameters.*but got shapes \[\(3, 3\), \(3,\)\]"):
            ms_accum.TrainOptim(opt, other)

    @pytest.mark.parametrize("sens, error", [(0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                             ("1", TypeError), (None, TypeError)])
    def test_sens_must_be_a_nonzero_finite_number(self, sens, error):
        """Not a number is a TypeError, as for every other numeric argument (a new user's 'sens'='1' was a
        ValueError); numpy's numbers are numbers."""
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        with pytest.raises(error, match="For 'TrainForwardBackward', 'sens' must be a non-zero finite number"):
            ms_accum.TrainForwardBackward(net, opt, grad_sum, sens=sens)
        assert ms_accum.TrainForwardBackward(net, opt, grad_sum, sens=np.float32(2.0)).sens == 2.0

    def test_train_optim_on_buffers_no_forward_adds_into_is_refused(self):
        """A new user's trial gave TrainOptim buffers cloned apart from TrainForwardBackward's: every call found an
        empty window and returned 0, and four windows trained nothing, in silence."""
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        other = opt.parameters.clone(prefix="other", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(net, opt, grad_sum)
        optim = ms_accum.TrainOptim(opt, other)
        forward_backward(Tensor(np.ones((2, 2), np.float32)))
        with pytest.raises(ValueError, match=r"For 'TrainOptim', 'grad_sum' must be the buffers a TrainForwardBackward "
                                             r"adds the micro-batches' gradients into, but none was built on 'other'.*"
                                             r"Pass TrainOptim the grad_sum given to TrainForwardBackward"):
            optim()
        before = net.w.asnumpy().copy()
        ms_accum.TrainOptim(opt, grad_sum)()  # the right buffers: the window is applied
        assert not np.array_equal(net.w.asnumpy(), before)

    def test_cells_on_one_grad_sum_must_step_the_same_parameters(self):
        """The same trial's buffers of another network's optimizer, alike in shapes and names and holding a window
        of that network's, were applied to this one's weights; an optimizer over the same Parameters is taken."""
        nets = [LinearLoss(), LinearLoss()]
        opts = [nn.SGD(net.trainable_params(), 0.1) for net in nets]
        grad_sum = opts[0].parameters.clone(prefix="grad_sum", init="zeros")
        ms_accum.TrainForwardBackward(nets[0], opts[0], grad_sum)
        ms_accum.TrainOptim(nn.SGD(nets[0].trainable_params(), 0.2), grad_sum)
        with pytest.raises(ValueError, match=r"For 'TrainOptim', 'optimizer' must update the Parameters whose "
                                             r"gradients the buffers 'grad_sum' hold, those of the other cells built "
                                             r"on this grad_sum \(1 Parameter: 'w'\), but it updates other Parameters "
                                             r"\(1 Parameter: 'w'\). Build TrainForwardBackward and TrainOptim on "
                                             r"one grad_sum"):
            ms_accum.TrainOptim(opts[1], grad_sum)

    def test_average_must_agree_between_cells_on_the_same_buffers(self):
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        ms_accum.TrainForwardBackward(net, opt, grad_sum, average=False)
        with pytest.raises(ValueError, match=r"For 'TrainOptim', 'average' must match .* \(False\), but got True"):
            ms_accum.TrainOptim(opt, grad_sum)

    def test_zeros_must_match_grad_sum(self):
        _, _, grad_sum, _ = _cells()
        wrong = nn.SGD(nn.Dense(3, 3).trainable_params(), 0.1).parameters.clone(prefix="z", init="zeros")
        with pytest.raises(ValueError, match="For 'TrainClear', 'zeros' must match 'grad_sum' in shapes"):
            ms_accum.TrainClear(grad_sum, wrong)

    def test_grad_sum_must_not_be_the_parameters_themselves(self, exec_mode):
        """The tutorial's line without .clone(...): clearing would zero every weight."""
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        for make in (lambda: ms_accum.TrainForwardBackward(net, opt, opt.parameters),
                     lambda: ms_accum.TrainOptim(opt, opt.parameters)):
            with pytest.raises(ValueError, match=r"'grad_sum' must be separate buffers, but it holds the network's "
                                                 r"or optimizer's own Parameters \['w'\].*clearing it would zero the "
                                                 r"weights. Build it with optimizer.parameters.clone\("
                                                 r"prefix='grad_sum', init='zeros'\)"):
                make()
        np.testing.assert_array_equal(net.w.asnumpy(), [1.0, 2.0])

    def test_grad_sum_narrower_than_its_parameters_is_refused(self):
        """A new user's trial: float16 buffers for float32 parameters were taken in silence, rounding every
        micro-batch's gradient (440 times farther from the large batch) and overflowing under a loss scale where
        float32 buffers did not. Buffers of the parameter's type, or a wider float's, are taken."""
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        narrow = ParameterTuple([Parameter(Tensor(np.zeros(2, np.float16)), name="grad_sum.w")])
        for owner, make in (("TrainForwardBackward", lambda: ms_accum.TrainForwardBackward(net, opt, narrow)),
                            ("TrainOptim", lambda: ms_accum.TrainOptim(opt, narrow))):
            with pytest.raises(ValueError, match=rf"For '{owner}', 'grad_sum' must hold each gradient in its "
                                                 r"parameter's type or a wider float, but its buffer 'grad_sum.w' is "
                                                 r"Float16 for the Float32 parameter 'w'.*Build it with "
                                                 r"optimizer.parameters.clone\(prefix='grad_sum', init='zeros'\)"):
                make()
        half = nn.SGD([Parameter(Tensor(np.ones(2, np.float16)), name="h")], 0.1)
        for dtype in (np.float16, np.float32):  # the parameter's own type, and the wider float32
            buffers = ParameterTuple([Parameter(Tensor(np.zeros(2, dtype)), name=f"grad_sum.h.{dtype.__name__}")])
            assert ms_accum.TrainOptim(half, buffers).grad_sum is buffers
        bf16 = ParameterTuple([Parameter(Tensor(np.zeros(2, np.float32)).astype(ms.bfloat16), name="grad_sum.b")])
        with pytest.raises(ValueError, match=r"its buffer 'grad_sum.b' is BFloat16 for the Float16 parameter 'h'"):
            ms_accum.TrainOptim(half, bf16)

    def test_clear_alone_on_the_weights_is_refused_before_it_zeroes_them(self, exec_mode):
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        clear = ms_accum.TrainClear(opt.parameters)
        with pytest.raises(ValueError, match=r"For 'TrainClear', 'grad_sum' must be the buffers of a "
                                             r"TrainForwardBackward or TrainOptim.*clearing the weights themselves "
                                             r"would zero the network"):
            clear()
        np.testing.assert_array_equal(net.w.asnumpy(), [1.0, 2.0])

    def test_numpy_inputs_are_refused_naming_the_input(self, exec_mode):
        """A new user's numpy batch reached MindSpore's 'For primitive[Shape], the input argument must be Tensor'."""
        net, _, grad_sum, (forward_backward, _, _) = _cells()
        with pytest.raises(TypeError, match=r"For 'TrainForwardBackward', input 0 must be a mindspore.Tensor, but "
                                            r"got a numpy.ndarray of shape \(4, 2\). Wrap it: mindspore.Tensor\(x\)."):
            forward_backward(np.ones((4, 2), np.float32))
        np.testing.assert_array_equal(grad_sum[0].asnumpy(), [0.0, 0.0])
        forward_backward(Tensor(np.ones((4, 2), np.float32)))  # wrapped, it runs: the mean row, the window's first
        np.testing.assert_allclose(grad_sum[0].asnumpy(), [1.0, 1.0])

    def test_zeros_must_not_be_grad_sum(self):
        _, _, grad_sum, _ = _cells()
        with pytest.raises(ValueError, match="For 'TrainClear', 'zeros' must be separate from 'grad_sum'"):
            ms_accum.TrainClear(grad_sum, grad_sum)

    def test_optimizer_and_network_are_checked(self):
        net = LinearLoss()
        opt = nn.SGD(net.trainable_params(), 0.1)
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        with pytest.raises(TypeError, match=r"For 'TrainOptim', 'optimizer' must be a mindspore.nn optimizer .*but "
                                            r"got NoneType"):
            ms_accum.TrainOptim(None, grad_sum)
        with pytest.raises(TypeError, match=r"For 'TrainForwardBackward', 'optimizer' must be a mindspore.nn "
                                            r"optimizer .*but got list"):
            ms_accum.TrainForwardBackward(net, list(net.trainable_params()), grad_sum)
        with pytest.raises(TypeError, match=r"For 'TrainForwardBackward', 'network' must be a mindspore.nn.Cell, "
                                            r"but got NoneType"):
            ms_accum.TrainForwardBackward(None, opt, grad_sum)
        with pytest.raises(ValueError, match=r"For 'TrainForwardBackward', the optimizer's parameters must be "
                                             r"parameters of 'network', but none of its 1 \(\['w'\]\) is: every "
                                             r"gradient would be zero and nothing would train"):
            ms_accum.TrainForwardBackward(LinearLoss(), opt, grad_sum)


def test_the_names_of_ms_accum_0_1_still_read_the_window_records_with_a_deprecation_warning():
    """TrainOptim.last_grad_norm (and last_items, last_clipped), documented in 0.1, were renamed accu_* by the engine
    round with no alias (AttributeError for a user of 0.1): they read the same Parameters and say the new name."""
    _, _, _, (forward_backward, optim, _) = _cells()
    forward_backward(Tensor(np.ones((2, 2), np.float32)))
    optim()
    for old in ("last_items", "last_grad_norm", "last_clipped"):
        with pytest.warns(DeprecationWarning, match=rf"For 'TrainOptim', '{old}' is renamed 'accu_{old}'"):
            assert getattr(optim, old) is getattr(optim, f"accu_{old}")
    assert float(optim.accu_last_items.asnumpy()) == 2.0

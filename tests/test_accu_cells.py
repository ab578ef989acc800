"""TrainAccuStepsCell and TrainAccuStepsWithLossScaleCell on one process: equivalence, modes and overflow."""
import re
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from helpers import (OPTIMIZERS, assert_equals_large_batch, assert_params_equal, build, micro_batches, numpy_dataset,
                     params_of, reference_train)

CELLS = {
    "plain": lambda net, opt, n: ms_accum.TrainAccuStepsCell(net, opt, accumulation_steps=n),
    "static_scale": lambda net, opt, n: ms_accum.TrainAccuStepsWithLossScaleCell(
        net, opt, Tensor(1024.0, ms.float32), accumulation_steps=n),
    "dynamic_scale": lambda net, opt, n: ms_accum.TrainAccuStepsWithLossScaleCell(
        net, opt, nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000), accumulation_steps=n),
}


def make_cell(kind, optimizer="momentum", steps=4):
    net, loss, opt = build(optimizer)
    return CELLS[kind](nn.WithLossCell(net, loss), opt, steps), net, opt


def run_window(cell, window):
    """Accumulate every micro-batch but the last, update on the last; return the update call's output."""
    for i, (x, y) in enumerate(window):
        cell.set_accumulation(i < len(window) - 1)
        out = cell(Tensor(x), Tensor(y))
    return out


def optimizer_state(opt):
    return {p.name: p.asnumpy().copy() for p in opt.get_parameters()}


@pytest.mark.parametrize("kind", sorted(CELLS))
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_one_window_equals_one_large_batch_step(kind, optimizer, exec_mode):
    batches = micro_batches((5, 3, 4, 2) * 2)
    windows = [batches[:4], batches[4:]]
    cell, net, opt = make_cell(kind, optimizer)
    for window in windows:
        run_window(cell, window)
    assert_equals_large_batch(params_of(net), partial(reference_train, optimizer), windows,
                              context=f"{kind}, {optimizer}")
    assert opt.global_step.asnumpy()[0] == 2
    assert all(not g.asnumpy().any() for g in cell.accu_grads)


def test_accumulation_calls_leave_parameters_alone_and_fill_buffers(exec_mode):
    cell, net, opt = make_cell("plain")
    before = params_of(net)
    batches = micro_batches((4, 4, 4))
    for x, y in batches:
        cell.set_accumulation(True)
        cell(Tensor(x), Tensor(y))
    assert_params_equal(params_of(net), before, context="after accumulation calls")
    assert any(g.asnumpy().any() for g in cell.accu_grads)
    assert cell.accu_micro_steps.asnumpy() == 3 and cell.accu_items.asnumpy() == 12
    assert opt.global_step.asnumpy()[0] == 0


def test_update_call_returns_the_window_mean_loss(exec_mode):
    cell, net, _ = make_cell("plain", "sgd")
    batches = micro_batches((4, 2))
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    expected = sum(float(loss_net(Tensor(x), Tensor(y)).asnumpy()) * len(y) for x, y in batches) / 6
    assert float(run_window(cell, batches).asnumpy()) == pytest.approx(expected, rel=1e-5)


def test_graph_mode_compiles_one_graph_per_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    cell, _, _ = make_cell("plain", steps=3)
    batches = micro_batches((4,) * 9)
    for w in range(3):
        run_window(cell, batches[3 * w:3 * w + 3])
    phases = {key.split(".")[0] for key in cell.compile_cache}
    assert phases == {ms_accum.ACCUMULATE_PHASE, ms_accum.UPDATE_PHASE}
    assert len(cell.compile_cache) == 2


def test_the_window_end_runs_without_data_or_network(exec_mode):
    """end_window() ends a window of accumulating calls on its own: the update graph holds no forward and backward
    (a graph that did would keep a second arena of activations; benchmarks/memory.py)."""
    batches = micro_batches((4, 3, 2))
    cell, net, opt = make_cell("plain", steps=3)
    cell.set_accumulation(True)
    for x, y in batches:
        cell(Tensor(x), Tensor(y))
    cell.end_window()
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches], context=exec_mode)
    assert opt.global_step.asnumpy()[0] == 1 and int(cell.accu_micro_steps.asnumpy()) == 0
    if exec_mode == "graph":
        assert {key.split(".")[0] for key in cell.compile_cache} == {ms_accum.ACCUMULATE_PHASE, ms_accum.UPDATE_PHASE}


def _by_attribute(cell, index, steps):
    cell.accumulation = index % steps != steps - 1  # the tutorial's style


def _by_method_then_set_train(cell, index, steps):
    cell.set_accumulation(index % steps != steps - 1)
    cell.set_train(True)  # resets the graph phase in MindSpore; the cell keeps the chosen mode's


def _automatic(cell, index, steps):
    """No mode set: the cell updates on every steps-th call."""


STYLES = {"attribute": _by_attribute, "method_then_set_train": _by_method_then_set_train, "automatic": _automatic}


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("kind", ["plain", "dynamic_scale"])
def test_every_way_of_choosing_the_mode_equals_the_large_batch(style, kind, exec_mode):
    batches = micro_batches((4, 3, 4, 2) * 2)
    cell, net, opt = make_cell(kind, steps=4)
    for index, (x, y) in enumerate(batches):
        STYLES[style](cell, index, 4)
        cell(Tensor(x), Tensor(y))
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[:4], batches[4:]],
                              context=f"{style}, {kind}, {exec_mode}")
    assert opt.global_step.asnumpy()[0] == 2
    if exec_mode == "graph":
        assert {key.split(".")[0] for key in cell.compile_cache} == {ms_accum.ACCUMULATE_PHASE, ms_accum.UPDATE_PHASE}


def test_automatic_mode_picks_up_a_window_left_open_by_explicit_calls(exec_mode):
    batches = micro_batches((4,) * 6)
    cell, net, _ = make_cell("plain", steps=3)
    cell.set_accumulation(True)
    cell(*map(Tensor, batches[0]))
    cell.accumulation = None  # back to automatic: one micro-batch is already in the window
    for x, y in batches[1:]:
        cell(Tensor(x), Tensor(y))
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[:3], batches[3:]],
                              context=f"explicit then automatic, {exec_mode}")


def test_automatic_mode_opens_a_window_after_a_drop(exec_mode):
    """A window dropped in the automatic mode is gone on the host too: the next N calls make the next window (the
    host's count of the dropped window once ended it after one micro-batch)."""
    batches = micro_batches((4,) * 8)
    cell, net, _ = make_cell("plain", steps=3)
    for x, y in batches[:2]:
        cell(Tensor(x), Tensor(y))
    assert int(cell.drop().asnumpy()) == 2
    for x, y in batches[2:]:
        cell(Tensor(x), Tensor(y))
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[2:5], batches[5:]],
                              context=f"a drop, then automatic, {exec_mode}")


def test_model_accu_gives_the_cell_back_in_the_mode_it_had(exec_mode):
    cell, _, _ = make_cell("plain", steps=2)
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 4)), dataset_sink_mode=False)
    assert cell.accumulation is None
    cell.accumulation = True
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(micro_batches((4,) * 4)), dataset_sink_mode=False)
    assert cell.accumulation is True


@pytest.mark.parametrize("position", [1, 3], ids=["accumulating_call", "updating_call"])
@pytest.mark.parametrize("kind", ["static_scale", "dynamic_scale"])
def test_overflow_in_any_micro_step_skips_the_window(kind, position, exec_mode):
    cell, net, opt = make_cell(kind)
    batches = micro_batches((4,) * 8)
    poisoned = [(x.copy(), y) for x, y in batches[:4]]
    poisoned[position][0][0, 0, 0, 0] = np.inf
    params_before, state_before = params_of(net), optimizer_state(opt)
    loss, overflow, scale = run_window(cell, poisoned)
    assert bool(overflow.asnumpy()), "overflow not reported"
    assert_params_equal(params_of(net), params_before, context="parameters after the skipped window")
    assert optimizer_state(opt).keys() == state_before.keys()
    for name, value in optimizer_state(opt).items():
        np.testing.assert_array_equal(value, state_before[name], err_msg=f"optimizer state {name} changed")
    expected_scale = 512.0 if kind == "dynamic_scale" else 1024.0
    assert float(scale.asnumpy()) == expected_scale
    assert float(cell.scale_sense.asnumpy()) == expected_scale, "loss scale updated more or less than once"
    assert all(not g.asnumpy().any() for g in cell.accu_grads)
    assert float(cell.accu_overflow.asnumpy()) == 0.0 and float(cell.accu_items.asnumpy()) == 0.0
    assert not np.isfinite(float(loss.asnumpy()))
    _, overflow, _ = run_window(cell, batches[4:])
    assert not bool(overflow.asnumpy())
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[4:]],
                              context="window after overflow")
    assert opt.global_step.asnumpy()[0] == 1


def test_loss_scale_cell_accumulates_in_float32_buffers():
    cell, _, _ = make_cell("static_scale")
    assert all(g.dtype == ms.float32 for g in cell.accu_grads)
    assert {g.name.split(".", 1)[0] for g in cell.accu_grads} == {"accu_grads"}


class TestBadInput:
    @pytest.mark.parametrize("cls", ["TrainAccuStepsCell", "TrainAccuStepsWithLossScaleCell"])
    @pytest.mark.parametrize("value, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                              ("2", TypeError), (True, TypeError), (4.0, TypeError)])
    def test_accumulation_steps(self, cls, value, error):
        net, loss, opt = build()
        args = (Tensor(1.0, ms.float32),) if cls == "TrainAccuStepsWithLossScaleCell" else ()
        text = ", or a schedule such as '0:1,2:2' as text" if isinstance(value, str) else \
            ", a schedule {first_update: N} (or its text, '0:1,2:2') or an AdaptiveAccumulation or " \
            "GoodputAccumulation policy" if error is TypeError else ""
        # a whole float (G / b, a new user's trial) is told which int to pass
        fix = {"2": " Convert a number read from a command line: int('2').",
               4.0: " Pass the int 4 (a float, such as the result of '/', is not taken: divide with '//')."}
        ending = re.escape(fix[value]) + "$" if value in fix else ""
        with pytest.raises(error, match=rf"For '{cls}', 'accumulation_steps' [(]gradient_accumulation_steps[)] must be "
                                        rf"an int >= 1{re.escape(text)}, "
                                        rf"but got {value!r}.*{ending}"):
            getattr(ms_accum, cls)(nn.WithLossCell(net, loss), opt, *args, accumulation_steps=value)

    def test_loss_must_be_a_scalar(self, exec_mode):
        net = nn.Dense(2, 2)
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss(reduction="none")),
                                           nn.SGD(net.trainable_params(), 0.1), accumulation_steps=2)
        with pytest.raises(ValueError, match=r"For 'TrainAccuStepsCell', the loss network must return one scalar"):
            cell.set_accumulation(True)(Tensor(np.ones((3, 2), np.float32)), Tensor(np.ones((3, 2), np.float32)))

    def test_set_accumulation_needs_a_bool(self):
        cell, _, _ = make_cell("plain")
        with pytest.raises(TypeError, match="For 'TrainAccuStepsCell', 'accumulation' must be a bool, or None to let "
                                            "the cell update every accumulation_steps-th call, but got 1"):
            cell.set_accumulation(1)
        with pytest.raises(TypeError, match="For 'TrainAccuStepsCell', 'accumulation' must be a bool, or None .* "
                                            "but got 'no'"):
            cell.accumulation = "no"

    @pytest.mark.parametrize("cls", ["TrainAccuStepsCell", "TrainAccuStepsWithLossScaleCell"])
    def test_accumulation_steps_accepts_numpy_integers(self, cls):
        net, loss, opt = build()
        args = (Tensor(1.0, ms.float32),) if cls == "TrainAccuStepsWithLossScaleCell" else ()
        cell = getattr(ms_accum, cls)(nn.WithLossCell(net, loss), opt, *args, accumulation_steps=np.int64(4))
        assert cell.accumulation_steps == 4 and type(cell.accumulation_steps) is int

    @pytest.mark.parametrize("cls", ["TrainAccuStepsCell", "TrainAccuStepsWithLossScaleCell"])
    def test_network_and_optimizer_are_checked(self, cls):
        net, loss, opt = build()
        args = (Tensor(1.0, ms.float32),) if cls == "TrainAccuStepsWithLossScaleCell" else ()
        with pytest.raises(TypeError, match=rf"For '{cls}', 'optimizer' must be a mindspore.nn optimizer.*"
                                            rf"but got NoneType"):
            getattr(ms_accum, cls)(nn.WithLossCell(net, loss), None, *args)
        with pytest.raises(TypeError, match=rf"For '{cls}', 'network' must be a mindspore.nn.Cell, but got "
                                            rf"function"):
            getattr(ms_accum, cls)(lambda x: x, opt, *args)
        other, _, _ = build()
        with pytest.raises(ValueError, match=rf"For '{cls}', the optimizer's parameters must be parameters of "
                                             rf"'network', but none of its \d+ .* is: every gradient would be zero"):
            getattr(ms_accum, cls)(nn.WithLossCell(other, loss), opt, *args)


@pytest.mark.parametrize("scale", [np.array(1024.0), np.array([1024.0])], ids=["float64", "float64-shape-1"])
def test_a_float64_scale_tensor_trains_as_the_large_batch(scale, exec_mode):
    """numpy's default dtype, ``Tensor(np.array(1024.0))``: the loss-scale cell, and the driver and Model_ACCU over it,
    took it and failed at their first update (a new user's trial: MindSpore's in-place write of float32 into a
    float64 Parameter). Each trains as the large batch now, the scale it returns a float32."""
    batches = micro_batches((4,) * 4)
    windows = [batches[:2], batches[2:]]
    reference = partial(reference_train, "momentum")
    net, loss, opt = build("momentum")
    cell = ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, loss), opt, Tensor(scale),
                                                    gradient_accumulation_steps=2)
    outputs = [cell(Tensor(x), Tensor(y)) for x, y in batches]
    assert_equals_large_batch(params_of(net), reference, windows, context=f"cell, {exec_mode}")
    assert outputs[-1][2].dtype == ms.float32 and float(outputs[-1][2].asnumpy().reshape(())) == 1024.0, outputs[-1]
    net, loss, opt = build("momentum")
    ms_accum.GradientAccumulation(net, loss, opt, scale_sense=Tensor(scale)).train_process(
        1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0)
    assert_equals_large_batch(params_of(net), reference, windows, context=f"driver, {exec_mode}")

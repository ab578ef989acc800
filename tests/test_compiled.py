"""PYNATIVE_MODE: every path runs its steps compiled, as a user's own ms.jit step, and falls back to eager
execution, with a one-line notice, only for a network that cannot be compiled (ms_accum/core/compiled.py).

Which graphs ran compiled is observed through the seam compiled.py calls (its `jit`); the numbers are checked
against plain large-batch training built without ms_accum.
"""
import collections
import contextlib
from functools import partial

import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn

import ms_accum
from ms_accum.core import compiled
import paths
from helpers import assert_equals_large_batch, build, concat, micro_batches, params_of, reference_train

SIZES = (3, 5, 4)  # one window of three unequal micro-batches


@pytest.fixture(autouse=True)
def _pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture
def compiled_calls(monkeypatch):
    """(cell class, graph phase) -> calls that ran through mindspore.jit."""
    calls = collections.Counter()
    real_jit = compiled.jit

    def spy(cell):
        run = real_jit(cell)

        def counted(*args, **kwargs):
            calls[(type(cell).__name__, cell.phase)] += 1
            return run(*args, **kwargs)
        return counted

    monkeypatch.setattr(compiled, "jit", spy)
    return calls


def _through(path, scale=None):
    """A function running `windows` (lists of equal length of micro-batches) through `path` (tests/paths.py)."""
    def run(net, loss, opt, windows):
        paths.train(path, nn.WithLossCell(net, loss), opt, sum(windows, []), len(windows[0]), scale=scale)
    return run


# each path, and the (cell, graph phase) pairs it must run through mindspore.jit
PATHS = {
    "three-cells": (_through("three_cells"), {("TrainForwardBackward", "train"), ("TrainOptim", "train"),
                                              ("TrainClear", "train")}),
    "driver": (_through("driver"), {("TrainAccuStepsCell", "train_accumulate"),
                                    ("TrainAccuStepsCell", "train_update")}),
    "parallel": (_through("accu_steps"), {("TrainAccuStepsCell", "train_accumulate"),
                                          ("TrainAccuStepsCell", "train_update")}),
    "parallel-loss-scale": (_through("accu_steps_loss_scale", 1024.0),
                            {("TrainAccuStepsWithLossScaleCell", "train_accumulate"),
                             ("TrainAccuStepsWithLossScaleCell", "train_update")}),
    "model-accu": (_through("model_accu"), {("TrainAccuStepsCell", "train_accumulate"),
                                            ("TrainAccuStepsCell", "train_update")}),
    "accumulator": (_through("accumulator"), {("Accumulator", "train")}),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_runs_its_steps_compiled_in_pynative(path, compiled_calls, capsys):
    run, graphs = PATHS[path]
    batches = micro_batches(SIZES)
    net, loss, opt = build("adam")
    run(net, loss, opt, [batches])
    assert set(compiled_calls) == graphs, f"{path}: graphs run through mindspore.jit: {dict(compiled_calls)}"
    assert "runs its step eagerly" not in capsys.readouterr().err
    assert_equals_large_batch(params_of(net), partial(reference_train, "adam"), [batches],
                              context=f"{path}, compiled PYNATIVE")


class TryNet(nn.Cell):
    """A network MindSpore's graph syntax does not take: a try statement in construct."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, pad_mode="valid", has_bias=True)
        self.flatten = nn.Flatten()
        self.dense = nn.Dense(2 * 4 * 4, 4)

    def construct(self, x):
        try:
            hidden = self.conv(x)
        except ValueError:
            hidden = x
        return self.dense(self.flatten(ops_relu(hidden)))


def ops_relu(x):
    return ms.ops.relu(x)


def _try_net(seed=0):
    ms.set_seed(seed)
    net = TryNet()
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(
        net.trainable_params(), learning_rate=0.1, momentum=0.9)


@pytest.mark.parametrize("path", ["three-cells", "driver", "parallel", "model-accu"])
def test_a_network_that_cannot_be_compiled_runs_eagerly_after_one_notice(path, capsys):
    batches = micro_batches(SIZES)
    net, loss, opt = _try_net()
    PATHS[path][0](net, loss, opt, [batches, batches])  # a second window: no second notice
    notices = [line for line in capsys.readouterr().err.splitlines() if "runs its step eagerly" in line]
    assert len(notices) == 1, notices
    assert "could not be compiled with mindspore.jit" in notices[0] and "Try" in notices[0], notices[0]

    reference = partial(reference_train, "momentum", make=lambda _, seed: _try_net(seed))
    assert_equals_large_batch(params_of(net), reference, [batches, batches], context=f"{path}, eager fallback")


def test_an_error_of_the_network_is_raised_not_taken_for_a_compile_failure(capsys):
    net, _, opt = build("sgd")
    per_sample = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")  # a loss that is not a scalar
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, per_sample), opt, grad_sum)
    x, y = micro_batches((4,))[0]
    with pytest.raises(ValueError, match="must return one scalar loss"):
        forward_backward(Tensor(x), Tensor(y))
    assert "runs its step eagerly" not in capsys.readouterr().err
    assert not any(buffer.asnumpy().any() for buffer in grad_sum)


@pytest.mark.parametrize("path", ["three-cells", "parallel"])
def test_a_network_with_hooks_runs_eagerly_so_its_hooks_run(path, capsys):
    batches = micro_batches(SIZES)
    net, loss, opt = build("sgd")
    calls = []
    net.conv.register_forward_hook(lambda cell, inputs, output: calls.append(1))
    PATHS[path][0](net, loss, opt, [batches])
    assert len(calls) == len(batches), "the hook must run once per micro-batch"
    notices = [line for line in capsys.readouterr().err.splitlines() if "runs its step eagerly" in line]
    assert len(notices) == 1 and "hooks (on 'network.network._backbone.conv')" in notices[0], notices
    assert_equals_large_batch(params_of(net), partial(reference_train, "sgd"), [batches],
                              context=f"{path}, hooks, eager")


def test_micro_steps_pass_through_the_branch_when_compiled_on_cpu():
    """A straight graph runs several times slower per call on CPU, in GRAPH_MODE as in PYNATIVE_MODE
    (benchmarks/jit_branch.py): the micro-steps and the clear are branched when compiled there, not when eager."""
    net, loss, opt = build("sgd")
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum)
    clear = ms_accum.TrainClear(grad_sum)
    (x, y), = micro_batches((4,), seed=19)
    for mode, branched in ((ms.GRAPH_MODE, True), (ms.PYNATIVE_MODE, True)):
        ms.set_context(mode=mode)
        forward_backward(Tensor(x), Tensor(y))
        clear()
        assert forward_backward._branched is branched and clear._branched is branched, mode
    forward_backward._eager_phases = frozenset({forward_backward.phase})  # as after a failed compilation
    forward_backward(Tensor(x), Tensor(y))
    assert forward_backward._eager and not forward_backward._branched


def test_a_counter_written_from_the_host_after_the_graphs_ran_is_read_by_them():
    """The driver sets its cell's window count at every train_process, after the first call's graphs ran with it:
    MindSpore's set_data detaches a Parameter from a jit graph in PYNATIVE_MODE (2.10: the graph kept counting on
    the old buffer, so the second run followed the schedule's last stage from its first window; 2.7.0: it read
    garbage), so ms_accum writes through an assign (compiled.write_parameter). Three runs of a schedule
    {0: 1, 2: 2} over 8 micro-batches make 5 updates each, and the device counts each run's 5 windows (the second
    and third warn that the schedule starts over: each is a new run, without initial_epoch)."""
    net, loss, opt = build("sgd")
    trainer = ms_accum.GradientAccumulation(net, loss, opt)
    x, y = concat(micro_batches([4] * 8))
    for run in range(1, 4):
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
        with pytest.warns(UserWarning, match=r"the schedule of N \{0: 1, 2: 2\} starts over at update 0") \
                if run > 1 else contextlib.nullcontext():
            trainer.train_process(1, data, {0: 1, 2: 2}, ckpt_path=None, log_every=0)
        assert int(opt.global_step.asnumpy()[0]) == 5 * run
        assert int(trainer.cell.accu_windows.asnumpy()) == 5


def test_a_network_that_cannot_be_compiled_gives_one_notice_for_all_its_graphs(capsys):
    """noise_scale="first": two accumulation graphs hold the network (measured and unmeasured micro-batches); it
    runs eagerly in both after one notice, and trains as the large batch."""
    batches = micro_batches(SIZES)
    net, loss, opt = _try_net()
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), opt, accumulation_steps=len(SIZES),
                                       noise_scale="first")
    for x, y in batches + batches:  # two windows, each opened by a measured micro-batch
        cell(Tensor(x), Tensor(y))
    notices = [line for line in capsys.readouterr().err.splitlines() if "runs its step eagerly" in line]
    assert len(notices) == 1, notices
    reference = partial(reference_train, "momentum", make=lambda _, seed: _try_net(seed))
    assert_equals_large_batch(params_of(net), reference, [batches, batches], context="noise_scale='first', eager")

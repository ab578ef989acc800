"""Sparse gradients (nn.EmbeddingLookup(sparse=True)) accumulate into dense buffers on every ms_accum path.

MindSpore 2.10 hands a sparse gradient over as rows plus indices (RowTensor) in a compiled graph only: GRAPH_MODE,
and PYNATIVE_MODE where ms_accum compiles each step. Run eagerly (MS_JIT=0, or a network that cannot be compiled)
the same gradient arrives as the rows' values without their indices, so a cell whose network looks rows up
sparsely refuses to run its step eagerly, and Accumulator, handed such rows from Python, refuses them where their
shape is not the table's.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from helpers import assert_equals_large_batch, assert_params_equal, computed_once, concat, numpy_dataset, params_of
from test_model_accu import fake_device  # noqa: F401  (the fixture: Model_ACCU's device seams faked)


class EmbeddingNet(nn.Cell):
    """Mean of the looked-up rows, then a dense head; the table's gradient is sparse when `sparse` is True."""

    def __init__(self, sparse):
        super().__init__()
        self.embedding = nn.EmbeddingLookup(10, 4, target="CPU" if sparse else "DEVICE", sparse=sparse)
        self.head = nn.Dense(4, 3)

    def construct(self, ids):
        return self.head(self.embedding(ids).mean(axis=1))


def build(sparse):
    ms.set_seed(3)
    net = EmbeddingNet(sparse)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, nn.WithLossCell(net, loss), nn.Momentum(net.trainable_params(), learning_rate=0.5, momentum=0.9)


def batches():
    """Three micro-batches of different sizes; ids repeat within and across micro-batches."""
    ids = [np.array([[1, 1, 2], [3, 2, 2]]), np.array([[1, 7, 7]]), np.array([[9, 1, 3], [2, 2, 2], [7, 0, 1]])]
    labels = [np.array([0, 2]), np.array([1]), np.array([2, 0, 1])]
    return [(i.astype(np.int32), y.astype(np.int32)) for i, y in zip(ids, labels)]


def equal_batches():
    """Three micro-batches of two samples each (sink mode feeds one shape)."""
    ids = np.array([[1, 1, 2], [3, 2, 2], [1, 7, 7], [9, 1, 3], [2, 2, 2], [7, 0, 1]], np.int32)
    labels = np.array([0, 2, 1, 2, 0, 1], np.int32)
    return [(ids[i:i + 2], labels[i:i + 2]) for i in range(0, 6, 2)]


@computed_once
def dense_reference(windows):
    """Plain TrainOneStepCell with a dense embedding, one step per window on its micro-batches concatenated."""
    net, loss_net, opt = build(sparse=False)
    step = nn.TrainOneStepCell(loss_net, opt)
    for window in windows:
        step(*map(Tensor, concat(window)))
    return params_of(net)


@pytest.fixture(autouse=True)
def _graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_three_cells_accumulate_sparse_rows(mode):
    ms.set_context(mode=mode)
    net, loss_net, opt = build(sparse=True)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(loss_net, opt, grad_sum)
    for ids, labels in batches():
        forward_backward(Tensor(ids), Tensor(labels))
    table_grad = grad_sum[0].asnumpy()
    assert table_grad.shape == (10, 4) and not table_grad[[4, 5, 6, 8]].any(), "untouched rows must stay zero"
    ms_accum.TrainOptim(opt, grad_sum)()
    assert_equals_large_batch(params_of(net), dense_reference, [batches()], context="sparse, three cells")


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
@pytest.mark.parametrize("kind", ["plain", "dynamic_scale"])
def test_parallel_cells_accumulate_sparse_rows(kind, mode):
    ms.set_context(mode=mode)
    net, loss_net, opt = build(sparse=True)
    if kind == "plain":
        cell = ms_accum.TrainAccuStepsCell(loss_net, opt, accumulation_steps=3)
    else:
        cell = ms_accum.TrainAccuStepsWithLossScaleCell(loss_net, opt, nn.DynamicLossScaleUpdateCell(1024.0, 2, 100),
                                                        accumulation_steps=3)
    data = batches()
    for index, (ids, labels) in enumerate(data):
        cell.set_accumulation(index < len(data) - 1)
        cell(Tensor(ids), Tensor(labels))
    assert_equals_large_batch(params_of(net), dense_reference, [data], context=f"sparse, {kind}")


@pytest.mark.parametrize("sink", [False, True], ids=["no_sink", "sink"])
def test_model_accu_accumulates_sparse_rows(sink, request):
    device = request.getfixturevalue("fake_device") if sink else None
    data = equal_batches()
    net, loss_net, opt = build(sparse=True)
    cell = ms_accum.TrainAccuStepsCell(loss_net, opt, accumulation_steps=3)
    ms_accum.Model_ACCU(cell).train(1, numpy_dataset(data), dataset_sink_mode=sink)
    assert device is None or device.events, "the sink branch was not taken"
    assert_equals_large_batch(params_of(net), dense_reference, [data], context=f"sparse, Model_ACCU, sink {sink}")


def accumulator_steps(sparse, compiled):
    """The functional loop: value_and_grad, then Accumulator (N = 3, each micro-batch weighted by its samples), the
    gradient computed in an ms.jit step when `compiled`, else from Python."""
    net, loss_net, opt = build(sparse)
    accumulator = ms_accum.Accumulator(opt, 3)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)

    def step(ids, labels):
        _, grads = grad_fn(ids, labels)
        return accumulator(grads, ids.shape[0])

    return net, (ms.jit(step) if compiled else step)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_accumulator_in_a_jit_step_accumulates_sparse_rows(mode):
    ms.set_context(mode=mode)
    net, step = accumulator_steps(sparse=True, compiled=True)
    updated = [bool(step(Tensor(ids), Tensor(labels))) for ids, labels in batches()]
    assert updated == [False, False, True]
    assert_equals_large_batch(params_of(net), dense_reference, [batches()], context="sparse, Accumulator in a jit step")


def test_accumulator_adds_a_sparse_gradient_computed_from_python_densely():
    # GRAPH_MODE hands the gradient to Python as (indices, rows, dense shape), which no compiled graph takes
    net, step = accumulator_steps(sparse=True, compiled=False)
    for ids, labels in batches():
        step(Tensor(ids), Tensor(labels))
    assert_equals_large_batch(params_of(net), dense_reference, [batches()],
                              context="sparse, Accumulator called from Python")


def test_accumulator_names_sparse_rows_that_lost_their_indices():
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the gradient computed eagerly: the rows arrive without their indices
    net, step = accumulator_steps(sparse=True, compiled=False)
    before = params_of(net)
    ids, labels = batches()[0]
    with pytest.raises(ValueError, match=r"gradient 0 has shape \(6, 4\) where the parameter has \(10, 4\).*table of "
                                         r"a sparse lookup.*rows without their indices.*inside a mindspore.jit step"):
        step(Tensor(ids), Tensor(labels))
    assert_params_equal(params_of(net), before, context="nothing applied")


def test_the_driver_trains_a_sparse_embedding_as_the_dense_large_batch():
    """Two epochs of one window each through the driver with a sparse embedding: each update equals the dense
    embedding's TrainOneStepCell step on the window (the driver's entry of the README's table)."""
    net, _, opt = build(sparse=True)
    trainer = ms_accum.GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
    trainer.train_process(2, numpy_dataset(batches()), 3, ckpt_path=None, log_every=0)
    assert int(opt.global_step.asnumpy()[0]) == 2
    assert_equals_large_batch(params_of(net), dense_reference, [batches(), batches()], context="sparse, driver")


EAGER_SPARSE = (r"For '{owner}', the network's sparse lookup 'embedding' \(EmbeddingLookup\) must run in a compiled "
                r"step, but the step would run eagerly: {why}\. Run eagerly, MindSpore hands back the looked-up rows' "
                r"gradient without their indices")


@pytest.mark.parametrize("cell", ["three-cells", "parallel", "driver"])
@pytest.mark.parametrize("ids_shape", [(2, 3), (2, 5)], ids=["6-rows", "10-rows-as-the-table"])
def test_eager_pynative_refuses_a_sparse_lookup_before_its_step(monkeypatch, cell, ids_shape):
    """Every step eager (MS_JIT=0, as for a network that cannot be compiled): refused before the step runs, also
    when as many ids are looked up as the table has rows (10), whose rows without their indices have the buffer's
    shape and were added to the wrong rows, with no error."""
    monkeypatch.setenv("MS_JIT", "0")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net, loss_net, opt = build(sparse=True)
    before = params_of(net)
    ids, labels = np.arange(np.prod(ids_shape), dtype=np.int32).reshape(ids_shape) % 10, np.zeros(2, np.int32)
    owner = {"three-cells": "TrainForwardBackward", "parallel": "TrainAccuStepsCell",
             "driver": "GradientAccumulation"}[cell]
    with pytest.raises(ValueError, match=EAGER_SPARSE.format(owner=owner, why="MS_JIT=0 is set")):
        if cell == "three-cells":
            grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
            ms_accum.TrainForwardBackward(loss_net, opt, grad_sum)(Tensor(ids), Tensor(labels))
        elif cell == "parallel":
            ms_accum.TrainAccuStepsCell(loss_net, opt, gradient_accumulation_steps=1)(Tensor(ids), Tensor(labels))
        else:
            trainer = ms_accum.GradientAccumulation(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                                          reduction="mean"), opt)
            trainer.train_process(1, numpy_dataset([(ids, labels)]), 1, ckpt_path=None, log_every=0)
    assert_params_equal(params_of(net), before, context="nothing applied")
    if cell == "three-cells":
        assert not grad_sum[0].asnumpy().any()


def test_a_sparse_lookup_with_hooks_is_refused_before_its_step():
    """A hook makes the step run eagerly (a compiled graph would not call it): refused, naming the hook's cell."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net, loss_net, opt = build(sparse=True)
    net.head.register_forward_hook(lambda cell, inputs, output: None)
    ids, labels = batches()[0]
    why = r"its network has hooks \(on 'network.network._backbone.head'\), which a compiled graph would not call"
    with pytest.raises(ValueError, match=EAGER_SPARSE.format(owner="TrainAccuStepsCell", why=why)):
        ms_accum.TrainAccuStepsCell(loss_net, opt, gradient_accumulation_steps=2)(Tensor(ids), Tensor(labels))


def test_noise_scale_refuses_sparse_gradients():
    _, loss_net, opt = build(sparse=True)
    cell = ms_accum.TrainAccuStepsCell(loss_net, opt, accumulation_steps=3, noise_scale=True)
    ids, labels = batches()[0]
    with pytest.raises(ValueError, match=r"For 'noise_scale', the micro-batch gradients must be dense, but got a "
                                         r"sparse \(RowTensor\) gradient"):
        cell(Tensor(ids), Tensor(labels))

"""The per-window reductions: the gradient norm's element sum and the overflow check, against numpy, in both
modes (GRAPH_MODE compiles them the way the update graphs do); the buffers' clearing, read from the compiled
graphs."""
import glob
import os
import re

import mindspore as ms
import numpy as np
import pytest

from mindspore import Tensor, nn, ops

from helpers import own_loop
from ms_accum.core import grad_ops


class _Sums(nn.Cell):
    def __init__(self):
        super().__init__()
        self.hyper_map = ops.HyperMap()

    def construct(self, tensors):
        return (grad_ops.sum_over(self.hyper_map, grad_ops.squared_sum, tensors),
                grad_ops.sum_over(self.hyper_map, grad_ops.nonfinite, tensors))


SHAPES = [(), (7,), (6, 5), (4, 3, 5, 5), (300, 301)]  # no empty tensor: MindSpore 2.10 sums those to garbage


def test_squared_sum_over_every_shape_matches_numpy(exec_mode):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    squares, nonfinite = _Sums()(tuple(Tensor(a) for a in arrays))
    want = sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)
    assert abs(float(squares.asnumpy()) - want) / want < 1e-6
    assert float(nonfinite.asnumpy()) == 0.0


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_overflow_check_finds_one_bad_element_and_ignores_large_finite_ones(bad, exec_mode):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    arrays[3][2, 1, 4, 0] = bad
    _, nonfinite = _Sums()(tuple(Tensor(a) for a in arrays))
    assert float(nonfinite.asnumpy()) == 1.0, f"{bad} not found"
    huge = tuple(Tensor(np.full(shape, 3e38, np.float32)) for shape in SHAPES)
    _, nonfinite = _Sums()(huge)
    assert float(nonfinite.asnumpy()) == 0.0, "finite values near float32's maximum were taken for an overflow"


class _EmbeddingBag(nn.Cell):
    """A lookup table first (16,000 elements, the largest parameter), as in a text model, then a linear head."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(400, 40)
        self.head = nn.Dense(40, 3)

    def construct(self, ids):
        return self.head(self.table(ids).mean(axis=1))


def _embedding_bag(optimizer, seed):
    """(network, loss, optimizer) for :func:`helpers.own_loop`: the table first, Momentum."""
    assert optimizer == "momentum", optimizer
    ms.set_seed(seed)
    net = _EmbeddingBag()
    return net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)


@pytest.mark.parametrize("path", ["accumulator", "parallel", "cells"])
def test_clearing_the_buffers_compiles_no_constant_of_their_shape(tmp_path, path):
    """The buffers are zeroed from zeros made while the graph runs: zeros made from constants alone (the first
    buffer's, until this test) are folded by MindSpore into a constant of the buffer's shape, which the compiled
    graph holds for as long as it lives: an extra copy of the first parameter, often the largest (an embedding
    table, as here). Read from the graphs MindSpore saves (save_graphs)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net, run, saved, _ = own_loop(path, seed=0, steps=2, make=_embedding_bag)
    buffers = (saved[1] if isinstance(saved, tuple) else saved).accu_grads
    before = net.table.embedding_table.asnumpy().copy()
    rng = np.random.default_rng(2)
    ms.set_context(save_graphs=1, save_graphs_path=str(tmp_path))
    try:
        for index in range(2):  # one window
            run(index, Tensor(rng.integers(0, 400, (4, 6)).astype(np.int32)),
                Tensor(rng.integers(0, 3, 4).astype(np.int32)))
    finally:
        ms.set_context(save_graphs=0)
    assert np.abs(net.table.embedding_table.asnumpy() - before).max() > 0.0, "the window was not applied"
    assert all(not buffer.asnumpy().any() for buffer in buffers), "the buffers were not cleared"
    graphs = [graph for graph in glob.glob(os.path.join(str(tmp_path), "**", "*.ir"), recursive=True)
              if re.fullmatch(r"\d+_execute_\d+\.ir", os.path.basename(graph))]  # each compiled graph's final IR
    assert graphs, f"MindSpore saved no final graph under {tmp_path}"
    table = int(np.prod(net.table.embedding_table.shape))
    for graph in graphs:
        with open(graph, encoding="utf-8") as handle:
            shapes = re.findall(r"Tensor\(shape=\[([0-9, ]+)\]", handle.read())
        large = [shape for shape in shapes if np.prod([int(d) for d in shape.split(",")]) >= table]
        assert not large, f"{os.path.basename(graph)} holds constants of shape {large}"


class _WeightedAdd(nn.Cell):
    def __init__(self, buffers):
        super().__init__()
        self.buffers = buffers
        self.hyper_map = ops.HyperMap()

    def construct(self, weight, grads):
        return self.hyper_map(ops.partial(grad_ops.accumulate_weighted, weight), self.buffers, grads)


@pytest.mark.parametrize("weight", [1.0, 0.3, 2.5])
def test_the_weighted_add_in_place_is_buffer_plus_weight_times_grad(weight, exec_mode):
    """accumulate_weighted adds through ApplyMomentum on the buffer (its variable and its accumulation at once):
    buffer + grad exactly for weight 1 (equal micro-batches), buffer + weight * grad to float32 rounding otherwise,
    a float16 gradient into its float32 buffer as well; the buffers change in place (the same Parameters)."""
    rng = np.random.default_rng(2)
    start = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES[1:]]
    grads = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES[1:]]
    grads[-1] = grads[-1].astype(np.float16)
    buffers = ms.ParameterTuple(ms.Parameter(Tensor(a), name=f"b{i}") for i, a in enumerate(start))
    _WeightedAdd(buffers)(Tensor(weight, ms.float32), tuple(Tensor(g) for g in grads))
    for buffer, before, grad in zip(buffers, start, grads):
        want = before.astype(np.float64) + weight * grad.astype(np.float32).astype(np.float64)
        got = buffer.asnumpy()
        if weight == 1.0:
            np.testing.assert_array_equal(got, before + grad.astype(np.float32))
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

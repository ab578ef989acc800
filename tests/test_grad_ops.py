"""The per-window reductions: the gradient norm's element sum and the overflow check, against numpy, in both
modes (GRAPH_MODE compiles them the way the update graphs do)."""
import numpy as np
import pytest

from mindspore import Tensor, nn, ops

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

"""Item-weighted windows: a loss that returns (loss, num_items) is weighed by its items on every path; inputs
whose batch is not on axis 0 are refused unless the loss says what it averaged over."""
import warnings
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

import ms_accum
import paths
from helpers import (assert_equals_large_batch, build_tagger, concat, micro_batches, params_of, rounding_rtol,
                     token_batches, token_reference, update_errors)
from test_model_accu import fake_device  # noqa: F401  (fixture)

REAL_TOKENS = (15, 4, 9, 11, 2, 17)  # of 18 token slots per micro-batch
N = 3


def windows():
    batches = token_batches(REAL_TOKENS)
    return [batches[:N], batches[N:]]


def token_mean_losses():
    """Each window's mean loss over its real tokens, from the initial parameters (first window) - computed
    directly on the large batch."""
    _, loss, _ = build_tagger(return_items=False)
    first = windows()[0]
    return float(loss(*(Tensor(np.concatenate(parts)) for parts in zip(*first))).asnumpy())


PATHS = ("three_cells", "driver", "accu_steps", "accu_steps_loss_scale", "model_accu", "model_accu_loss_scale")


def train(path, optimizer="momentum", batches=None):
    """The tagger trained through `path` (tests/paths.py) on `batches` (the two windows by default); its parameters
    and what each window reported."""
    net, loss, opt = build_tagger(optimizer)
    trained = paths.train(path, loss, opt, batches or token_batches(REAL_TOKENS), N, returns_items=True)
    return params_of(net), trained.windows


@pytest.mark.parametrize("path", PATHS)
def test_token_weighted_window_equals_the_large_batch_token_mean(path, exec_mode):
    got, records = train(path)
    assert_equals_large_batch(got, partial(token_reference, "momentum"), windows(), context=f"{path}, {exec_mode}")
    assert records[0].loss == pytest.approx(token_mean_losses(), rel=1e-5), "window loss is not the token mean"


def test_sink_mode_weighs_tokens_too(fake_device):  # noqa: F811
    got, _ = train("model_accu_sink")
    assert_equals_large_batch(got, partial(token_reference, "momentum"), windows(), context="sink")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_averaging_micro_batch_means_would_be_wrong_here(optimizer):
    """The data of these tests tell the two weightings apart: the mean of micro-batch means is far off."""
    net, loss, opt = build_tagger(optimizer, return_items=False)
    grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
    forward_backward = ms_accum.TrainForwardBackward(loss, opt, grad_sum)  # weighs samples: 3 per micro-batch
    optim = ms_accum.TrainOptim(opt, grad_sum)
    for batch in windows()[0]:
        forward_backward(*map(Tensor, batch))
    optim()
    reference = partial(token_reference, optimizer)
    worst = max(update_errors(params_of(net), reference(windows()[:1]), reference([])).values())
    assert worst > 100 * rounding_rtol(windows()[:1]), \
        f"sample weighting came within {worst:.2g} of the token mean's update: the test data are too even"
    got, _ = train("three_cells", optimizer, windows()[0])
    assert_equals_large_batch(got, reference, windows()[:1], context=f"token weighting, {optimizer}")


def summed_loss_model(seed=3):
    """A small classifier in a WithLossCell whose cross-entropy is summed over the micro-batch, and its SGD."""
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Flatten(), nn.Dense(36, 4))
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum"))
    return net, loss_net, nn.SGD(net.trainable_params(), 0.01)


def summed_loss_reference(windows_):
    """The large batch's summed-loss steps, one TrainOneStepCell step per window (no ms_accum)."""
    net, loss_net, opt = summed_loss_model()
    step = nn.TrainOneStepCell(loss_net, opt)
    for window in windows_:
        step(*map(Tensor, concat(window)))
    return params_of(net)


@pytest.mark.parametrize("path", PATHS)
def test_a_summed_loss_is_warned_of_when_averaged_and_trains_as_the_large_batch_sum_when_summed(path, exec_mode):
    """A new user's trial: a WithLossCell whose loss reduces by 'sum' trained 1/N of the large batch's step, in
    silence. Averaged, every path that takes a loss network warns, naming the loss function and both ways out;
    with average=False, the warning's second way, it equals the large batch's summed-loss steps, unequal
    micro-batches included."""
    batches = micro_batches((3, 5, 4, 4))
    _, loss_net, opt = summed_loss_model()
    with pytest.warns(UserWarning, match=r"the loss network's loss function, SoftmaxCrossEntropyWithLogits, reduces "
                                         r"by 'sum'.*1/N of the large batch's summed gradient \(with N equal "
                                         r"micro-batches\)\. Use reduction='mean' .*or average=False"):
        paths.train(path, loss_net, opt, batches, 2)
    net, loss_net, opt = summed_loss_model()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*reduces by 'sum'")
        trained = paths.train(path, loss_net, opt, batches, 2, average=False)
    assert len(trained.windows) == 2
    assert_equals_large_batch(params_of(net), summed_loss_reference, [batches[:2], batches[2:]],
                              context=f"{path}, {exec_mode}")


def test_check_equivalence_weighs_items():
    batches = windows()[0]
    large = tuple(np.concatenate(parts) for parts in zip(*batches))

    def make_network():
        return build_tagger()[1]

    report = ms_accum.check_equivalence(make_network, None, lambda p: nn.SGD(p, 0.5), large, N)
    assert report.passed, str(report)


def test_numbers_of_items_may_be_python_numbers(exec_mode):
    """num_items returned as a Python int (a constant) weighs like a Tensor."""

    class ConstantItems(nn.Cell):
        def __init__(self, network):
            super().__init__(auto_prefix=False)
            self.network = network

        def construct(self, x, labels, mask):
            loss, _ = self.network(x, labels, mask)
            return loss, 7

    net, loss, opt = build_tagger()
    cell = ms_accum.TrainAccuStepsCell(ConstantItems(loss), opt, accumulation_steps=2)
    for batch in token_batches((5, 5)):
        cell(*map(Tensor, batch))
    assert float(cell.accu_last_items.asnumpy()) == 14.0
    assert int(opt.global_step.asnumpy()[0]) == 1


@pytest.mark.parametrize("end", ["skip", "raise", "apply", "loss_scale"])
@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
def test_no_items_in_a_window_is_refused_before_the_update(cell, end, exec_mode):
    """The check shares the window end's skip branch (nonfinite="skip" or "raise", a loss scale) or, without one
    (nonfinite="apply"), has a branch of its own; either way it raises and nothing is updated. With "raise" its
    error comes before the non-finite gradient's that an empty micro-batch's loss may also cause."""
    net, loss, opt = build_tagger()
    before = params_of(net)
    empty = token_batches((0,))[0]
    scale = {"scale_sense": Tensor(np.float32(4.0))} if end == "loss_scale" else {}
    nonfinite = {} if scale else {"nonfinite": end}
    with pytest.raises(ValueError, match=r"'num_items' returned by the loss network must be a finite number > 0 for "
                                         r"every micro-batch, but a micro-batch of this window had 0"):
        if cell == "three_cells":
            grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
            ms_accum.TrainForwardBackward(loss, opt, grad_sum, **scale)(*map(Tensor, empty))
            ms_accum.TrainOptim(opt, grad_sum, **scale, **nonfinite)()
        elif scale:
            ms_accum.TrainAccuStepsWithLossScaleCell(loss, opt, accumulation_steps=1, **scale)(*map(Tensor, empty))
        else:
            ms_accum.TrainAccuStepsCell(loss, opt, accumulation_steps=1, **nonfinite)(*map(Tensor, empty))
    after = params_of(net)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=f"{name} changed by a refused window")
    assert int(opt.global_step.asnumpy()[0]) == 0


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
def test_items_that_are_not_finite_are_refused_not_skipped(cell, bad, exec_mode):
    """A NaN or inf item count (here a mask's sum over a NaN or an inf) is not a count: the window is refused as one
    without items is. It also made the window's gradient non-finite, and the window was skipped as an overflow, with
    no word under nonfinite="skip" (the default): a weighting bug looked like a numerical one."""
    net, loss, opt = build_tagger()
    before = params_of(net)
    first, second = token_batches((7, 5))
    second[2][0, 0] = float(bad)
    with pytest.raises(ValueError, match=r"'num_items' returned by the loss network must be a finite number > 0 for "
                                         r"every micro-batch, but a micro-batch of this window had -inf \(-inf stands "
                                         r"for a NaN or an infinite count\)"):
        if cell == "three_cells":
            grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
            forward_backward = ms_accum.TrainForwardBackward(loss, opt, grad_sum)
            for batch in (first, second):
                forward_backward(*map(Tensor, batch))
            ms_accum.TrainOptim(opt, grad_sum)()
        else:
            cell = ms_accum.TrainAccuStepsCell(loss, opt, accumulation_steps=2)
            for batch in (first, second):
                cell(*map(Tensor, batch))
    after = params_of(net)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=f"{name} changed by a refused window")
    assert int(opt.global_step.asnumpy()[0]) == 0


def test_no_items_in_a_window_names_the_driver(exec_mode):
    """The driver's error names what the user built, not the cells it builds inside."""
    net, loss, opt = build_tagger()
    before = params_of(net)
    data = paths.dataset(token_batches((5, 0)))
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation', 'num_items' returned by the loss network must "
                                         r"be a finite number > 0 for every micro-batch, but a micro-batch of this "
                                         r"window had 0.*"
                                         r"build a new GradientAccumulation\."):
        ms_accum.GradientAccumulation(loss, None, opt).train_process(1, data, 2, ckpt_path=None, log_every=0)
    after = params_of(net)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=f"{name} changed by a refused window")


# ------------------------------------------------------------------ sequence-first inputs
class SequenceFirstClassifier(nn.Cell):
    """Inputs (T, B, F), time first (the layout of nn.LSTM's default): mean over time, then classify."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 4)

    def construct(self, x):
        return self.fc(x.mean(axis=0))


class SequenceLoss(nn.Cell):
    """Cross-entropy over the batch; with return_items, also the batch size, read from axis 1."""

    def __init__(self, network, return_items):
        super().__init__(auto_prefix=False)
        self.network = network
        self.return_items = return_items
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, labels):
        loss = self.ce(self.network(x), labels)
        if self.return_items:
            return loss, x.shape[1]
        return loss


def sequence_batches(batch_sizes, length=5, seed=4):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(length, b, 6)).astype(np.float32), rng.integers(0, 4, size=b).astype(np.int32))
            for b in batch_sizes]


def sequence_net(return_items, seed=0):
    ms.set_seed(seed)
    net = SequenceFirstClassifier()
    return net, SequenceLoss(net, return_items), nn.Momentum(net.trainable_params(), 0.1, 0.9)


@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
def test_sequence_first_inputs_are_refused_with_the_shapes(cell, exec_mode):
    _, loss, opt = sequence_net(return_items=False)
    if cell == "three_cells":
        step = ms_accum.TrainForwardBackward(loss, opt, opt.parameters.clone(prefix="grad_sum", init="zeros"))
    else:
        step = ms_accum.TrainAccuStepsCell(loss, opt, accumulation_steps=2)
    x, y = sequence_batches((4,))[0]
    with pytest.raises(ValueError, match=r"the inputs' leading dimensions must agree to count samples, but got "
                                         r"shapes \[\[5, 4, 6\], \[4\]\].*returns '\(loss, num_items\)'"):
        step(Tensor(x), Tensor(y))


@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
def test_sequence_first_inputs_with_num_items_equal_the_large_batch(cell, exec_mode):
    batches = sequence_batches((4, 4, 2))
    net, loss, opt = sequence_net(return_items=True)
    if cell == "three_cells":
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(loss, opt, grad_sum)
        for x, y in batches:
            forward_backward(Tensor(x), Tensor(y))
        ms_accum.TrainOptim(opt, grad_sum)()
    else:
        step = ms_accum.TrainAccuStepsCell(loss, opt, accumulation_steps=3)
        for x, y in batches:
            step(Tensor(x), Tensor(y))
    def large_batch(windows):
        ref_net, ref_loss, ref_opt = sequence_net(return_items=False)
        step = nn.TrainOneStepCell(ref_loss, ref_opt)
        for window in windows:
            step(Tensor(np.concatenate([x for x, _ in window], axis=1)), Tensor(np.concatenate([y for _, y in window])))
        return params_of(ref_net)
    assert_equals_large_batch(params_of(net), large_batch, [batches], context=f"sequence-first, {cell}, {exec_mode}")


def test_scalar_inputs_do_not_count_as_a_batch_axis():
    """A rank-0 input (a temperature, say) beside the batch does not trip the leading-dimension check."""

    class Scaled(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 1)

        def construct(self, x, temperature):
            return ops.mean(self.fc(x)) * temperature

    net = Scaled()
    opt = nn.SGD(net.trainable_params(), 0.1)
    cell = ms_accum.TrainAccuStepsCell(net, opt, accumulation_steps=1)
    cell(Tensor(np.ones((4, 3), np.float32)), Tensor(2.0, ms.float32))
    assert float(cell.accu_last_items.asnumpy()) == 4.0

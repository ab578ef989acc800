"""The learning-rate rules (lr_scaling) on every path that ends a window: each window's update equals MindSpore's
own optimizer stepped on the window's concatenated batch at the rate the rule gives, computed here independently.

The model is a softmax regression (Dense + softmax cross-entropy) whose per-sample gradients numpy computes in
closed form (``test_noise_scale.per_sample_grads``), so that AdaScale's gain r comes from noise estimates computed
without MindSpore. N follows the schedule {0: 1, 2: 3}: G0 is the first window's 4 samples, later windows hold 12.
Each check has a control: the same comparison with the factor left at 1 must fail.
"""
import math

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import ms_accum
from ms_accum.core.compiled import write_parameter
from test_noise_scale import FEATURES, formula, make_net, per_sample_grads, population, smoothed_estimates

SCHEDULE = {0: 1, 2: 3}
WINDOWS = (1, 1, 3, 3)  # the schedule's N for windows 0 to 3
MICRO = 4  # samples per micro-batch
BASE_RATE = {"momentum": 0.5, "adamw": 0.05}
RTOL = 2e-5


def make_optimizer(kind, params, rate):
    if kind == "momentum":
        return nn.Momentum(params, learning_rate=rate, momentum=0.9)
    return nn.AdamWeightDecay(params, learning_rate=rate, weight_decay=0.01)


def windows_of_data(seed=3):
    """WINDOWS windows of MICRO-sample micro-batches drawn from the population."""
    x, y = population()
    rng = np.random.default_rng(seed)
    out = []
    for steps in WINDOWS:
        window = []
        for _ in range(steps):
            index = rng.choice(len(y), size=MICRO, replace=False)
            window.append((x[index], y[index]))
        out.append(window)
    return out


def expected_factor(rule, kind, window, net, estimates):
    """The factor the rule gives the window, from its size and (AdaScale) the noise estimates computed in numpy
    at the weights the window's gradients are taken at; `estimates` collects the windows' (grad_sq, trace)."""
    total = sum(len(y) for _, y in window)
    ratio = total / MICRO  # G / G0: the first window holds MICRO samples
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    if len(window) > 1:
        estimates.append(formula([per_sample_grads(net, x, y) for x, y in window]))
    smooth = smoothed_estimates(estimates)
    grad_sq, trace = smooth[-1] if smooth else (0.0, 0.0)
    gain = 1.0
    if grad_sq > 0:
        noise = max(trace, 0.0) / grad_sq
        gain = ratio * (noise + 1.0 * MICRO) / (noise + total)
    return gain if kind == "momentum" else math.sqrt(gain)


class Reference:
    """MindSpore's own optimizer stepped on each window's concatenated batch at a rate set before the step."""

    def __init__(self, kind):
        self.net, self.kind = make_net(), kind
        self.optimizer = make_optimizer(kind, self.net.trainable_params(), BASE_RATE[kind])
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.step = nn.TrainOneStepCell(nn.WithLossCell(self.net, loss), self.optimizer)

    def update(self, window, factor):
        before = weights(self.net)
        write_parameter(self.optimizer.learning_rate, np.float32(BASE_RATE[self.kind] * factor))
        x = np.concatenate([x for x, _ in window])
        y = np.concatenate([y for _, y in window])
        self.step(Tensor(x), Tensor(y))
        return difference(weights(self.net), before)


def weights(net):
    return [p.asnumpy().astype(np.float64).copy() for p in net.trainable_params()]


def difference(after, before):
    return [a - b for a, b in zip(after, before)]


def close(got, want):
    """Whether two updates agree at float32 tolerance (relative to the largest entry of each tensor)."""
    return all(np.abs(g - w).max() <= RTOL * max(np.abs(w).max(), 1e-12) for g, w in zip(got, want))


def run_path(path, net, optimizer, rule, noise):
    """A function window -> None that runs one window's micro-batches through `path`, built on `net`."""
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    loss_net = nn.WithLossCell(net, loss)
    if path in ("cell", "loss_scale"):
        if path == "cell":
            cell = ms_accum.TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=SCHEDULE,
                                               noise_scale=noise, lr_scaling=rule)
        else:
            cell = ms_accum.TrainAccuStepsWithLossScaleCell(
                loss_net, optimizer, nn.FixedLossScaleUpdateCell(1024.0), gradient_accumulation_steps=SCHEDULE,
                noise_scale=noise, lr_scaling=rule)
        cell.set_train(True)

        def run(window):
            for x, y in window:
                cell(Tensor(x), Tensor(y))
        return cell, run
    if path == "single":
        grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(loss_net, optimizer, grad_sum, noise_scale=noise)
        optim = ms_accum.TrainOptim(optimizer, grad_sum, noise_scale=noise, lr_scaling=rule)
        clear = ms_accum.TrainClear(grad_sum)
        forward_backward.set_train(True)

        def run(window):
            for x, y in window:
                forward_backward(Tensor(x), Tensor(y))
            optim()
            clear()
        return optim, run
    accumulator = ms_accum.Accumulator(optimizer, gradient_accumulation_steps=SCHEDULE, noise_scale=noise,
                                       lr_scaling=rule)
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    @ms.jit
    def step(x, y):
        _, grads = grad_fn(x, y)
        return accumulator(grads, x.shape[0])

    def run(window):
        for x, y in window:
            step(Tensor(x), Tensor(y))
    return accumulator, run


def check_rule(path, rule, kind):
    """Each window's update against the reference at the rule's factor, and the control at factor 1."""
    noise = rule == "adascale"
    net = make_net()
    optimizer = make_optimizer(kind, net.trainable_params(), BASE_RATE[kind])
    cell, run = run_path(path, net, optimizer, rule, noise)
    reference, control = Reference(kind), Reference(kind)
    estimates, factors = [], []
    control_failed = False
    for index, window in enumerate(windows_of_data()):
        factor = expected_factor(rule, kind, window, reference.net, estimates)
        factors.append(factor)
        before = weights(net)
        run(window)
        got = difference(weights(net), before)
        want = reference.update(window, factor)
        assert close(got, want), (f"{path}/{rule}/{kind}: window {index} (N={len(window)}, factor {factor}): the "
                                  f"update differs from the reference by "
                                  f"{max(np.abs(g - w).max() for g, w in zip(got, want)):.3g}")
        control_failed |= not close(got, control.update(window, 1.0))
        control.net.weight.set_data(Tensor(reference.net.weight.asnumpy()))  # the control starts each window alike
        control.net.bias.set_data(Tensor(reference.net.bias.asnumpy()))
    assert max(abs(f - 1.0) for f in factors) > 0.05, f"{rule}: the factors {factors} do not test the rule"
    assert control_failed, f"{path}/{rule}/{kind}: the control at factor 1 passed: the test cannot fail"
    assert abs(float(cell.accu_lr_factor.asnumpy()) - factors[-1]) < 1e-5 * factors[-1]
    return cell, factors


@pytest.mark.parametrize("kind", ["momentum", "adamw"])
@pytest.mark.parametrize("rule", ["linear", "sqrt", "adascale"])
@pytest.mark.parametrize("path", ["cell", "loss_scale", "single", "functional"])
def test_each_window_is_the_large_batch_step_at_the_rules_rate(exec_mode, path, rule, kind):
    cell, _ = check_rule(path, rule, kind)
    # progress: G / G0 per window (1 + 1 + 3 + 3), or AdaScale's gains
    if rule != "adascale":
        assert cell.lr_state.progress == pytest.approx(8.0)

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
from mindspore.train import Callback

import ms_accum
from ms_accum.core.compiled import write_parameter
from ms_accum.core import engine as engine_module
from ms_accum.core.engine import WindowEngine
from helpers import in_pynative, jit_accumulator_step, numpy_dataset
from test_noise_scale import formula, make_net, per_sample_grads, population, smoothed_estimates

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


def rank_windows(rank, world, seed=3):
    """Rank `rank`'s share of :func:`windows_of_data` in data parallel: its slice of every micro-batch."""
    size = MICRO // world
    return [[(x[rank * size:(rank + 1) * size], y[rank * size:(rank + 1) * size]) for x, y in window]
            for window in windows_of_data(seed)]


def union_of_ranks(world, seed=3):
    """What `world` ranks see of each window together: every rank's micro-batches, as the units the noise
    estimate sums over the devices (a device's micro-batch is one of them)."""
    shares = [rank_windows(rank, world, seed) for rank in range(world)]
    return [[shares[rank][w][s] for s in range(len(shares[0][w])) for rank in range(world)]
            for w in range(len(WINDOWS))]


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
    """MindSpore's own optimizer stepped on each window's concatenated batch at a rate set before the step, in
    PYNATIVE_MODE whatever the test's mode (helpers.in_pynative: no graph to compile)."""

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
        in_pynative(self.step, Tensor(x), Tensor(y))
        return difference(weights(self.net), before)


def weights(net):
    return [p.asnumpy().astype(np.float64).copy() for p in net.trainable_params()]


def difference(after, before):
    return [a - b for a, b in zip(after, before)]


def close(got, want):
    """Whether two updates agree at float32 tolerance (relative to the largest entry of each tensor)."""
    return all(np.abs(g - w).max() <= RTOL * max(np.abs(w).max(), 1e-12) for g, w in zip(got, want))


def run_path(path, net, optimizer, rule, noise, **options):
    """A function window -> None that runs one window's micro-batches through `path`, built on `net`."""
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    loss_net = nn.WithLossCell(net, loss)
    if path in ("cell", "loss_scale"):
        if path == "cell":
            cell = ms_accum.TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=SCHEDULE,
                                               noise_scale=noise, lr_scaling=rule, **options)
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
    return functional_path(loss_net, optimizer, rule, noise, options)


def functional_path(loss_net, optimizer, rule, noise, options):
    """Accumulator in the tutorial's jit step (a function of its own: a jit function's closure must hold only what
    it reads)."""
    accumulator = ms_accum.Accumulator(optimizer, gradient_accumulation_steps=SCHEDULE, noise_scale=noise,
                                       lr_scaling=rule, **options)
    step = jit_accumulator_step(loss_net, optimizer, accumulator)

    def run(window):
        for x, y in window:
            step(Tensor(x), Tensor(y))
    return accumulator, run


def check_rule(path, rule, kind, **options):
    """Each window's update against the reference at the rule's factor, and the control at factor 1."""
    noise = rule == "adascale"
    net = make_net()
    optimizer = make_optimizer(kind, net.trainable_params(), BASE_RATE[kind])
    cell, run = run_path(path, net, optimizer, rule, noise, **options)

    def update(_, window):
        before = weights(net)
        run(window)
        return difference(weights(net), before)
    factors = check_updates(update, windows_of_data(), rule, kind, path)
    assert abs(float(cell.accu_lr_factor.asnumpy()) - factors[-1]) < 1e-5 * factors[-1]
    return cell, factors


def check_updates(update, windows, rule, kind, context):
    """`update(index, window)` (the update of window `index` on the path under test) against the reference at the
    rule's factor, and the control at factor 1, which must fail for some window; the factors."""
    reference, control = Reference(kind), Reference(kind)
    estimates, factors = [], []
    control_failed = False
    for index, window in enumerate(windows):
        factor = expected_factor(rule, kind, window, reference.net, estimates)
        factors.append(factor)
        got = update(index, window)
        want = reference.update(window, factor)
        assert close(got, want), (f"{context}/{rule}/{kind}: window {index} (N={len(window)}, factor {factor}): the "
                                  f"update differs from the reference by "
                                  f"{max(np.abs(g - w).max() for g, w in zip(got, want)):.3g}")
        control_failed |= not close(got, control.update(window, 1.0))
        control.net.weight.set_data(Tensor(reference.net.weight.asnumpy()))  # the control starts each window alike
        control.net.bias.set_data(Tensor(reference.net.bias.asnumpy()))
    assert max(abs(f - 1.0) for f in factors) > 0.05, f"{rule}: the factors {factors} do not test the rule"
    assert control_failed, f"{context}/{rule}/{kind}: the control at factor 1 passed: the test cannot fail"
    return factors


@pytest.mark.parametrize("kind", ["momentum", "adamw"])
@pytest.mark.parametrize("rule", ["linear", "sqrt", "adascale"])
@pytest.mark.parametrize("path", ["cell", "loss_scale", "single", "functional"])
def test_each_window_is_the_large_batch_step_at_the_rules_rate(exec_mode, path, rule, kind):
    cell, _ = check_rule(path, rule, kind)
    # progress: G / G0 per window (1 + 1 + 3 + 3), or AdaScale's gains
    if rule != "adascale":
        assert cell.lr_state.progress == pytest.approx(8.0)


@pytest.mark.parametrize("path", ["cell", "functional"])
def test_the_rule_holds_without_the_nonfinite_check(exec_mode, path):
    """nonfinite="apply" leaves no skip flag to order the factor's write before the step by: the window's loss is
    ordered instead, and the step still reads the window's own factor."""
    check_rule(path, "adascale", "adamw", nonfinite="apply")


# ----------------------------------------------------------------- the trainers (GradientAccumulation, Model_ACCU)


class Snapshots(Callback):
    """The network's weights after every update."""

    def __init__(self, net):
        super().__init__()
        self.net, self.taken = net, [weights(net)]

    def on_train_step_end(self, run_context):
        self.taken.append(weights(self.net))


def flat(windows):
    return [batch for window in windows for batch in window]


def check_trainer_run(snapshots, records, rule, kind):
    """The run's per-window updates against the reference at the rule's factors, its telemetry (the rate applied,
    G, the progress), and the control at factor 1."""
    reference, control = Reference(kind), Reference(kind)
    estimates, progress, control_failed = [], 0.0, False
    for index, window in enumerate(windows_of_data()):
        factor = expected_factor(rule, kind, window, reference.net, estimates)
        want = reference.update(window, factor)
        got = difference(snapshots[index + 1], snapshots[index])
        assert close(got, want), f"{rule}/{kind}: window {index} differs from the reference"
        control_failed |= not close(got, control.update(window, 1.0))
        control.net.weight.set_data(Tensor(reference.net.weight.asnumpy()))
        control.net.bias.set_data(Tensor(reference.net.bias.asnumpy()))
        record = records[index]
        assert record.items == len(window) * MICRO
        assert record.learning_rate == pytest.approx(BASE_RATE[kind] * factor, rel=1e-5)
        progress += len(window) if rule != "adascale" else factor if kind == "momentum" else factor ** 2
        assert record.progress == pytest.approx(progress, rel=1e-5)
    assert control_failed, f"{rule}/{kind}: the control at factor 1 passed: the test cannot fail"


@pytest.mark.parametrize("kind", ["momentum", "adamw"])
@pytest.mark.parametrize("rule", ["linear", "sqrt", "adascale"])
@pytest.mark.parametrize("trainer", ["GradientAccumulation", "Model_ACCU"])
def test_trainers_apply_the_rule_window_by_window(trainer, rule, kind):
    net = make_net()
    optimizer = make_optimizer(kind, net.trainable_params(), BASE_RATE[kind])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    telemetry, snapshots = ms_accum.WindowTelemetry(), Snapshots(net)
    dataset = numpy_dataset(flat(windows_of_data()))
    if trainer == "GradientAccumulation":
        driver = ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=rule == "adascale", lr_scaling=rule)
        driver.train_process(1, dataset, SCHEDULE, callbacks=[telemetry, snapshots], ckpt_path=None, log_every=0)
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=SCHEDULE,
                                           noise_scale=rule == "adascale", lr_scaling=rule)
        ms_accum.Model_ACCU(cell).train(1, dataset, callbacks=[telemetry, snapshots], dataset_sink_mode=False)
    assert [r.micro_batches for r in telemetry.records] == list(WINDOWS)
    check_trainer_run(snapshots.taken, telemetry.records, rule, kind)


def test_without_a_rule_the_optimizer_is_left_as_it_is():
    net = make_net()
    optimizer = make_optimizer("momentum", net.trainable_params(), 0.1)
    rate = optimizer.learning_rate
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, gradient_accumulation_steps=2)
    assert optimizer.learning_rate is rate and cell.lr_state is None and cell.lr_scaling == "none"
    assert not [p.name for p in cell.get_parameters() if ".lr." in p.name]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(lr_scaling="cubic"), ValueError, r"For 'TrainAccuStepsCell', 'lr_scaling' must be one of"),
    (dict(lr_scaling="adascale"), ValueError,
     r"For 'TrainAccuStepsCell', 'lr_scaling'='adascale' reads AdaScale's gain from the window's gradient noise "
     r"scale, but TrainAccuStepsCell does not measure it. Build it with noise_scale=True"),
    (dict(lr_scaling="linear", average=False), ValueError,
     r"For 'TrainAccuStepsCell', 'lr_scaling'='linear' scales the learning rate of the window's mean gradient, but "
     r"got average=False: .* Pass average=True"),
    (dict(reference_batch=64), ValueError,
     r"For 'TrainAccuStepsCell', 'reference_batch' is read by a learning-rate rule only, but got 64 with "
     r"lr_scaling='none'"),
    (dict(lr_scaling="sqrt", reference_batch=0), ValueError,
     r"For 'TrainAccuStepsCell', 'reference_batch' must be a finite number > 0"),
    (dict(lr_scaling="sqrt", reference_batch="64"), TypeError,
     r"For 'TrainAccuStepsCell', 'reference_batch' must be a finite number > 0"),
])
def test_refused_rules_name_the_argument(kwargs, error, message):
    net = make_net()
    optimizer = make_optimizer("momentum", net.trainable_params(), 0.1)
    with pytest.raises(error, match=message):
        ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, **kwargs)


@pytest.mark.parametrize("make", ["Accumulator", "TrainOptim", "TrainAccuStepsWithLossScaleCell",
                                  "GradientAccumulation"])
def test_every_front_end_refuses_a_rule_over_the_raw_sum(make):
    """average=False applies the sum of the micro-batches' gradients, which grows with N by itself: a rule on top
    would scale the step twice (a user's trial: lr_scaling="linear" with average=False took the step from 2 to 8
    times the mean gradient when N doubled, silently)."""
    net = make_net()
    optimizer = make_optimizer("momentum", net.trainable_params(), 0.1)
    with pytest.raises(ValueError, match=rf"For '{make}', 'lr_scaling'='sqrt' scales the learning rate of the "
                                         rf"window's mean gradient, but got average=False"):
        if make == "Accumulator":
            ms_accum.Accumulator(optimizer, 2, average=False, lr_scaling="sqrt")
        elif make == "TrainOptim":
            ms_accum.TrainOptim(optimizer, optimizer.parameters.clone(prefix="g", init="zeros"), average=False,
                                lr_scaling="sqrt")
        elif make == "TrainAccuStepsWithLossScaleCell":
            ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer,
                                                     Tensor(1.0, ms.float32), average=False, lr_scaling="sqrt")
        else:
            ms_accum.GradientAccumulation(net, nn.MSELoss(), optimizer, average=False, lr_scaling="sqrt")


@pytest.mark.parametrize("make", ["Accumulator", "TrainOptim", "TrainAccuStepsWithLossScaleCell",
                                  "GradientAccumulation"])
def test_every_front_end_refuses_adascale_without_the_noise_scale(make):
    net = make_net()
    optimizer = make_optimizer("adamw", net.trainable_params(), 0.1)
    owner = make
    with pytest.raises(ValueError, match=rf"For '{owner}', 'lr_scaling'='adascale' reads AdaScale's gain"):
        if make == "Accumulator":
            ms_accum.Accumulator(optimizer, 2, lr_scaling="adascale")
        elif make == "TrainOptim":
            ms_accum.TrainOptim(optimizer, optimizer.parameters.clone(prefix="g", init="zeros"),
                                lr_scaling="adascale")
        elif make == "TrainAccuStepsWithLossScaleCell":
            ms_accum.TrainAccuStepsWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer,
                                                     Tensor(1.0, ms.float32), lr_scaling="adascale")
        else:
            ms_accum.GradientAccumulation(net, nn.MSELoss(), optimizer, lr_scaling="adascale")


def test_a_rate_list_is_checked_against_the_runs_reference_steps():
    """With a rule a list is indexed by reference steps: 8 micro-batches of 4 samples over G0 = 4 take 8 entries,
    though the run makes 4 updates."""
    net = make_net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=[0.1] * 7, momentum=0.9)
    driver = ms_accum.GradientAccumulation(net, loss, optimizer, lr_scaling="linear")
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation.train_process', the optimizer's learning-rate "
                                         r"list must have an entry for every reference step of the run .* but it has "
                                         r"7 and this run needs 8"):
        driver.train_process(1, numpy_dataset(flat(windows_of_data())), SCHEDULE, ckpt_path=None, log_every=0)


@pytest.mark.parametrize("entries, refused", [(3, False), (2, True)])
def test_a_rate_list_is_checked_against_the_windows_that_train(entries, refused):
    """partial_window="drop": 14 micro-batches of 8, N 4, G0 = 32, so three windows read entries 0 to 2 and the
    last two micro-batches are dropped, moving no progress: 3 entries are enough, 2 are not."""
    rng = np.random.default_rng(0)
    data = numpy_dataset([(rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
                          for _ in range(14)])
    net = nn.Dense(6, 1)
    optimizer = nn.Momentum(net.trainable_params(), [0.01, 0.02, 0.03][:entries], 0.9)
    driver = ms_accum.GradientAccumulation(net, nn.MSELoss(), optimizer, lr_scaling="linear")
    telemetry = ms_accum.WindowTelemetry()

    def run():
        driver.train_process(1, data, 4, partial_window="drop", callbacks=[telemetry], ckpt_path=None, log_every=0)
    if refused:
        with pytest.raises(ValueError, match=r"but it has 2 and this run needs 3 \(0 done before it, 3 in it: 12 "
                                             r"micro-batches"):
            run()
        return
    run()
    assert [r.learning_rate for r in telemetry.records] == pytest.approx([0.01, 0.02, 0.03])
    assert [r.progress for r in telemetry.records] == [1.0, 2.0, 3.0]


# ----------------------------------------------------------------- exact resume


def test_a_run_resumed_mid_window_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    """A changing N, AdaScale (its factor from the noise state) and a rate list read at the progress: killed inside
    the third window, resumed into fresh weights from the state file, the run ends where the uninterrupted one
    does, with the same progress and factor."""
    from test_resume import _Killed, die_after  # pylint: disable=import-outside-toplevel
    rates = [0.5, 0.4, 0.45, 0.3, 0.35, 0.2, 0.25, 0.15, 0.1, 0.12, 0.08, 0.05]
    batches = flat(windows_of_data()) + flat(windows_of_data(seed=4))[:3]  # windows 1, 1, 3, 3, 3

    def trainer(seed):
        net = make_net(seed)
        optimizer = nn.Momentum(net.trainable_params(), learning_rate=rates, momentum=0.9)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        return ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=True, lr_scaling="adascale"), net

    full, full_net = trainer(0)
    full.train_process(1, numpy_dataset(batches), SCHEDULE, ckpt_path=None, log_every=0)
    state = str(tmp_path / "state.ckpt")
    cut, _ = trainer(0)
    die_after(monkeypatch, ms_accum.TrainAccuStepsCell, 3)  # windows 1, 1, then 1 micro-batch of 3
    with pytest.raises(_Killed):
        cut.train_process(1, numpy_dataset(batches), SCHEDULE, ckpt_path=None, log_every=0, state_path=state,
                          save_state_every=1)
    monkeypatch.undo()
    resumed, net = trainer(5)
    resumed.train_process(1, numpy_dataset(batches), SCHEDULE, ckpt_path=None, log_every=0, resume_from=state)
    for got, want in zip(weights(net), weights(full_net)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert resumed.cell.lr_state.progress == pytest.approx(full.cell.lr_state.progress, rel=1e-6)
    assert float(resumed.cell.accu_lr_factor.asnumpy()) == pytest.approx(float(full.cell.accu_lr_factor.asnumpy()))
    assert full.cell.lr_state.progress > 5.0  # the gains moved progress beyond the first windows' 1 + 1


# ----------------------------------------------------------------- N chosen for goodput


def goodput_run(policy, batches, state_path=None, resume_from=None, seed=0):
    """GradientAccumulation over `batches` with `policy`: (telemetry records, snapshots, trainer)."""
    net = make_net(seed)
    optimizer = make_optimizer("momentum", net.trainable_params(), 0.1)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    driver = ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=True)
    telemetry, snapshots = ms_accum.WindowTelemetry(), Snapshots(net)
    extra = {} if state_path is None else dict(state_path=state_path, save_state_every=1)
    driver.train_process(1, numpy_dataset(batches), policy, callbacks=[telemetry, snapshots], ckpt_path=None,
                         log_every=0, resume_from=resume_from, **extra)
    return telemetry.records, snapshots.taken, driver


def goodput_batches(count=26, seed=5):
    x, y = population()
    rng = np.random.default_rng(seed)
    return [(x[index], y[index]) for index in (rng.choice(len(y), size=MICRO, replace=False) for _ in range(count))]


@pytest.fixture
def steady_windows(monkeypatch):
    """The cell reports each window's time as 0.01 s a micro-batch + 0.05 s (what a quiet device would take), not
    its wall time: the model here is so small that the wall time of N = 2 and N = 4 is noise on a shared machine,
    and no timing belongs in pytest. What is tested is the path from the cell's window end to the policy."""
    def report(cell, micro_batches):
        if micro_batches is not None:
            cell.observe_window(int(cell.accu_windows.asnumpy()) - 1, micro_batches, 0.01 * micro_batches + 0.05)
    monkeypatch.setattr(WindowEngine, "_time_window", report)


def test_goodput_policy_calibrates_then_decides_as_the_host_rule(steady_windows):
    """Windows 0-1 at N = 2, 2-3 at N = 4 (the calibration, reported by the cell), then N from the fitted constants
    and the noise scale every 2 windows, as the host's next_steps decides from the same figures; each window the
    large-batch step of its size."""
    from ms_accum.core.goodput import GoodputAccumulation  # pylint: disable=import-outside-toplevel
    policy = GoodputAccumulation(min_steps=2, max_steps=6, interval=2, calibration_windows=2)
    batches = goodput_batches()
    records, snapshots, driver = goodput_run(policy, batches)
    sizes = [r.micro_batches for r in records]
    assert sizes[:4] == [2, 2, 4, 4] and policy.frozen
    assert (policy.micro_time, policy.end_time) == pytest.approx((0.01, 0.05), rel=1e-6)
    np.testing.assert_allclose(driver.cell.accu_goodput_constants.asnumpy(), policy.device_constants, rtol=1e-6)
    host = GoodputAccumulation(min_steps=2, max_steps=6, interval=2, calibration_windows=2,
                               micro_time=policy.micro_time, end_time=policy.end_time)
    for update in range(3, len(records) - 1):  # after the calibration: the constants are on the device
        record = records[update]
        want = host.next_steps(record.accumulation_steps, update, record.noise_scale,
                               record.items / record.micro_batches)
        assert records[update + 1].accumulation_steps == want, f"window {update + 1}: {sizes}"
    reference, start = Reference("momentum"), 0
    for index, size in enumerate(sizes):  # no rule: the rate the optimizer was built with, 0.1
        want = reference.update(batches[start:start + size], 0.1 / BASE_RATE["momentum"])
        start += size
        assert close(difference(snapshots[index + 1], snapshots[index]), want), f"window {index} of {sizes}"


def test_goodput_policy_state_resumes_from_the_state_file(tmp_path, monkeypatch, steady_windows):
    """Killed after the calibration: the resumed run's fresh policy takes the measured constants from the state
    file instead of calibrating again."""
    from ms_accum.core.goodput import GoodputAccumulation  # pylint: disable=import-outside-toplevel
    from test_resume import _Killed, die_after  # pylint: disable=import-outside-toplevel
    state = str(tmp_path / "state.ckpt")
    cut_policy = GoodputAccumulation(min_steps=2, max_steps=6, interval=2, calibration_windows=2)
    die_after(monkeypatch, ms_accum.TrainAccuStepsCell, 15)  # the calibration's 12 micro-batches and 3 more
    with pytest.raises(_Killed):
        goodput_run(cut_policy, goodput_batches(), state_path=state)
    monkeypatch.undo()
    assert cut_policy.frozen
    resumed_policy = GoodputAccumulation(min_steps=2, max_steps=6, interval=2, calibration_windows=2)
    records, _, _ = goodput_run(resumed_policy, goodput_batches(), resume_from=state, seed=3)
    assert resumed_policy.frozen and resumed_policy.device_constants == pytest.approx(cut_policy.device_constants,
                                                                                      rel=1e-6)
    assert records and all(r.accumulation_steps >= 2 for r in records)


def test_goodput_policy_without_constants_is_refused_by_accumulator():
    from ms_accum.core.goodput import GoodputAccumulation  # pylint: disable=import-outside-toplevel
    net = make_net()
    optimizer = make_optimizer("momentum", net.trainable_params(), 0.1)
    with pytest.raises(ValueError, match=r"For 'Accumulator', 'gradient_accumulation_steps' as a GoodputAccumulation "
                                         r"policy must be told each window's time"):
        ms_accum.Accumulator(optimizer, GoodputAccumulation(2, 6), noise_scale=True)
    given = GoodputAccumulation(2, 6, micro_time=0.01, end_time=0.02)
    accumulator = ms_accum.Accumulator(optimizer, given, noise_scale=True)
    np.testing.assert_allclose(accumulator.accu_goodput_constants.asnumpy(), [0.01, 0.02], rtol=1e-6)


@pytest.mark.filterwarnings("ignore:For 'Model_ACCU.train', dataset sink mode needs a GPU or Ascend")
def test_sink_mode_says_the_rule_has_nothing_to_follow():
    """Dataset sink mode runs one N: a rule's factor stays 1 (G0 the first window), and a warning says so; asked on
    CPU (MindSpore trains without sink there), the run still applies the factor 1 and reads the update count."""
    net = make_net()
    optimizer = make_optimizer("momentum", net.trainable_params(), BASE_RATE["momentum"])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=2,
                                       lr_scaling="linear")
    telemetry = ms_accum.WindowTelemetry()
    with pytest.warns(UserWarning, match=r"For 'Model_ACCU.train', dataset sink mode runs one N \(2\), so the "
                                         r"learning-rate rule lr_scaling='linear' has no batch change to follow"):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(goodput_batches(8)), callbacks=[telemetry],
                                        dataset_sink_mode=True)
    assert [r.learning_rate for r in telemetry.records] == pytest.approx([BASE_RATE["momentum"]] * 4)
    assert [r.progress for r in telemetry.records] == pytest.approx([1.0, 2.0, 3.0, 4.0])


def test_in_data_parallel_a_calibrating_goodput_policy_is_told_the_slowest_devices_times(monkeypatch):
    """In data parallel the calibration reads each window's time as the slowest device measured it (one AllGather
    per window, every device calling it), so every device freezes the same constants; once frozen, no gather. (The
    cell's is_distributed is set by hand and the gather is replaced: building a DATA_PARALLEL cell needs msrun;
    tests/test_goodput_data_parallel.py runs the real one on two msrun workers.)"""
    net = nn.Dense(4, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       noise_scale=True, gradient_accumulation_steps=3)
    cell.is_distributed = True
    gathered = []
    monkeypatch.setattr(engine_module, "slowest_device_seconds",
                        lambda seconds: gathered.append(seconds) or 2.0 * seconds)  # the other device, twice slower
    policy = ms_accum.GoodputAccumulation(2, 4, calibration_windows=2)
    cell.set_gradient_accumulation_steps(policy)
    for update, steps in enumerate([2, 2, 4, 4]):
        cell.observe_window(update, steps, 0.01 * steps + 0.05)
    assert gathered == pytest.approx([0.07, 0.07, 0.09, 0.09])
    assert policy.device_constants == pytest.approx((0.02, 0.1))
    np.testing.assert_allclose(cell.accu_goodput_constants.asnumpy(), [0.02, 0.1], rtol=1e-6)
    cell.observe_window(4, 4, 0.09)
    assert len(gathered) == 4  # frozen: the same on every device, nothing to gather


def test_a_frozen_goodput_policy_costs_its_windows_one_read_and_still_takes_a_loaded_state(monkeypatch):
    """Once the policy is frozen a window's end reads neither the open window before it starts nor the window
    count, and writes nothing: reading and writing the policy's Parameters every window cost LeNet5 7 ms a window
    of 16 ms. What is left, one read of the constants, still sees a state loaded into the cell: the policy takes
    it once (a calibrating state: it calibrates again, from the window after), and the next windows compare
    equal."""
    net = nn.Dense(4, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                       noise_scale=True, gradient_accumulation_steps=3)
    policy = ms_accum.GoodputAccumulation(2, 4, calibration_windows=2)
    cell.set_gradient_accumulation_steps(policy)
    for update, steps in enumerate([2, 2, 4, 4]):  # the calibration's windows, reported: frozen
        cell.observe_window(update, steps, 0.01 * steps + 0.05)
    assert policy.frozen
    calls = {"write": 0, "observe": 0, "load": 0}

    def counting(name, method):
        def counted(*args, **kwargs):
            calls[name] += 1
            return method(*args, **kwargs)
        return counted
    monkeypatch.setattr(WindowEngine, "_write_goodput", counting("write", WindowEngine._write_goodput))
    monkeypatch.setattr(type(policy), "observe", counting("observe", type(policy).observe))
    monkeypatch.setattr(type(policy), "load_state_dict", counting("load", type(policy).load_state_dict))
    x, y = Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 2), np.float32))

    def windows(count):
        for _ in range(count):
            cell(x, y)
            while int(cell.accu_micro_steps.asnumpy()):
                cell(x, y)
    windows(3)
    assert calls == {"write": 0, "observe": 0, "load": 0} and policy.frozen
    # the state of a run stopped before its first window's end, written into the cell as a state file's load
    write_parameter(cell.accu_goodput_constants, Tensor(np.zeros(2, np.float32)))
    write_parameter(cell.accu_goodput_observed, Tensor(-np.ones(cell.accu_goodput_observed.shape, np.float32)))
    write_parameter(cell.accu_windows, Tensor(np.zeros(cell.accu_windows.shape, cell.accu_windows.asnumpy().dtype)))
    windows(1)
    assert calls["load"] == 1 and not policy.frozen and policy.device_constants == (0.0, 0.0)
    assert calls["observe"] == 1 and policy.state_dict()["observed"] == [], "the window after a load is untimed"
    windows(2)
    assert calls["load"] == 1 and calls["observe"] == 3 and len(policy.state_dict()["observed"]) == 2


@pytest.mark.parametrize("cell", ["TrainAccuStepsCell", "TrainAccuStepsWithLossScaleCell", "Accumulator"])
@pytest.mark.parametrize("steps, message", [(0, "must be an int >= 1"),
                                            (ms_accum.AdaptiveAccumulation(2, 8), "needs the noise scale")])
def test_a_refused_cell_leaves_the_optimizer_as_it_was(cell, steps, message):
    """A cell whose N is refused does not rewire the optimizer for its rule first: the learning rate is the
    optimizer's own, and the corrected cell without a rule is built (a rewired one would be refused, its progress
    never advanced)."""
    net = nn.Dense(4, 1)
    optimizer = nn.Momentum(net.trainable_params(), [0.01] * 10, 0.9)
    rate = optimizer.learning_rate

    def build(**kwargs):
        if cell == "Accumulator":
            return ms_accum.Accumulator(optimizer, **kwargs)
        scale = (Tensor(1024.0, ms.float32),) if cell == "TrainAccuStepsWithLossScaleCell" else ()
        return getattr(ms_accum, cell)(nn.WithLossCell(net, nn.MSELoss()), optimizer, *scale, **kwargs)
    with pytest.raises(ValueError, match=message):
        build(gradient_accumulation_steps=steps, lr_scaling="linear")
    assert optimizer.learning_rate is rate, type(optimizer.learning_rate).__name__
    assert build(gradient_accumulation_steps=2).lr_scaling == "none"

"""Accumulation schedules and the adaptive policy: every window equals the large-batch step of its own size.

The reference is value_and_grad on each window's concatenated micro-batches and the same optimizer, stepped once
per window, with no ms_accum code.
"""
import argparse
import math
import random
import re
import time

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn
from mindspore.train import Callback, LossMonitor

import ms_accum
from ms_accum.core.adaptive import next_steps_on_device
from ms_accum.core.noise_scale import noise_scale_of
from ms_accum.core.schedule import AccumulationSchedule, schedule_argument
from helpers import build, computed_once, micro_batches, numpy_dataset, params_of

SCHEDULE = {0: 1, 2: 2, 4: 3}
RATES = [0.1, 0.05, 0.2, 0.02, 0.08, 0.03, 0.1, 0.04, 0.06, 0.01]  # one per update, distinct


def momentum(params, rates=None):
    return nn.Momentum(params, learning_rate=rates if rates is not None else 0.1, momentum=0.9)


@computed_once
def reference(batches, sizes, rates=None, seed=0):
    """Parameters after each window of `sizes` micro-batches, stepped as one large batch."""
    net, loss, _ = build("momentum", seed)
    optimizer = momentum(net.trainable_params(), rates)

    def forward(x, y):
        return loss(net(x), y)
    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    out, start = [], 0
    for size in sizes:
        window = batches[start:start + size]
        start += size
        _, grads = grad_fn(Tensor(np.concatenate([x for x, _ in window])),
                           Tensor(np.concatenate([y for _, y in window])))
        optimizer(grads)
        out.append(params_of(net))
    return out


def assert_windows_match(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} windows, the reference {len(want)}"
    for index, (params, expected) in enumerate(zip(got, want)):
        for name, value in expected.items():
            scale = max(np.abs(value).max(), 1e-12)
            err = np.abs(params[name] - value).max() / scale
            assert err <= 1e-5, f"{what}, window {index}: {name} differs by {err:.3g} from its large batch"


class Snapshots(Callback):
    """The network's parameters after every update."""

    def __init__(self, net):
        super().__init__()
        self.net, self.taken = net, []

    def on_train_step_end(self, run_context):
        self.taken.append(params_of(self.net))


# ----------------------------------------------------------------- the schedule itself


def test_schedule_gives_each_update_its_n():
    schedule = AccumulationSchedule(SCHEDULE)
    assert [schedule.steps_at(u) for u in range(7)] == [1, 1, 2, 2, 3, 3, 3]
    assert schedule == AccumulationSchedule("0:1, 2:2, 4:3") == schedule_argument("0:1,2:2,4:3")
    assert AccumulationSchedule(4).constant == 4 and schedule.constant is None
    assert AccumulationSchedule({0: 4, 3: 4}).as_given == 4 and schedule.as_given is schedule  # as a cell shows N
    assert schedule_argument("3") == AccumulationSchedule(3)


@pytest.mark.parametrize("text, message", [
    ("2:2", "must say how many micro-batches the first windows hold (an entry for update 0), but got {2: 2}. Add "
            "0: N."),
    ("0:x", "must be 'first_update:N' pairs separated by commas, such as '0:1,2:2,4:3', but got '0:x'."),
    ("0", "must be an int >= 1, but got 0."),
])
def test_a_schedule_argument_says_what_it_must_be_for_argparse_to_name_the_flag(text, message):
    """argparse prefixes "argument --accumulation_schedule: ", so the type's error is the requirement alone."""
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        schedule_argument(text)
    assert str(caught.value) == message
    with pytest.raises((TypeError, ValueError), match=r"^For 'train.py', '--accumulation_schedule' must "):
        AccumulationSchedule(text, "train.py", "--accumulation_schedule")


@pytest.mark.parametrize("steps, error, message", [
    ({}, ValueError, "must hold at least one stage"),
    ({1: 2}, ValueError, r"must say how many micro-batches the first windows hold \(an entry for update 0\), but "
                         r"got \{1: 2\}"),
    ({0: 0}, ValueError, "must map first updates >= 0 to micro-batch counts >= 1, but got 0: 0"),
    ({0: 1, -1: 2}, ValueError, "must map first updates >= 0 to micro-batch counts >= 1, but got -1: 2"),
    ({0: 1.5}, TypeError, "must map int first updates to int micro-batch counts, but got 0: 1.5"),
    ("0:1,x", ValueError, r"must be 'first_update:N' pairs separated by commas, such as '0:1,2:2,4:3', but got "
                          r"'0:1,x'"),
    ("0:1,0:2", ValueError, "must give each first update once, but 0 appears twice"),
    (0, ValueError, "must be an int >= 1, but got 0"),
    (2.0, TypeError, "must be an int >= 1 or a schedule"),
    ([1, 2], TypeError, "must be an int or a schedule"),
])
def test_bad_schedules_are_refused(steps, error, message):
    with pytest.raises(error, match=rf"For 'AccumulationSchedule', 'steps' {message}"):
        AccumulationSchedule(steps)


def simulate(schedule, steps_per_epoch, epochs, policy):
    """The driver's loop, micro-batch by micro-batch: windows begun before each epoch, updates, and the
    micro-batches that reached an update."""
    update, pending, before, trained = 0, 0, [0], 0
    for epoch in range(epochs):
        for _ in range(steps_per_epoch):
            pending += 1
            if pending == schedule.steps_at(update):
                update, pending, trained = update + 1, 0, trained + pending
        last = epoch == epochs - 1
        if pending and (policy == "flush" or (policy == "carry" and last)):
            update, pending, trained = update + 1, 0, trained + pending
        elif pending and policy == "drop":
            pending = 0
        before.append(update)
    return before, update, trained


RANDOM_SCHEDULES = [{0: random.Random(seed).randint(1, 9),
                     **{random.Random(seed).randint(1, 60) + 7 * k: random.Random(seed + k).randint(1, 9)
                        for k in range(random.Random(seed).randint(0, 4))}} for seed in range(6)]


@pytest.mark.parametrize("policy", ms_accum.PARTIAL_WINDOW_POLICIES)
@pytest.mark.parametrize("steps", [SCHEDULE, {0: 3}, {0: 4, 1: 1, 5: 7}, {0: 2, 3: 5, 4: 1, 30: 3}]
                         + RANDOM_SCHEDULES)
def test_run_plan_counts_the_windows_of_the_drivers_loop(steps, policy):
    """run_plan and trained_micro_batches, which count a stage's windows in an epoch together, against the driver's
    loop micro-batch by micro-batch: stages that change inside an epoch, after one window, epochs shorter and longer
    than a window."""
    schedule = AccumulationSchedule(steps)
    for steps_per_epoch, epochs in ((7, 3), (10, 2), (13, 1), (1, 9), (3, 20), (64, 4)):
        before, updates, trained = simulate(schedule, steps_per_epoch, epochs, policy)
        assert schedule.run_plan(steps_per_epoch, epochs, policy) == (before, updates), (steps_per_epoch, epochs)
        assert schedule.trained_micro_batches(steps_per_epoch, epochs, policy) == trained, (steps_per_epoch, epochs)


def test_a_run_of_a_million_epochs_is_planned_in_time_linear_in_its_epochs():
    """Model.train(10 ** 6, ...) stopped by a callback is a common way to train "until told": its plan (94
    micro-batches an epoch, N = 2: 47 million windows) walked window by window took 47 s alone, twice per run
    (benchmarks/data_parallel.py's lone worker; its test took 195 s in CI). Counted a stage at a time, this plan of
    94 million windows takes under a second here; walked window by window, 15 s would not be enough on this
    machine even without load."""
    start = time.perf_counter()
    before, updates = AccumulationSchedule({0: 2, 5: 3, 1000: 1}).run_plan(94, 10 ** 6, "carry")
    assert time.perf_counter() - start < 15
    assert len(before) == 10 ** 6 + 1 and updates == before[-1] == 5 + 995 + (94 * 10 ** 6 - 5 * 2 - 995 * 3)


# ----------------------------------------------------------------- the driver


FORMS = {"dict": SCHEDULE, "text": "0:1,2:2,4:3"}  # text, as AccumulationSchedule reads it (refused as 'an int' before)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_driver_follows_the_schedule_window_by_window(form, exec_mode):
    """Two epochs of 7 micro-batches, windows 1, 1, 2, 2 and a flushed 1 (epoch 1), then 3, 3, 1: each the
    large-batch step of its size, the learning rate indexed by the update."""
    batches = micro_batches([4, 3, 5, 4, 2, 4, 4])
    net, loss, _ = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, momentum(net.trainable_params(), RATES[:8]))
    telemetry, snapshots = ms_accum.WindowTelemetry(), Snapshots(net)
    trainer.train_process(2, numpy_dataset(batches), FORMS[form], callbacks=[telemetry, snapshots], ckpt_path=None,
                          log_every=0)
    sizes = [r.micro_batches for r in telemetry.records]
    assert sizes == [1, 1, 2, 2, 1, 3, 3, 1]
    assert [r.accumulation_steps for r in telemetry.records] == [1, 1, 2, 2, 3, 3, 3, 3]
    assert [r.learning_rate for r in telemetry.records] == pytest.approx(RATES[:8])
    assert_windows_match(snapshots.taken, reference(batches + batches, sizes, RATES[:8]), "driver")


def test_driver_schedule_resumes_mid_window(tmp_path, monkeypatch, capsys):
    """Killed inside the first window of three micro-batches; the resumed run ends where an uninterrupted one
    does, and numbers its updates in its log as that run did."""
    from test_resume import _Killed, die_after  # pylint: disable=import-outside-toplevel
    batches = micro_batches([4] * 11)  # windows 1, 1, 2, 2, 3 and a flushed 2

    def trainer(seed):
        net, loss, optimizer = build("momentum", seed)
        return ms_accum.GradientAccumulation(net, loss, optimizer), net
    full, full_net = trainer(0)
    full.train_process(1, numpy_dataset(batches), SCHEDULE, ckpt_path=None, log_every=0)
    state = str(tmp_path / "state.ckpt")
    cut, _ = trainer(0)
    die_after(monkeypatch, ms_accum.TrainAccuStepsCell, 7)  # windows 1, 1, 2, 2, then 1 of 3
    with pytest.raises(_Killed):
        cut.train_process(1, numpy_dataset(batches), SCHEDULE, ckpt_path=None, log_every=0, state_path=state,
                          save_state_every=1)
    monkeypatch.undo()
    resumed, net = trainer(5)
    telemetry = ms_accum.WindowTelemetry()
    capsys.readouterr()
    resumed.train_process(1, numpy_dataset(batches), SCHEDULE, callbacks=[telemetry], ckpt_path=None,
                          resume_from=state)
    assert [(r.update, r.micro_batches) for r in telemetry.records] == [(5, 3), (6, 2)]
    assert re.findall(r"^epoch: 1 step: (\d+) loss is", capsys.readouterr().out, re.M) == ["5", "6"]
    for name, value in params_of(full_net).items():
        np.testing.assert_allclose(params_of(net)[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_driver_refuses_a_window_longer_than_an_epoch():
    net, loss, optimizer = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer)
    with pytest.raises(ValueError, match=r"'gradient_accumulation_steps' must be <= the 4 micro-batches in an epoch, "
                                         r"but got 5"):
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), {0: 1, 3: 5}, ckpt_path=None)


def test_driver_checks_the_learning_rate_list_against_the_scheduled_updates():
    net, loss, _ = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, momentum(net.trainable_params(), [0.1] * 7))
    with pytest.warns(UserWarning, match=r"learning-rate list has 7 entries, one per micro-batch of this run, but the "
                                         r"optimizer reads one entry per update \(5 in this run\)"):
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 7)), SCHEDULE, ckpt_path=None)


# ----------------------------------------------------------------- Accumulator and the parallel cell


def accumulator_step(net, loss, optimizer, accumulator, exec_mode):
    """The tutorial's train step around `accumulator` (jit-compiled in GRAPH mode): returns whether it updated."""
    def forward(x, y):
        return loss(net(x), y)
    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        _, grads = grad_fn(x, y)
        return accumulator(grads, x.shape[0])
    return ms.jit(step) if exec_mode == "graph" else step


def test_accumulator_follows_the_schedule(exec_mode):
    batches = micro_batches([4, 3, 5, 4, 2, 4, 4, 3, 4, 4])
    net, loss, optimizer = build("momentum")
    accumulator = ms_accum.Accumulator(optimizer, SCHEDULE)
    step = accumulator_step(net, loss, optimizer, accumulator, exec_mode)
    taken = [params_of(net) for x, y in batches if bool(step(Tensor(x), Tensor(y)))]
    if bool(accumulator.flush()):
        taken.append(params_of(net))
    assert int(accumulator.accu_windows.asnumpy()) == 6 and accumulator.accumulate_step == AccumulationSchedule(
        SCHEDULE)
    assert_windows_match(taken, reference(batches, [1, 1, 2, 2, 3, 1]), "Accumulator")


@pytest.mark.parametrize("form", sorted(FORMS))
def test_train_accu_steps_cell_follows_the_schedule(form, exec_mode):
    batches = micro_batches([4, 3, 5, 4, 2, 4, 4, 3, 4])
    net, loss, optimizer = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, accumulation_steps=FORMS[form])
    taken = []
    for x, y in batches:
        cell(Tensor(x), Tensor(y))
        if not int(cell.accu_micro_steps.asnumpy()):
            taken.append(params_of(net))
    assert_windows_match(taken, reference(batches, [1, 1, 2, 2, 3]), "TrainAccuStepsCell")


@pytest.mark.parametrize("given_to", ["cell", "model_accu"])
def test_model_accu_follows_the_schedule_without_sink(given_to, exec_mode):
    """Model_ACCU lays each window out with the cell's N for it; the epoch's last partial window is applied. The
    schedule given to the cell as a dict, or to Model_ACCU as text (refused as 'an int' by Model_ACCU before)."""
    batches = micro_batches([4, 3, 5, 4, 2, 4, 4, 3, 4, 4])
    net, loss, optimizer = build("momentum")
    on_cell = {"gradient_accumulation_steps": SCHEDULE} if given_to == "cell" else {}
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, **on_cell)
    on_model = {"gradient_accumulation_steps": FORMS["text"]} if given_to == "model_accu" else {}
    snapshots, telemetry = Snapshots(net), ms_accum.WindowTelemetry()
    ms_accum.Model_ACCU(cell, **on_model).train(1, numpy_dataset(batches), callbacks=[snapshots, telemetry])
    assert [r.micro_batches for r in telemetry.records] == [1, 1, 2, 2, 3, 1]
    assert [r.accumulation_steps for r in telemetry.records] == [1, 1, 2, 2, 3, 3]
    assert_windows_match(snapshots.taken, reference(batches, [1, 1, 2, 2, 3, 1]), "Model_ACCU")


class EpochUpdates(Callback):
    """(epoch, batch_num) at every update."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        self.seen.append((cb_params.cur_epoch_num, cb_params.batch_num))


def _train_two_epochs(trainer, steps, callbacks):
    batches = micro_batches([4] * 7)
    net, loss, optimizer = build("momentum")
    if trainer == "driver":
        ms_accum.GradientAccumulation(net, loss, optimizer).train_process(
            2, numpy_dataset(batches), steps, callbacks=callbacks, ckpt_path=None, log_every=0)
    else:
        cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=steps)
        ms_accum.Model_ACCU(cell).train(2, numpy_dataset(batches), callbacks=callbacks)


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_batch_num_is_each_epochs_updates_and_loss_monitor_is_warned_of(trainer, recwarn):
    """Two epochs of 7 micro-batches under the schedule: windows 1, 1, 2, 2 and a flushed 1, then 3, 3, 1. The
    callbacks' batch_num is each epoch's own count (it was their mean, 4, in both); MindSpore's LossMonitor, which
    labels steps cur_step_num modulo batch_num, would label epoch 2's wrongly, and is warned of. With a constant N
    it labels right and nothing is said."""
    seen = EpochUpdates()
    with pytest.warns(UserWarning, match=r"LossMonitor labels an update .* this run's epochs have 5, 3 \(N follows a "
                                         r"schedule, or windows are carried across epochs\), so its step labels will "
                                         r"be off from epoch 2\. The updates and losses are right"):
        _train_two_epochs(trainer, SCHEDULE, [LossMonitor(1), seen])
    assert seen.seen == [(1, 5)] * 5 + [(2, 3)] * 3
    recwarn.clear()
    seen = EpochUpdates()
    _train_two_epochs(trainer, 2, [LossMonitor(1), seen])
    assert seen.seen == [(1, 4)] * 4 + [(2, 4)] * 4
    assert not [w for w in recwarn if "LossMonitor" in str(w.message)]


def _schedule_trainer(trainer, net, loss, optimizer):
    """train(epochs, dataset, **kwargs) of the driver or of Model_ACCU over the schedule, with its telemetry."""
    if trainer == "driver":
        driver = ms_accum.GradientAccumulation(net, loss, optimizer)
        return lambda epochs, dataset, **kwargs: driver.train_process(epochs, dataset, SCHEDULE, ckpt_path=None,
                                                                      log_every=0, **kwargs)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=SCHEDULE)
    return ms_accum.Model_ACCU(cell).train


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_a_run_begun_at_an_initial_epoch_takes_the_schedule_where_the_uninterrupted_run_is(trainer, exec_mode,
                                                                                           recwarn, capsys):
    """Epochs of 5 micro-batches under {0: 1, 2: 2, 4: 3} lay windows 1, 1, 2, 1 (flushed), then 3, 2 and 3, 2. A
    run resumed at epoch 2 from the network and optimizer of epoch 1 (copied by name into a fresh model, without the
    cell's counters, as an epoch checkpoint holds them) starts at update 4: windows of 3 and 2, each update equal to
    the large batch's window written without ms_accum. Model_ACCU started the schedule over at update 0 (windows 1,
    1, 2, 1 in epoch 2) until 2026-12-05. A second call on the same trainer without initial_epoch starts the
    schedule over while the optimizer goes on: warned of; with initial_epoch, or at a constant N, nothing is said.
    The progress lines count the run's epochs (Model_ACCU's read "epoch 3/2": Model's epoch_num is this call's)."""
    batches = micro_batches([4] * 5)
    sizes = [1, 1, 2, 1, 3, 2, 3, 2]
    net, loss, optimizer = build("momentum")
    _schedule_trainer(trainer, net, loss, optimizer)(1, numpy_dataset(batches))
    saved = {p.name: ms.Parameter(p.asnumpy().copy(), p.name) for p in
             [*net.get_parameters(), *optimizer.get_parameters()]}
    net, loss, optimizer = build("momentum", seed=5)  # other weights until the copy
    ms.load_param_into_net(net, saved, strict_load=True)
    ms.load_param_into_net(optimizer, saved, strict_load=True)
    train = _schedule_trainer(trainer, net, loss, optimizer)
    snapshots, telemetry = Snapshots(net), ms_accum.WindowTelemetry(print_every=1)
    capsys.readouterr()
    train(3, numpy_dataset(batches), callbacks=[snapshots, telemetry], initial_epoch=1)
    assert re.findall(r"^update \d+/\d+ \((epoch \d/\d)\)", capsys.readouterr().out, re.M) == \
        ["epoch 2/3"] * 2 + ["epoch 3/3"] * 2
    assert [(r.epoch, r.update, r.micro_batches) for r in telemetry.records] == [
        (2, 5, 3), (2, 6, 2), (3, 7, 3), (3, 8, 2)], telemetry.records
    assert_windows_match(snapshots.taken, reference(batches * 3, sizes)[4:], f"{trainer} from epoch 2, {exec_mode}")
    assert not [w for w in recwarn if "starts over" in str(w.message)]
    with pytest.warns(UserWarning, match=r"the schedule of N \{0: 1, 2: 2, 4: 3\} starts over at update 0 \(epoch "
                                         r"1\), but the cell has made 8 updates in an earlier call: each call is a "
                                         r"new run.* pass initial_epoch=<the epochs it ran>"):
        train(1, numpy_dataset(batches))
    recwarn.clear()
    net, loss, optimizer = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=2)
    for _ in range(2):
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(batches)) if trainer == "model_accu" else \
            ms_accum.GradientAccumulation(net, loss, optimizer).train_process(1, numpy_dataset(batches), 2,
                                                                              ckpt_path=None, log_every=0)
    assert not [w for w in recwarn if "starts over" in str(w.message)]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_model_accu_takes_the_schedule_its_cell_trained_with_in_any_form(form):
    """A later Model_ACCU.train given the schedule its cell has trained with, as a dict or as text, trains on (it
    was refused as another N: the dict was compared with the parsed schedule; a new user's trial); another N is
    refused, the cell's graphs holding its own."""
    batches = micro_batches([4] * 5)
    net, loss, optimizer = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=SCHEDULE)
    model = ms_accum.Model_ACCU(cell)
    model.train(1, numpy_dataset(batches))
    telemetry = ms_accum.WindowTelemetry()
    model.train(2, numpy_dataset(batches), callbacks=[telemetry], gradient_accumulation_steps=FORMS[form],
                initial_epoch=1)
    assert [r.micro_batches for r in telemetry.records] == [3, 2], telemetry.records
    with pytest.raises(ValueError, match=r"For 'Model_ACCU.train', 'gradient_accumulation_steps' needs N = 2, but "
                                         r"the cell has trained with N = AccumulationSchedule"):
        model.train(1, numpy_dataset(batches), gradient_accumulation_steps=2)


def test_loss_monitor_warning_under_carry_and_an_adaptive_n(recwarn):
    """The check alone: windows of N = 3 carried over epochs of 7 (2, 2, 3 updates: epoch 3 starts after 4), an
    adaptive N (counts unknown), a resumed run that starts past the epochs it would mislabel, no LossMonitor."""
    from ms_accum.trainers.loop import check_loss_monitor  # pylint: disable=import-outside-toplevel
    before, _ = AccumulationSchedule(3).run_plan(7, 3, "carry")
    assert before == [0, 2, 4, 7]
    with pytest.warns(UserWarning, match=r"this run's epochs have 2, 2, 3 .* off from epoch 3\."):
        check_loss_monitor("owner", [LossMonitor()], before, 1)
    with pytest.warns(UserWarning, match=r"For 'owner', MindSpore's LossMonitor .* an adaptive N decides how many "
                                         r"updates each epoch has, so its step labels may be off"):
        check_loss_monitor("owner", LossMonitor(), None, 1)
    recwarn.clear()
    check_loss_monitor("owner", [LossMonitor()], [0, 2, 4, 6, 9], 4)  # epochs 4 on: 3 updates after 6
    check_loss_monitor("owner", [EpochUpdates()], before, 1)
    check_loss_monitor("owner", None, None, 1)
    assert not recwarn.list


@pytest.mark.parametrize("alias", ["accumulation_steps", "mini_steps", "accumulate_step"])
def test_every_entry_point_takes_every_older_name_of_n(alias):
    net, loss, optimizer = build("momentum")
    loss_net = nn.WithLossCell(net, loss)
    for cell in (ms_accum.TrainAccuStepsCell(loss_net, optimizer, **{alias: 3}),
                 ms_accum.TrainAccuStepsWithLossScaleCell(loss_net, optimizer, Tensor(8.0, ms.float32), **{alias: 3}),
                 ms_accum.Accumulator(optimizer, **{alias: 3})):
        assert cell.gradient_accumulation_steps == 3, type(cell).__name__
    model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(loss_net, optimizer), **{alias: 2})
    assert model.gradient_accumulation_steps == 2
    with pytest.raises(ValueError, match=rf"For 'GradientAccumulation.train_process', '{alias}' "
                                         r"[(]gradient_accumulation_steps[)] must be an int"):
        ms_accum.GradientAccumulation(net, loss, optimizer).train_process(
            1, numpy_dataset(micro_batches([4] * 4)), ckpt_path=None, **{alias: 0})
    with pytest.raises(ValueError, match=rf"For 'check_equivalence', '{alias}' must be an int >= 1"):
        ms_accum.check_equivalence(lambda: nn.Dense(3, 2), nn.MSELoss(), lambda p: nn.SGD(p, 0.1),
                                   (np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)), **{alias: 0})


def test_n_is_one_name_with_its_older_names_accepted():
    net, loss, optimizer = build("momentum")
    loss_net = nn.WithLossCell(net, loss)
    cell = ms_accum.TrainAccuStepsCell(loss_net, optimizer, accumulation_steps=3)
    assert cell.gradient_accumulation_steps == cell.accumulation_steps == 3
    assert ms_accum.Model_ACCU(cell, gradient_accumulation_steps=2).gradient_accumulation_steps == 2
    assert ms_accum.Accumulator(optimizer, accumulate_step=SCHEDULE).gradient_accumulation_steps == \
        AccumulationSchedule(SCHEDULE)
    with pytest.raises(TypeError, match=r"For 'TrainAccuStepsCell', N must be given once, as "
                                        r"'gradient_accumulation_steps', but got 'gradient_accumulation_steps' and "
                                        r"'accumulation_steps'"):
        ms_accum.TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=2, accumulation_steps=2)
    with pytest.raises(ValueError, match=r"For 'Model_ACCU', 'accumulation_steps' "
                                         r"[(]gradient_accumulation_steps[)] must be an int >= 1, but got 0"):
        ms_accum.Model_ACCU(cell, accumulation_steps=0)
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer)
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation.train_process', 'mini_steps' "
                                         r"[(]gradient_accumulation_steps[)] must be an int >= "
                                         r"1, but got 0"):
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), mini_steps=0, ckpt_path=None)


# ----------------------------------------------------------------- the adaptive policy


def test_adaptive_policy_moves_towards_the_noise_scale_within_its_bounds():
    policy = ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=16, interval=5, max_factor=2.0)
    assert policy.initial_steps == 2
    assert policy.next_steps(4, 4, 64.0 * 100, 64.0) == 8      # wants 100: at most doubled
    assert policy.next_steps(8, 4, 64.0 * 6, 64.0) == 6        # wants 6
    assert policy.next_steps(8, 4, 1.0, 64.0) == 4             # wants 0: at most halved
    assert policy.next_steps(3, 4, 1.0, 64.0) == 2             # never below min_steps
    assert policy.next_steps(16, 4, 1e9, 64.0) == 16           # never above max_steps
    assert policy.next_steps(4, 3, 64.0 * 100, 64.0) == 4      # decisions only every 5th window
    assert policy.next_steps(4, 9, math.nan, 64.0) == 4        # no estimate yet
    slow = ms_accum.AdaptiveAccumulation(2, 8, interval=1, max_factor=1.2)
    assert slow.next_steps(2, 0, 1e9, 1.0) == 3 and slow.next_steps(3, 0, 0.0, 1.0) == 2  # always a step


@pytest.mark.parametrize("kwargs, error, message", [
    ({"min_steps": 0, "max_steps": 4}, ValueError, "'min_steps' must be an int >= 1, but got 0"),
    ({"min_steps": 4, "max_steps": 2}, ValueError, r"'max_steps' must be >= 'min_steps' \(4\), but got 2: pass the "
                                                   r"largest N as max_steps and the smallest as min_steps"),
    ({"min_steps": 2, "max_steps": 4, "max_factor": 1.0}, ValueError, "'max_factor' must be a finite number > 1"),
    ({"min_steps": 2, "max_steps": 4, "initial_steps": 5}, ValueError, r"'initial_steps' must be in \[2, 4\]"),
    ({"min_steps": 1.0, "max_steps": 4}, TypeError, "'min_steps' must be an int >= 1, but got 1.0"),
])
def test_adaptive_policy_arguments(kwargs, error, message):
    with pytest.raises(error, match=rf"For 'AdaptiveAccumulation', {message}"):
        ms_accum.AdaptiveAccumulation(**kwargs)


def test_adaptive_policy_needs_the_noise_scale():
    net, loss, optimizer = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer)
    with pytest.raises(ValueError, match=r"'gradient_accumulation_steps' as an AdaptiveAccumulation policy needs "
                                         r"the noise scale, but GradientAccumulation was built with noise_scale=False"):
        trainer.train_process(1, numpy_dataset(micro_batches([4] * 4)), ms_accum.AdaptiveAccumulation(2, 3),
                              ckpt_path=None)


def test_adaptive_driver_changes_n_between_exact_windows(exec_mode):
    """Random labels: the noise scale is far above a micro-batch of 4, so N grows from 2 to 4 at a decision
    (every second window) once the smoothed estimate is positive; each N is the policy's answer to the recorded
    figures, and every window is the large-batch step of the size it ran with."""
    batches = micro_batches([4] * 24)
    net, loss, optimizer = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=True)
    telemetry, snapshots = ms_accum.WindowTelemetry(), Snapshots(net)
    policy = ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=4, interval=2)
    trainer.train_process(1, numpy_dataset(batches), policy, callbacks=[telemetry, snapshots], ckpt_path=None,
                          log_every=0)
    steps = [r.accumulation_steps for r in telemetry.records]
    assert steps[:2] == [2, 2] and max(steps) == 4, steps
    assert all(b in (a, 2 * a, a // 2) for a, b in zip(steps, steps[1:])), steps
    changes = [i for i in range(1, len(steps)) if steps[i] != steps[i - 1]]
    assert all(i % 2 == 0 for i in changes), f"N changed after windows {changes}, not at decisions"
    for index, record in enumerate(telemetry.records[:-1]):  # each window's successor has the policy's N
        want = policy.next_steps(record.accumulation_steps, index, record.noise_scale,
                                 record.items / record.micro_batches)
        assert steps[index + 1] == want, f"after window {index} ({record}): N {steps[index + 1]}, policy {want}"
    sizes = [r.micro_batches for r in telemetry.records]
    assert_windows_match(snapshots.taken, reference(batches, sizes), "adaptive driver")


# ----------------------------------------------------------------- the adaptive policy on the device

ADAPTIVE = dict(min_steps=2, max_steps=4, interval=2)


def _check_adaptive_windows(what, batches, net_snapshots, windows, policy):
    """`windows`: per window (micro-batches, N asked, items, smoothed noise scale) read after it. Each window equals
    the large batch of its size, and each next N is the host policy's answer to the figures."""
    asked = [w[1] for w in windows]
    assert asked[:2] == [2, 2] and max(asked) == 4, f"{what}: N never grew: {asked}"
    _check_policy_windows(what, batches, net_snapshots, windows, policy)


def _check_policy_windows(what, batches, net_snapshots, windows, policy):
    """As :func:`_check_adaptive_windows`, for any policy whose N changed during the run."""
    sizes = [w[0] for w in windows]
    asked = [w[1] for w in windows]
    assert len(set(asked)) > 1, f"{what}: N never changed: {asked}"
    for index, (micro, n, items, noise) in enumerate(windows[:-1]):
        want = policy.next_steps(n, index, noise, items / micro)
        assert asked[index + 1] == want, f"{what}: after window {index}, N {asked[index + 1]}, host policy {want}"
    assert_windows_match(net_snapshots, reference(batches, sizes), what)


def _accumulator_windows(policy, exec_mode):
    """Accumulator with `policy` in the user's jit step over 24 micro-batches of 4: (its batches, each window's
    parameters after it, each window's (micro-batches, N asked, items, smoothed noise scale))."""
    batches = micro_batches([4] * 24)
    net, loss, optimizer = build("momentum")
    accumulator = ms_accum.Accumulator(optimizer, policy, noise_scale=True)
    assert accumulator.gradient_accumulation_steps is policy
    step = accumulator_step(net, loss, optimizer, accumulator, exec_mode)
    snapshots, windows, held, asked = [], [], 0, int(accumulator.accu_steps.asnumpy())
    for x, y in batches:
        held += 1
        if bool(step(Tensor(x), Tensor(y))):
            _, _, grad_sq, trace = (float(v.asnumpy()) for v in accumulator.noise_records)
            windows.append((held, asked, float(accumulator.accu_last_items.asnumpy()), noise_scale_of(grad_sq, trace)))
            snapshots.append(params_of(net))
            held, asked = 0, int(accumulator.accu_steps.asnumpy())
    return batches[:sum(w[0] for w in windows)], snapshots, windows


def _cell_windows(policy):
    """As :func:`_accumulator_windows`, for TrainAccuStepsCell called once per micro-batch."""
    batches = micro_batches([4] * 24)
    net, loss, optimizer = build("momentum")
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=policy,
                                       noise_scale=True)
    snapshots, windows, held, asked = [], [], 0, cell.next_window_steps()
    for x, y in batches:
        cell(Tensor(x), Tensor(y))
        held += 1
        if not int(cell.accu_micro_steps.asnumpy()):
            _, _, grad_sq, trace = (float(v.asnumpy()) for v in cell.noise_records)
            windows.append((held, asked, float(cell.accu_last_items.asnumpy()), noise_scale_of(grad_sq, trace)))
            snapshots.append(params_of(net))
            held, asked = 0, cell.next_window_steps()
    return batches[:sum(w[0] for w in windows)], snapshots, windows


def test_adaptive_accumulator_decides_on_the_device_inside_jit(exec_mode):
    policy = ms_accum.AdaptiveAccumulation(**ADAPTIVE)
    _check_adaptive_windows("Accumulator", *_accumulator_windows(policy, exec_mode), policy)


def test_adaptive_parallel_cell_called_directly(exec_mode):  # pylint: disable=unused-argument
    policy = ms_accum.AdaptiveAccumulation(**ADAPTIVE)
    _check_adaptive_windows("TrainAccuStepsCell", *_cell_windows(policy), policy)


GOODPUT = dict(min_steps=2, max_steps=6, interval=2, micro_time=0.01, end_time=0.05)  # the window times given


def test_goodput_parallel_cell_called_directly(exec_mode):  # pylint: disable=unused-argument
    """A GoodputAccumulation with its window times given, on TrainAccuStepsCell called once per micro-batch: each
    next N the host rule's answer to the window's figures, each window the large batch of its size."""
    policy = ms_accum.GoodputAccumulation(**GOODPUT)
    _check_policy_windows("TrainAccuStepsCell", *_cell_windows(policy), policy)


def test_goodput_accumulator_decides_on_the_device_inside_jit(exec_mode):
    """The same policy in Accumulator inside the user's ms.jit step (which cannot time its windows, so the times
    are given): N decided on the device at each window's end."""
    policy = ms_accum.GoodputAccumulation(**GOODPUT)
    _check_policy_windows("Accumulator", *_accumulator_windows(policy, exec_mode), policy)


def test_adaptive_model_accu_without_sink(exec_mode):
    batches = micro_batches([4] * 24)
    net, loss, optimizer = build("momentum")
    policy = ms_accum.AdaptiveAccumulation(**ADAPTIVE)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, noise_scale=True)
    snapshots, telemetry = Snapshots(net), ms_accum.WindowTelemetry()
    ms_accum.Model_ACCU(cell, gradient_accumulation_steps=policy).train(1, numpy_dataset(batches),
                                                                         callbacks=[snapshots, telemetry])
    windows = [(r.micro_batches, r.accumulation_steps, r.items, r.noise_scale) for r in telemetry.records]
    _check_adaptive_windows("Model_ACCU", batches, snapshots.taken, windows, policy)


def test_adaptive_policy_on_the_device_is_the_hosts():
    """The graph rule against AdaptiveAccumulation.next_steps on a grid with rounding ties, bounds, factors and
    missing estimates."""
    policy = ms_accum.AdaptiveAccumulation(min_steps=2, max_steps=16, interval=5, max_factor=2.0)
    for current in (2, 3, 4, 7, 8, 16):
        for update in (3, 4, 9):
            for grad_sq, trace in ((1.0, 0.0), (1.0, 18.0), (1.0, 20.0), (1.0, 22.0), (1.0, 1e9), (0.0, 5.0),
                                   (-1.0, 5.0), (1.0, math.nan), (2.0, 40.0)):
                for items, micro in ((8.0, 2), (4.0, 1), (0.0, 1)):
                    got = int(next_steps_on_device(policy.device_policy, Tensor(current, ms.int32),
                                                   Tensor(update, ms.int32), Tensor(grad_sq, ms.float32),
                                                   Tensor(trace, ms.float32), Tensor(items, ms.float32),
                                                   Tensor(micro, ms.int32)).asnumpy())
                    want = policy.next_steps(current, update, noise_scale_of(grad_sq, trace), items / micro)
                    assert got == want, (current, update, grad_sq, trace, items, micro, got, want)


@pytest.mark.parametrize("kind", ["AdaptiveAccumulation", "GoodputAccumulation"])
@pytest.mark.parametrize("path", ["Accumulator", "TrainAccuStepsCell", "GradientAccumulation"])
def test_a_policy_of_min_steps_1_is_refused_on_one_device(path, kind):
    """min_steps=1 is for data parallel (a window of N = 1 holds a micro-batch a device there); on one device its
    windows of one micro-batch would carry no noise estimate, and N = 1 could never be left."""
    net, loss, optimizer = build("momentum")
    policy = getattr(ms_accum, kind)(1, 4, **({"micro_time": 0.01, "end_time": 0.1} if kind[0] == "G" else {}))
    owner = f"{path}.train_process" if path == "GradientAccumulation" else path
    article = "an" if kind[0] == "A" else "a"
    with pytest.raises(ValueError, match=rf"For '{owner}', 'gradient_accumulation_steps' as {article} {kind} policy "
                                         rf"must have 'min_steps' >= 2 on one device, but got min_steps=1: a window "
                                         rf"of one micro-batch carries no noise-scale estimate, .* Halve the "
                                         rf"micro-batch and pass min_steps=2"):
        if path == "Accumulator":
            ms_accum.Accumulator(optimizer, policy, noise_scale=True)
        elif path == "TrainAccuStepsCell":
            ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=policy,
                                        noise_scale=True)
        else:
            ms_accum.GradientAccumulation(net, loss, optimizer, noise_scale=True).train_process(
                1, numpy_dataset(micro_batches([4] * 4)), policy, ckpt_path=None)


@pytest.mark.parametrize("path", ["Accumulator", "TrainAccuStepsCell"])
def test_adaptive_policy_on_a_cell_needs_the_noise_scale(path):
    net, loss, optimizer = build("momentum")
    policy = ms_accum.AdaptiveAccumulation(2, 4)
    with pytest.raises(ValueError, match=rf"For '{path}', 'gradient_accumulation_steps' as an AdaptiveAccumulation "
                                         rf"policy needs the noise scale, but {path} was built with noise_scale=False"):
        if path == "Accumulator":
            ms_accum.Accumulator(optimizer, policy)
        else:
            ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=policy)

"""An optimizer that reads its learning rate from progress (a cell with `lr_scaling` rewired it) passed to a later
cell: the later cell adopts its progress and goes on where the first left it, as one cell running both parts
would; without a rule, or with another reference batch, it is refused (nothing would advance the progress, or
progress would be counted in other steps). Found by a new user's run: a second trainer without a rule trained at
the first run's last rate, the schedule standing still, in silence."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

import ms_accum
from helpers import build, micro_batches, numpy_dataset, params_of

B, N, G0 = 4, 4, 8  # micro-batch, N, the reference batch: every window G = 16 samples = 2 reference steps
SCHEDULE = [0.01 * (k + 1) for k in range(40)]  # a rate per reference step, all different


def _trainer(net, loss, optimizer):
    return ms_accum.GradientAccumulation(net, loss, optimizer, lr_scaling="linear", reference_batch=G0)


def _built():
    net, loss, _ = build("momentum")
    return net, loss, nn.Momentum(net.trainable_params(), SCHEDULE, 0.9)


def test_a_later_trainer_goes_on_with_the_progress_its_optimizer_reads():
    first, second = micro_batches([B] * 8, seed=1), micro_batches([B] * 8, seed=2)
    net, loss, optimizer = _built()
    one = _trainer(net, loss, optimizer)
    one.train_process(1, numpy_dataset(first), N, ckpt_path=None, log_every=0)
    one.train_process(1, numpy_dataset(second), N, ckpt_path=None, log_every=0)
    expected = params_of(net)

    net, loss, optimizer = _built()
    _trainer(net, loss, optimizer).train_process(1, numpy_dataset(first), N, ckpt_path=None, log_every=0)
    telemetry = ms_accum.WindowTelemetry()
    _trainer(net, loss, optimizer).train_process(1, numpy_dataset(second), N, callbacks=[telemetry],
                                                 ckpt_path=None, log_every=0)
    got = params_of(net)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
    # the second trainer's windows are the run's 3rd and 4th: progress 4 and 6 before them, f = G / G0 = 2
    assert [record.progress for record in telemetry.records] == [6.0, 8.0], telemetry.records
    assert [record.learning_rate for record in telemetry.records] == pytest.approx(
        [2 * SCHEDULE[4], 2 * SCHEDULE[6]], rel=1e-6)


def test_a_later_cell_without_a_rule_or_with_another_reference_batch_is_refused():
    net, loss, optimizer = _built()
    _trainer(net, loss, optimizer).train_process(1, numpy_dataset(micro_batches([B] * 4)), N, ckpt_path=None,
                                                 log_every=0)
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation', 'lr_scaling' must be a rule when the optimizer "
                                         r"reads its learning rate from progress .* but got 'none': nothing would "
                                         r"advance that progress.* Pass the rule it was trained with \(linear\)"):
        ms_accum.GradientAccumulation(net, loss, optimizer)
    with pytest.raises(ValueError, match=r"'reference_batch' must be the G0 of the progress the optimizer reads, 8, "
                                         r"but got 16: progress counted in other reference steps"):
        ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, lr_scaling="sqrt", reference_batch=16)


def test_the_state_of_a_progress_learning_rate_built_by_hand_is_adopted():
    """An optimizer built with ProgressLearningRate (the way to give LARS a rate on progress) trains under a cell's
    rule, which advances that state."""
    from ms_accum.core.progress_lr import ProgressLearningRate, ProgressState  # pylint: disable=import-outside-toplevel
    state = ProgressState(reference_batch=G0)
    net, loss, _ = build("momentum")
    optimizer = nn.Momentum(net.trainable_params(), ProgressLearningRate(SCHEDULE, state), 0.9)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=N,
                                       lr_scaling="linear")
    for x, y in micro_batches([B] * 8):
        cell(ms.Tensor(x), ms.Tensor(y))
    assert state.progress == 4.0 and cell.lr_state is state


def test_lars_over_an_optimizer_built_on_progress_is_adopted():
    """The refusal's advice for LARS, followed: the optimizer LARS wraps built with a ProgressLearningRate; the cell
    takes LARS and adopts that state, whose rate LARS's step reads (through the wrapped optimizer's learning rate).
    Only the building runs here: LARS's LARSUpdate has no CPU kernel, so its steps were not run."""
    from ms_accum.core.progress_lr import ProgressLearningRate, ProgressState  # pylint: disable=import-outside-toplevel
    state = ProgressState(reference_batch=G0)
    net, loss, _ = build("momentum")
    optimizer = nn.LARS(nn.Momentum(net.trainable_params(), ProgressLearningRate(SCHEDULE, state), 0.9))
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=N,
                                       lr_scaling="linear")
    assert cell.lr_state is state and cell.accu_lr_steps is state.steps


def test_a_run_resumed_at_an_epoch_takes_its_progress_from_a_checkpoint_of_either_path(tmp_path):
    """The driver's epoch 1 (windows of 16 samples at G0 8: progress 4 after two windows) written with its cell's
    state, then epoch 2 as a new run with initial_epoch=1 through Model_ACCU, its cell loaded from the driver's
    checkpoint after it was built: the driver keeps the progress under 'grad_sum.lr.*', Model_ACCU under
    'accu_window.lr.*', and the progress is found under either (it was left at 0 in silence; a new user's trial).
    Telemetry shows epoch 2's windows at progress 6 and 8, at the schedule's entries 4 and 6 times f = 2. Loaded
    before the rule made those Parameters, the progress is 0 at epoch 2: warned of, naming the names."""
    batches = micro_batches([B] * 8, seed=1)
    net, loss, optimizer = _built()
    driver = _trainer(net, loss, optimizer)
    path = str(tmp_path / "driver.ckpt")
    driver.train_process(1, numpy_dataset(batches), N, ckpt_path=None, log_every=0)
    ms_accum.save_checkpoint_atomic(driver.cell, path)
    assert any(name.startswith("grad_sum.lr.") for name in ms_accum.read_checkpoint(path))
    net, loss, optimizer = _built()
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer, gradient_accumulation_steps=N,
                                       lr_scaling="linear", reference_batch=G0)
    ms_accum.load_network_checkpoint(cell, path, optional=ms_accum.is_accumulation_buffer)
    assert cell.lr_state.progress == 4.0
    telemetry = ms_accum.WindowTelemetry()
    ms_accum.Model_ACCU(cell).train(2, numpy_dataset(batches), callbacks=[telemetry], initial_epoch=1)
    assert [record.progress for record in telemetry.records] == [6.0, 8.0], telemetry.records
    assert [record.learning_rate for record in telemetry.records] == pytest.approx(
        [2 * SCHEDULE[4], 2 * SCHEDULE[6]], rel=1e-6)
    net, loss, optimizer = _built()
    ms.load_param_into_net(net, ms_accum.read_checkpoint(path))
    ms.load_param_into_net(optimizer, ms_accum.read_checkpoint(path))  # before the rule: no progress to load into
    with pytest.warns(UserWarning, match=r"For 'GradientAccumulation.train_process', the learning-rate rule "
                                         r"\('linear'\) reads the optimizer's schedule at the run's progress, which "
                                         r"is 0 at epoch 2 \(initial_epoch=1\).* \('grad_sum.lr.\*'\), load it after "
                                         r"building the trainer"):
        _trainer(net, loss, optimizer).train_process(2, numpy_dataset(batches), N, ckpt_path=None, log_every=0,
                                                     initial_epoch=1)

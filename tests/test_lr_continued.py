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

"""ms_accum.check: the equivalence check users run on their own model, as a function and as a command."""
import math
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_accum
from ms_accum.core.compiled import first_line
from ms_accum.tools.equivalence import ParameterCheck
from conftest import ROOT
from helpers import BatchNormNet, ConvPoolNet, SmallConvNet, run_python


def batch(size=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(size, 1, 6, 6)).astype(np.float32), rng.integers(0, 4, size=size).astype(np.int32)


LOSS = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


OPTIMIZERS = {
    "sgd": lambda p: nn.SGD(p, 0.1),
    "momentum": lambda p: nn.Momentum(p, 0.1, 0.9),
    "adam": lambda p: nn.Adam(p, 0.01),
    "adamw": lambda p: nn.AdamWeightDecay(p, 0.01, weight_decay=0.01),
}


def image_batch(size=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(size, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, size=size).astype(np.int32)


@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_correct_accumulation_passes_with_every_optimizer(optimizer, cell, exec_mode):
    """Adam used to fail here: an element whose gradient is rounding noise moves by lr in either computation."""
    report = ms_accum.check_equivalence(ConvPoolNet, LOSS, OPTIMIZERS[optimizer], image_batch(), 4, cell=cell)
    assert report.passed, str(report)
    assert {row.name for row in report.rows} == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}
    assert report.max_grad_relative < 1e-6
    assert str(report).splitlines()[-1].startswith("PASS: largest relative difference")


def test_noise_level_elements_are_reported_not_failed_with_adam():
    report = ms_accum.check_equivalence(ConvPoolNet, LOSS, OPTIMIZERS["adam"], image_batch(), 4)
    assert report.passed, str(report)
    assert sum(row.noise_elements for row in report.rows) >= 1, "this batch has noise-level gradient elements"
    assert "elements left out of" in str(report) and "(left out: elements whose large-batch gradient is rounding " \
        "noise" in str(report)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_batchnorm_model_fails_and_names_the_parameters(optimizer):
    report = ms_accum.check_equivalence(BatchNormNet, LOSS, OPTIMIZERS[optimizer], batch(), 4)
    assert not report.passed
    assert report.max_grad_relative > 1e-3, "micro-batch statistics change the gradient itself"
    names = {name for name, _ in report.failing}
    assert names and all(name.startswith(("fc.", "bn.", "head.")) for name in names)
    verdict, cause = str(report).splitlines()[-2:]
    assert verdict.startswith("FAIL: largest relative difference") and "decided by the applied gradient of" in verdict
    assert report.batch_norm_layers == ["bn"]
    assert cause.startswith("The network has 1 BatchNorm layer ('bn'): in training mode each normalises a "
                            "micro-batch with that micro-batch's own statistics"), cause


def test_a_report_that_compared_no_update_gives_no_figure_for_it():
    """A new user's trial: on a BatchNorm network every element was left out of the updates' comparison (the table's
    '-'), yet max_param_relative read 0.0, which code comparing it with rtol takes for a pass. It is NaN then, the
    verdict's line says '-', and max_relative is the applied gradient's; a parameter fully left out beside one
    compared does not count."""
    nothing = ms_accum.EquivalenceReport(1e-5, rows=[ParameterCheck("w", 2e-6, 0.0, 4, 4),
                                                     ParameterCheck("b", 1e-6, 0.0, 2, 2)])
    assert math.isnan(nothing.max_param_relative) and nothing.max_relative == 2e-6 and nothing.passed
    assert str(nothing).splitlines()[-1] == ("PASS: largest relative difference 2.000e-06 <= rtol 1e-05 (applied "
                                             "gradient 2.000e-06, updated parameters -)")
    some = ms_accum.EquivalenceReport(1e-5, rows=[ParameterCheck("w", 2e-6, 0.0, 4, 4),
                                                  ParameterCheck("b", 1e-6, 3e-6, 0, 2)])
    assert some.max_param_relative == 3e-6 and some.max_relative == 3e-6


def test_the_report_gives_the_micro_batches_and_names_batchnorm_only_where_it_is():
    """A batch that N does not divide is split into unequal micro-batches, which the report shows; a failing
    network without BatchNorm gets no BatchNorm note."""
    report = ms_accum.check_equivalence(ConvPoolNet, LOSS, OPTIMIZERS["sgd"], image_batch(16), 3)
    assert report.passed, str(report)
    assert report.micro_batch_sizes == [6, 5, 5]
    assert str(report).splitlines()[0] == "micro-batches of 6, 5, 5 samples against one batch of 16"
    raw = ms_accum.check_equivalence(ConvPoolNet, LOSS, OPTIMIZERS["sgd"], image_batch(), 4, average=False)
    assert not raw.passed and raw.batch_norm_layers == [] and "BatchNorm" not in str(raw)


class FrozenStatisticsNet(BatchNormNet):
    """BatchNormNet whose BatchNorm normalises by its moving statistics in training mode too."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(8, use_batch_statistics=False)


def test_batchnorm_on_its_moving_statistics_is_not_blamed():
    """A BatchNorm built with use_batch_statistics=False normalises as in evaluation, so accumulation can equal the
    large batch through it: the network passes, and a failure of another cause (a sum loss) is not put on that
    layer (a new user's trial: the report blamed it for reduction='sum', a masked loss and average=False alike);
    the sum is named by the cells' warning instead."""
    assert ms_accum.check_equivalence(FrozenStatisticsNet, LOSS, OPTIMIZERS["sgd"], batch(), 4).passed
    summed = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
    with pytest.warns(UserWarning, match=r"loss function, SoftmaxCrossEntropyWithLogits, reduces by 'sum'"):
        report = ms_accum.check_equivalence(FrozenStatisticsNet, summed, OPTIMIZERS["sgd"], batch(), 4)
    assert not report.passed and report.batch_norm_layers == [] and "BatchNorm" not in str(report), str(report)


class DropoutNet(nn.Cell):
    def __init__(self, p=0.5):
        super().__init__()
        self.fc = nn.Dense(6, 16)
        self.drop = nn.Dropout(p=p)
        self.head = nn.Dense(16, 4)

    def construct(self, x):
        return self.head(self.drop(ops.relu(self.fc(x))))


def features(size, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(size, 6)).astype(np.float32), rng.integers(0, 4, size=size).astype(np.int32)


def test_a_failing_network_with_dropout_is_told_why_and_a_passing_one_warned():
    """A new user's dropout network failed on unequal micro-batches with no cause named (and passed on equal ones,
    by luck of the random masks); dropout at p=0 drops nothing and is not named."""
    x, y = features(22)
    report = ms_accum.check_equivalence(DropoutNet, LOSS, OPTIMIZERS["sgd"], (x, y), 4)
    assert not report.passed and report.dropout_layers == ["drop"]
    assert str(report).splitlines()[-1] == (
        "The network has 1 dropout layer ('drop'): in training mode each draws its random masks anew, in the large "
        "batch and in every micro-batch, so the two steps need not agree (docs/models.md). Check a copy with "
        "dropout off (p=0) to test the accumulation.")
    off = ms_accum.check_equivalence(lambda: DropoutNet(p=0.0), LOSS, OPTIMIZERS["sgd"], (x, y), 4)
    assert off.passed and off.dropout_layers == [] and "dropout" not in str(off), str(off)
    lucky = ms_accum.EquivalenceReport(1e-5, micro_batch_sizes=[4, 4], dropout_layers=["a", "b"])
    assert str(lucky).splitlines()[-1].startswith("Note: the network has 2 dropout layers ('a', 'b'): in training "
                                                  "mode each draws its random masks anew, in the large batch and in "
                                                  "every micro-batch, so the two steps need not agree; they did with "
                                                  "these micro-batches")


def test_a_network_or_an_optimizer_built_already_is_refused_with_the_fix():
    x, y = features(8)
    with pytest.raises(TypeError, match=r"For 'check_equivalence', 'make_network' must be a function that builds a "
                                        r"new one for each copy compared \(all start from the same weights\), but "
                                        r"got DropoutNet \(built already\). Pass make_network=lambda: MyNet\(\)."):
        ms_accum.check_equivalence(DropoutNet(), LOSS, OPTIMIZERS["sgd"], (x, y), 4)
    net = DropoutNet()
    with pytest.raises(TypeError, match=r"'make_optimizer' must be a function .* but got SGD \(built already\)"):
        ms_accum.check_equivalence(DropoutNet, LOSS, nn.SGD(net.trainable_params(), 0.1), (x, y), 4)
    with pytest.raises(ValueError, match=r"'gradient_accumulation_steps' must be <= the batch size 3, but got 4: "
                                         r"every micro-batch needs a sample. Lower it, or pass a batch of at least 4 "
                                         r"samples."):
        ms_accum.check_equivalence(DropoutNet, LOSS, OPTIMIZERS["sgd"], (x[:3], y[:3]), 4)


def test_the_tutorials_raw_sum_fails():
    report = ms_accum.check_equivalence(ConvPoolNet, LOSS, OPTIMIZERS["sgd"], image_batch(), 4, average=False)
    assert not report.passed
    assert report.max_grad_relative == pytest.approx(3.0, rel=1e-3), "the raw sum is N times the mean"
    assert {name for name, _ in report.failing} == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}


class BiasBeforeBatchNorm(nn.Cell):
    """Dense with a bias, then BatchNorm: BatchNorm removes any constant shift, so the bias's exact gradient is 0
    and what float32 computes for it is rounding noise."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 5)
        self.bn = nn.BatchNorm1d(5)
        self.head = nn.Dense(5, 4)

    def construct(self, x):
        return self.head(self.bn(self.fc(x)))


def test_a_gradient_that_is_rounding_noise_is_left_out_not_failed():
    rng = np.random.default_rng(3)
    micro = rng.normal(size=(4, 6)).astype(np.float32)  # four micro-batches of equal statistics
    x, y = np.tile(micro, (4, 1)), rng.integers(0, 4, size=16).astype(np.int32)
    report = ms_accum.check_equivalence(BiasBeforeBatchNorm, LOSS, OPTIMIZERS["sgd"], (x, y), 4)
    assert report.passed, str(report)
    bias = next(row for row in report.rows if row.name == "fc.bias")
    assert bias.noise_elements == bias.elements == 5 and bias.grad_relative == 0.0
    assert "fc.bias" in str(report) and "5 of 5" in str(report)


@pytest.mark.parametrize("lr", [0.1, 1e-3, 1e-5])
def test_small_learning_rates_pass_despite_float32_rounding_of_the_parameters(lr):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(32, 192)).astype(np.float32), rng.integers(0, 5, size=32).astype(np.int32)
    report = ms_accum.check_equivalence(lambda: nn.Dense(192, 5), LOSS, lambda p: nn.SGD(p, lr), (x, y), 4)
    assert report.passed, str(report)


def test_rtol_is_checked():
    with pytest.raises(ValueError, match=r"For 'check_equivalence', 'rtol' must be a finite number > 0, but got -1"):
        ms_accum.check_equivalence(SmallConvNet, LOSS, OPTIMIZERS["sgd"], batch(), 4, rtol=-1)


@pytest.mark.parametrize("cell", ["three_cells", "accu_steps"])
def test_a_factory_returning_one_network_for_every_copy_is_refused(cell):
    """A new-user trial passed lambda: net: the copies trained one set of weights and the check failed, blaming
    the gradient."""
    net = SmallConvNet()
    with pytest.raises(ValueError, match=r"For 'check_equivalence', 'make_network' must build a new network at each "
                                         r"call .* Build the network inside it: make_network=lambda: MyNet\(\)\."):
        ms_accum.check_equivalence(lambda: net, LOSS, OPTIMIZERS["sgd"], batch(), 4, cell=cell)
    with pytest.raises(TypeError, match=r"For 'check_equivalence', 'make_network\(\)' must be a mindspore.nn.Cell, "
                                        r"but got the class SmallConvNet itself"):
        ms_accum.check_equivalence(lambda: SmallConvNet, LOSS, OPTIMIZERS["sgd"], batch(), 4, cell=cell)


def test_accumulation_steps_larger_than_the_batch():
    with pytest.raises(ValueError, match="'gradient_accumulation_steps' must be <= the batch size 12, but got 13"):
        ms_accum.check_equivalence(SmallConvNet, LOSS, lambda p: nn.SGD(p, 0.1), batch(), 13)
    with pytest.raises(ValueError, match="'accumulation_steps' must be <= the batch size 12, but got 13"):
        ms_accum.check_equivalence(SmallConvNet, LOSS, lambda p: nn.SGD(p, 0.1), batch(), accumulation_steps=13)


def test_inputs_that_are_not_one_batch_are_refused_naming_the_shapes():
    """A new user passed the features alone (its 16 rows became 16 arguments of WithLossCell) and inputs of two
    batch sizes (MindSpore's shape error from deep inside the loss)."""
    x, y = batch(16)
    with pytest.raises(TypeError, match=r"For 'check_equivalence', 'inputs' must be a tuple of the loss network's "
                                        r"inputs \(numpy arrays or Tensors sharing their first, batch dimension\), "
                                        r"but got ndarray. Pass inputs=\(x, y\)."):
        ms_accum.check_equivalence(SmallConvNet, LOSS, OPTIMIZERS["sgd"], x, 4)
    with pytest.raises(ValueError, match=r"'inputs' must share their first \(batch\) dimension, but they have "
                                         r"shapes \(16, 1, 6, 6\), \(12,\)\. Pass one large batch"):
        ms_accum.check_equivalence(SmallConvNet, LOSS, OPTIMIZERS["sgd"], (x, y[:12]), 4)


class HalfHead(nn.Cell):
    """SmallConvNet's features with a float16 head: the half-precision case of a new user's GRU."""

    def __init__(self):
        super().__init__()
        self.body = SmallConvNet()
        self.head = nn.Dense(4, 4).to_float(ms.float16)

    def construct(self, x):
        return ops.cast(self.head(self.body(x)), ms.float32)


def test_a_half_precision_network_is_named_with_the_tolerance_its_rounding_needs():
    """A float16 head and amp O2 failed at rtol 1e-5 (by float16 rounding, which a plain MindSpore reference shows
    alike) with BatchNorm and dropout the only causes named; the report now names the half-precision cells, and
    at rtol 1e-3 both pass."""
    x, y = batch(16)
    report = ms_accum.check_equivalence(HalfHead, LOSS, OPTIMIZERS["sgd"], (x, y), 4)
    assert not report.passed and report.low_precision_layers == ["head"], str(report)
    assert str(report).splitlines()[-1].startswith("The network computes in half precision in 1 cell ('head'): ")
    assert "Pass rtol=2e-3" in str(report).splitlines()[-1]
    whole_net = SmallConvNet().to_float(ms.float16)  # every cell flagged, the network itself named ''
    assert ms_accum.tools.equivalence.low_precision_cells(whole_net)[:2] == ["", "conv"]
    whole = ms_accum.EquivalenceReport(1e-5, rows=[ParameterCheck("w", 1e-3, 1e-3, 0, 4)],
                                       low_precision_layers=ms_accum.tools.equivalence.low_precision_cells(whole_net))
    assert str(whole).splitlines()[-1].startswith("The network computes in half precision as a whole: ")
    assert ms_accum.check_equivalence(HalfHead, LOSS, OPTIMIZERS["sgd"], (x, y), 4, rtol=1e-3).passed
    amp = ms_accum.check_equivalence(lambda: ms.amp.auto_mixed_precision(SmallConvNet(), "O2"), LOSS,
                                     OPTIMIZERS["sgd"], (x, y), 4, rtol=1e-3)
    assert amp.passed and amp.low_precision_layers, str(amp)
    assert ms_accum.check_equivalence(SmallConvNet, LOSS, OPTIMIZERS["sgd"], (x, y), 4).low_precision_layers == []


def run_check(*args):
    """``python -m ms_accum.check args`` (helpers.run_python), with the tests' models importable; its
    (returncode, stdout, stderr)."""
    tests = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])
    return run_python(["-m", "ms_accum.check", *args], env={"PYTHONPATH": tests}, timeout=300)


@pytest.mark.slow
def test_command_passes_and_fails_with_exit_codes():
    ok = run_check("--network", "helpers:SmallConvNet", "--input-shape", "1,6,6", "--num-classes", "4",
                   "--batch-size", "16", "--accumulation-steps", "4", "--mode", "graph")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    adam = run_check("--network", "helpers:ConvPoolNet", "--input-shape", "3,32,32", "--num-classes", "10",
                     "--batch-size", "16", "--accumulation-steps", "4", "--optimizer", "adam")
    assert adam.returncode == 0 and "\nPASS:" in adam.stdout, adam.stdout + adam.stderr
    assert "one window of 4 micro-batches (momentum, lr 0.01, graph" in ok.stdout and "\nPASS:" in ok.stdout
    assert "\nmicro-batches of 4, 4, 4, 4 samples against one batch of 16\n" in ok.stdout
    differs = run_check("--network", "helpers:BatchNormNet", "--input-shape", "1,6,6", "--num-classes", "4",
                        "--batch-size", "16", "--accumulation-steps", "4", "--optimizer", "sgd", "--lr", "0.5")
    assert differs.returncode == 1 and "\nFAIL:" in differs.stdout, differs.stdout + differs.stderr
    # a regression loss (the last stop's note: the command took classifiers only), passing and failing as above
    mse = run_check("--network", "helpers:SmallConvNet", "--input-shape", "1,6,6", "--loss", "mse", "--batch-size",
                    "16", "--accumulation-steps", "4", "--optimizer", "sgd")
    assert mse.returncode == 0 and "sgd, lr 0.01, pynative, three_cells, mse)" in mse.stdout, mse.stdout + mse.stderr
    mse_bn = run_check("--network", "helpers:BatchNormNet", "--input-shape", "1,6,6", "--loss", "mse",
                       "--batch-size", "16", "--accumulation-steps", "4", "--optimizer", "sgd", "--lr", "0.5")
    assert mse_bn.returncode == 1 and "\nFAIL:" in mse_bn.stdout, mse_bn.stdout + mse_bn.stderr
    bad = run_check("--network", "helpers:NoSuchNet", "--input-shape", "1,6,6", "--num-classes", "4")
    assert bad.returncode == 2 and "'--network' 'helpers:NoSuchNet' could not be loaded" in bad.stderr
    # a new user's 50 classes for a 4-way head ended in MindSpore's label error, exit code 1 ("not equivalent")
    wide = run_check("--network", "helpers:SmallConvNet", "--input-shape", "1,6,6", "--num-classes", "50")
    assert wide.returncode == 2 and ("'--num-classes' must be at most the network's 4 outputs (the labels are drawn "
                                     "from 0..num_classes-1 for its cross-entropy), but got 50. Pass --num-classes 4 "
                                     "or fewer.") in wide.stderr, wide.stdout + wide.stderr
    # a new user's shape without the channel: MindSpore's Conv2D message and C++ stack, naming no flag
    flat = run_check("--network", "helpers:SmallConvNet", "--input-shape", "6,6", "--num-classes", "4")
    assert flat.returncode == 2 and "Call Stack" not in flat.stderr, flat.stderr
    assert ("'--input-shape' must be one sample's shape as the network takes it, but the network could not run on a "
            "batch of one sample of shape 6,6 (float32 values): ") in flat.stderr and "Conv2D" in flat.stderr, \
        flat.stderr


@pytest.mark.slow
def test_command_checks_a_network_over_token_ids():
    """A new user's token model: float inputs ended in MindSpore's Gather error cut to its banner of dashes and
    blamed on '--input-shape' alone; with --input-ids the check runs on int32 ids and passes."""
    ids = run_check("--network", "helpers:TokenClassifier", "--input-shape", "7", "--input-ids", "20",
                    "--num-classes", "3", "--batch-size", "12", "--accumulation-steps", "3", "--optimizer", "adam")
    assert ids.returncode == 0 and "\nPASS:" in ids.stdout and "embedding.embedding_table" in ids.stdout, \
        ids.stdout + ids.stderr
    floats = run_check("--network", "helpers:TokenClassifier", "--input-shape", "7", "--num-classes", "3")
    assert floats.returncode == 2, floats.stdout + floats.stderr
    assert ("the network could not run on a batch of one sample of shape 7 (float32 values): Select CPU "
            "operator[Gather] fail!") in floats.stderr, floats.stderr
    assert ("A network that takes token ids (an Embedding first) needs --input-ids VOCAB, its vocabulary's "
            "size.") in floats.stderr and "-----" not in floats.stderr, floats.stderr


def test_first_line_skips_mindspores_banner():
    banner = "\n" + "-" * 52 + "\n- Kernel select failed:\n" + "-" * 52 + "\nSelect CPU operator[Gather] fail!\nmore"
    assert first_line(TypeError(banner)) == "Select CPU operator[Gather] fail!"
    assert first_line(ValueError("For 'x', y must be 1.\n\n- C++ Call Stack:")) == "For 'x', y must be 1."
    assert first_line(RuntimeError("----\n")) == "RuntimeError" and first_line(KeyError()) == "KeyError"


@pytest.mark.parametrize("args, message", [
    (("--input-shape", "3x8x8"), "argument --input-shape: must be one sample's shape as comma-separated ints >= 1"),
    (("--num-classes", "0"), "argument --num-classes: must be an int >= 1, but got '0'"),
    (("--rtol", "-1"), "argument --rtol: must be a finite number > 0, but got '-1'"),
    (("--lr", "nan"), "argument --lr: must be a finite number > 0, but got 'nan'"),
    (("--network", "helpers:OPTIMIZERS"), "'--network' 'helpers:OPTIMIZERS' must name what builds the network (a "
                                          "Cell class or a function returning a new Cell), but it is a dict."),
    # a new user's trial: a factory returning no Cell was told as a bad '--input-shape', and N over the batch by
    # check_equivalence's 'gradient_accumulation_steps'
    (("--network", "builtins:int"), "'--network' 'builtins:int' must build a mindspore.nn.Cell, but calling it "
                                    "returned a value of type int. Name a Cell class or a function that returns a "
                                    "new Cell."),
    (("--network", "json:dumps"), "'--network' 'json:dumps' could not build the network: calling it with no "
                                  "arguments raised TypeError: "),
    (("--num-classes", None), "the following arguments are required with --loss cross_entropy: --num-classes (or "
                              "pass --loss mse for a regression network)"),
    (("--batch-size", "4", "--accumulation-steps", "8"), "'--gradient-accumulation-steps' must be <= '--batch-size' "
                                                         "4 (each micro-batch holds at least one sample), but got 8. "
                                                         "Pass --batch-size 8 or more"),
])
def test_command_refuses_bad_arguments_naming_the_flag(args, message):
    defaults = {"--network": "helpers:SmallConvNet", "--input-shape": "1,6,6", "--num-classes": "4"}
    defaults.update(dict(zip(args[::2], args[1::2])))
    done = run_check(*[item for flag, value in defaults.items() if value is not None for item in (flag, value)])
    assert done.returncode == 2 and message in done.stderr, done.stderr

"""model_zoo_lenet: the data pipeline, train.py and eval.py as a user runs them, and their one-line errors."""
import glob
import os
import re
import shutil
import struct

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_accum

from helpers import (ACCURACY, SAMPLE, assert_equals_large_batch, assert_noise_records_match, functional_reference,
                     large_batch, noise_reference, open_files, reference_run, rounding_rtol, run_script)
from src.dataset import create_dataset
from src.epoch_files import EpochFiles
from src.idx import DataError
from src.lenet import LeNet5
from src.lr_schedule import warmup_cosine

def assert_one_line_error(result, *needles):
    """Exit code 2, no traceback, and one stderr line (MindSpore's own log lines aside) that names what went wrong:
    argparse's errors printed the whole usage above it (25 lines for train.py)."""
    code, _, err = result
    lines = [line for line in err.strip().splitlines() if not re.match(r"\[(WARNING|ERROR)\] ME\(", line)]
    last = lines[-1]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert re.match(r"^(train|eval|prepare_data)\.py: error: ", last), last
    for needle in needles:
        assert needle in last, f"{needle!r} not in {last!r}"


def write_idx(directory, split, n_images, n_labels=None):
    """Write a split's two IDX files with `n_images` blank images."""
    os.makedirs(directory, exist_ok=True)
    prefix = "train" if split == "train" else "t10k"
    with open(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, n_images, 28, 28) + bytes(n_images * 784))
    n_labels = n_images if n_labels is None else n_labels
    with open(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 2049, n_labels) + bytes(n_labels))


class TestDataset:
    def test_batches_are_lenet_inputs(self):
        data = create_dataset(SAMPLE, batch_size=32, split="train")
        assert data.get_dataset_size() == 3000 // 32
        image, label = next(data.create_tuple_iterator(num_epochs=1))
        assert image.shape == (32, 1, 32, 32) and image.dtype == ms.float32
        assert label.shape == (32,) and label.dtype == ms.int32
        # normalised with MNIST's mean and std: black is -0.42, white 2.82 (resizing blurs the brightest pixels)
        assert float(image.min()) == pytest.approx(-0.1307 / 0.3081, abs=1e-3)
        assert 2.0 < float(image.max()) <= (1 - 0.1307) / 0.3081 + 1e-3

    def test_test_split_keeps_every_sample(self):
        data = create_dataset(SAMPLE, batch_size=256, split="test")
        assert sum(int(label.shape[0]) for _, label in data.create_tuple_iterator(num_epochs=1)) == 1000

    def test_missing_directory(self, tmp_path):
        with pytest.raises(DataError, match="'--data_path' must be a directory holding train/ and test/"):
            create_dataset(str(tmp_path / "nope"))

    def test_a_file_given_as_the_data_directory_is_told_as_a_file(self, tmp_path):
        """A new user's trial: a file given as --data_path was said not to exist; eval.py's test split was asked for
        train/ too."""
        (tmp_path / "afile").write_text("x")
        with pytest.raises(DataError, match=r"'--data_path' must be a directory holding train/ and test/, but "
                                            r"'.*afile' is a file\."):
            create_dataset(str(tmp_path / "afile"))
        with pytest.raises(DataError, match=r"'--data_path' must be a directory holding test/, but '.*nope' does "
                                            r"not exist\."):
            create_dataset(str(tmp_path / "nope"), split="test")

    def test_too_few_samples_taken_name_num_samples(self):
        """A new user's trial: --num_samples 10 was refused as if the directory held 10 samples (it holds 3000)."""
        with pytest.raises(DataError, match=r"must hold at least one batch of 16 samples \(--batch_size\), but it "
                                            r"holds 3000, of which --num_samples takes 10\. Pass a smaller "
                                            r"--batch_size, or more samples \(--num_samples\)\.$"):
            create_dataset(SAMPLE, batch_size=16, num_samples=10)

    def test_directory_without_idx_files_names_them(self, tmp_path):
        os.makedirs(tmp_path / "train")
        with pytest.raises(DataError, match="must contain the MNIST-format files train-images-idx3-ubyte and "
                                            "train-labels-idx1-ubyte"):
            create_dataset(str(tmp_path))

    def test_gzipped_files_point_to_prepare_data(self, tmp_path):
        os.makedirs(tmp_path / "train")
        for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
            shutil.copy(os.path.join("/dev/null"), tmp_path / "train" / name)
        with pytest.raises(DataError, match="gzipped IDX files.*prepare_data.py"):
            create_dataset(str(tmp_path))

    def test_empty_data_set(self, tmp_path):
        write_idx(tmp_path / "train", "train", 0)
        with pytest.raises(DataError, match=r"must hold at least one batch of 32 samples \(--batch_size\), but it "
                                            r"holds 0\. Pass a smaller --batch_size, or more samples\.$"):
            create_dataset(str(tmp_path))

    def test_label_count_mismatch(self, tmp_path):
        write_idx(tmp_path / "train", "train", 64, n_labels=10)
        with pytest.raises(DataError, match="must hold 64 labels for its 64 images"):
            create_dataset(str(tmp_path))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """train.py on the bundled sample, as the README's smoke run does; returns the run directory."""
    run_dir = tmp_path_factory.mktemp("lenet")
    _, out, _ = run_script("train.py", "--device_target", "CPU", "--data_path", SAMPLE, "--ckpt_path", run_dir,
                           "--epoch_size", 10, "--batch_size", 32, "--accumulation_steps", 4, "--lr", 0.1,
                           "--lr_schedule", "constant", "--log_every", 10)
    return run_dir, out


@pytest.mark.slow
def test_train_reports_progress_and_writes_epoch_checkpoints(trained):
    run_dir, out = trained
    assert "effective batch 128" in out
    assert re.search(r"^update 240/240 \(epoch 10/10\) loss [0-9.]+ \| window: 1 micro-batch of 4 \(partial\), "
                     r"32 items \| grad norm [0-9.e+-]+ \| lr 0.1 \| loss scale 1, 0 skipped \| [0-9]+ items/s, "
                     r"0 s left$",
                     out, re.M), out
    assert re.search(r"^epoch 10/10: 24 updates, 2976 samples in [0-9.]+ s \([0-9]+ samples/s\), about 0 s "
                     r"left$", out, re.M), out
    names = sorted(f for f in os.listdir(run_dir) if f.endswith(".ckpt"))
    assert names == sorted([f"checkpoint_lenet-{e}_24.ckpt" for e in range(1, 11)] + ["train_state.ckpt",
                                                                                     "train_state.prev.ckpt"])
    state = ms.load_checkpoint(str(run_dir / "train_state.ckpt"))  # every 100 of the 930 micro-batches
    assert int(state["ms_accum_micro_steps_done"].asnumpy()) == 900


@pytest.mark.slow
def test_trained_lenet_is_far_above_chance_through_eval_py(trained):
    run_dir, _ = trained
    _, out, _ = run_script("eval.py", "--device_target", "CPU", "--data_path", SAMPLE, "--ckpt_path",
                           run_dir / "checkpoint_lenet-10_24.ckpt")
    accuracy = float(ACCURACY.search(out).group(1))
    # Calibrated: 0.765 on this sample after 10 epochs at lr 0.1 (chance is 0.10).
    assert accuracy >= 0.65, out
    assert "note:" not in out, out
    # a new user's trial evaluated the run's training state and took it for the run's final weights: it is named
    _, out, _ = run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", run_dir / "train_state.ckpt")
    assert re.search(r"^note: '.*train_state.ckpt' is a training state, written during a run after 232 updates: "
                     r"its weights are the newest update's, not a finished epoch's", out, re.M), out
    assert ACCURACY.search(out), out


def lenet_micro_batches(num_samples, batch_size=32, seed=1):
    """One epoch of train.py's micro-batches, in its order: its create_dataset with its seed, read as numpy."""
    data = create_dataset(SAMPLE, batch_size, "train", num_samples=num_samples, seed=seed)
    return list(data.create_tuple_iterator(num_epochs=1, output_numpy=True))


def lenet_as_train_py_builds_it(rates, num_samples, seed=1):
    """helpers' `make` for train.py's run (LeNet5 after ms.set_seed and create_dataset with its seed, as train.py
    builds it; its loss; Momentum 0.9 over the run's learning rates `rates`, one per update), without ms_accum."""
    def make(_, __):
        ms.set_seed(seed)
        create_dataset(SAMPLE, 32, "train", num_samples=num_samples, seed=seed)
        net = LeNet5()
        return (net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                nn.Momentum(net.trainable_params(), learning_rate=rates, momentum=0.9))
    return make


def checkpoint_params(path):
    """LeNet5's parameters in an epoch checkpoint of train.py."""
    saved = ms.load_checkpoint(str(path))
    return {param.name: saved[param.name].asnumpy() for param in LeNet5().get_parameters()}


@pytest.mark.slow
def test_functional_trainer_and_clipping_train_lenet_like_the_driver(tmp_path):
    """--trainer functional (value_and_grad and ms_accum.Accumulator) and the driver, both clipping every window,
    each end one epoch with the update of the large batch clipped by ops.clip_by_global_norm (at train.py's
    learning rates: a linear warm-up over the epoch's 5 updates); the functional checkpoint evaluates and resumes,
    keeping the run's newest --keep_checkpoint_max."""
    common = ("--data_path", SAMPLE, "--num_samples", 640, "--batch_size", 32, "--accumulation_steps", 4,
              "--lr", 0.1, "--clip_norm", 0.5, "--log_every", 1)
    _, out, _ = run_script("train.py", "--trainer", "functional", "--ckpt_path", tmp_path / "f", "--epoch_size", 1,
                           *common)
    assert re.search(r"^epoch 1 micro-batch 20/20: 5 updates so far, micro-batch loss [0-9.]+$", out, re.M), out
    run_script("train.py", "--trainer", "driver", "--ckpt_path", tmp_path / "d", "--epoch_size", 1, *common)
    batches = lenet_micro_batches(640)
    windows = [batches[i:i + 4] for i in range(0, 20, 4)]
    reference = large_batch("momentum", 0.5, make=lenet_as_train_py_builds_it(warmup_cosine(0.1, 5, 5), 640))
    for trainer in ("f", "d"):
        assert_equals_large_batch(checkpoint_params(tmp_path / trainer / "checkpoint_lenet-1_5.ckpt"), reference,
                                  windows, context=f"--trainer {trainer}, clipped")
    functional = ms.load_checkpoint(str(tmp_path / "f" / "checkpoint_lenet-1_5.ckpt"))
    assert int(functional["global_step"].asnumpy()[0]) == 5 and int(functional["epoch_num"].asnumpy()) == 1
    _, out, _ = run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path",
                           tmp_path / "f" / "checkpoint_lenet-1_5.ckpt")
    assert ACCURACY.search(out), out
    run_script("train.py", "--trainer", "functional", "--ckpt_path", tmp_path / "f", "--epoch_size", 3,
               "--resume", tmp_path / "f" / "checkpoint_lenet-1_5.ckpt", "--keep_checkpoint_max", 1, *common)
    # --keep_checkpoint_max keeps the run's newest, as on the other trainers: the resumed run continues the names
    # of the checkpoint it resumed from, and counts it with its own, as MindSpore's ModelCheckpoint would
    assert sorted(os.listdir(tmp_path / "f")) == ["checkpoint_lenet-3_5.ckpt"]
    resumed = ms.load_checkpoint(str(tmp_path / "f" / "checkpoint_lenet-3_5.ckpt"))
    assert int(resumed["global_step"].asnumpy()[0]) == 15 and int(resumed["epoch_num"].asnumpy()) == 3


def test_epoch_files_keep_the_newest_of_their_prefix_in_epoch_order(tmp_path):
    """Epoch 10 is newer than epoch 9 (not by name); the prefix's files from before a resume count, another
    prefix's are not touched; an epoch written again replaces its entry; a file removed by hand is no error."""
    for name in ("checkpoint_lenet-9_4.ckpt", "checkpoint_lenet-10_4.ckpt", "checkpoint_lenet-2_4.ckpt",
                 "checkpoint_lenet_1-1_4.ckpt", "checkpoint_lenet-notes.txt"):
        (tmp_path / name).write_bytes(b"")
    files = EpochFiles(str(tmp_path), "checkpoint_lenet", 2)
    assert [os.path.basename(p) for p in files.written] == ["checkpoint_lenet-2_4.ckpt", "checkpoint_lenet-9_4.ckpt",
                                                           "checkpoint_lenet-10_4.ckpt"]
    net = nn.Dense(2, 2)
    files.write(net, 10, 4, 40)  # the same epoch again: the newest two are 9 and 10
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_lenet-10_4.ckpt", "checkpoint_lenet-9_4.ckpt",
                                            "checkpoint_lenet-notes.txt", "checkpoint_lenet_1-1_4.ckpt"]
    os.remove(tmp_path / "checkpoint_lenet-10_4.ckpt")
    files.write(net, 11, 4, 44)
    assert files.write(net, 12, 4, 48) == str(tmp_path / "checkpoint_lenet-12_4.ckpt") == files.latest
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_lenet-11_4.ckpt", "checkpoint_lenet-12_4.ckpt",
                                            "checkpoint_lenet-notes.txt", "checkpoint_lenet_1-1_4.ckpt"]
    assert int(ms.load_checkpoint(files.latest)["step_num"].asnumpy()) == 48


@pytest.mark.slow
def test_a_window_carried_over_an_epochs_end_is_counted_in_the_epoch_it_ends_in(tmp_path):
    """--partial_window carry, 10 micro-batches of 32 an epoch, N 4, 2 epochs: epoch 1 ends 2 windows and carries
    2 micro-batches on, epoch 2 ends 3 (the carried one first, the last flushed). Every trainer prints and names
    its checkpoints by the updates that ended in the epoch (the driver and Model_ACCU named epoch 1's 3, counting
    the window still open, and the functional loop counted the samples it read, 320 in each), with step_num the
    run's updates."""
    common = ("--data_path", SAMPLE, "--num_samples", 320, "--batch_size", 32, "--gradient_accumulation_steps", 4,
              "--partial_window", "carry", "--epoch_size", 2, "--log_every", 0)
    for trainer in ("driver", "model_accu", "functional"):
        _, out, _ = run_script("train.py", "--trainer", trainer, "--ckpt_path", tmp_path / trainer, *common)
        lines = re.findall(r"^epoch (\d)/2: (\d+) updates, (\d+) samples in ", out, re.M)
        assert lines == [("1", "2", "256"), ("2", "3", "384")], (trainer, out)
        names = sorted(f for f in os.listdir(tmp_path / trainer) if f.startswith("checkpoint_lenet-"))
        assert names == ["checkpoint_lenet-1_2.ckpt", "checkpoint_lenet-2_3.ckpt"], (trainer, names)
        saved = [ms.load_checkpoint(str(tmp_path / trainer / name)) for name in names]
        assert [int(params["step_num"].asnumpy()) for params in saved] == [2, 5], trainer
        # no gradient buffers (Model_ACCU's cell held them, a carried window's half-filled): the network's state only
        assert not [name for params in saved for name in params if name.startswith("accu_grads.")], trainer
    # resumed from epoch 1's checkpoint, the 2 carried micro-batches are not there: said (a new user's trial lost
    # them in silence); epoch 2 ended with no window open, so a resume from its checkpoint says nothing of it
    for trainer, checkpoint, epochs, carried in (("driver", "checkpoint_lenet-1_2.ckpt", 2, True),
                                                 ("functional", "checkpoint_lenet-1_2.ckpt", 2, True),
                                                 ("driver", "checkpoint_lenet-2_3.ckpt", 3, False)):
        _, out, _ = run_script("train.py", "--trainer", trainer, "--ckpt_path", tmp_path / f"{trainer}_{epochs}",
                               "--resume", tmp_path / trainer / checkpoint, *common[:-4], "--epoch_size", epochs,
                               "--log_every", 0)
        note = re.search(r"^note: '.*' was written at the end of epoch 1 with a window open \(--partial_window "
                         r"carry\): its 2 micro-batches are not in the checkpoint", out, re.M)
        assert bool(note) == carried and ("window open" in out) == carried, (trainer, checkpoint, out)


@pytest.mark.slow
def test_sink_mode_on_cpu_trains_every_micro_batch_as_without_sink(tmp_path):
    """A new user's trial: 7 micro-batches an epoch and N 2 in sink mode on CPU, where MindSpore trains without sink
    (every micro-batch, the last window flushed), crashed at the epoch's end with a traceback: the learning rate
    was laid over the 3 windows a device sinks, and the 4th update read past it. It trains as --trainer model_accu
    without sink does, to the same weights, and says so."""
    common = ("--data_path", SAMPLE, "--num_samples", 112, "--batch_size", 16, "--gradient_accumulation_steps", 2,
              "--epoch_size", 2, "--warmup_epochs", 1, "--trainer", "model_accu", "--log_every", 0)
    _, out, err = run_script("train.py", "--ckpt_path", tmp_path / "sink", "--dataset_sink_mode", *common)
    assert "each epoch runs all 7 micro-batches, its last window of 1 applied as a smaller one, where a device " \
           "sinks 6" in err, err
    assert re.findall(r"^epoch (\d)/2: (\d+) updates, (\d+) samples in ", out, re.M) == [("1", "4", "112"),
                                                                                   ("2", "4", "112")], out
    run_script("train.py", "--ckpt_path", tmp_path / "plain", *common)
    sunk, plain = (ms.load_checkpoint(str(tmp_path / run / "checkpoint_lenet-2_4.ckpt")) for run in ("sink", "plain"))
    assert int(sunk["step_num"].asnumpy()) == 8
    for name, value in plain.items():
        np.testing.assert_array_equal(sunk[name].asnumpy(), value.asnumpy(), err_msg=name)


@pytest.mark.slow
def test_every_trainer_takes_a_schedule_the_noise_scale_and_partial_windows(tmp_path):
    """The driver, Model_ACCU and the functional loop with the same schedule, noise scale and dropped partial
    window (20 micro-batches: windows of 1, 1, 2, 2, 3, 3, 3, 3, then 2 dropped) each end the epoch with the
    large batch's update, and write the telemetry CSV, a row per update, whose loss, gradient norm, learning rate
    and noise-scale estimates are the large batch's: its loss and gradient norm on the window, train.py's
    learning rate for the update, and the estimator on the micro-batches' value_and_grad gradients."""
    common = ("--data_path", SAMPLE, "--num_samples", 640, "--batch_size", 32, "--accumulation_schedule",
              "0:1,2:2,4:3", "--noise_scale", "--partial_window", "drop", "--lr", 0.1, "--epoch_size", 1,
              "--log_every", 0)
    batches = lenet_micro_batches(640)
    windows, start = [], 0
    for size in (1, 1, 2, 2, 3, 3, 3, 3):
        windows.append(batches[start:start + size])
        start += size
    rates = warmup_cosine(0.1, 8, 8)
    make = lenet_as_train_py_builds_it(rates, 640)
    losses = reference_run("momentum", windows, make=make)[1]
    norms = functional_reference("momentum", windows, make=make)[1]
    noise = noise_reference("momentum", windows, make=make)
    rtol = rounding_rtol(windows)
    for trainer in ("driver", "model_accu", "functional"):
        _, out, _ = run_script("train.py", "--trainer", trainer, "--ckpt_path", tmp_path / trainer, *common,
                               "--telemetry_csv", tmp_path / f"{trainer}.csv")
        # the samples of the epoch's updates: the 2 dropped micro-batches count nothing (the functional loop
        # counted them, 640)
        assert re.search(r"^epoch 1/1: 8 updates, 576 samples in ", out, re.M), (trainer, out)
        [name] = [f for f in os.listdir(tmp_path / trainer) if f.startswith("checkpoint_lenet-1_")]
        assert int(ms.load_checkpoint(str(tmp_path / trainer / name))["global_step"].asnumpy()[0]) == 8, name
        assert_equals_large_batch(checkpoint_params(tmp_path / trainer / name), large_batch("momentum", make=make),
                                  windows, context=trainer)
        rows = read_csv(tmp_path / f"{trainer}.csv")
        assert [[int(row[k]) for k in ("update", "micro_batches", "accumulation_steps")] for row in rows] == \
            [[k + 1, len(w), len(w)] for k, w in enumerate(windows)], (trainer, rows)
        assert [float(row["items"]) for row in rows] == [32.0 * len(w) for w in windows], (trainer, rows)
        assert [float(row["loss"]) for row in rows] == pytest.approx(losses, rel=rtol), trainer
        assert [float(row["grad_norm"]) for row in rows] == pytest.approx(norms, rel=rtol), trainer
        assert [float(row["learning_rate"]) for row in rows] == pytest.approx(rates, rel=1e-6), trainer
        assert_noise_records_match([[float(row["grad_sq"]), float(row["noise_trace"])] for row in rows], noise,
                                   windows, context=trainer)
        for row, ((_, _, smooth_sq, smooth_trace), (_, _, sq_terms, trace_terms)) in zip(rows, noise):
            bound = 2 * rtol  # of assert_noise_records_match: B_simple is NaN while the smoothed |G|^2 is not > 0
            if smooth_sq == 0.0 or smooth_sq < -bound * sq_terms:  # no estimate yet (windows of one), or negative
                assert row["noise_scale"] == "nan", (trainer, row, smooth_sq)
            elif smooth_sq > bound * sq_terms:  # else its sign is within rounding: NaN or a ratio
                ratio = max(smooth_trace, 0.0) / smooth_sq
                allowed = bound * (trace_terms + ratio * sq_terms) / smooth_sq
                assert abs(float(row["noise_scale"]) - ratio) <= allowed, (trainer, row, ratio, allowed)


class _TutorialForwardBackward(nn.Cell):
    """The MindSpore tutorial's TrainForwardBackward as it was written, kept to make its checkpoint format."""

    def __init__(self, network, optimizer, grad_sum, sens=1.0):
        super().__init__(auto_prefix=False)
        self.network = network
        self.network.set_grad()
        self.weights = optimizer.parameters
        self.optimizer = optimizer
        self.grad_sum = grad_sum
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = sens
        self.hyper_map = ops.HyperMap()

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(ops.dtype(loss), ops.shape(loss), self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        return ops.depend(loss, self.hyper_map(ops.partial(ops.assign_add), self.grad_sum, grads))


@pytest.mark.slow
def test_eval_py_accepts_the_tutorials_checkpoint_format(trained, tmp_path):
    run_dir, _ = trained
    ours = run_dir / "checkpoint_lenet-10_24.ckpt"
    net = LeNet5()
    ms.load_param_into_net(net, ms.load_checkpoint(str(ours)))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    grad_sum = optimizer.parameters.clone(prefix="grad_sum", init="ones")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = _TutorialForwardBackward(nn.WithLossCell(net, loss), optimizer, grad_sum)
    tutorial = str(tmp_path / "gradient_accumulation.ckpt")
    ms.save_checkpoint(cell, tutorial)
    assert any(name.startswith("grad_sum.") for name in ms.load_checkpoint(tutorial))
    results = [float(ACCURACY.search(run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", path)[1])
                     .group(1)) for path in (ours, tutorial)]
    assert results[0] == results[1] >= 0.65


@pytest.mark.slow
def test_a_resumed_run_writes_epoch_checkpoints_only_and_counts_what_it_ran(tmp_path):
    """MindSpore's ModelCheckpoint, every 4 updates, fired at the first update of a run resumed in epoch 2 (its
    count began at 5) and wrote a mid-epoch state named like an epoch's end, from which --resume then skipped the
    rest of that epoch; the epoch line counted the whole epoch. A new run into a used directory gets other names."""
    common = ("--data_path", SAMPLE, "--num_samples", 256, "--batch_size", 32, "--accumulation_steps", 2,
              "--epoch_size", 2, "--log_every", 0, "--save_state_every", 11)  # 8 micro-batches, 4 updates an epoch
    run_script("train.py", "--ckpt_path", tmp_path / "full", *common)
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(tmp_path / "full" / "train_state.ckpt", cut)  # written after micro-batch 11: epoch 2, update 6 open
    _, out, _ = run_script("train.py", "--ckpt_path", cut, "--resume", cut / "train_state.ckpt", *common)
    assert sorted(f for f in os.listdir(cut) if f.startswith("checkpoint_")) == ["checkpoint_lenet-2_4.ckpt"]
    assert re.search(r"^epoch 2/2: 3 updates, 192 samples in ", out, re.M), out
    # Model_ACCU, as MindSpore's Model, counts updates from the first epoch of a resume at an epoch's end
    run_script("train.py", "--ckpt_path", tmp_path / "epoch", "--trainer", "model_accu", "--resume",
               tmp_path / "full" / "checkpoint_lenet-1_4.ckpt", *common)
    assert sorted(f for f in os.listdir(tmp_path / "epoch") if f.startswith("checkpoint_")) == \
        ["checkpoint_lenet-2_4.ckpt"]
    full, *resumed = (ms.load_checkpoint(str(d / "checkpoint_lenet-2_4.ckpt"))
                      for d in (tmp_path / "full", cut, tmp_path / "epoch"))
    for got in resumed:
        assert int(got["step_num"].asnumpy()) == int(full["step_num"].asnumpy()) == 8
    for param in LeNet5().get_parameters():
        np.testing.assert_allclose(resumed[0][param.name].asnumpy(), full[param.name].asnumpy(), rtol=1e-6,
                                   atol=1e-7, err_msg=param.name)
    _, out, _ = run_script("train.py", "--ckpt_path", tmp_path / "full", *common[:-2], "--save_state_every", 0)
    assert "holds another run's checkpoints; this run's are checkpoint_lenet_1-<epoch>_<update>.ckpt" in out
    names = ["checkpoint_lenet-1_4.ckpt", "checkpoint_lenet-2_4.ckpt", "checkpoint_lenet_1-1_4.ckpt",
             "checkpoint_lenet_1-2_4.ckpt"]
    assert sorted(f for f in os.listdir(tmp_path / "full") if f.startswith("checkpoint_")) == names
    # the first run's state, resumed there, continues the first run's names: the second run's files are untouched
    second = {name: (tmp_path / "full" / name).read_bytes() for name in names[2:]}
    _, out, _ = run_script("train.py", "--ckpt_path", tmp_path / "full", "--resume",
                           tmp_path / "full" / "train_state.ckpt", *common)
    assert "last checkpoint: " + str(tmp_path / "full" / "checkpoint_lenet-2_4.ckpt") in out, out
    assert sorted(f for f in os.listdir(tmp_path / "full") if f.startswith("checkpoint_")) == names
    assert all((tmp_path / "full" / name).read_bytes() == data for name, data in second.items())


@pytest.mark.slow
def test_a_state_older_than_the_runs_first_epoch_checkpoint_resumes_under_the_runs_names(tmp_path):
    """An exact state written before the run's first epoch checkpoint (micro-batch 5 of the epoch's 8) resumed in
    its directory: the run's own checkpoint, the newer file, is not another run's. The names were told apart by
    time alone, and the resumed run wrote checkpoint_lenet_1-1_4.ckpt beside checkpoint_lenet-1_4.ckpt, saying that
    the directory held another run's checkpoints."""
    common = ("--data_path", SAMPLE, "--num_samples", 256, "--batch_size", 32, "--accumulation_steps", 2,
              "--epoch_size", 1, "--log_every", 0, "--save_state_every", 5, "--ckpt_path", tmp_path)
    run_script("train.py", *common)
    finished = ms.load_checkpoint(str(tmp_path / "checkpoint_lenet-1_4.ckpt"))
    _, out, _ = run_script("train.py", "--resume", tmp_path, *common)
    assert "another run's" not in out and "last checkpoint: " + str(tmp_path / "checkpoint_lenet-1_4.ckpt") in out, \
        out
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("checkpoint_")) == ["checkpoint_lenet-1_4.ckpt"]
    again = ms.load_checkpoint(str(tmp_path / "checkpoint_lenet-1_4.ckpt"))
    for param in LeNet5().get_parameters():
        np.testing.assert_array_equal(again[param.name].asnumpy(), finished[param.name].asnumpy(), param.name)


@pytest.mark.slow
def test_more_samples_asked_than_the_data_set_holds_are_told(tmp_path):
    """--num_samples above the sample's 3,000 training images: the epoch reads them all, and says so (it did so
    silently)."""
    _, out, _ = run_script("train.py", "--data_path", SAMPLE, "--num_samples", 5000, "--batch_size", 500,
                           "--accumulation_steps", 2, "--epoch_size", 1, "--save_state_every", 0, "--ckpt_path",
                           tmp_path)
    assert f"note: --num_samples 5000 is more than {SAMPLE}/train holds: an epoch reads all of it, 6 micro-batches " \
           f"of 500." in out, out
    assert re.search(r"^epoch 1/1: 3 updates, 3000 samples in ", out, re.M), out


@pytest.mark.slow
class TestCommandLineErrors:
    @pytest.mark.parametrize("value", ["0", "-1", "two"])
    def test_accumulation_steps(self, value):
        for flag in ("--gradient_accumulation_steps", "--accumulation_steps"):  # N's name, and its older one
            assert_one_line_error(run_script("train.py", flag, value, check=False), "argument "
                                  "--gradient_accumulation_steps/--accumulation_steps: must be an int >= 1",
                                  repr(value))

    @pytest.mark.parametrize("value", ["0", "-0.5", "inf"])
    def test_clip_norm(self, value):
        assert_one_line_error(run_script("train.py", "--clip_norm", value, check=False),
                              "argument --clip_norm: must be a finite number > 0", repr(value))

    @pytest.mark.parametrize("flags, message", [
        (("--momentum", "1.5"), "'--momentum' must be in [0, 1), the weight of the previous velocity, but got 1.5"),
        (("--warmup_epochs", "5", "--epoch_size", "1"), "'--warmup_epochs' must be an int in [0, --epoch_size 1], "
                                                        "but got 5"),
        (("--global_batch_size", "100"), "For 'train.py', '--global_batch_size' must be a multiple of devices x "
                                         "micro-batch = 1 x 32 = 32, so that every device runs a whole number of "
                                         "micro-batches per update, but got 100. The nearest valid values are 96 or "
                                         "128"),
        (("--global_batch_size", "64", "--accumulation_steps", "2"), "'--global_batch_size' sets N (G / (devices x "
                                                                     "--batch_size)), but "
                                                                     "'--gradient_accumulation_steps' was given too"),
        (("--log_every", "-1"), "argument --log_every: must be an int >= 0, but got '-1' (see --help)"),
        (("--save_state_every", "-1"), "argument --save_state_every: must be an int >= 0, but got '-1' (see --help)"),
        (("--batch_size", "auto"), "but '--global_batch_size' and '--max_memory' were not given"),
        (("--batch_size", "auto", "--max_memory", "1GiB"), "but '--global_batch_size' was not given"),
        (("--trainer", "functional", "--save_state_every", "5"), "'--save_state_every' is an option of '--trainer "
                                                                 "driver' and '--trainer model_accu'"),
        (("--adaptive_interval", "5"), "'--adaptive_interval' is the windows between two decisions of "
                                       "'--adaptive_steps' or '--goodput_steps', neither of which is given"),
        (("--trainer", "model_accu", "--on_out_of_memory", "halve"), "'--on_out_of_memory halve' reruns a window "
                                                                     "with half the micro-batch in the driver"),
    ])
    def test_out_of_range_training_flags(self, flags, message, tmp_path):
        """Refused before anything is built: the data path, which does not exist, is not read yet."""
        assert_one_line_error(run_script("train.py", "--data_path", tmp_path / "none", *flags, check=False), message)

    def test_functional_trainer_refuses_what_it_does_not_do(self):
        assert_one_line_error(run_script("train.py", "--trainer", "functional", "--dataset_sink_mode", check=False),
                              "'--trainer functional' runs on one device without sink mode")

    def test_exact_resume_refuses_another_learning_rate_schedule(self, tmp_path):
        common = ("--data_path", SAMPLE, "--num_samples", 256, "--batch_size", 32, "--accumulation_steps", 2,
                  "--log_every", 0, "--save_state_every", 1, "--ckpt_path", tmp_path)
        run_script("train.py", "--epoch_size", 2, *common)
        assert_one_line_error(run_script("train.py", "--epoch_size", 3, "--resume", tmp_path, *common, check=False),
                              "continues the exact run it was written by, whose learning-rate schedule has shape "
                              "(8,), but this run's has (12,)")
        run_script("train.py", "--epoch_size", 2, "--resume", tmp_path / "checkpoint_lenet-1_4.ckpt", *common)

    def test_a_run_stopped_by_non_finite_windows_says_so_in_one_line(self, tmp_path):
        """A new user's trial: a run that stops after --max_nonfinite_windows skipped windows printed a traceback and
        exited 1 like a crash; it ends with the error's one line (the windows, the state written) and exit code 1."""
        code, _, err = run_script("train.py", "--data_path", SAMPLE, "--num_samples", 256, "--batch_size", 32,
                                  "--accumulation_steps", 2, "--lr", "1e6", "--lr_schedule", "constant",
                                  "--max_nonfinite_windows", 2, "--log_every", 0, "--ckpt_path", tmp_path, check=False)
        last = err.strip().splitlines()[-1]
        assert code == 1 and "Traceback" not in err, err
        assert last.startswith("train.py: stopped: For 'GradientAccumulation.train_process', window "), last
        assert "max_nonfinite_windows=2" in last and str(tmp_path / "train_state.ckpt") in last, last

    def test_data_parallel_without_msrun_says_how_to_launch(self):
        assert_one_line_error(run_script("train.py", "--parallel_mode", "data_parallel", "--data_path", SAMPLE,
                                         check=False),
                              "'--parallel_mode' data_parallel needs a distributed launch (msrun; see README.md)")

    def test_missing_data_path(self, tmp_path):
        assert_one_line_error(run_script("train.py", "--data_path", tmp_path / "none", check=False),
                              "'--data_path' must be a directory", "does not exist. Lay out Fashion-MNIST there with "
                              "'bash scripts/fashion_mnist.sh .venv/bin/python'")

    def test_data_path_without_idx_files(self, tmp_path):
        os.makedirs(tmp_path / "train")
        assert_one_line_error(run_script("train.py", "--data_path", tmp_path, check=False),
                              "train-images-idx3-ubyte and train-labels-idx1-ubyte")

    def test_empty_data_set(self, tmp_path):
        write_idx(tmp_path / "train", "train", 0)
        assert_one_line_error(run_script("train.py", "--data_path", tmp_path, check=False),
                              "must hold at least one batch", "holds 0")

    @pytest.mark.parametrize("flags, message", [
        (("--lr_scaling", "sqrt", "--trainer", "model_accu", "--dataset_sink_mode"),
         "'--lr_scaling sqrt' follows N as it changes between windows, but '--dataset_sink_mode' runs one N"),
        (("--lr_scaling", "linear", "--trainer", "functional"), "'--lr_scaling linear' is an option of '--trainer "
                                                                "driver' and '--trainer model_accu'"),
        (("--lr_scaling", "sqrt", "--raw_sum"), "'--lr_scaling sqrt' scales the learning rate of the window's mean "
                                                "gradient, but '--raw_sum' applies the sum"),
        (("--reference_batch", "0"), "argument --reference_batch: must be a finite number > 0, but got '0'"),
        (("--reference_batch", "64"), "'--reference_batch' is G0 of a learning-rate rule, but '--lr_scaling' is "
                                      "not given"),
        (("--goodput_steps", "2:8"), "'--goodput_steps' needs '--lr_schedule constant', but got '--lr_schedule "
                                     "cosine': the number of updates, which the schedule is laid out over, is not "
                                     "known in advance when N adapts. Or pass '--lr_scaling linear', 'sqrt' or "
                                     "'adascale'"),
        (("--goodput_steps", "2:8", "--adaptive_steps", "2:8"), "'--adaptive_steps' and '--goodput_steps' both "
                                                                "set N"),
        # the flag's type, before the cosine's refusal (a new user's trial met that one first, then this one,
        # whose MIN < MAX the type's MIN <= MAX had not said)
        (("--goodput_steps", "4:4"), "argument --goodput_steps: must be MIN:MAX with 1 <= MIN < MAX, such as 2:16, "
                                     "but got '4:4': with one N there is nothing to choose; pass one N with "
                                     "--gradient_accumulation_steps"),
        (("--goodput_steps", "2:8", "--trainer", "functional"), "'--goodput_steps' needs '--lr_schedule constant', "
                                                                "but got '--lr_schedule cosine': the number of "
                                                                "updates, which the schedule is laid out over, is not "
                                                                "known in advance when N adapts."),
        (("--accumulation_schedule", "0:2", "--accumulation_steps", "3"), "'--accumulation_schedule' sets N, but "
                                                                          "'--gradient_accumulation_steps' was given "
                                                                          "too"),
        (("--num_samples", "256", "--accumulation_steps", "9"), "For 'train.py', '--gradient_accumulation_steps' "
                                                                "must be <= the 8 micro-batches in an epoch, but got "
                                                                "9. Lower it, or pass --partial_window carry"),
        (("--num_samples", "256", "--accumulation_schedule", "0:2,3:9"), "'--accumulation_schedule' must be <= the "
                                                                         "8 micro-batches in an epoch, but got 9"),
        (("--num_samples", "256", "--global_batch_size", "512"), "'N = --global_batch_size / (devices x "
                                                                 "--batch_size)' must be <= the 8 micro-batches in an "
                                                                 "epoch, but got 16"),
        (("--num_samples", "256", "--adaptive_steps", "2:16", "--lr_schedule", "constant"),
         "'--adaptive_steps' must be <= the 8 micro-batches in an epoch, but got AdaptiveAccumulation(min_steps=2, "
         "max_steps=16"),
        (("--seed", "-1"), "argument --seed: must be an int >= 0, but got '-1'"),
        (("--goodput_steps", "2:8", "--lr_schedule", "constant", "--trainer", "functional"),
         "'--goodput_steps' calibrates from the window times the driver and model_accu measure"),
        (("--goodput_times", "0.004:0.01"), "'--goodput_times' is the window-time model of '--goodput_steps', which "
                                            "is not given"),
        (("--goodput_times", "0:1"), "argument --goodput_times: must be MICRO:END, seconds per micro-batch (> 0)"),
        (("--goodput_steps", "2:8", "--global_batch_size", "64"), "'--global_batch_size' sets N (G / (devices x "
                                                                  "--batch_size)), but '--goodput_steps' was given"),
    ])
    def test_learning_rate_rule_flags(self, flags, message):
        assert_one_line_error(run_script("train.py", "--data_path", SAMPLE, *flags, check=False), message)

    def test_exact_resume_refuses_another_reference_batch_or_rule(self, tmp_path):
        common = ("--data_path", SAMPLE, "--num_samples", 256, "--batch_size", 32, "--accumulation_schedule",
                  "0:1,2:2", "--log_every", 0, "--save_state_every", 1, "--ckpt_path", tmp_path, "--epoch_size", 1)
        run_script("train.py", "--lr_scaling", "linear", *common)
        assert_one_line_error(run_script("train.py", "--lr_scaling", "linear", "--reference_batch", 64, "--resume",
                                         tmp_path, *common, check=False),
                              "whose '--lr_scaling' reference batch G0 was 32 samples, but this run's is 64: pass "
                              "--reference_batch 32")
        assert_one_line_error(run_script("train.py", "--resume", tmp_path, *common, check=False),
                              "continues a run trained with --lr_scaling linear, but this run has no --lr_scaling: "
                              "resume it with --lr_scaling linear")
        # another rule read the rate at another factor from the same progress and G0 (a new user's trial: sqrt
        # resumed under linear doubled the rate at G = 4 G0, silently)
        assert_one_line_error(run_script("train.py", "--lr_scaling", "sqrt", "--resume", tmp_path, *common,
                                         check=False),
                              "continues a run trained with --lr_scaling linear, but this run has --lr_scaling sqrt")
        os.remove(os.path.join(tmp_path, "train_flags.json"))  # as an earlier train.py's state: the state's own check
        assert_one_line_error(run_script("train.py", "--resume", tmp_path, *common, check=False),
                              "which read its learning rate from its progress, but this run reads it at its update "
                              "count: keep --lr_scaling as it was")

    @pytest.mark.parametrize("flags, message", [
        (("--accumulation_schedule", "2:2"), "argument --accumulation_schedule: must say how many micro-batches the "
                                             "first windows hold (an entry for update 0), but got {2: 2}. Add 0: N "
                                             "(see --help)"),
        (("--adaptive_steps", "0:8"), "argument --adaptive_steps: must be MIN:MAX with 1 <= MIN <= MAX"),
        (("--goodput_steps", "1:8"), "'--goodput_steps' must have MIN >= 2 on one device, but got MIN = 1"),
        (("--adaptive_steps", "2:8", "--accumulation_schedule", "0:2"), "'--accumulation_schedule' and "
                                                                        "'--adaptive_steps' both set N"),
        (("--adaptive_steps", "2:8"), "'--adaptive_steps' needs '--lr_schedule constant', but got '--lr_schedule "
                                      "cosine'"),
        (("--accumulation_schedule", "0:2", "--trainer", "model_accu", "--dataset_sink_mode"),
         "'--accumulation_schedule' needs N to change between windows, but '--dataset_sink_mode' compiles its graphs "
         "for one --accumulation_steps"),
    ])
    def test_schedule_flags(self, flags, message):
        assert_one_line_error(run_script("train.py", "--data_path", SAMPLE, *flags, check=False), message)

    def test_unavailable_device_suggests_cpu(self):
        for script in ("train.py", "eval.py"):
            extra = ("--ckpt_path", "x.ckpt") if script == "eval.py" else ()
            assert_one_line_error(run_script(script, "--device_target", "GPU", *extra, check=False),
                                  "'--device_target' GPU is not available", "Use '--device_target CPU'")

    def test_missing_checkpoint(self, tmp_path):
        assert_one_line_error(run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", tmp_path / "no.ckpt",
                                         check=False),
                              "'--ckpt_path' must be an existing checkpoint file", "does not exist")
        assert_one_line_error(run_script("train.py", "--data_path", SAMPLE, "--resume", tmp_path / "no.ckpt",
                                         check=False), "'--resume' must be an existing checkpoint file")

    def test_truncated_checkpoint(self, trained, tmp_path):
        run_dir, _ = trained
        data = (run_dir / "checkpoint_lenet-1_24.ckpt").read_bytes()
        broken = tmp_path / "broken.ckpt"
        broken.write_bytes(data[: len(data) // 2])
        assert_one_line_error(run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", broken, check=False),
                              "could not be read (truncated or not a checkpoint)")

    def test_a_truncated_state_names_resume_and_the_state_kept_before_it(self, trained, tmp_path):
        """A new user's trial: a truncated train_state.ckpt under '--resume DIR' was refused naming 'ckpt_path', an
        argument train.py has not, and said nothing of train_state.prev.ckpt beside it, from which the run resumes."""
        run_dir, _ = trained
        for name in ("train_state.ckpt", "train_state.prev.ckpt", "train_flags.json"):
            shutil.copy(run_dir / name, tmp_path / name)
        data = (tmp_path / "train_state.ckpt").read_bytes()
        (tmp_path / "train_state.ckpt").write_bytes(data[: len(data) // 2])
        flags = ("--epoch_size", 10, "--batch_size", 32, "--accumulation_steps", 4, "--lr", 0.1, "--lr_schedule",
                 "constant")  # the run's (`trained`)
        assert_one_line_error(run_script("train.py", "--data_path", SAMPLE, "--resume", tmp_path, *flags,
                                         check=False),
                              f"'--resume' must be a complete MindSpore checkpoint, but "
                              f"'{tmp_path / 'train_state.ckpt'}' could not be read",
                              f"The state written before it is kept beside it: resume from "
                              f"'{tmp_path / 'train_state.prev.ckpt'}'")

    def test_checkpoint_of_another_network(self, tmp_path):
        other = str(tmp_path / "dense.ckpt")
        ms.save_checkpoint(nn.Dense(3, 2), other)
        assert_one_line_error(run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", other, check=False),
                              "must be a checkpoint of LeNet5", "belongs to another network", "conv1.weight")

    def test_checkpoint_of_the_other_network_names_its_flag(self, tmp_path):
        other = str(tmp_path / "lenet.ckpt")
        ms.save_checkpoint(LeNet5(), other)
        assert_one_line_error(run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", other, "--network",
                                         "resnet18", check=False),
                              "'--ckpt_path' must be a checkpoint of MindCV's ResNet18 (--network resnet18; pass "
                              "--network lenet5 for a checkpoint of that network)")

    def test_eval_and_prepare_data_flags(self, tmp_path):
        assert_one_line_error(run_script("eval.py", "--ckpt_path", tmp_path / "x.ckpt", "--batch_size", "0",
                                         check=False), "argument --batch_size: must be an int >= 1, but got '0'")
        assert_one_line_error(run_script("prepare_data.py", "--dest", tmp_path / "d", "--train_limit", "-5",
                                         check=False), "argument --train_limit: must be an int >= 1, but got '-5'")
        (tmp_path / "a_file").write_text("")
        assert_one_line_error(run_script("prepare_data.py", "--source", os.path.join(SAMPLE, "train"), "--dest",
                                         tmp_path / "a_file", check=False),
                              "'--dest' must be a directory to lay train/ and test/ out in, but")
        assert_one_line_error(run_script("train.py", "--data_path", SAMPLE, "--ckpt_path", tmp_path / "a_file",
                                         check=False),
                              "'--ckpt_path' must be a directory for the run's checkpoints, but")
        assert_one_line_error(run_script("prepare_data.py", "--source", SAMPLE, "--dest", tmp_path / "d",
                                         check=False),
                              f"{SAMPLE!r} holds them laid out already, in train/ and test/: nothing to prepare, pass "
                              f"it to train.py and eval.py as '--data_path {SAMPLE}'")
        code, out, err = run_script("train.py", "--data_path", SAMPLE, "--num_samples", 256, "--ckpt_path",
                                    tmp_path / "ckpt", "--telemetry_csv", tmp_path, check=False)
        assert "training" not in out, out  # refused before the run's first line
        assert_one_line_error((code, out, err), f"'--telemetry_csv' must be a file the run can write, but "
                                                f"{str(tmp_path)!r} cannot be: Is a directory. Pass a file in")
        # a path that cannot be made (a new user's trial: a bare "[Errno 2] ...", after the run's first line)
        _, out, _ = result = run_script("train.py", "--data_path", SAMPLE, "--ckpt_path", tmp_path / "a_file" / "d",
                                        check=False)
        assert_one_line_error(result, "'--ckpt_path' must be a directory the run can write its checkpoints to, but "
                                      f"'{tmp_path / 'a_file' / 'd'}' cannot be made: ")
        assert "training LeNet5" not in out

    def test_an_exact_state_of_another_trainer_or_other_flags_names_them(self, tmp_path):
        """The trainer, and the flags that decide the run's course beyond its state (another --seed resumed the
        rest of the epoch from another shuffle, silently)."""
        common = ("--data_path", SAMPLE, "--num_samples", 256, "--batch_size", 32, "--accumulation_steps", 2,
                  "--log_every", 0, "--save_state_every", 1, "--ckpt_path", tmp_path, "--epoch_size", 1)
        run_script("train.py", *common)
        assert_one_line_error(run_script("train.py", "--resume", tmp_path, "--trainer", "model_accu", *common,
                                         check=False),
                              "is the exact state of a '--trainer driver' run, whose buffers this run's '--trainer "
                              "model_accu' does not hold: pass --trainer driver")
        assert_one_line_error(run_script("train.py", "--resume", tmp_path, "--seed", 7, "--raw_sum", *common,
                                         check=False),
                              "continues a run trained with --seed 1, no --raw_sum, but this run has --seed 7, "
                              "--raw_sum: resume it with --seed 1, no --raw_sum, or from an epoch checkpoint to "
                              "change them")
        # a new user's trial was told of a --partial_window it never passed, --global_batch_size's default
        assert_one_line_error(run_script("train.py", "--resume", tmp_path, "--partial_window", "drop", *common,
                                         check=False),
                              "continues a run trained with --partial_window flush, but this run has "
                              "--partial_window drop (--partial_window's default: drop with --global_batch_size, "
                              "flush without it): resume it with --partial_window flush")

    def test_checkpoint_with_other_shapes(self, tmp_path):
        other = str(tmp_path / "lenet3.ckpt")
        ms.save_checkpoint(LeNet5(num_class=3), other)
        assert_one_line_error(run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", other, check=False),
                              "shape mismatch", "fc3.weight (3, 84) != (10, 84)")


@pytest.mark.slow
def test_prepare_data_lays_out_gzipped_idx(tmp_path):
    import gzip
    source = tmp_path / "src"
    os.makedirs(source)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        with open(os.path.join(SAMPLE, "train", name), "rb") as fin, gzip.open(source / f"{name}.gz", "wb") as f:
            f.write(fin.read())
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        shutil.copy(os.path.join(SAMPLE, "test", name), source / name)
    run_script("prepare_data.py", "--source", source, "--dest", tmp_path / "out", "--train_limit", 100)
    images = np.fromfile(tmp_path / "out" / "train" / "train-images-idx3-ubyte", np.uint8)
    assert images.size == 16 + 100 * 784
    assert create_dataset(str(tmp_path / "out"), 10).get_dataset_size() == 10
    assert create_dataset(str(tmp_path / "out"), 100, split="test").get_dataset_size() == 10


@pytest.mark.slow
@pytest.mark.parametrize("gzipped", [False, True])
def test_a_truncated_idx_file_is_refused_in_one_line(gzipped, tmp_path):
    """An IDX file cut short (a broken download): train.py refuses the data directory before training (MindSpore's
    reader failed with a traceback once the run had begun), and prepare_data.py lays nothing out (it copied the
    file and said "prepared"), plain or gzipped."""
    write_idx(tmp_path / "data" / "train", "train", 20)
    write_idx(tmp_path / "data" / "test", "test", 10)
    write_idx(tmp_path / "data" / "train", "test", 10)  # the source prepare_data.py reads: both splits in one
    images = tmp_path / "data" / "train" / "train-images-idx3-ubyte"
    whole = images.read_bytes()
    images.write_bytes(whole[:1000])
    assert_one_line_error(run_script("train.py", "--data_path", tmp_path / "data", check=False),
                          f"'{images}' must hold the 20 images its header announces (15696 bytes), but it has 1000 "
                          f"bytes: it is truncated")
    if gzipped:
        import gzip  # pylint: disable=import-outside-toplevel
        images.unlink()
        images.with_name(images.name + ".gz").write_bytes(gzip.compress(whole)[:-12])  # its trailer cut off
    message = "could not be read to its end" if gzipped else "must hold the 20 images its header announces"
    assert_one_line_error(run_script("prepare_data.py", "--source", tmp_path / "data" / "train", "--dest",
                                     tmp_path / "out", check=False), message)
    assert not os.path.exists(tmp_path / "out" / "train" / "train-images-idx3-ubyte")


def read_csv(path):
    import csv  # pylint: disable=import-outside-toplevel
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_train_py_follows_a_schedule_and_records_the_noise_scale(tmp_path):
    """--accumulation_schedule with --noise_scale: windows of the scheduled sizes, the noise scale in the CSV and
    the plot, a checkpoint at each epoch's end that eval.py reads."""
    run_script("train.py", "--data_path", SAMPLE, "--num_samples", 320, "--batch_size", 32, "--epoch_size", 2,
               "--accumulation_schedule", "0:1,2:2,4:3", "--noise_scale", "--ckpt_path", tmp_path,
               "--telemetry_csv", tmp_path / "t.csv", "--log_every", 0)
    rows = read_csv(tmp_path / "t.csv")
    assert [int(r["micro_batches"]) for r in rows] == [1, 1, 2, 2, 3, 1, 3, 3, 3, 1]  # 10 per epoch, flushed
    assert [int(r["accumulation_steps"]) for r in rows] == [1, 1, 2, 2] + [3] * 6
    assert all(r["noise_scale"] == "nan" for r in rows[:2]) and any(r["noise_scale"] != "nan" for r in rows[2:])
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("checkpoint_lenet")) == \
        ["checkpoint_lenet-1_6.ckpt", "checkpoint_lenet-2_4.ckpt"]  # 6 updates, then 4
    _, out, _ = run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", tmp_path / "checkpoint_lenet-2_4.ckpt")
    assert ACCURACY.search(out), out
    run_script("plot_telemetry.py", "--csv", tmp_path / "t.csv", "--out", tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flag", ["--adaptive_steps", "--goodput_steps"])
def test_train_py_takes_a_policy_from_one_micro_batch_in_data_parallel_only(flag):
    """MIN = 1 is planned on 2 devices (a window of one micro-batch a device holds two for the noise estimate: the
    engine's data-parallel test runs it, tests/test_goodput_data_parallel.py) and refused on one, naming the flag."""
    import train  # pylint: disable=import-outside-toplevel  (model_zoo_lenet/, on the tests' path)
    args = train.parse_args([flag, "1:8", "--lr_scaling", "sqrt"])
    policy, plan = train.accumulation_plan(args, "driver", 2)
    assert (policy.min_steps, policy.max_steps, policy.initial_steps) == (1, 8, 1) and plan.steps_at(0) == 1
    with pytest.raises(ValueError, match=f"'{flag}' must have MIN >= 2 on one device, but got MIN = 1"):
        train.accumulation_plan(train.parse_args([flag, "1:8", "--lr_scaling", "sqrt"]), "driver", 1)


@pytest.mark.slow
def test_train_py_adapts_n_to_the_measured_noise_scale(tmp_path):
    """--adaptive_steps: every window's N is the policy's answer to the figures recorded before it."""
    import ms_accum  # pylint: disable=import-outside-toplevel
    run_script("train.py", "--data_path", SAMPLE, "--num_samples", 640, "--batch_size", 16, "--epoch_size", 2,
               "--adaptive_steps", "2:8", "--adaptive_interval", 2, "--lr_schedule", "constant", "--ckpt_path",
               tmp_path, "--telemetry_csv", tmp_path / "t.csv", "--log_every", 0)
    rows = read_csv(tmp_path / "t.csv")
    assert_policy_decided(rows, ms_accum.AdaptiveAccumulation(2, 8, interval=2))


def assert_policy_decided(rows, policy):
    """Telemetry `rows` (the CSV's) of a run whose N `policy` chose from N = 2: N changed, and every next N is the
    host policy's answer to the figures the window recorded."""
    steps = [int(r["accumulation_steps"]) for r in rows]
    assert steps[0] == 2 and len(set(steps)) > 1, steps
    for index, row in enumerate(rows[:-1]):
        want = policy.next_steps(steps[index], index, float(row["noise_scale"]),
                                 float(row["items"]) / int(row["micro_batches"]))
        assert steps[index + 1] == want, f"after window {index}: N {steps[index + 1]}, the policy says {want}"


@pytest.mark.slow
def test_train_py_plans_the_micro_batch_for_a_memory_budget(tmp_path):
    """--batch_size auto measures train.py itself in fresh processes: a budget below what one sample needs is
    refused naming the measured peak, before anything is trained; a generous one takes the largest micro-batch that
    divides the global batch, prints the table and the plan's line, and trains with it (b x N = G). Neither leaves
    the measuring runs' checkpoints behind in the temporary directory."""
    common = ("--data_path", SAMPLE, "--epoch_size", "1", "--global_batch_size", "64", "--batch_size", "auto",
              "--num_samples", "256")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    code, out, err = run_script("train.py", *common, "--max_memory", "64MiB", "--ckpt_path", tmp_path / "small",
                                check=False, env={"TMPDIR": str(scratch)})
    assert code == 2, (out, err)
    peak = re.search(r"^train.py: error: '--max_memory' must hold the smallest micro-batch \(1\), which peaked at "
                     r"(\d+) MiB, but got 64MiB: pass --max_memory (\d+)MiB or more", err, re.M)
    assert peak and peak.group(1) == peak.group(2), err
    assert not glob.glob(str(tmp_path / "small" / "*.ckpt")), "a refused plan trained"
    _, out, _ = run_script("train.py", *common, "--max_memory", "8GiB", "--ckpt_path", tmp_path / "large",
                           env={"TMPDIR": str(scratch)})
    assert not glob.glob(str(scratch / "ms_accum_plan_*")), os.listdir(scratch)
    assert "| b | N | predicted peak | measured peak | samples/s | fits |" in out
    assert re.search(r"^plan: micro-batch 64 x N 1 x 1 device\(s\) = global batch 64; peak measured \d+ MiB of "
                     r"8.00 GiB", out, re.M), out
    assert "4 micro-batches of 64 per epoch, 1 per update (effective batch 64)" in out, out
    assert glob.glob(str(tmp_path / "large" / "checkpoint_lenet-1_4.ckpt"))
    for flags, message in ((("--batch_size", "auto", "--global_batch_size", "64"),
                            "'--batch_size auto' plans the micro-batch for a global batch and a memory budget, but "
                            "'--max_memory' was not given"),
                           (("--batch_size", "16", "--max_memory", "1GiB"),
                            "'--max_memory' is the budget '--batch_size auto' plans for"),
                           (("--batch_size", "auto", "--global_batch_size", "64", "--max_memory", "lots"),
                            "'--max_memory' must be a size such as '3GiB'"),
                           # refused after a measuring process had run, in its failure (a new user's trial)
                           (("--batch_size", "auto", "--global_batch_size", "64", "--max_memory", "1GiB",
                             "--gradient_accumulation_steps", "4"),
                            "'--global_batch_size' sets N (G / (devices x --batch_size)), but "
                            "'--gradient_accumulation_steps' was given too: pass one of them.")):
        code, out, err = run_script("train.py", "--data_path", SAMPLE, *flags, check=False)
        assert code == 2 and message in err and "plan:" not in out + err, out + err
    # a missing data directory before the measuring processes (a new user's trial: told inside the first one's
    # failure, "'--batch_size auto' could not plan: For 'FreshProcessMeasure', measuring micro-batch 1 failed")
    code, out, err = run_script("train.py", "--data_path", tmp_path / "none", "--global_batch_size", "64",
                                "--batch_size", "auto", "--max_memory", "1GiB", check=False)
    assert_one_line_error((code, out, err), "'--data_path' must be a directory holding train/ and test/, but")
    assert "plan:" not in out + err and "measuring" not in err, out + err


@pytest.mark.slow
def test_train_py_trains_mindcv_resnet18_and_eval_py_reads_its_checkpoint(tmp_path):
    """--network resnet18: MindCV's ResNet18 for the same 1 x 32 x 32 inputs, trained with accumulation, its
    checkpoints named for it, evaluated by eval.py --network resnet18 (as the planning docs run it)."""
    run_script("train.py", "--network", "resnet18", "--data_path", SAMPLE, "--ckpt_path", tmp_path,
               "--epoch_size", "1", "--num_samples", "64", "--batch_size", "8", "--accumulation_steps", "2",
               "--log_every", "0")
    checkpoint = tmp_path / "checkpoint_resnet18-1_4.ckpt"
    assert checkpoint.exists(), sorted(os.listdir(tmp_path))
    _, out, _ = run_script("eval.py", "--network", "resnet18", "--data_path", SAMPLE, "--ckpt_path", checkpoint)
    assert re.search(r"\{'Accuracy': 0\.\d+\}", out), out
    code, _, err = run_script("eval.py", "--data_path", SAMPLE, "--ckpt_path", checkpoint, check=False)
    assert code == 2 and "lenet" in err.lower(), err


def cosine_over_reference_steps(samples, warmup_samples, reference, peak=0.05):
    """train.py's cosine with a learning-rate rule, built here from its definition: one entry per reference step of
    `reference` samples, as many as the run's samples make (rounded up), the warm-up over its samples likewise."""
    return warmup_cosine(peak, -(-samples // reference), -(-warmup_samples // reference))


@pytest.mark.slow
@pytest.mark.parametrize("flags, rule", [
    (("--accumulation_schedule", "0:1,4:2,8:4", "--batch_size", 32), "linear"),
    (("--goodput_steps", "2:8", "--goodput_times", "0.004:0.01", "--adaptive_interval", 2, "--batch_size", 16),
     "sqrt"),
], ids=["schedule-linear", "goodput-sqrt"])
def test_train_py_lays_the_cosine_over_reference_steps_under_a_changing_n_and_a_rule(flags, rule, tmp_path):
    """A schedule of N, or goodput's (its window times given: every N is the policy's answer to the figures
    recorded before it), with a rule: each window's rate is the cosine's entry at the progress before it (the
    samples seen over G0, the first window's 32) times G / G0 or its square root, and progress ends at the run's
    samples over G0 whatever the windows' sizes; the control, the cosine read at the update count, differs."""
    run_script("train.py", "--data_path", SAMPLE, "--num_samples", 640, "--epoch_size", 2, *flags, "--lr_scaling",
               rule, "--ckpt_path", tmp_path, "--telemetry_csv", tmp_path / "t.csv", "--log_every", 0)
    rows = read_csv(tmp_path / "t.csv")
    rates = cosine_over_reference_steps(1280, 640, 32)
    seen, control_differs = 0, False
    for index, row in enumerate(rows):
        ratio = float(row["items"]) / 32
        want = rates[seen // 32] * (ratio if rule == "linear" else ratio ** 0.5)
        assert float(row["learning_rate"]) == pytest.approx(want, rel=1e-6), f"update {index}: {row}"
        control_differs |= float(row["learning_rate"]) != pytest.approx(rates[index], rel=1e-3)
        seen += int(float(row["items"]))
        assert float(row["progress"]) == pytest.approx(seen / 32), f"update {index}: {row}"
    assert seen == 1280 and control_differs, "the rates read at the update count equal the progress's"
    steps = [int(r["accumulation_steps"]) for r in rows]
    if rule == "linear":
        assert steps[:9] == [1, 1, 1, 1, 2, 2, 2, 2, 4], steps
        return
    import ms_accum  # pylint: disable=import-outside-toplevel
    assert_policy_decided(rows, ms_accum.GoodputAccumulation(2, 8, interval=2, micro_time=0.004, end_time=0.01))


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_an_adaptive_cosine_run_with_a_rule_resumed_mid_window_equals_the_uninterrupted_run(trainer, tmp_path):
    """--adaptive_steps, --lr_schedule cosine and --lr_scaling adascale: a state written 57 micro-batches in (inside
    a window of epoch 2) resumes to the uninterrupted run's N, learning rates, progress and parameters."""
    common = ("--data_path", SAMPLE, "--num_samples", 640, "--batch_size", 16, "--epoch_size", 2, "--adaptive_steps",
              "2:8", "--adaptive_interval", 2, "--lr_scaling", "adascale", "--log_every", 0, "--save_state_every", 57,
              "--trainer", trainer)
    run_script("train.py", "--ckpt_path", tmp_path / "full", "--telemetry_csv", tmp_path / "full.csv", *common)
    full_rows = read_csv(tmp_path / "full.csv")
    ends = np.cumsum([int(r["micro_batches"]) for r in full_rows])
    assert 57 not in ends and len({r["accumulation_steps"] for r in full_rows}) > 1, ends
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(tmp_path / "full" / "train_state.ckpt", cut)
    assert int(ms.load_checkpoint(str(cut / "train_state.ckpt"))["ms_accum_micro_steps_done"].asnumpy()) == 57
    run_script("train.py", "--ckpt_path", cut, "--resume", cut / "train_state.ckpt", "--telemetry_csv",
               tmp_path / "cut.csv", *common)
    resumed_rows = read_csv(tmp_path / "cut.csv")
    tail = full_rows[len(full_rows) - len(resumed_rows):]
    assert int(resumed_rows[0]["update"]) == int(tail[0]["update"]) and int(tail[0]["update"]) > 1
    for got, want in zip(resumed_rows, tail):
        for column in ("accumulation_steps", "micro_batches", "items"):
            assert got[column] == want[column], f"update {want['update']}: {column}"
        for column in ("learning_rate", "progress"):
            assert float(got[column]) == pytest.approx(float(want[column]), rel=1e-6), f"update {want['update']}"
    name = f"checkpoint_lenet-2_{len(full_rows)}.ckpt"
    full, resumed = (ms.load_checkpoint(str(d / name)) for d in (tmp_path / "full", cut))
    fraction = [value for key, value in full.items() if key.endswith(".lr.progress_fraction")]
    assert len(fraction) == 1 and float(fraction[0].asnumpy()) > 0, "AdaScale's gains must leave a fraction"
    for key, value in full.items():
        if key not in ("epoch_num", "step_num"):
            np.testing.assert_allclose(resumed[key].asnumpy(), value.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("grad_sq, trace, shown", [
    (0.0, 0.0, "noise scale not estimated, N now 4"),  # no window measured yet
    (-0.5, 2.0, "noise scale none now (smoothed |G|^2 <= 0), N now 4"),  # measured; the noise swamps the signal
    (0.5, 2.0, "noise scale 4 samples, N now 4"),
])
def test_the_functional_epoch_line_tells_an_estimate_not_made_from_one_lost(grad_sq, trace, shown):
    """The functional trainer's epoch line: 'not yet estimated' also stood after estimates had been made and N had
    moved (N now 4 of MIN 2), once the smoothed |G|^2 fell to 0 or below."""
    from src.functional_train import _noise_summary  # pylint: disable=import-outside-toplevel

    class Records:  # an Accumulator's smoothed noise records and its next N
        noise_records = tuple(ms.Tensor(value, ms.float32) for value in (0.0, 0.0, grad_sq, trace))

        @staticmethod
        def next_window_steps():
            return 4

    assert _noise_summary(Records()) == ", " + shown


def test_the_functional_loop_closes_the_telemetry_csv_when_training_raises(tmp_path):
    """The functional trainer enters its WindowTelemetry as MindSpore's callback manager does for the others: a
    failure (here writing the epoch checkpoint) leaves the CSV closed with the epoch's rows."""
    from src.functional_train import train_functional  # pylint: disable=import-outside-toplevel

    class FailingFiles:  # an EpochFiles whose disk is full
        @staticmethod
        def write(*_):
            raise OSError("no space left on device")

    net = LeNet5()
    path = str(tmp_path / "telemetry.csv")
    telemetry = ms_accum.WindowTelemetry(csv_path=path, print_every=0)
    with pytest.raises(OSError, match="no space left"):
        train_functional(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                         nn.Momentum(net.trainable_params(), 0.01, 0.9),
                         create_dataset(SAMPLE, 32, "train", num_samples=128), 1, 2, FailingFiles(), log_every=0,
                         telemetry=telemetry)
    assert os.path.realpath(path) not in open_files()
    with open(path, encoding="utf-8") as f:
        assert len(f.read().strip().splitlines()) == 1 + 2  # the header and the epoch's 2 windows


@pytest.mark.slow
def test_an_epoch_checkpoint_resumed_with_another_n_continues_the_schedule_at_its_epoch(tmp_path):
    """An epoch checkpoint of N = 3 (40 micro-batches an epoch: 14 updates, the last flushed) resumed with N = 4 for
    2 epochs more, 10 updates each, by every trainer: the run ends (the optimizer's list of 30 entries, laid out for
    N = 4 throughout, ended at update 30 while its global_step went on from 14: MindSpore's Gather failed mid-run),
    step_num counts on from the checkpoint's 14 to 34, and the list the optimizer read from update 14 on is the
    cosine of this run's plan from epoch 2's place in it (entry 10 on)."""
    common = ("--data_path", SAMPLE, "--batch_size", 16, "--num_samples", 640, "--log_every", 0)
    run_script("train.py", *common, "--epoch_size", 1, "--accumulation_steps", 3, "--ckpt_path", tmp_path / "a")
    rates = warmup_cosine(0.05, 30, 10)  # train.py's default --lr and --warmup_epochs 1, over N = 4's 3 epochs
    for trainer in ("driver", "model_accu", "functional"):
        _, out, _ = run_script("train.py", *common, "--epoch_size", 3, "--accumulation_steps", 4, "--trainer", trainer,
                               "--ckpt_path", tmp_path / trainer, "--resume",
                               tmp_path / "a" / "checkpoint_lenet-1_14.ckpt")
        assert re.findall(r"^epoch (\d)/3: (\d+) updates", out, re.M) == [("2", "10"), ("3", "10")], (trainer, out)
        last = ms.load_checkpoint(str(tmp_path / trainer / "checkpoint_lenet-3_10.ckpt"))
        assert int(last["step_num"].asnumpy()) == int(last["global_step"].asnumpy()[0]) == 34, trainer
        np.testing.assert_allclose(last["learning_rate"].asnumpy()[14:], rates[10:], rtol=1e-6, err_msg=trainer)

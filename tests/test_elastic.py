"""A global batch kept across device counts, and exact resume of a state on another device count.

The claims: each device derives N = G / (devices x micro-batch); with MindSpore's distributed sampler a window
holds the same samples on every device count, so a run on 1 device and on 2 devices with one G end alike (checked
against a large-batch run built without ms_accum); a state written on 2 devices resumes on 1 and one written on 1,
inside a window, resumes on 2, both ending with the uninterrupted run's parameters; a resume that would change G
is refused, naming global_batch_size.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn

import ms_accum
from ms_accum.trainers.elastic import (RunLayout, check_same_global_batch, dataset_shards, elastic_position,
                                      resume_notice)
from conftest import ZOO
from helpers import (KILL_NODE_TIMEOUT, SAMPLE, assert_equals_large_batch, launch_local, micro_batches, msrun_env,
                     own_loop, params_of, run_local, train_py_worker)
import elastic_worker as ew
from src.lenet import LeNet5

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------- N from G
def test_each_device_derives_n_from_the_global_batch():
    assert ms_accum.steps_for_global_batch(256, 32, device_num=2) == 4
    assert ms_accum.steps_for_global_batch(256, 32, device_num=1) == 8
    assert ms_accum.steps_for_global_batch(256, 32, device_num=8) == 1
    assert ms_accum.steps_for_global_batch(256, 32) == 8  # one device outside a parallel mode


@pytest.mark.parametrize("global_batch, nearest", [(250, "values are 192 or 256"), (32, "value is 64")])
def test_a_global_batch_that_does_not_divide_is_refused_with_the_nearest_values(global_batch, nearest):
    with pytest.raises(ValueError, match=rf"For 'steps_for_global_batch', 'global_batch_size' must be a multiple of "
                                         rf"devices x micro-batch = 2 x 32 = 64, .* but got {global_batch}\. The "
                                         rf"nearest valid {nearest}"):
        ms_accum.steps_for_global_batch(global_batch, 32, device_num=2)
    with pytest.raises(ValueError, match=r"'device_num' must be an int >= 1, but got 0"):
        ms_accum.steps_for_global_batch(64, 32, device_num=0)


def test_a_global_batch_is_named_as_its_caller_gave_it():
    with pytest.raises(ValueError, match=r"^For 'train.py', '--global_batch_size' must be a multiple of devices x "
                                         r"micro-batch = 1 x 32 = 32"):
        ms_accum.steps_for_global_batch(100, 32, 1, owner="train.py", arg_name="--global_batch_size")
    with pytest.raises(ValueError, match=r"^For 'train.py', '--global_batch_size' must be an int >= 1, but got 0"):
        ms_accum.steps_for_global_batch(0, 32, 1, owner="train.py", arg_name="--global_batch_size")
    # of another type: a TypeError, as N's (a new user's trial: '8' and 8.0 were ValueErrors through Model_ACCU)
    net = nn.Dense(4, 2)
    model = ms_accum.Model_ACCU(ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()),
                                                            nn.SGD(net.trainable_params(), 0.1)))
    for value, hint in (("8", r" Convert a number read from a command line: int\('8'\)\."),
                        (8.0, r" Pass the int 8 \(a float, such as the result of '/', is not taken: divide with "
                              r"'//'\)\.")):
        with pytest.raises(TypeError, match=rf"^For 'Model_ACCU.train', 'global_batch_size' must be an int >= 1, "
                                            rf"but got {value!r} of type {type(value).__name__}\.{hint}$"):
            model.train(1, _dense_data(), global_batch_size=value)


# ---------------------------------------------------------------------------------------------- the data order
def _orders(make, world, epochs=2):
    """Each rank's sample tags, epoch by epoch."""
    ranks = []
    for rank in range(world):
        ds.config.set_seed(ew.DATA_SEED)
        iterator = make(world, rank).create_tuple_iterator(num_epochs=epochs, output_numpy=True)
        ranks.append([[int(row[0]) for row in iterator] for _ in range(epochs)])
    return ranks


def _tagged_mnist(world, rank):
    mnist = ds.MnistDataset(os.path.join(SAMPLE, "train"), shuffle=True, num_shards=world, shard_id=rank)
    return mnist.map(lambda image: np.array(int(image.astype(np.int64).sum()), np.int64), input_columns="image",
                     output_columns="tag").project("tag")


def _indices(world, rank):
    return ds.NumpySlicesDataset({"i": np.arange(120, dtype=np.int64)}, shuffle=True, num_shards=world,
                                 shard_id=rank)


@pytest.mark.parametrize("make", [_indices, _tagged_mnist], ids=["numpy_slices", "mnist"])
def test_mindspore_shares_one_order_of_the_epoch_out_by_rank(make):
    """What elastic resume relies on: rank r of R reads positions r, r + R, ... of an order that does not depend on
    R, in every epoch, so the ranks' windows together are one contiguous block of that order."""
    one = _orders(make, 1)[0]
    assert one[0] != one[1], "the epochs were not reshuffled"
    for world in (2, 3):
        ranks = _orders(make, world)
        for epoch in range(2):
            length = min(len(rank[epoch]) for rank in ranks)
            interleaved = [ranks[r][epoch][i] for i in range(length) for r in range(world)]
            assert interleaved == one[epoch][:len(interleaved)], f"{world} ranks, epoch {epoch + 1}"


# ---------------------------------------------------------------------------------------------- positions
TWO = RunLayout(world=2, micro_batch_size=4, steps_per_epoch=31, steps=2, partial_window="drop")
ONE = RunLayout(world=1, micro_batch_size=4, steps_per_epoch=62, steps=4, partial_window="drop")


def test_the_resume_line_speaks_of_devices_only_for_several():
    """A state of two devices resumed on one: 'done', not 'done on each device' (a new user's trial read the
    latter on one device); on two, each device's count."""
    assert resume_notice(TWO, ONE, 12, 0).endswith("at epoch 1 with 12 of its 62 micro-batches done.")
    assert resume_notice(ONE, TWO, 12, 3).startswith(
        "ms_accum: resuming a state of 1 device on 2, the global batch kept")
    assert "with 12 of its 31 micro-batches done on each device; it was written 3 micro-batches into a window" in \
        resume_notice(ONE, TWO, 12, 3)


def test_a_position_moves_to_the_same_sample_of_its_epoch():
    assert TWO.global_batch_size == ONE.global_batch_size == 16 and TWO.full_windows == ONE.full_windows == 15
    # 2 -> 1 at an update boundary in epoch 2: 5 windows in, 10 micro-batches per device there, 20 here
    assert elastic_position(TWO, ONE, 31 + 10, 20, 0, "s") == (62 + 20, 20, 0)
    # 1 -> 2 three micro-batches into window 12 of epoch 1: back to its start, the window not counted
    assert elastic_position(ONE, TWO, 11 * 4 + 3, 12, 3, "s") == (11 * 2, 11, 3)
    # the dropped tail: a state in it resumes at the tail's start, whose micro-batches are dropped again
    assert elastic_position(ONE, TWO, 60 + 1, 16, 1, "s") == (30, 15, 1)
    # an epoch's end (written after the drop) is the next epoch's start
    assert elastic_position(TWO, ONE, 31, 15, 0, "s") == (62, 15, 0)


def test_partial_windows_of_the_same_samples_move_too():
    """flush and carry: an epoch of 40 micro-batches of 4 per device on 1 device, 20 on 2; G = 32: 5 windows and
    a tail of 0 on both. Under carry with a tail, windows that span epochs move when the tails hold the same
    samples."""
    one = RunLayout(1, 4, 41, 8, "carry")  # tail: 1 micro-batch of 4 = 4 samples
    two = RunLayout(2, 2, 41, 8, "carry")  # micro-batch 2 per device: tail of 1 micro-batch x 2 x 2 = 4 samples
    assert one.tail_samples == two.tail_samples == 4
    # the window after the carried one starts 7 micro-batches (28 samples) into epoch 2
    assert elastic_position(one, two, 41 + 7, 6, 0, "s") == (41 + 7, 6, 0)
    with pytest.raises(ms_accum.CheckpointError, match=r"each epoch ends with a partial window of 4 samples there "
                                                       r"and 8 here, which are not the same samples\. Train both "
                                                       r"runs with partial_window='drop'"):
        elastic_position(RunLayout(1, 4, 41, 8, "flush"), RunLayout(2, 4, 21, 4, "flush"), 8, 1, 0, "s")


def test_the_trainers_see_whether_the_data_are_sharded():
    x = np.arange(40, dtype=np.float32)
    assert dataset_shards(ds.NumpySlicesDataset({"x": x}, num_shards=2, shard_id=1).batch(4)) == 2
    assert dataset_shards(ds.NumpySlicesDataset({"x": x}, num_shards=1, shard_id=0).map(lambda v: v).batch(4)) == 1
    assert dataset_shards(ds.NumpySlicesDataset({"x": x}, sampler=ds.DistributedSampler(3, 0)).batch(4)) == 3
    assert dataset_shards(ds.NumpySlicesDataset({"x": x}, shuffle=True).batch(4)) is None
    assert dataset_shards(_tagged_mnist(1, 0)) == 1


def test_a_resume_on_another_device_count_refuses_data_that_are_not_sharded():
    for saved, mine, which in [(RunLayout(2, 4, 31, 2, "drop", sharded=False), ONE, "saved"),
                               (TWO, RunLayout(1, 4, 62, 4, "drop", sharded=False), "new")]:
        with pytest.raises(ms_accum.CheckpointError, match=rf"the {which} run's dataset is not sharded over its "
                                                           rf"devices\. To continue exactly, build the dataset with "
                                                           rf"num_shards=<devices>, shard_id=<rank> \(on one device "
                                                           rf"num_shards=1, shard_id=0\)"):
            elastic_position(saved, mine, 10, 5, 0, "s")


def test_a_resume_that_would_change_the_global_batch_is_refused_naming_it():
    with pytest.raises(ms_accum.CheckpointError, match=r"continues a run whose 'global_batch_size' was 16 = 2 "
                                                       r"devices x 2 micro-batches x 4 samples, but this run's is "
                                                       r"32 = 1 device x 8 micro-batches x 4 samples.*Pass "
                                                       r"gradient_accumulation_steps=4 \(or global_batch_size=16\), "
                                                       r"so that N x devices x micro-batch stays 16"):
        elastic_position(TWO, RunLayout(1, 4, 62, 8, "drop"), 10, 5, 0, "s")
    with pytest.raises(ms_accum.CheckpointError, match=r"Pass global_batch_size=16 with a micro-batch that divides "
                                                       r"it"):
        elastic_position(TWO, RunLayout(1, 6, 62, 2, "drop"), 10, 5, 0, "s")
    with pytest.raises(ms_accum.CheckpointError, match=r"only with a fixed 'global_batch_size' \(one N\), but N "
                                                       r"changes between windows in the saved run"):
        elastic_position(RunLayout(2, 4, 31, 0, "drop"), ONE, 10, 5, 0, "s")
    # on the same device count too: a schedule's state resumed with one N, or the reverse
    with pytest.raises(ms_accum.CheckpointError, match=r"continues a run whose N changed between windows \(a "
                                                       r"schedule or a policy\), but this run's N is fixed"):
        check_same_global_batch(RunLayout(1, 4, 62, 0, "drop"), ONE, "s")
    with pytest.raises(ms_accum.CheckpointError, match=r"whose N was fixed, but this run's N changes between "
                                                       r"windows.*Resume with the saved run's global_batch_size=16"):
        check_same_global_batch(ONE, RunLayout(1, 4, 62, 0, "drop"), "s")
    with pytest.raises(ms_accum.CheckpointError, match=r"'partial_window' must be the saved run's 'drop', but got "
                                                       r"'flush'"):
        elastic_position(TWO, RunLayout(1, 4, 62, 4, "flush"), 10, 5, 0, "s")
    with pytest.raises(ms_accum.CheckpointError, match=r"an epoch must hold the same windows of 16 samples, but it "
                                                       r"holds 15 there and 12 here"):
        elastic_position(TWO, RunLayout(1, 4, 50, 4, "drop"), 10, 5, 0, "s")


def _dense_data(samples=96, batch=8):
    rng = np.random.default_rng(0)
    return ds.NumpySlicesDataset({"x": rng.normal(size=(samples, 4)).astype(np.float32),
                                  "y": rng.normal(size=(samples, 2)).astype(np.float32)}, shuffle=False).batch(batch)


def _driver():
    net = nn.Dense(4, 2)
    return ms_accum.GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))


def test_the_driver_takes_a_global_batch_and_its_state_refuses_another(tmp_path):
    state = str(tmp_path / "state.ckpt")
    trainer = _driver()
    losses = trainer.train_process(1, _dense_data(), global_batch_size=32, ckpt_path=None, log_every=0,
                                   state_path=state, save_state_every=5)
    assert len(losses) == 3  # 12 micro-batches of 8, N = 32 / 8 = 4
    with pytest.raises(ms_accum.CheckpointError, match=r"whose 'global_batch_size' was 32 = 1 device x 4 "
                                                       r"micro-batches x 8 samples, but this run's is 16 = 1 device "
                                                       r"x 2 micro-batches x 8 samples"):
        _driver().train_process(2, _dense_data(), global_batch_size=16, ckpt_path=None, log_every=0,
                                resume_from=state)
    refused = _driver()  # another micro-batch too: the state would move, and its global batch is checked there
    before = {p.name: p.asnumpy().copy() for p in refused.cell.get_parameters()}
    with pytest.raises(ms_accum.CheckpointError, match=r"'global_batch_size' was 32 = 1 device x 4 micro-batches x "
                                                       r"8 samples, but this run's is 16 = 1 device x 4 "
                                                       r"micro-batches x 4 samples"):
        refused.train_process(2, _dense_data(batch=4), global_batch_size=16, ckpt_path=None, log_every=0,
                              resume_from=state)
    # refused before anything was loaded (a new user's trial found the state's weights and global_step in the cell);
    # N itself (grad_sum.steps) is the run's, set before the resume
    for param in refused.cell.get_parameters():
        if param.name != "grad_sum.steps":
            np.testing.assert_array_equal(param.asnumpy(), before[param.name], err_msg=param.name)
    with pytest.raises(ms_accum.CheckpointError, match=r"'global_batch_size' was 32 .* this run's is 16.* Pass "
                                                       r"gradient_accumulation_steps=4 \(or global_batch_size=32\)"):
        _driver().train_process(2, _dense_data(), 2, ckpt_path=None, log_every=0, resume_from=state)  # N given
    assert len(_driver().train_process(2, _dense_data(), global_batch_size=32, ckpt_path=None, log_every=0,
                                       resume_from=state)) == 4  # written after 10 micro-batches: window 3 of 6
    with pytest.raises(TypeError, match=r"N must be given once, but got both 'accumulation_steps' and "
                                        r"'global_batch_size'"):
        _driver().train_process(1, _dense_data(), accumulation_steps=4, global_batch_size=32, ckpt_path=None)
    with pytest.raises(ValueError, match=r"For 'GradientAccumulation.train_process', 'global_batch_size' must be a "
                                         r"multiple of devices x micro-batch = 1 x 8 = 8"):
        _driver().train_process(1, _dense_data(), global_batch_size=36, ckpt_path=None)


def test_a_global_batch_needs_a_dataset_that_gives_its_micro_batch():
    """A new user's trial: a GeneratorDataset yielding micro-batches of 16 (no .batch) says get_batch_size() 1, and
    global_batch_size=48 derived N = 48 (refused there only as longer than the epoch; a longer dataset would have
    trained windows of 768 samples, in silence). Both trainers refuse G, and a plan, without a batch operation;
    N itself is taken."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 4)).astype(np.float32), rng.normal(size=(96, 2)).astype(np.float32)

    def micro_batches():
        for start in range(0, 96, 16):
            yield x[start:start + 16], y[start:start + 16]
    data = ds.GeneratorDataset(micro_batches, ["x", "y"], shuffle=False)
    message = (r"'global_batch_size' derives N from the dataset's micro-batch size, which this dataset does not "
               r"give: it has no batch operation, so its get_batch_size\(\) is 1 whatever its rows hold.* Yield "
               r"samples and batch them with dataset.batch\(micro_batch\), or pass N itself")
    with pytest.raises(ValueError, match=rf"For 'GradientAccumulation.train_process', {message}"):
        _driver().train_process(1, data, global_batch_size=32, ckpt_path=None, log_every=0)
    with pytest.raises(ValueError, match=rf"For 'Model_ACCU.train', {message}"):
        _model_accu(nn.Dense(4, 2)).train(1, data, global_batch_size=32)
    plan = ms_accum.plan_micro_batch(lambda b: ms_accum.Measurement(b, b, 1.0), 32, 2 ** 30, verbose=False)
    with pytest.raises(ValueError, match=r"'plan' derives N from the dataset's micro-batch size"):
        _driver().train_process(1, data, plan=plan, ckpt_path=None, log_every=0)
    assert len(_driver().train_process(1, data, 2, ckpt_path=None, log_every=0)) == 3


def _model_accu(net, state_path=None):
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    return ms_accum.Model_ACCU(cell, state_path=state_path, save_state_every=5 if state_path else 0)


def _train_at(trainer, net, batch, epochs, tmp_path, state=None, resume=None):
    """Train `net` ("driver" or "model_accu") `epochs` epochs of _dense_data at micro-batch `batch`, G = 32."""
    data = _dense_data(batch=batch)
    if trainer == "driver":
        ms_accum.GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)).train_process(
            epochs, data, global_batch_size=32, ckpt_path=None, log_every=0, state_path=state,
            save_state_every=5 if state else 0, resume_from=resume)
    else:
        _model_accu(net, state).train(epochs, data, global_batch_size=32, resume_from=resume)
    return {p.name: p.asnumpy() for p in net.trainable_params()}


@pytest.mark.parametrize("trainer", ["driver", "model_accu"])
def test_a_state_resumed_with_another_micro_batch_continues_through_its_samples(trainer, tmp_path, capsys):
    """One device, G = 32 kept: a state written at micro-batches of 8 (N 4), 10 micro-batches in (window 3 open
    with 2), resumed with the dataset batched at 4 (N 8) or 16 (N 2) ends where the uninterrupted run at 8 ends.
    The position was taken in the new micro-batches (a new user's trial, as the out-of-memory refusal advises:
    10 of 4 samples, 40 samples where 80 had trained, maxdiff 5e-3, silently)."""
    ms.set_seed(0)
    expected = _train_at(trainer, nn.Dense(4, 2), 8, 2, tmp_path)
    state = str(tmp_path / "state.ckpt")
    ms.set_seed(0)
    _train_at(trainer, nn.Dense(4, 2), 8, 1, tmp_path, state=state)  # the last state: after 10 of 12
    for batch, line in ((4, "ms_accum: resuming a state of micro-batches of 8 samples with micro-batches of 4, the "
                            "global batch kept (32 = 1 device x 4 micro-batches x 8 samples -> 32 = 1 device x 8 "
                            "micro-batches x 4 samples), at epoch 1 with 16 of its 24 micro-batches done; it was "
                            "written 2 micro-batches into a window, which runs again from its start (after a change "
                            "of micro-batch a state resumes from the last complete window)."),
                        (16, "at epoch 1 with 4 of its 6 micro-batches done; it was written 2 micro-batches")):
        capsys.readouterr()
        ms.set_seed(5)
        resumed = _train_at(trainer, nn.Dense(4, 2), batch, 2, tmp_path, resume=state)
        assert line in capsys.readouterr().out
        for name, want in expected.items():
            np.testing.assert_allclose(resumed[name], want, rtol=1e-5, atol=1e-6, err_msg=f"batch {batch}: {name}")


def test_a_state_with_a_schedule_is_refused_with_another_micro_batch():
    """N changing between windows gives no fixed sample offset per window: refused, naming the change."""
    with pytest.raises(ms_accum.CheckpointError, match=r"'s' was written with micro-batches of 8 samples and this "
                                                       r"run's hold 4: an exact state moves to another micro-batch "
                                                       r"only with a fixed 'global_batch_size' \(one N\), but N "
                                                       r"changes between windows in the saved run\. Resume on 1 "
                                                       r"device with micro-batches of 8 samples, or from an epoch "
                                                       r"checkpoint\."):
        elastic_position(RunLayout(1, 8, 12, 0, "flush"), RunLayout(1, 4, 24, 8, "flush"), 10, 3, 2, "s")


def test_model_accu_sets_the_cells_n_from_the_global_batch_and_refuses_conflicts():
    net = nn.Dense(4, 2)
    cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    model = ms_accum.Model_ACCU(cell)
    model.train(1, _dense_data(), global_batch_size=48)
    assert model.gradient_accumulation_steps == 6 and int(cell.optimizer.global_step.asnumpy()[0]) == 2
    with pytest.raises(ValueError, match=r"'global_batch_size' 16 needs N = 2, but the cell has trained with N = 6"):
        model.train(1, _dense_data(), global_batch_size=16)
    given = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                        gradient_accumulation_steps=3)
    with pytest.raises(ValueError, match=r"N must be given once, but the cell's 'gradient_accumulation_steps' is 3 "
                                         r"and this call's 'global_batch_size' 48 gives N = 6"):
        ms_accum.Model_ACCU(given).train(1, _dense_data(), global_batch_size=48)
    scheduled = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1),
                                            gradient_accumulation_steps={0: 1, 2: 2})
    with pytest.raises(ValueError, match=r"'global_batch_size' sets one N, but the cell's "
                                         r"'gradient_accumulation_steps' is AccumulationSchedule"):
        ms_accum.Model_ACCU(scheduled).train(1, _dense_data(), global_batch_size=16)


@pytest.mark.parametrize("path", ["cells", "parallel", "accumulator"])
def test_a_users_own_loop_keeps_its_global_batch_in_its_state(path, tmp_path):
    """A loop of one's own: N from the global batch, the layout saved with the state; a load with another global
    batch is refused, one with the same resumes mid-window where the uninterrupted run goes."""
    steps = ms_accum.steps_for_global_batch(12, 4, device_num=1)
    layout = RunLayout(world=1, micro_batch_size=4, steps_per_epoch=9, steps=steps, partial_window="flush")
    batches = [(ms.Tensor(x), ms.Tensor(y)) for x, y in micro_batches([4] * 9)]
    net, run, _, _ = own_loop(path, seed=0, steps=steps)
    for index, (x, y) in enumerate(batches):
        run(index, x, y)
    expected = params_of(net)
    net, run, saved, _ = own_loop(path, seed=0, steps=steps)
    for index, (x, y) in enumerate(batches[:4]):
        run(index, x, y)
    state = ms_accum.save_training_state(saved, str(tmp_path / "state.ckpt"), 4, 2, layout=layout, open_window=1)
    net, run, fresh, drop = own_loop(path, seed=7, steps=steps)
    with pytest.raises(ms_accum.CheckpointError, match=r"'global_batch_size' was 12 = 1 device x 3 micro-batches x "
                                                       r"4 samples, but this run's is 8"):
        ms_accum.load_training_state(fresh, state, 9, layout=RunLayout(1, 4, 9, 2, "flush"), drop_window=drop)
    done, updates = ms_accum.load_training_state(fresh, state, 9, layout=layout, drop_window=drop)
    assert (done, updates) == (4, 2)
    for index, (x, y) in enumerate(batches[done:], start=done):
        run(index, x, y)
    for name, want in expected.items():
        np.testing.assert_allclose(params_of(net)[name], want, rtol=1e-6, atol=1e-7, err_msg=f"{path}: {name}")


# ---------------------------------------------------------------------------------------------- msrun: the API
def _relative(got, want):
    return max(float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want if k != "losses")


def _large_batch_windows():
    """The run's windows on one order of the data (the one-shard sampler's), each one batch of G samples."""
    ds.config.set_seed(ew.DATA_SEED)
    x, y = ew.samples()
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=1, shard_id=0).batch(
        ew.GLOBAL, drop_remainder=True)
    iterator = data.create_tuple_iterator(num_epochs=ew.EPOCHS)
    windows = [[(images.asnumpy(), labels.asnumpy())] for _ in range(ew.EPOCHS) for images, labels in iterator]
    assert len(windows) == ew.UPDATES
    return windows


def _large_batch_reference(windows, rates=None):
    """The run as large-batch steps of G, one a window, without ms_accum, at `rates` (one per update; default: the
    run's): the trainable parameters after them."""
    net = ew.network()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=rates or ew.learning_rates(), momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    for window in windows:
        step(*(Tensor(part) for part in window[0]))
    return {p.name: p.asnumpy() for p in net.trainable_params()}


def _parameters(run):
    return {name: value for name, value in run.items() if name != "losses"}


class _Crash(Exception):
    pass


def _crash_one_device_run(state_path, trainer="model_accu"):
    """Train on one device (here) with the state written every 5 micro-batches, crashed 3 micro-batches into a
    window: the newest state is at micro-batch 35, 3 into window 8 (from 0)."""
    real_call, calls = ms_accum.TrainAccuStepsCell.__call__, []

    def call(cell, *inputs):
        if len(calls) == 4 * 9 + 3:
            raise _Crash()
        calls.append(1)
        return real_call(cell, *inputs)
    ms_accum.TrainAccuStepsCell.__call__ = call
    try:
        with pytest.raises(_Crash):
            ew.train(0, 1, state_path=state_path, save_state_every=5, trainer=trainer)
    finally:
        ms_accum.TrainAccuStepsCell.__call__ = real_call


@pytest.fixture(scope="module")
def api_runs(tmp_path_factory):
    """On 2 msrun devices: the whole run and the run stopped after CUT_AT updates. On one device (here): the whole
    run, and the run crashed 3 micro-batches into a window (its state written every 5 micro-batches), then resumed
    on 2 devices."""
    out = tmp_path_factory.mktemp("elastic_api")
    ms.set_context(mode=ms.GRAPH_MODE)
    one_full = ew.train(0, 1)
    _crash_one_device_run(str(out / "one" / "state.ckpt"))
    # the three runs on 2 devices in one launch (each launch costs both workers MindSpore's start)
    resumed_logs = run_local(out / "two", os.path.join(HERE, "elastic_worker.py"), out, "full", "cut",
                             f"resume={out / 'one' / 'state.ckpt'}")
    two_to_one = ew.train(0, 1, resume_from=str(out / "cut" / "rank_1" / "state.ckpt"))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    load = lambda name: dict(np.load(out / name))  # noqa: E731
    return dict(out=out, one_full=one_full, two_full=[load(f"full_rank_{r}.npz") for r in range(2)],
                two_cut=load("cut_rank_0.npz"), two_resumed=[load(f"resume_rank_{r}.npz") for r in range(2)],
                two_to_one=two_to_one, resumed_logs=resumed_logs)


@pytest.mark.slow
def test_one_global_batch_trains_alike_on_one_and_two_devices(api_runs):
    windows = _large_batch_windows()
    assert_equals_large_batch(_parameters(api_runs["one_full"]), _large_batch_reference, windows, context="1 device")
    for rank in range(2):
        assert_equals_large_batch(_parameters(api_runs["two_full"][rank]), _large_batch_reference, windows,
                                  context=f"2 devices, rank {rank}")
    assert _relative(api_runs["two_cut"], _large_batch_reference(windows)) > 1e-2, "the cut run was not cut"
    # the reported loss is the window's mean over every device's samples: the same on 1 and 2 devices
    assert len(api_runs["one_full"]["losses"]) == ew.UPDATES
    for rank in range(2):
        np.testing.assert_allclose(api_runs["two_full"][rank]["losses"], api_runs["one_full"]["losses"], rtol=1e-5)


@pytest.mark.slow
def test_a_state_of_two_devices_resumes_on_one(api_runs):
    saved = ms_accum.read_checkpoint(str(api_runs["out"] / "cut" / "rank_1" / "state.ckpt"))
    assert int(saved["ms_accum_world"].asnumpy()) == 2 and int(saved["ms_accum_updates_done"].asnumpy()) == ew.CUT_AT
    assert _relative(api_runs["two_to_one"], api_runs["two_full"][0]) <= 1e-5


@pytest.mark.slow
def test_a_state_of_one_device_written_inside_a_window_resumes_on_two(api_runs):
    saved = ms_accum.read_checkpoint(str(api_runs["out"] / "one" / "state.ckpt"))
    assert int(saved["ms_accum_micro_steps_done"].asnumpy()) == 35  # 8 windows of 4, and 3 micro-batches
    assert int(saved["ms_accum_open_window"].asnumpy()) == 3
    assert "it was written 3 micro-batches into a window, which runs again from its start" in api_runs["resumed_logs"]
    assert "at epoch 1 with 16 of its 31 micro-batches done on each device" in api_runs["resumed_logs"]
    for rank in range(2):
        assert _relative(api_runs["two_resumed"][rank], api_runs["one_full"]) <= 1e-5, f"rank {rank}"


@pytest.fixture(scope="module")
def driver_runs(tmp_path_factory):
    """The runs of `api_runs` through the driver (GradientAccumulation.train_process): on 2 msrun devices the whole
    run, the run stopped after CUT_AT updates and the one-device crash's state resumed; on one device (here) the
    crash and the 2-device state resumed."""
    out = tmp_path_factory.mktemp("elastic_driver")
    ms.set_context(mode=ms.GRAPH_MODE)
    _crash_one_device_run(str(out / "one" / "state.ckpt"), trainer="driver")
    logs = run_local(out / "two", os.path.join(HERE, "elastic_worker.py"), out, "driver-full", "driver-cut",
                     f"driver-resume={out / 'one' / 'state.ckpt'}")
    two_to_one = ew.train(0, 1, resume_from=str(out / "driver-cut" / "rank_1" / "state.ckpt"), trainer="driver")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    load = lambda name: dict(np.load(out / name))  # noqa: E731
    return dict(out=out, two_full=[load(f"driver-full_rank_{r}.npz") for r in range(2)],
                two_cut=load("driver-cut_rank_0.npz"),
                two_resumed=[load(f"driver-resume_rank_{r}.npz") for r in range(2)], two_to_one=two_to_one, logs=logs)


@pytest.mark.slow
def test_the_driver_resumes_on_another_device_count_with_the_global_batch_kept(driver_runs):
    """The driver in data parallel, elastic both ways: its 2-device run equals the large batch built without
    ms_accum, the state it wrote on 2 devices after CUT_AT updates resumes on 1 device, and the state of a one-device
    run crashed inside a window resumes on 2, each ending as the large batch's run (until f610fd1 the driver took
    itself for one device under msrun; its elastic resume was tested through Model_ACCU only)."""
    windows = _large_batch_windows()
    reference = _large_batch_reference(windows)
    for rank in range(2):
        assert_equals_large_batch(_parameters(driver_runs["two_full"][rank]), _large_batch_reference, windows,
                                  context=f"the driver on 2 devices, rank {rank}")
    assert _relative(driver_runs["two_cut"], reference) > 1e-2, "the cut run was not cut"
    saved = ms_accum.read_checkpoint(str(driver_runs["out"] / "driver-cut" / "rank_1" / "state.ckpt"))
    assert int(saved["ms_accum_world"].asnumpy()) == 2 and int(saved["ms_accum_updates_done"].asnumpy()) == ew.CUT_AT
    assert _relative(driver_runs["two_to_one"], reference) <= 1e-5
    assert "it was written 3 micro-batches into a window, which runs again from its start" in driver_runs["logs"]
    for rank in range(2):
        assert _relative(driver_runs["two_resumed"][rank], reference) <= 1e-5, f"rank {rank}"


@pytest.fixture(scope="module")
def rule_runs(tmp_path_factory):
    """With lr_scaling="sqrt" and G0 = G / 2 (each window 2 reference steps, the rate x sqrt(2)): on 2 msrun
    devices the whole run and the run stopped after CUT_AT updates; on one device (here) the latter resumed."""
    out = tmp_path_factory.mktemp("elastic_rule")
    run_local(out / "two", os.path.join(HERE, "elastic_worker.py"), out, "full@sqrt", "cut@sqrt")
    ms.set_context(mode=ms.GRAPH_MODE)
    two_to_one = ew.train(0, 1, resume_from=str(out / "cut@sqrt" / "rank_1" / "state.ckpt"), rule="sqrt")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return dict(out=out, two_full=[dict(np.load(out / f"full@sqrt_rank_{r}.npz")) for r in range(2)],
                two_to_one=two_to_one)


@pytest.mark.slow
def test_a_state_of_two_devices_with_a_rule_resumes_on_one_with_its_progress(rule_runs):
    """The rule on 2 devices: every update is the large-batch step at the rate of reference step 2u times sqrt(2),
    built without ms_accum (the control, the rate of update u at factor 1, differs). The state written on 2
    devices after CUT_AT updates holds progress 2 CUT_AT and G0; resumed on 1 device (G kept) the run ends as the
    uninterrupted one: parameters, losses, progress and the last rate."""
    rates = ew.learning_rates(ew.rule_steps())
    ruled = [rates[2 * u] * 2 ** 0.5 for u in range(ew.UPDATES)]
    windows = _large_batch_windows()
    full = rule_runs["two_full"]
    network = [name for name in full[0] if name not in ("losses", "progress", "applied_rate")]
    for rank in range(2):
        assert_equals_large_batch({name: full[rank][name] for name in network},
                                  lambda some: _large_batch_reference(some, ruled), windows, context=f"rank {rank}")
    assert _relative(full[0], _large_batch_reference(windows)) > 1e-2, "the control passed: the test cannot fail"
    saved = ms_accum.read_checkpoint(str(rule_runs["out"] / "cut@sqrt" / "rank_1" / "state.ckpt"))
    assert int(saved["ms_accum_world"].asnumpy()) == 2 and int(saved["ms_accum_updates_done"].asnumpy()) == ew.CUT_AT
    lr_state = {name.rsplit(".", 1)[1]: float(value.asnumpy().reshape(-1)[0]) for name, value in saved.items()
                if ".lr." in name}
    assert (lr_state["progress_steps"], lr_state["reference_batch"]) == (2 * ew.CUT_AT, ew.RULE_REFERENCE)
    resumed = rule_runs["two_to_one"]
    assert _relative(resumed, {name: full[0][name] for name in network}) <= 1e-5
    np.testing.assert_allclose(resumed["losses"], full[0]["losses"][ew.CUT_AT:], rtol=1e-5)
    assert float(resumed["progress"]) == float(full[0]["progress"]) == 2 * ew.UPDATES
    last = rates[2 * (ew.UPDATES - 1)] * 2 ** 0.5  # the last update reads reference step 2 (UPDATES - 1)
    assert float(resumed["applied_rate"]) == pytest.approx(last, rel=1e-6)
    assert float(full[0]["applied_rate"]) == pytest.approx(last, rel=1e-6)


# ---------------------------------------------------------------------------------------------- msrun: train.py
COMMON = ("--data_path", SAMPLE, "--num_samples", 3000, "--batch_size", 16, "--global_batch_size", 64,
          "--epoch_size", 2, "--log_every", 0, "--trainer", "model_accu")
FINAL = "checkpoint_lenet-2_46.ckpt"  # 3000 samples: 46 windows of 64 an epoch (named by update in the epoch)


def _launch_two(out_dir, *args, node_timeout=None):
    return launch_local(out_dir, os.path.join(ZOO, "train.py"), "--parallel_mode", "data_parallel", *args,
                        node_timeout=node_timeout)


def _finish(proc, timeout=300):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a run did not end in time")
    return proc.returncode, out


def _one_device(*args):
    return subprocess.Popen([sys.executable, os.path.join(ZOO, "train.py"), *map(str, args)], cwd=ZOO,
                            env=msrun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_when(proc, path, victim):
    """SIGKILL `victim()` (a process) once `path` exists; return whether it was killed before the run ended."""
    deadline = time.time() + 300
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    target = victim()
    if target is None or proc.poll() is not None:
        return False
    target.send_signal(signal.SIGKILL)
    return True


def _lenet(path):
    saved = ms.load_checkpoint(str(path))
    return {p.name: saved[p.name].asnumpy() for p in LeNet5().trainable_params()}


@pytest.mark.slow
def test_train_py_runs_survive_a_change_of_device_count(tmp_path):
    """2 msrun workers -> 1 process (a worker SIGKILLed mid-epoch; and from an epoch's checkpoint), 1 process
    (SIGKILLed inside a window) -> 2 workers: every resumed run ends with the parameters of its uninterrupted run,
    and the uninterrupted runs on 1 and 2 devices agree. A resume with another global batch is refused."""
    code, out = _finish(_launch_two(tmp_path / "two_logs", "--ckpt_path", tmp_path / "two", *COMMON))
    assert code == 0, out[-3000:]
    two = _lenet(tmp_path / "two" / "rank_0" / FINAL)
    code, out = _finish(_one_device("--ckpt_path", tmp_path / "one", *COMMON))
    assert code == 0, out[-3000:]
    one = _lenet(tmp_path / "one" / FINAL)
    assert _relative(one, two) <= 1e-4, "1 and 2 devices with one global batch trained differently"

    # 2 -> 1: one of two workers SIGKILLed mid-run; msrun ends the job; the state resumes on one process
    cut = tmp_path / "cut2"
    proc = _launch_two(tmp_path / "cut2_logs", "--ckpt_path", cut, "--save_state_every", 1, *COMMON,
                       node_timeout=KILL_NODE_TIMEOUT)
    assert _kill_when(proc, cut / "rank_1" / "train_state.prev.ckpt", lambda: train_py_worker(proc, 1)), \
        "the run ended before a worker could be killed"
    code, _ = _finish(proc, timeout=120)
    assert code != 0 and not (cut / "rank_0" / FINAL).exists(), "the kill came after the end of training"
    code, out = _finish(_one_device("--ckpt_path", cut, "--resume", cut, *COMMON))
    assert code == 0, out[-3000:]
    assert "ms_accum: resuming a state of 2 devices on 1, the global batch kept (64 = 2 devices x 2 micro-batches " \
           "x 16 samples -> 64 = 1 device x 4 micro-batches x 16 samples)" in out
    assert _relative(_lenet(cut / FINAL), two) <= 1e-4

    # 2 -> 1 at an epoch's end, from the 2-device run's epoch checkpoint
    code, out = _finish(_one_device("--ckpt_path", tmp_path / "epoch", "--resume",
                                    tmp_path / "two" / "rank_0" / "checkpoint_lenet-1_46.ckpt", *COMMON))
    assert code == 0, out[-3000:]
    assert _relative(_lenet(tmp_path / "epoch" / FINAL), two) <= 1e-4

    # 1 -> 2: one process SIGKILLed (its state written every 3 micro-batches, so inside a window), resumed on two
    cut = tmp_path / "cut1"
    proc = _one_device("--ckpt_path", cut, "--save_state_every", 3, *COMMON)
    assert _kill_when(proc, cut / "train_state.prev.ckpt", lambda: proc), "the run ended before the kill"
    _finish(proc)
    code, out = _finish(_launch_two(tmp_path / "cut1_logs", "--ckpt_path", cut, "--resume", cut, *COMMON))
    logs = "".join(open(tmp_path / "cut1_logs" / "logs" / f"worker_{r}.log").read() for r in range(2))
    assert code == 0, out[-3000:] + logs[-3000:]
    assert "ms_accum: resuming a state of 1 device on 2" in logs
    for rank in range(2):
        assert _relative(_lenet(cut / f"rank_{rank}" / FINAL), one) <= 1e-4, f"rank {rank}"

    # another global batch: refused, naming the option and both values
    code, out = _finish(_one_device("--ckpt_path", tmp_path / "other", "--resume", tmp_path / "two",
                                    *COMMON[:-8], "--global_batch_size", 128, *COMMON[-6:]))
    assert code != 0 and "'global_batch_size' was 64 = 2 devices x 2 micro-batches x 16 samples, but this run's " \
                         "is 128" in out, out[-2000:]
    code, out = _finish(_one_device("--ckpt_path", tmp_path / "other", "--resume",
                                    tmp_path / "two" / "rank_0" / "checkpoint_lenet-1_46.ckpt",
                                    *COMMON[:-8], "--global_batch_size", 128, *COMMON[-6:]))
    assert code != 0 and "'--global_batch_size' must be the 64 samples per update that" in out, out[-2000:]

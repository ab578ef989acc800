"""on_out_of_memory="halve": a window that runs out of device memory is discarded and rerun from its start with half
the micro-batch. No device here runs out of memory: tests/oom_worker.py's seam fails the driver's micro-batches
above a size with MindSpore's message, before they run."""
import pytest

import ms_accum
from helpers import build, micro_batches, numpy_dataset, params_of, reference_train, assert_params_close
from oom_worker import out_of_memory_above

HALVED = ("a window ran out of device memory with micro-batches of {} sample(s): rerunning it from its start with "
          "{} and 2 times as many micro-batches (the global batch and the update count stay the same)")


def halving_driver(limit, seen, make=build, **crash):
    """The driver on `make`'s network, its micro-batches above `limit` samples failing as MindSpore's device memory
    pool fails; `crash`: out_of_memory_above's `stop_after` and `stop`."""
    net, loss, opt = make("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, opt)
    trainer._add_micro_batch = out_of_memory_above(  # pylint: disable=protected-access
        trainer._add_micro_batch, limit, seen, **crash)  # pylint: disable=protected-access
    return trainer, net, opt


def test_a_window_out_of_memory_is_rerun_with_half_the_micro_batch_and_equals_the_large_batch(capsys, exec_mode):
    """Micro-batches of 8, N = 2; the device holds 4 samples: the first window fails at its first micro-batch, is
    discarded and run again from its start as 4 micro-batches of 4, and every later window so; the parameters
    equal the large-batch steps on the same windows, and the optimizer stepped once per window."""
    batches = micro_batches([8] * 6)
    seen = []
    trainer, net, opt = halving_driver(4, seen)
    trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0, on_out_of_memory="halve")
    assert seen == [8] + [4] * 12, seen
    assert int(opt.global_step.asnumpy()[0]) == 3, "a window was applied twice, or not at all"
    expected = reference_train("momentum", [batches[0:2], batches[2:4], batches[4:6]])
    assert_params_close(params_of(net), expected, context=f"halved after out of memory, {exec_mode}")
    assert HALVED.format(8, 4) in capsys.readouterr().out


def test_out_of_memory_mid_window_discards_what_the_window_had_added():
    """The second micro-batch of each window is larger (12 against 4) and fails: the window's first, already
    added, is added again once, not twice."""
    batches = micro_batches([4, 12] * 2)
    seen = []
    trainer, net, opt = halving_driver(6, seen)
    trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0, on_out_of_memory="halve")
    assert seen == [4, 12, 2, 2, 6, 6, 2, 2, 6, 6], seen
    assert int(opt.global_step.asnumpy()[0]) == 2
    expected = reference_train("momentum", [batches[0:2], batches[2:4]])
    assert_params_close(params_of(net), expected, context="out of memory mid-window")


def test_out_of_memory_is_raised_by_default_and_when_a_sample_alone_does_not_fit():
    batches = micro_batches([2] * 4)
    trainer, _, opt = halving_driver(0, [])
    with pytest.raises(RuntimeError, match="Out of Memory"):
        trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0)
    assert int(opt.global_step.asnumpy()[0]) == 0
    trainer, _, opt = halving_driver(0, [])
    with pytest.raises(RuntimeError, match=r"For 'GradientAccumulation.train_process', a window ran out of device "
                                           r"memory with micro-batches of 1 sample\(s\), which cannot be halved"):
        trainer.train_process(1, numpy_dataset(batches), 2, ckpt_path=None, log_every=0, on_out_of_memory="halve")
    assert int(opt.global_step.asnumpy()[0]) == 0


def test_other_errors_are_not_taken_for_out_of_memory():
    net, loss, opt = build("momentum")
    trainer = ms_accum.GradientAccumulation(net, loss, opt)

    def fail(data):
        raise RuntimeError("For 'Conv2D', the input must be 4-D")
    trainer._add_micro_batch = fail  # pylint: disable=protected-access
    with pytest.raises(RuntimeError, match="the input must be 4-D"):
        trainer.train_process(1, numpy_dataset(micro_batches([2] * 2)), 2, ckpt_path=None, log_every=0,
                              on_out_of_memory="halve")
    with pytest.raises(ValueError, match=r"'on_out_of_memory' must be one of \['raise', 'halve'\], but got 'retry'"):
        trainer.train_process(1, numpy_dataset(micro_batches([2] * 2)), 2, ckpt_path=None, on_out_of_memory="retry")

"""train.py's --batch_size auto: plan the micro-batch for --global_batch_size and --max_memory by measuring this
very script, run at a few micro-batch sizes in fresh processes (--measure_micro_batch B: a short run of the same
job whose peak memory and speed it prints, then exits)."""
import argparse
import math
import shutil
import sys
import tempfile
import time

from mindspore.train import Callback

import ms_accum

MEASURED_WINDOWS = 3  # the first one compiles; the speed is read over the others
MEASURED_STEPS = 4  # at most this N in a measuring run: a window's peak does not grow with N, its time does


def batch_size_argument(text):
    """--batch_size: a positive int, or 'auto' (planned from --global_batch_size and --max_memory)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1 or 'auto', but got {text!r}")
    return value


def check_planning_flags(args):
    """Refuse flags that plan nothing or cannot be planned, saying what to pass."""
    if args.measure_micro_batch:  # a measuring process, started by plan()
        return
    if args.batch_size == "auto":
        missing = [flag for flag, value in (("--global_batch_size", args.global_batch_size),
                                            ("--max_memory", args.max_memory)) if value is None]
        if missing:
            raise ValueError(f"'--batch_size auto' plans the micro-batch for a global batch and a memory budget, but "
                             f"{' and '.join(repr(flag) for flag in missing)} "
                             f"{'was' if len(missing) == 1 else 'were'} not given: pass --global_batch_size "
                             f"G --max_memory SIZE (such as 3GiB), or a --batch_size number.")
        ms_accum.parse_memory(args.max_memory, "train.py", "--max_memory")
        if args.trainer not in (None, "driver") or args.parallel_mode != "stand_alone":
            raise ValueError("'--batch_size auto' plans for the driver on one device (--trainer driver, "
                             "--parallel_mode stand_alone); plan with ms_accum.plan_micro_batch(..., devices=D) for "
                             "other runs.")
    elif args.max_memory is not None:
        raise ValueError("'--max_memory' is the budget '--batch_size auto' plans for: pass --batch_size auto and "
                         "--global_batch_size G with it, or drop it.")


def plan(script, argv, args, world):
    """Measure `script` (train.py, run with `argv`) at a few micro-batch sizes in fresh processes, each started
    while the one before measures (MindSpore's import overlaps it), and return the MicroBatchPlan."""
    scratch = tempfile.mkdtemp(prefix="ms_accum_plan_")
    command = [sys.executable, script, *argv, "--batch_size", "{micro_batch}", "--measure_micro_batch",
               "--ckpt_path", scratch, "--log_every", "0"]
    print(f"planning the micro-batch for a global batch of {args.global_batch_size} in {args.max_memory} "
          f"(fresh processes of this script, {MEASURED_WINDOWS} windows of at most {MEASURED_STEPS} micro-batches "
          f"each):", flush=True)
    start = time.time()
    try:
        with ms_accum.FreshProcessMeasure(command, preload=("mindspore", "ms_accum")) as measure:
            result = ms_accum.plan_micro_batch(measure, args.global_batch_size, args.max_memory, devices=world)
    except ms_accum.MemoryBudgetError as error:
        least = math.ceil(error.peak / 2 ** 20)
        raise ValueError(f"'--max_memory' must hold the smallest micro-batch ({error.micro_batch}), which peaked at "
                         f"{least} MiB, but got {args.max_memory}: pass --max_memory {least}MiB or more, or train a "
                         f"smaller model.") from error
    except RuntimeError as error:  # a measuring process failed: its own error ends the message
        raise ValueError(f"'--batch_size auto' could not plan: {error}") from error
    finally:  # the measuring runs' checkpoints
        shutil.rmtree(scratch)
    print(f"planned in {time.time() - start:.1f} s", flush=True)
    return result


def measuring_run(args, world):
    """--measure_micro_batch: the run's first MEASURED_WINDOWS windows at --batch_size (SpeedAfterFirstWindow stops
    it), then its epoch's end, checkpoint included; with N at most MEASURED_STEPS (the buffers, the micro-batch's
    step and the window's end are all there, and small micro-batches do not take G samples a window). The dataset
    is the run's own: cut to those windows, its pipeline's queues held less than a whole epoch's (numbers in
    docs/planning.md)."""
    n = ms_accum.steps_for_global_batch(args.global_batch_size, args.batch_size, world, owner="train.py",
                                        arg_name="--global_batch_size")
    n = min(n, MEASURED_STEPS)
    args.global_batch_size = args.batch_size * n * world
    args.epoch_size, args.warmup_epochs, args.resume, args.telemetry_csv = 1, 0, None, None
    args.save_state_every = 0


class SpeedAfterFirstWindow(Callback):
    """Samples per second over the windows after the first (which compiles the graphs); stops the run after
    MEASURED_WINDOWS windows."""

    def __init__(self, samples_per_window):
        super().__init__()
        self.samples_per_window = samples_per_window
        self.first_end, self.windows, self.last_end = None, 0, None

    def on_train_step_end(self, run_context):
        self.windows += 1
        self.last_end = time.perf_counter()
        if self.first_end is None:
            self.first_end = self.last_end
        if self.windows >= MEASURED_WINDOWS:
            run_context.request_stop()

    def report(self):
        """Print the measurement for the planning process."""
        seconds = (self.last_end - self.first_end) if self.first_end is not None and self.windows > 1 else 0.0
        ms_accum.report_measurement(self.samples_per_window * (self.windows - 1), seconds)

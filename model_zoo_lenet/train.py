r"""Train LeNet5 (or MindCV's ResNet18, --network resnet18) on MNIST-format data with gradient accumulation
(ms_accum).

    python model_zoo_lenet/train.py --device_target CPU --data_path data/fashion-mnist --ckpt_path runs/lenet \
        --epoch_size 10 --batch_size 32 --accumulation_steps 4

Each optimizer step applies the mean gradient of N micro-batches (--gradient_accumulation_steps, or its older
name --accumulation_steps) of --batch_size samples, the same update as one batch of N*batch_size (times the
number of devices in parallel modes); --raw_sum applies their sum instead. With every trainer, N may follow a
schedule (--accumulation_schedule 0:1,2:2,4:3) or be chosen between windows from the measured gradient noise
scale (--adaptive_steps 2:16) or for goodput (--goodput_steps 2:16: throughput x statistical efficiency, from
window times measured at the run's start); --noise_scale records the noise scale of every window; --raw_sum and
--partial_window work alike (dataset sink mode takes one N and whole windows). With --lr_scaling the learning rate
follows the window's global batch G (linear G/G0, sqrt, or AdaScale's gain) and --lr_schedule cosine is laid out
over reference steps (the updates a run at the reference batch G0 would make on the same data), so a changing N
keeps the schedule's length in data.
Epoch checkpoints (network and optimizer state) are written at the end of every epoch, and only there, as
<prefix>-<epoch>_<n>.ckpt in --ckpt_path (one device) or --ckpt_path/rank_<r> (parallel): the prefix is
checkpoint_lenet (checkpoint_resnet18 for ResNet18; the first free <prefix>_<k> when another run's checkpoints
are there), n the epoch's updates (under --adaptive_steps or --goodput_steps with the driver or model_accu, the
run's updates so far). The driver and model_accu also write the exact training state there, train_state.ckpt
(--save_state_every), with the flags an exact resume must keep beside it, train_flags.json.

Trainers: 'driver' (one device: GradientAccumulation, which builds one engine cell, a TrainAccuStepsCell, and
drives it with the window loop it shares with Model_ACCU), 'model_accu' (a TrainAccuStepsCell trained by
Model_ACCU: the trainer of the parallel modes and of --dataset_sink_mode) or 'functional' (one device: a
mindspore.value_and_grad step in mindspore.jit with ms_accum.Accumulator, in a loop of its own). Parallel modes
are launched with msrun, for example on 2 CPU processes:

    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8118 --join=True \
        --log_dir=runs/msrun_logs model_zoo_lenet/train.py --parallel_mode data_parallel ...
"""
import argparse
import glob
import json
import math
import os
import sys
import time
from functools import partial

from src.cpu_speed import apply_env_defaults

apply_env_defaults()  # must precede the MindSpore import

# pylint: disable=wrong-import-position
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback

import ms_accum
from src.cli import run_cli, set_device
from src.cpu_speed import set_cpu_threads, set_mode, tuned
from src.dataset import check_data_path, create_dataset
from src.epoch_files import EpochFiles
from src.functional_train import train_functional
from src.network import NETWORKS, checkpoint_stem, create_network
from src.lr_schedule import warmup_cosine
from src.parallel import PARALLEL_MODES, init_parallel, release_parallel
from src.plan import SpeedAfterFirstWindow, batch_size_argument, check_planning_flags, measuring_run
from src.plan import plan as plan_micro_batch
from ms_accum.tools.argtypes import OneLineParser, non_negative_int, positive_float, positive_int
from ms_accum.trainers.checkpoint import buffer_prefix, load_into
from ms_accum.core.progress_lr import ProgressLearningRate
from ms_accum.core.schedule import AccumulationSchedule, schedule_argument
from ms_accum.trainers.elastic import saved_layout
from ms_accum.trainers.run_checks import check_window_fits
from ms_accum.trainers.state import WORLD, is_state_file, read_state

STATE_FILE = "train_state.ckpt"
FLAGS_FILE = "train_flags.json"  # beside the exact state: the flags an exact resume must keep
# the flags that decide an exact run's course beyond what its state file holds (N, the micro-batch, the device count
# and the global batch, and the learning-rate rule's G0 are checked from the state itself: G may be kept with
# another N, and G0 given as the first window's items is the same run; the state holds whether a rule read the
# rate, not which)
RUN_FLAGS = ("network", "seed", "num_samples", "lr", "lr_schedule", "warmup_epochs", "momentum", "clip_norm",
             "raw_sum", "partial_window", "nonfinite", "accumulation_schedule", "adaptive_steps", "goodput_steps",
             "goodput_times", "adaptive_interval", "lr_scaling")
ADAPTIVE_INTERVAL = 10  # --adaptive_interval's default
PREFIX_KEY = "checkpoint_prefix"  # in FLAGS_FILE: the run's epoch checkpoints' name prefix
SAMPLES_KEY = "samples_over_devices"  # in FLAGS_FILE: --num_samples over every process (None: all the data)
STATE_TRAINERS = {"grad_sum.": "driver", "accu_grads.": "model_accu"}  # the trainer whose exact state holds them


def steps_range(text, strict=False):
    """argparse type: 'MIN:MAX', two ints with 1 <= MIN <= MAX, or MIN < MAX if `strict` (MIN = 1 only in data
    parallel: see :func:`accumulation_plan`)."""
    pieces = text.split(":")
    try:
        low, high = (int(piece) for piece in pieces)
    except ValueError:
        low = high = None
    if low is None or not 1 <= low <= high or strict and low == high:
        relation = "<" if strict else "<="
        why = ": with one N there is nothing to choose; pass one N with --gradient_accumulation_steps" \
            if low is not None and strict and low == high else ""
        raise argparse.ArgumentTypeError(f"must be MIN:MAX with 1 <= MIN {relation} MAX, such as 2:16, but got "
                                         f"{text!r}{why}")
    return low, high


def window_times(text):
    """argparse type: 'MICRO:END', seconds per micro-batch (> 0) and per window's end (>= 0)."""
    try:
        micro, end = (float(piece) for piece in text.split(":"))
    except ValueError:
        micro = end = math.nan
    if not (0 < micro < math.inf and 0 <= end < math.inf):
        raise argparse.ArgumentTypeError(f"must be MICRO:END, seconds per micro-batch (> 0) and per window's end "
                                         f"(>= 0), such as 0.004:0.01, but got {text!r}")
    return micro, end


def parse_args(argv):
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device_target", default="CPU", choices=["Ascend", "GPU", "CPU"])
    parser.add_argument("--mode", default="graph", choices=["graph", "pynative"],
                        help="MindSpore execution mode (default: %(default)s)")
    parser.add_argument("--network", choices=list(NETWORKS), default="lenet5",
                        help="lenet5, or MindCV's resnet18 (needs mindcv) for the same 32 x 32 inputs (default: "
                             "%(default)s)")
    parser.add_argument("--data_path", default="data/fashion-mnist",
                        help="directory with train/ and test/ in MNIST's file format; training reads train/ "
                             "(default: %(default)s)")
    parser.add_argument("--ckpt_path", default="runs/lenet",
                        help="directory for the epoch checkpoints and the exact training state, in rank_<r>/ per "
                             "process in parallel modes (default: %(default)s)")
    parser.add_argument("--epoch_size", type=positive_int, default=10, help="epochs to train (default: %(default)s)")
    parser.add_argument("--batch_size", type=batch_size_argument, default=32,
                        help="micro-batch size, or 'auto': the largest that fits --max_memory with --global_batch_size "
                             "exactly, measured in fresh processes before training (--trainer driver on one "
                             "device) (default: %(default)s)")
    parser.add_argument("--max_memory", default=None, metavar="SIZE",
                        help="the memory budget of '--batch_size auto', such as 3GiB or 512MiB (on CPU the peak "
                             "resident memory of the training process)")
    parser.add_argument("--on_out_of_memory", choices=["raise", "halve"], default=None,
                        help="'halve': a window that runs out of device memory is rerun from its start with half the "
                             "micro-batch and twice N, and halved again while the error comes back (--trainer driver; "
                             "default: halve with --batch_size auto, else raise)")
    parser.add_argument("--measure_micro_batch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gradient_accumulation_steps", "--accumulation_steps", dest="accumulation_steps",
                        type=positive_int, default=None,
                        help="N, micro-batches per optimizer step on each device; --accumulation_steps is its "
                             "older name (default: 4)")
    parser.add_argument("--global_batch_size", type=positive_int, default=None, metavar="G",
                        help="samples per optimizer step over all devices, replacing --gradient_accumulation_steps: "
                             "each device runs N = G / (devices x --batch_size), so the run keeps its learning "
                             "dynamics on any device count and an exact state of --trainer model_accu resumes on "
                             "another one; epochs are cut to whole global batches (--partial_window defaults to "
                             "drop) and --num_samples counts every device's samples")
    parser.add_argument("--accumulation_schedule", type=schedule_argument, default=None, metavar="U:N,...",
                        help="micro-batches per update by update index, replacing --gradient_accumulation_steps: "
                             "0:1,2:2,4:3 runs updates 0-1 with 1, 2-3 with 2, then 3 (not with --dataset_sink_mode)")
    parser.add_argument("--noise_scale", action="store_true",
                        help="measure the gradient noise scale of every window (telemetry columns grad_sq, "
                             "noise_trace, noise_scale; the functional trainer prints it at each epoch's end)")
    parser.add_argument("--adaptive_steps", type=steps_range, default=None, metavar="MIN:MAX",
                        help="choose N between windows from the measured noise scale, in MIN..MAX, starting at MIN "
                             "(MIN >= 2 on one device, >= 1 in data parallel; with --lr_schedule constant, or "
                             "cosine with --lr_scaling; implies --noise_scale; not with --dataset_sink_mode)")
    parser.add_argument("--goodput_steps", type=partial(steps_range, strict=True), default=None, metavar="MIN:MAX",
                        help="choose N between windows for goodput (throughput x statistical efficiency), in "
                             "MIN..MAX with MIN < MAX: the first 10 windows calibrate the window time at N = MIN and "
                             "min(MAX, 2 x MIN) (or --goodput_times gives it), then N follows the measured noise "
                             "scale (with --lr_schedule constant, or cosine with --lr_scaling; implies --noise_scale; "
                             "calibrating: --trainer driver or model_accu, in data parallel on the slowest "
                             "device's window times; not with --dataset_sink_mode)")
    parser.add_argument("--goodput_times", type=window_times, default=None, metavar="MICRO:END",
                        help="--goodput_steps with the window-time model given instead of calibrated: seconds per "
                             "micro-batch and per window's end, as measured in a quiet run (decisions then depend on "
                             "the noise scale only, from the first window on)")
    parser.add_argument("--adaptive_interval", type=positive_int, default=None, metavar="WINDOWS",
                        help=f"windows between two decisions of --adaptive_steps or --goodput_steps (default: "
                             f"{ADAPTIVE_INTERVAL})")
    parser.add_argument("--lr", type=positive_float, default=0.05,
                        help="peak learning rate of the (large-batch) updates (default: %(default)s)")
    parser.add_argument("--lr_schedule", choices=["cosine", "constant"], default="cosine",
                        help="'cosine': linear warm-up over --warmup_epochs, then cosine decay towards 0, one step "
                             "per update (per reference step with --lr_scaling); 'constant': --lr throughout "
                             "(default: %(default)s)")
    parser.add_argument("--lr_scaling", choices=["none", "linear", "sqrt", "adascale"], default=None,
                        help="how the learning rate follows the window's global batch G when N changes: 'linear' "
                             "multiplies it by G/G0, 'sqrt' by sqrt(G/G0), 'adascale' by AdaScale's gain from the "
                             "noise scale (implies --noise_scale); the schedule is then read at the run's progress "
                             "in reference steps of G0 samples (G/G0 per window, the gain for adascale) instead of "
                             "its update count. 'none' or unset: the optimizer steps its schedule once per update "
                             "(a rule: --trainer driver or model_accu, not with --dataset_sink_mode)")
    parser.add_argument("--reference_batch", type=positive_float, default=None, metavar="G0",
                        help="G0 of --lr_scaling, in samples over all devices (default: the first window's, devices "
                             "x --batch_size x its N)")
    parser.add_argument("--warmup_epochs", type=int, default=1,
                        help="epochs of linear warm-up of --lr_schedule cosine, 0 to --epoch_size; the last update "
                             "always comes after the warm-up (default: %(default)s)")
    parser.add_argument("--momentum", type=float, default=0.9,
                        help="the momentum of the optimizer, nn.Momentum, in [0, 1) (default: %(default)s)")
    parser.add_argument("--clip_norm", type=positive_float, default=None,
                        help="clip each update's gradient to this global norm (default: no clipping)")
    parser.add_argument("--partial_window", default=None, choices=list(ms_accum.PARTIAL_WINDOW_POLICIES),
                        help="what to do with a window still open at the end of an epoch (default: flush; drop "
                             "with --global_batch_size)")
    parser.add_argument("--nonfinite", choices=["skip", "raise", "apply"], default="skip",
                        help="a window whose gradient holds a NaN or an inf: skip it (the driver and model_accu "
                             "warn, naming its micro-batches; the functional loop counts it in its epoch line), "
                             "stop at it, or apply it as mindspore.nn.TrainOneStepCell would (default: %(default)s)")
    parser.add_argument("--max_nonfinite_windows", type=positive_int, default=50,
                        help="the driver and model_accu stop once this many windows in a row were skipped, the "
                             "exact state written first; the functional loop goes on (default: %(default)s)")
    parser.add_argument("--raw_sum", action="store_true",
                        help="apply the raw sum of micro-batch gradients (the tutorial's behaviour) instead of "
                             "the large-batch mean")
    parser.add_argument("--num_samples", type=positive_int, default=None,
                        help="train on N samples only (per process in parallel modes; over all processes with "
                             "--global_batch_size); more than the data set holds reads all of it, with a note")
    parser.add_argument("--seed", type=non_negative_int, default=1,
                        help="seed of MindSpore and of the data's shuffle (default: %(default)s)")
    parser.add_argument("--cpu_threads", type=positive_int, default=None,
                        help="MindSpore CPU kernel threads (default: MindSpore's own choice)")
    parser.add_argument("--log_every", type=non_negative_int, default=100,
                        help="the driver and model_accu print a progress line every N updates (update/total, "
                             "loss, the window, grad norm, lr, loss scale, skipped windows, rate, time left; no total "
                             "under --adaptive_steps), the functional loop every N micro-batches (the updates so "
                             "far, the micro-batch's loss); 0: never (default: %(default)s)")
    parser.add_argument("--telemetry_csv", default=None, metavar="FILE",
                        help="write one row per update (epoch, update, micro-batches, samples, loss, grad norm, "
                             "clipped, loss scale, whether it was skipped, lr, N, the noise-scale estimates, skipped "
                             "windows so far, seconds); plot it with plot_telemetry.py")
    parser.add_argument("--keep_checkpoint_max", type=positive_int, default=10,
                        help="keep the newest K epoch checkpoints of this run, those before a resume included "
                             "(default: 10)")
    parser.add_argument("--trainer", choices=["driver", "model_accu", "functional"], default=None,
                        help="default: driver on one device, model_accu in parallel modes (pass model_accu for "
                             "--dataset_sink_mode on one device)")
    parser.add_argument("--parallel_mode", choices=list(PARALLEL_MODES), default="stand_alone",
                        help="launch the parallel modes with msrun; data_parallel is tested, semi_auto_parallel and "
                             "auto_parallel are not (MindSpore 2.10 refuses them on CPU: docs/parallel.md) "
                             "(default: %(default)s)")
    parser.add_argument("--dataset_sink_mode", action="store_true",
                        help="--trainer model_accu only: sink the accumulation and update graphs (GPU/Ascend, graph "
                             "mode; on CPU MindSpore trains without sinking, after a warning)")
    parser.add_argument("--resume", default=None, metavar="CKPT",
                        help="continue from what train.py wrote: an epoch checkpoint (any device count, every "
                             "trainer), or the run's --ckpt_path directory (or, on one device, its train_state.ckpt) "
                             "to continue at the exact micro-batch where it stopped, with the trainer that wrote it "
                             "(driver or model_accu); under msrun each rank then resumes from its "
                             "own rank_<r>/train_state.ckpt. On another device count the global batch must be kept "
                             "(--global_batch_size): the run continues at the same sample, from the last complete "
                             "window")
    parser.add_argument("--save_state_every", type=non_negative_int, default=None, metavar="N",
                        help="write the exact training state to CKPT_PATH[/rank_R]/train_state.ckpt every N "
                             "micro-batches (in parallel modes at the first update boundary after them), atomically "
                             "(0: never; not with --dataset_sink_mode nor --trainer functional; default: 100)")
    return parser.parse_args(argv)


class EpochSummary(Callback):
    """Prints one line per epoch: the updates that ended in it on this process and the samples they trained on
    every device (read from `telemetry`'s records: a resumed epoch counts the updates that ended after the resume,
    a window's micro-batches from before it included, a window carried on or dropped at the epoch's end nothing),
    the time and throughput, and the run's time left as `telemetry`'s update lines estimate it."""

    def __init__(self, telemetry):
        super().__init__()
        self.telemetry = telemetry
        self.start, self.first = 0.0, 0

    def on_train_epoch_begin(self, run_context):
        self.start, self.first = time.time(), len(self.telemetry.records)

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        elapsed = max(time.time() - self.start, 1e-9)
        records = self.telemetry.records[self.first:]
        samples = sum(record.items for record in records)
        left = self.telemetry.seconds_left()  # the update lines' estimate, so that the two agree
        left = "" if left is None else f", about {left:.0f} s left"
        print(f"epoch {cb.cur_epoch_num}/{cb.epoch_num}: {len(records)} updates, {samples:.0f} samples in "
              f"{elapsed:.1f} s ({samples / elapsed:.0f} samples/s){left}", flush=True)


def checkpoint_prefix(directory, resume, exact, stem="checkpoint_lenet"):
    """The name prefix of this run's epoch checkpoints in `directory`: a run resumed from its exact state there
    continues the names its FLAGS_FILE records (a state of an earlier train.py, which recorded none: those of the
    newest checkpoint there written before that state), a run resumed from an epoch checkpoint there continues
    that checkpoint's; any other run takes `stem` ('checkpoint_lenet'), or the first free '<stem>_<k>' when
    another run's checkpoints are there (as MindSpore's ModelCheckpoint names them), and says so."""
    here = resume is not None and os.path.abspath(os.path.dirname(resume)) == os.path.abspath(directory)
    recorded = (saved_run_flags(resume) or {}).get(PREFIX_KEY) if exact and here else None
    if recorded is not None:
        return recorded
    written = glob.glob(os.path.join(directory, f"{stem}*-*.ckpt"))
    own = [path for path in written if exact and os.path.getmtime(path) <= os.path.getmtime(resume)]
    continued = max(own, key=os.path.getmtime) if own else None
    if here and not exact:
        continued = resume
    if continued is not None:
        return os.path.basename(continued).rsplit("-", 1)[0]
    prefix, k = stem, 0
    while glob.glob(os.path.join(directory, f"{prefix}-*.ckpt")):
        k += 1
        prefix = f"{stem}_{k}"
    if k:
        print(f"note: {directory} holds another run's checkpoints; this run's are {prefix}-<epoch>_<update>.ckpt "
              f"(give each run its own --ckpt_path)", flush=True)
    return prefix


class EpochCheckpoint(Callback):
    """Network and optimizer state at every epoch's end, and only there, through `files` (an EpochFiles:
    <prefix>-<epoch>_<n>.ckpt, the newest kept), with step_num the updates done in the run. `before[e]` is the
    run's plan of updates before epoch e + 1, and n the update's number in its epoch; with `before` None (an adaptive N
    decides the updates as it goes) n and step_num are the trainer's count. The trainers count updates from the
    run's start after an exact resume, but Model_ACCU, as MindSpore's Model, from its first epoch after a resume at
    an epoch (`exact` False): the plan says where that epoch began. (MindSpore's ModelCheckpoint, every so many
    updates, fired at the first update of a resumed run, whose count began above zero, and wrote a mid-epoch state
    named like an epoch's end.)"""

    def __init__(self, cell, files, before=None, exact=False):
        super().__init__()
        self.cell, self.files, self.before, self.exact = cell, files, before, exact
        self.offset = None  # updates of the run the trainer's count leaves out

    @property
    def latest_ckpt_file_name(self):
        return self.files.latest

    def on_train_epoch_begin(self, run_context):
        if self.offset is None:
            cb = run_context.original_args()
            self.offset = 0 if self.exact or self.before is None else \
                self.before[int(cb.cur_epoch_num) - 1] - int(cb.cur_step_num)

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        # a window carried on into the next epoch (--partial_window carry) is counted by cur_step_num, not done
        carried = 1 if cb.get("open_micro_batches") else 0
        epoch, update = int(cb.cur_epoch_num), int(cb.cur_step_num) + (self.offset or 0) - carried
        number = update if self.before is None else update - self.before[epoch - 1]
        self.files.write(self.cell, epoch, number, update)


def varying_n_flags(args):
    """The flags given that set an N changing between windows, as written: a schedule, an adaptive or goodput N."""
    return [f"--{name}" for name in ("accumulation_schedule", "adaptive_steps", "goodput_steps")
            if getattr(args, name) is not None]


def n_flag(args):
    """N as this run's flags gave it, for messages."""
    if args.global_batch_size is not None:
        return "N = --global_batch_size / (devices x --batch_size)"
    return (varying_n_flags(args) or ["--gradient_accumulation_steps"])[0]


def check_n_given_once(args):
    """N is given by one flag: --global_batch_size, --gradient_accumulation_steps, or a schedule or policy."""
    varying = varying_n_flags(args)
    if args.global_batch_size is None:
        if varying and args.accumulation_steps is not None:  # it was taken silently, the other's N trained
            raise ValueError(f"'{varying[0]}' sets N, but '--gradient_accumulation_steps' was given too: pass one of "
                             f"them.")
        return
    given = ["--gradient_accumulation_steps"] * (args.accumulation_steps is not None) + varying
    if given:
        raise ValueError(f"'--global_batch_size' sets N (G / (devices x --batch_size)), but '{given[0]}' was given "
                         f"too: pass one of them.")


def set_global_batch(args, world):
    """Resolve N and the partial-window policy from --global_batch_size (or their defaults without it); the flags
    were checked by :func:`check_n_given_once`."""
    if args.global_batch_size is None:
        args.accumulation_steps = args.accumulation_steps or 4
        args.partial_window = args.partial_window or "flush"
        return
    args.accumulation_steps = ms_accum.steps_for_global_batch(args.global_batch_size, args.batch_size, world,
                                                              owner="train.py", arg_name="--global_batch_size")
    args.partial_window = args.partial_window or "drop"


def num_samples_counts_each_process(args):
    """Whether --num_samples counts each process's samples (without --global_batch_size) or every process's."""
    return args.global_batch_size is None


def samples_per_process(args, world):
    """--num_samples as each process's sample count: with --global_batch_size it counts every process's."""
    if args.num_samples is None or num_samples_counts_each_process(args):
        return args.num_samples
    if args.num_samples % world:
        raise ValueError(f"'--num_samples' must be a multiple of the {world} processes with '--global_batch_size' "
                         f"(it counts every process's samples), but got {args.num_samples}.")
    return args.num_samples // world


def shards(args, rank, world):
    """The dataset's sharding: MindSpore's distributed sampler in parallel modes, and on one device too with
    --global_batch_size, whose random sampler would shuffle an epoch in another order (a window's samples must be
    the same block of one order on every device count)."""
    if world == 1 and args.global_batch_size is None:
        return {}
    return {"num_shards": world, "shard_id": rank}


def accumulation_plan(args, trainer_kind, world):
    """(the AdaptiveAccumulation or GoodputAccumulation policy, or None; the AccumulationSchedule to plan the run
    with) from the flags, on `world` devices. A policy decides N as the run goes, so the number of updates is not
    known in advance: a cosine schedule then needs a learning-rate rule, which lays it out over reference steps of
    the data. Its MIN may be 1 only on two devices or more, where a window of one micro-batch a device still holds
    two micro-batches to estimate the noise scale from."""
    varying = varying_n_flags(args)
    if len(varying) > 1:
        raise ValueError(f"'{varying[0]}' and '{varying[1]}' both set N: pass one of them.")
    if varying and args.dataset_sink_mode:
        raise ValueError(f"'{varying[0]}' needs N to change between windows, but '--dataset_sink_mode' compiles its "
                         f"graphs for one --accumulation_steps: drop one of them.")
    if args.goodput_times is not None and args.goodput_steps is None:
        raise ValueError("'--goodput_times' is the window-time model of '--goodput_steps', which is not given: pass "
                         "--goodput_steps MIN:MAX, or drop --goodput_times.")
    if args.adaptive_interval is not None and args.adaptive_steps is None and args.goodput_steps is None:
        raise ValueError("'--adaptive_interval' is the windows between two decisions of '--adaptive_steps' or "
                         "'--goodput_steps', neither of which is given: pass one of them, or drop "
                         "--adaptive_interval.")
    args.adaptive_interval = args.adaptive_interval or ADAPTIVE_INTERVAL
    if args.adaptive_steps is None and args.goodput_steps is None:
        return None, args.accumulation_schedule or AccumulationSchedule(args.accumulation_steps)
    low = (args.adaptive_steps or args.goodput_steps)[0]
    if low == 1 and world == 1:
        raise ValueError(f"'{varying[0]}' must have MIN >= 2 on one device, but got MIN = 1: a window of one "
                         f"micro-batch carries no noise-scale estimate there. Pass MIN >= 2 (such as 2:16), or run "
                         f"on two devices or more (msrun, --parallel_mode data_parallel), where MIN = 1 holds a "
                         f"micro-batch on each.")
    if args.lr_schedule != "constant" and args.lr_scaling in (None, "none"):
        rules = "" if trainer_kind == "functional" else \
            " Or pass '--lr_scaling linear', 'sqrt' or 'adascale', which lays the schedule out over reference steps " \
            "of the data."
        raise ValueError(f"'{varying[0]}' needs '--lr_schedule constant', but got '--lr_schedule "
                         f"{args.lr_schedule}': the number of updates, which the schedule is laid out over, is not "
                         f"known in advance when N adapts.{rules}")
    args.noise_scale = True
    if args.adaptive_steps is not None:
        policy = ms_accum.AdaptiveAccumulation(*args.adaptive_steps, interval=args.adaptive_interval)
    else:
        if trainer_kind == "functional" and args.goodput_times is None:
            raise ValueError("'--goodput_steps' calibrates from the window times the driver and model_accu measure, "
                             "but '--trainer functional' measures none: pass --trainer driver or model_accu, or the "
                             "window times with --goodput_times.")
        micro_time, end_time = args.goodput_times or (None, None)
        policy = ms_accum.GoodputAccumulation(*args.goodput_steps, interval=args.adaptive_interval,
                                              micro_time=micro_time, end_time=end_time)
    return policy, AccumulationSchedule(policy.initial_steps)


def check_lr_scaling(args, trainer_kind):
    """The learning-rate rule's flags: the rule itself, or None for the optimizer's own schedule over updates."""
    if args.lr_scaling in (None, "none"):
        if args.reference_batch is not None:
            given = "'--lr_scaling' is not given" if args.lr_scaling is None else "got '--lr_scaling none'"
            raise ValueError(f"'--reference_batch' is G0 of a learning-rate rule, but {given}: pass --lr_scaling "
                             f"linear, sqrt or adascale, or drop --reference_batch.")
        return None
    if args.dataset_sink_mode:
        raise ValueError(f"'--lr_scaling {args.lr_scaling}' follows N as it changes between windows, but "
                         f"'--dataset_sink_mode' runs one N: drop one of them.")
    if args.raw_sum:
        raise ValueError(f"'--lr_scaling {args.lr_scaling}' scales the learning rate of the window's mean gradient, "
                         f"but '--raw_sum' applies the sum of its micro-batches' gradients, which already grows with "
                         f"N: the rule would scale it a second time. Drop one of them.")
    if trainer_kind == "functional":
        raise ValueError(f"'--lr_scaling {args.lr_scaling}' is an option of '--trainer driver' and '--trainer "
                         f"model_accu', whose exact state holds the run's progress: pass one of them.")
    if args.lr_scaling == "adascale":
        args.noise_scale = True  # AdaScale's gain is read from the window's noise estimates
    return args.lr_scaling


def reference_steps(args, world, micro_batches, first_steps):
    """With a learning-rate rule: (G0 in samples, the run's reference steps, the warm-up's). G0 is
    --reference_batch, or the first window's samples over all devices; the run's reference steps are its samples
    over all devices (every micro-batch of every epoch; an upper bound with --partial_window drop) over G0,
    rounded up, so that the schedule holds an entry for every reference step the run reaches."""
    reference = args.reference_batch or float(world * args.batch_size * first_steps)
    epoch_samples = micro_batches * args.batch_size * world
    total = math.ceil(args.epoch_size * epoch_samples / reference)
    return reference, total, math.ceil(args.warmup_epochs * epoch_samples / reference)


def learning_rate_of(args, total_updates, warmup_updates, rule):
    """The optimizer's learning rate: --lr, or the warm-up and cosine with one entry per update (no rule) or per
    reference step (a rule). AdaScale's progress, the sum of its gains, can pass the run's samples over G0 by less
    than one step per window smaller than G0 (a partial window at an epoch's end): its list is followed by one
    entry per epoch at the cosine's last rate, so that the rate read there is the schedule's end."""
    if args.lr_schedule == "constant":
        return args.lr
    rates = warmup_cosine(args.lr, total_updates, warmup_updates)
    return rates + rates[-1:] * args.epoch_size if rule == "adascale" else rates


def describe(policy, plan, args, world):
    """How many micro-batches an update takes, for the start-up line."""
    if isinstance(policy, ms_accum.GoodputAccumulation):
        model = f"{policy.calibration_end} windows calibrating at N = {policy.calibration_steps}" if \
            policy.calibration_end else f"window times {policy.micro_time:g} s x N + {policy.end_time:g} s"
        return (f"N for goodput in {policy.min_steps}..{policy.max_steps}, every {policy.interval} windows, after "
                f"{model}")
    if policy is not None:
        return (f"N adaptive in {policy.min_steps}..{policy.max_steps} from the noise scale, every "
                f"{policy.interval} windows")
    if plan.constant is None:
        return f"N by update {dict(plan.points)}"
    n = plan.constant
    return f"{n} per update (effective batch {args.batch_size * n * world})"


def run_telemetry(csv_path, print_every):
    """The run's :class:`ms_accum.WindowTelemetry`, made before the run's first line, so that a ``--telemetry_csv``
    that cannot be written is refused as the flag's."""
    try:
        return ms_accum.WindowTelemetry(csv_path=csv_path, print_every=print_every)
    except ValueError as error:
        cause = error.__cause__
        reason = (cause.strerror or cause) if isinstance(cause, OSError) else error
        raise ValueError(f"'--telemetry_csv' must be a file the run can write, but {csv_path!r} cannot be: "
                         f"{reason}. Pass a file in a directory you can write to.") from error


def run_flags(args):
    """This run's :data:`RUN_FLAGS`, as JSON values."""
    def plain(value):
        return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
    flags = {name: plain(getattr(args, name)) for name in RUN_FLAGS}
    if flags["lr_scaling"] == "none":  # no rule, as when the flag is not given
        flags["lr_scaling"] = None
    return flags


def samples_over_devices(args, world):
    """The samples an epoch reads over all `world` processes (:func:`samples_per_process` on each); None for all the
    data."""
    each = samples_per_process(args, world)
    return None if each is None else each * world


def write_run_flags(directory, args, prefix, world):
    """Record this run's :data:`RUN_FLAGS` beside its exact state, atomically, with its epoch checkpoints' name
    `prefix` (PREFIX_KEY), which a resume from that state continues, and its samples over all `world` processes
    (SAMPLES_KEY), which a resume on another device count keeps."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, FLAGS_FILE)
    with open(path + ".partial", "w", encoding="utf-8") as f:
        json.dump({**run_flags(args), PREFIX_KEY: prefix, SAMPLES_KEY: samples_over_devices(args, world)}, f,
                  indent=1, sort_keys=True)
    os.replace(path + ".partial", path)


def saved_run_flags(state_path):
    """What :func:`write_run_flags` recorded beside the exact state `state_path`, or None (a run of an earlier
    train.py recorded nothing)."""
    path = os.path.join(os.path.dirname(state_path), FLAGS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_same_flags(state_path, args, world):
    """An exact resume keeps the flags of the run that wrote the state (read from its FLAGS_FILE; a run of an
    earlier train.py wrote none): another seed draws the rest of the epoch from another shuffle, another rate or
    policy trains another course, and the resumed run would no longer be the interrupted one. Its samples are
    compared over all processes (`world` this run's), where the saved run recorded them so: on another device
    count the same --num_samples may read other data."""
    saved = saved_run_flags(state_path)
    if saved is None:
        return
    mine = run_flags(args)
    if SAMPLES_KEY in saved:
        check_same_samples(state_path, saved[SAMPLES_KEY], args, world)
        saved.pop("num_samples", None)
    differ = [name for name in RUN_FLAGS if name in saved and saved[name] != mine[name]]
    if differ:
        def shown(flags):
            return ", ".join(f"no --{name}" if flags[name] in (None, False) else
                             f"--{name}" if flags[name] is True else f"--{name} {flags[name]}" for name in differ)
        default = " (--partial_window's default: drop with --global_batch_size, flush without it)" \
            if "partial_window" in differ else ""  # a trial's run had it from --global_batch_size, unasked
        raise ValueError(f"'--resume' {state_path!r} continues a run trained with {shown(saved)}, but this run has "
                         f"{shown(mine)}{default}: resume it with {shown(saved)}, or from an epoch checkpoint to "
                         f"change {'it' if len(differ) == 1 else 'them'}.")


def check_same_samples(state_path, saved, args, world):
    """The saved run's epoch read `saved` samples over all its processes (None: all the data), as this run must: a
    new user's trial resumed a 2-process state on 1 with the same --num_samples, half the data, and was refused for
    the learning-rate schedule's length instead."""
    mine = samples_over_devices(args, world)
    if mine == saved:
        return
    def shown(count):
        return "all the data set's samples" if count is None else f"{count} samples"
    each = num_samples_counts_each_process(args)
    if saved is None:
        fix = "leave --num_samples out"
    elif each and saved % world:
        fix = f"run on a device count that divides {saved}"
    else:
        fix = f"pass --num_samples {saved // world if each else saved}"
    raise ValueError(f"'--resume' {state_path!r} continues a run whose epochs read {shown(saved)} over all its "
                     f"processes, but this run's epochs would read {shown(mine)} over its {world} (its --num_samples "
                     f"counts {'each process' if each else 'every process'}'s samples"
                     f"{'' if each else ' with --global_batch_size'}): {fix}, or resume from an epoch checkpoint to "
                     f"change it.")


def check_same_run(optimizer, state_path, run_global_batch, trainer_kind):
    """An exact resume continues the same run: its trainer (whose state holds its own buffers), its global batch,
    its learning-rate schedule and its learning-rate rule's G0 (or no rule) must be this run's."""
    params = read_state(state_path, "--resume")
    written = STATE_TRAINERS.get(buffer_prefix(params))
    if written is not None and written != trainer_kind:
        raise ValueError(f"'--resume' {state_path!r} is the exact state of a '--trainer {written}' run, whose "
                         f"buffers this run's '--trainer {trainer_kind}' does not hold: pass --trainer {written}, or "
                         f"resume from an epoch checkpoint (network and optimizer), which every trainer loads.")
    layout, _ = saved_layout(params, int(params[WORLD].asnumpy()) if WORLD in params else 1)
    if layout is not None and layout.steps and run_global_batch and layout.global_batch_size != run_global_batch:
        raise ValueError(f"'--resume' {state_path!r} continues a run whose 'global_batch_size' was "
                         f"{layout.describe()}, but this run's is {run_global_batch}: pass --global_batch_size "
                         f"{layout.global_batch_size} (or the --gradient_accumulation_steps that gives it), or resume "
                         f"from an epoch checkpoint to change it.")
    mine = optimizer.learning_rate
    check_same_reference(params, state_path, mine)
    if isinstance(mine, ProgressLearningRate):  # a rule: the rate read from progress
        mine = mine.base
    saved = params.get(SCHEDULE)
    mine = getattr(mine, "learning_rate", mine)  # a list or Tensor rate is wrapped in _IteratorLearningRate
    if saved is not None and tuple(saved.shape) != tuple(mine.shape):
        raise ValueError(f"'--resume' {state_path!r} continues the exact run it was written by, whose learning-rate "
                         f"schedule has shape {tuple(saved.shape)}, but this run's has {tuple(mine.shape)}: keep "
                         f"--epoch_size, --lr_schedule and --warmup_epochs as they were, or resume from an epoch "
                         f"checkpoint to train longer.")


def check_same_reference(params, state_path, rate):
    """The saved run's learning-rate rule read progress in reference steps of the same G0 as this run's (`rate`, the
    optimizer's learning rate: a ProgressLearningRate with a rule), or neither run has a rule."""
    saved = next((name for name in params if name.endswith(REFERENCE_SUFFIX)), None)
    mine = rate.reference_batch if isinstance(rate, ProgressLearningRate) else None
    if saved is None and mine is None:
        return
    if saved is None or mine is None:
        raise ValueError(f"'--resume' {state_path!r} continues the exact run it was written by, which read its "
                         f"learning rate {'at its update count' if saved is None else 'from its progress'}, but "
                         f"this run reads it {'from its progress' if saved is None else 'at its update count'}: keep "
                         f"--lr_scaling as it was, or resume from an epoch checkpoint to change it.")
    before, now = float(params[saved].asnumpy()), float(mine.asnumpy())
    if before != now:
        raise ValueError(f"'--resume' {state_path!r} continues the exact run it was written by, whose '--lr_scaling' "
                         f"reference batch G0 was {before:g} samples, but this run's is {now:g}: pass "
                         f"--reference_batch {before:g}, or resume from an epoch checkpoint to change it.")


REFERENCE_SUFFIX = ".lr.reference_batch"  # G0 of a learning-rate rule, in a state file (progress_lr.ProgressState)


def resume_target(path, rank, world):
    """
    What '--resume PATH' names for this rank: (checkpoint file, whether it is an exact state file, the contents of
    an epoch checkpoint or None).

    A directory is a run's --ckpt_path: its train_state.ckpt on one device, rank_<r>/train_state.ckpt for rank r
    in parallel modes. When it holds neither, because the run had another device count, rank r takes the saved
    run's state files in turn (every one holds the same parameters at an update boundary); loading them checks
    that the global batch is kept. A file is an epoch checkpoint, or a state file (whose rank is checked when it is
    loaded).
    """
    if os.path.isdir(path):
        directory = path if world == 1 else os.path.join(path, f"rank_{rank}")
        state = os.path.join(directory, STATE_FILE)
        if os.path.isfile(state):
            return state, True, None
        saved = sorted(glob.glob(os.path.join(path, "rank_*", STATE_FILE)),
                       key=lambda name: int(os.path.basename(os.path.dirname(name))[len("rank_"):]))
        saved += [name for name in [os.path.join(path, STATE_FILE)] if os.path.isfile(name)]
        if not saved:
            raise ValueError(f"'--resume' {path!r} must be a run's --ckpt_path holding {os.path.relpath(state, path)}"
                             f" (written every --save_state_every micro-batches), but there is none; pass an "
                             f"epoch checkpoint file to resume at an epoch.")
        return saved[rank % len(saved)], True, None
    params = ms_accum.read_checkpoint(path, arg_name="--resume")
    exact = is_state_file(params)
    return path, exact, None if exact else params


SCHEDULE = "learning_rate"  # the optimizer's learning-rate table: configuration, rebuilt from the flags
GLOBAL_BATCH = "global_batch_size"  # recorded in epoch checkpoints of runs with one N


def resume_from(cell, ckpt_path, params, args, run_global_batch):
    """Load network and optimizer state into `cell` from `params`, the contents of the epoch checkpoint
    `ckpt_path`, but not the learning-rate schedule (this run's flags decide it); return the number of epochs the
    checkpoint had done. With --global_batch_size the checkpoint's global batch must be this run's."""
    saved_global = int(params[GLOBAL_BATCH].asnumpy()) if GLOBAL_BATCH in params else None
    if saved_global is not None and saved_global != run_global_batch:
        if args.global_batch_size is not None:
            raise ValueError(f"'--global_batch_size' must be the {saved_global} samples per update that {ckpt_path!r} "
                             f"was trained with, but got {args.global_batch_size}: pass --global_batch_size "
                             f"{saved_global}, or give N with --gradient_accumulation_steps to change it on purpose.")
        print(f"note: {ckpt_path!r} was trained with a global batch of {saved_global} samples per update; this "
              f"run's is {run_global_batch}.", flush=True)
    params.pop(SCHEDULE, None)
    load_into(cell, params, ckpt_path, optional=lambda name: ms_accum.is_accumulation_buffer(name) or name == SCHEDULE,
              arg_name="--resume", what=f"a checkpoint of this {NETWORKS[args.network]} training run")
    if "epoch_num" not in params:
        raise ValueError(f"'--resume' must name a checkpoint written by train.py (it records epoch_num), but "
                         f"{ckpt_path!r} does not record it.")
    return int(params["epoch_num"].asnumpy())


def note_carried_window(ckpt_path, params, epoch, n, steps, run_global_batch):
    """Under --partial_window carry, a run resumed from an epoch checkpoint (`params`, its contents, `epoch` the
    epochs done) of its own global batch (so its N, `n`) whose epoch ended with a window open: say that the
    checkpoint does not hold that window's micro-batches (a new user's trial lost them in silence; the page says such
    a resume is not exact), and where the run's exact state is."""
    if GLOBAL_BATCH not in params or int(params[GLOBAL_BATCH].asnumpy()) != run_global_batch:
        return
    carried = epoch * steps % n
    if carried:
        print(f"note: {ckpt_path!r} was written at the end of epoch {epoch} with a window open (--partial_window "
              f"carry): its {carried} micro-batch{'es are' if carried > 1 else ' is'} not in the checkpoint, so this "
              f"run begins a new window and does not continue the run exactly. The driver and model_accu continue it "
              f"exactly from the run's {STATE_FILE} (--resume with the run's directory).", flush=True)


def continued_plan(params, before, learning_rate):
    """A run resumed from an epoch checkpoint (`params`, its contents) whose run made another number of updates
    before that epoch than this run's plan `before` (another N): the plan moved to count on from the checkpoint's
    updates, and a per-update `learning_rate` list read there at the epoch's place in this run's plan (the
    optimizer reads it at its global_step, which goes on from the checkpoint's; the list ended before the run did).
    Unchanged when the counts agree, or for a constant rate."""
    if "epoch_num" not in params or "global_step" not in params:
        return before, learning_rate  # not train.py's: resume_from says so
    epoch, done = int(params["epoch_num"].asnumpy()), int(params["global_step"].asnumpy().reshape(-1)[0])
    if epoch >= len(before) or done == before[epoch]:
        return before, learning_rate
    shift = done - before[epoch]
    if isinstance(learning_rate, list):  # entries before `done` are never read: the epoch's rate stands in
        learning_rate = learning_rate[before[epoch]:before[epoch] + 1] * done + learning_rate[before[epoch]:]
    return [count + shift for count in before], learning_rate


def check_flags(args, trainer_kind):
    """Refuse flags that contradict each other or are out of range, before anything is built: a mistyped flag is
    told in the time MindSpore takes to import, not after the data set and the network."""
    check_n_given_once(args)  # before --batch_size auto measures anything
    if trainer_kind in ("driver", "functional") and (args.parallel_mode != "stand_alone" or args.dataset_sink_mode):
        raise ValueError(f"'--trainer {trainer_kind}' runs on one device without sink mode; use '--trainer "
                         f"model_accu' with --parallel_mode or --dataset_sink_mode.")
    if args.dataset_sink_mode and args.partial_window not in (None, "flush"):
        raise ValueError(f"'--partial_window {args.partial_window}' needs windows cut by epoch, but "
                         f"'--dataset_sink_mode' sinks whole windows only: drop one of them.")
    if args.on_out_of_memory == "halve" and trainer_kind != "driver":  # given: --batch_size auto plans the driver
        raise ValueError(f"'--on_out_of_memory halve' reruns a window with half the micro-batch in the driver, but "
                         f"this run trains with '--trainer {trainer_kind}': pass --trainer driver, or drop it.")
    if not 0 <= args.warmup_epochs <= args.epoch_size:
        raise ValueError(f"'--warmup_epochs' must be an int in [0, --epoch_size {args.epoch_size}], but got "
                         f"{args.warmup_epochs}.")
    if not 0.0 <= args.momentum < 1.0:
        raise ValueError(f"'--momentum' must be in [0, 1), the weight of the previous velocity, but got "
                         f"{args.momentum}.")
    if os.path.exists(args.ckpt_path) and not os.path.isdir(args.ckpt_path):
        raise ValueError(f"'--ckpt_path' must be a directory for the run's checkpoints, but {args.ckpt_path!r} is a "
                         f"file: pass a directory (it is made if missing).")
    if trainer_kind == "functional" and args.save_state_every:
        raise ValueError("'--save_state_every' is an option of '--trainer driver' and '--trainer model_accu'; the "
                         "functional loop writes epoch checkpoints only.")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    check_planning_flags(args)
    trainer_kind = args.trainer or ("driver" if args.parallel_mode == "stand_alone" else "model_accu")
    check_flags(args, trainer_kind)
    set_device(args.device_target)
    set_mode(args.mode, args.device_target)
    if args.device_target == "CPU":
        threads = set_cpu_threads(args.cpu_threads)
        blocking = ", synchronous launches" if args.mode == "pynative" and tuned() else ""
        print(f"CPU settings: ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}, kernel threads: "
              f"{threads}{blocking}")
    rank, world = init_parallel(args.parallel_mode)
    if args.batch_size == "auto":
        check_data_path(args.data_path)  # before the measuring processes, each of which would fail on it
        args.batch_size = plan_micro_batch(os.path.abspath(__file__), argv, args, world).micro_batch
        args.on_out_of_memory = args.on_out_of_memory or "halve"
    if args.measure_micro_batch:
        measuring_run(args, world)
    set_global_batch(args, world)
    policy, plan = accumulation_plan(args, trainer_kind, world)
    rule = check_lr_scaling(args, trainer_kind)
    ms.set_seed(args.seed)
    requested = samples_per_process(args, world)
    dataset = create_dataset(args.data_path, args.batch_size, "train", num_samples=requested, seed=args.seed,
                             **shards(args, rank, world))
    steps = dataset.get_dataset_size()
    if requested is not None and requested // args.batch_size > steps:
        print(f"note: --num_samples {args.num_samples} is more than {args.data_path}/train holds"
              f"{f' for each of {world} processes' if world > 1 else ''}: an epoch reads all of it, {steps} "
              f"micro-batches of {args.batch_size}.", flush=True)
    check_window_fits("train.py", n_flag(args), policy or plan, steps, args.partial_window,
                      carry="--partial_window carry")
    net = create_network(args.network)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    n = args.accumulation_steps
    sink_size = steps // n * n if args.dataset_sink_mode else -1
    # On CPU MindSpore trains without sink (Model_ACCU warns): every micro-batch of an epoch, its last window flushed,
    # so the learning rate is laid over those updates, not over the sunk windows alone.
    if args.dataset_sink_mode and args.device_target != "CPU":
        updates_per_epoch = sink_size // n
        total_updates = updates_per_epoch * args.epoch_size
        before = [updates_per_epoch * epoch for epoch in range(args.epoch_size + 1)]
    else:
        before, total_updates = plan.run_plan(steps, args.epoch_size, args.partial_window)
    resume, exact, epoch_params = resume_target(args.resume, rank, world) if args.resume else (None, False, None)
    reference_batch, schedule_line = None, ""
    if rule is None:
        learning_rate = learning_rate_of(args, total_updates, before[args.warmup_epochs], rule)
        if epoch_params is not None:
            before, learning_rate = continued_plan(epoch_params, before, learning_rate)
    else:
        reference_batch, total_steps, warmup_steps = reference_steps(args, world, steps, plan.steps_at(0))
        learning_rate = learning_rate_of(args, total_steps, warmup_steps, rule)
        schedule_line = (f"; learning rate x {rule} rule, read at the progress in reference steps of G0 = "
                         f"{reference_batch:g} samples" + ("" if args.lr_schedule == "constant" else
                                                         f", cosine over {total_steps} of them after a warm-up "
                                                         f"of {min(warmup_steps, total_steps - 1)}"))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=learning_rate, momentum=args.momentum)
    if trainer_kind == "driver":
        trainer = ms_accum.GradientAccumulation(net, loss, optimizer, average=not args.raw_sum,
                                                clip_norm=args.clip_norm, noise_scale=args.noise_scale,
                                                nonfinite=args.nonfinite, lr_scaling=rule or "none",
                                                reference_batch=reference_batch)
        state_cell = trainer.train_state
    elif trainer_kind == "functional":
        state_cell = ms_accum.TrainState(nn.WithLossCell(net, loss), optimizer)
    else:
        state_cell = ms_accum.TrainAccuStepsCell(nn.WithLossCell(net, loss), optimizer,
                                                 gradient_accumulation_steps=policy or plan, clip_norm=args.clip_norm,
                                                 noise_scale=args.noise_scale, average=not args.raw_sum,
                                                 nonfinite=args.nonfinite, lr_scaling=rule or "none",
                                                 reference_batch=reference_batch)
    run_global_batch = world * n * args.batch_size if policy is None and plan.constant is not None else None
    if exact and trainer_kind == "functional":
        raise ValueError("'--trainer functional' resumes at an epoch: pass an epoch checkpoint to '--resume', not "
                         "the exact training state.")
    if exact:
        check_same_flags(resume, args, world)
        check_same_run(optimizer, resume, run_global_batch, trainer_kind)
    initial_epoch = 0 if epoch_params is None else resume_from(state_cell, resume, epoch_params, args,
                                                               run_global_batch)
    if epoch_params is not None and args.partial_window == "carry" and run_global_batch:
        note_carried_window(resume, epoch_params, initial_epoch, n, steps, run_global_batch)
    if initial_epoch >= args.epoch_size:
        raise ValueError(f"'--epoch_size' must exceed the {initial_epoch} epochs done in {resume!r}, but got "
                         f"{args.epoch_size}.")
    directory = args.ckpt_path if world == 1 else os.path.join(args.ckpt_path, f"rank_{rank}")
    try:  # made before the run starts, so that a path that cannot be made is told as the flag's
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise ValueError(f"'--ckpt_path' must be a directory the run can write its checkpoints to, but "
                         f"{directory!r} cannot be made: {error.strerror or error}. Pass a directory you can write "
                         f"to.") from error
    telemetry = run_telemetry(args.telemetry_csv, 0 if trainer_kind == "functional" else args.log_every)
    print(f"training {NETWORKS[args.network]} on {args.data_path}/train with '{trainer_kind}' ({args.parallel_mode}, "
          f"rank {rank} of {world}): {steps} micro-batches of {args.batch_size} per epoch, "
          f"{describe(policy, plan, args, world)}, epochs {initial_epoch + 1}..{args.epoch_size}{schedule_line}",
          flush=True)
    files = EpochFiles(directory, checkpoint_prefix(directory, resume, exact, checkpoint_stem(args.network)),
                       args.keep_checkpoint_max,
                       {GLOBAL_BATCH: run_global_batch} if run_global_batch else None)
    if trainer_kind == "functional":
        last = train_functional(net, loss, optimizer, dataset, args.epoch_size, policy or plan, files,
                                args.clip_norm, initial_epoch, args.log_every, noise_scale=args.noise_scale,
                                average=not args.raw_sum, partial_window=args.partial_window,
                                initial_updates=before[initial_epoch], nonfinite=args.nonfinite,
                                telemetry=telemetry if args.telemetry_csv else None)
        print(f"last checkpoint: {last}", flush=True)
        return 0
    state_path = os.path.join(directory, STATE_FILE)
    save_state_every = 0 if args.dataset_sink_mode else (100 if args.save_state_every is None else
                                                         args.save_state_every)
    if save_state_every and not args.measure_micro_batch:
        write_run_flags(directory, args, files.prefix, world)
    checkpoints = EpochCheckpoint(state_cell, files, before if policy is None else None, exact)
    callbacks = [checkpoints, EpochSummary(telemetry), telemetry]
    if args.measure_micro_batch:  # the run's own callbacks too: its epoch checkpoint's writing is part of its peak
        speed = SpeedAfterFirstWindow(args.batch_size * n * world)
        callbacks.append(speed)
    if trainer_kind == "driver":
        trainer.train_process(args.epoch_size, dataset, policy or plan, callbacks=callbacks,
                              partial_window=args.partial_window, ckpt_path=None, log_every=0,
                              initial_epoch=initial_epoch, resume_from=resume if exact else None,
                              state_path=state_path, save_state_every=save_state_every,
                              max_nonfinite_windows=args.max_nonfinite_windows,
                              on_out_of_memory=args.on_out_of_memory or "raise")
    else:
        model = ms_accum.Model_ACCU(state_cell, state_path=state_path, save_state_every=save_state_every)
        model.train(args.epoch_size, dataset, callbacks=callbacks, dataset_sink_mode=args.dataset_sink_mode,
                    sink_size=sink_size, initial_epoch=initial_epoch, resume_from=resume if exact else None,
                    partial_window=args.partial_window, max_nonfinite_windows=args.max_nonfinite_windows)
    if args.measure_micro_batch:
        speed.report()
        return 0
    print(f"last checkpoint: {checkpoints.latest_ckpt_file_name}", flush=True)
    if world > 1:
        release_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, stops=(ms_accum.NonFiniteWindowError,)))

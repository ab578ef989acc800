"""Train LeNet5 on MNIST-format data with gradient accumulation (ms_accum).

    python model_zoo_lenet/train.py --device_target CPU --data_path data/fashion-mnist --ckpt_path runs/lenet \
        --epoch_size 10 --batch_size 32 --accumulation_steps 4

Each optimizer step applies the mean gradient of --accumulation_steps micro-batches of --batch_size samples,
the same update as one batch of accumulation_steps*batch_size. Checkpoints (network and optimizer state) are
written to --ckpt_path as checkpoint_lenet-<epoch>_<update>.ckpt at the end of every epoch.
"""
import argparse
import math
import os
import sys
import time

from src.cpu_speed import apply_env_defaults

apply_env_defaults()  # must precede the MindSpore import

# pylint: disable=wrong-import-position
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, ModelCheckpoint

import ms_accum
from src.cli import run_cli, set_device
from src.cpu_speed import set_cpu_threads
from src.dataset import create_dataset
from src.lenet import LeNet5


def positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, but got {text!r}")
    return value


def positive_float(text):
    """argparse type: a float > 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, but got {text!r}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device_target", default="CPU", choices=["Ascend", "GPU", "CPU"])
    parser.add_argument("--mode", default="graph", choices=["graph", "pynative"],
                        help="MindSpore execution mode (default: %(default)s)")
    parser.add_argument("--data_path", default="data/fashion-mnist", help="directory with train/ and test/")
    parser.add_argument("--ckpt_path", default="runs/lenet", help="directory for checkpoints")
    parser.add_argument("--epoch_size", type=positive_int, default=10)
    parser.add_argument("--batch_size", type=positive_int, default=32, help="micro-batch size")
    parser.add_argument("--accumulation_steps", type=positive_int, default=4,
                        help="micro-batches per optimizer step (default: %(default)s)")
    parser.add_argument("--lr", type=positive_float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--partial_window", default="flush", choices=list(ms_accum.PARTIAL_WINDOW_POLICIES),
                        help="what to do with a window still open at the end of an epoch")
    parser.add_argument("--raw_sum", action="store_true",
                        help="apply the raw sum of micro-batch gradients (the tutorial's behaviour) instead of "
                             "the large-batch mean")
    parser.add_argument("--num_samples", type=positive_int, default=None, help="train on the first N samples only")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cpu_threads", type=positive_int, default=None,
                        help="MindSpore CPU kernel threads (default: the cores available)")
    parser.add_argument("--log_every", type=int, default=100, help="print the loss every N updates (0: never)")
    parser.add_argument("--keep_checkpoint_max", type=positive_int, default=10)
    return parser.parse_args(argv)


class EpochSummary(Callback):
    """Prints one line per epoch: updates, samples, time and throughput."""

    def __init__(self, samples_per_epoch):
        super().__init__()
        self.samples_per_epoch = samples_per_epoch
        self.start = 0.0

    def on_train_epoch_begin(self, run_context):
        self.start = time.time()

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        elapsed = time.time() - self.start
        left = elapsed * (cb.epoch_num - cb.cur_epoch_num)
        print(f"epoch {cb.cur_epoch_num}/{cb.epoch_num}: {cb.cur_step_num} updates so far, "
              f"{self.samples_per_epoch} samples in {elapsed:.1f} s ({self.samples_per_epoch / elapsed:.0f} "
              f"samples/s), about {left:.0f} s left", flush=True)


def main(argv=None):
    args = parse_args(argv)
    set_device(args.device_target)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    if args.device_target == "CPU":
        threads = set_cpu_threads(args.cpu_threads)
        print(f"CPU settings: ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}, {threads} kernel threads")
    ms.set_seed(args.seed)
    dataset = create_dataset(args.data_path, args.batch_size, "train", num_samples=args.num_samples,
                             seed=args.seed)
    steps = dataset.get_dataset_size()
    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=args.lr, momentum=args.momentum)
    trainer = ms_accum.GradientAccumulation(net, loss, optimizer, average=not args.raw_sum)
    updates_per_epoch = math.ceil(steps / args.accumulation_steps) if args.partial_window == "flush" \
        else max(1, steps // args.accumulation_steps)
    checkpoints = ModelCheckpoint(prefix="checkpoint_lenet", directory=args.ckpt_path,
                                  config=CheckpointConfig(save_checkpoint_steps=updates_per_epoch,
                                                          keep_checkpoint_max=args.keep_checkpoint_max))
    print(f"training LeNet5 on {args.data_path}/train: {steps} micro-batches of {args.batch_size} per epoch, "
          f"{args.accumulation_steps} per update (effective batch {args.batch_size * args.accumulation_steps}), "
          f"{args.epoch_size} epochs", flush=True)
    trainer.train_process(args.epoch_size, dataset, args.accumulation_steps,
                          callbacks=[checkpoints, EpochSummary(steps * args.batch_size)],
                          partial_window=args.partial_window, ckpt_path=None, log_every=args.log_every)
    print(f"last checkpoint: {checkpoints.latest_ckpt_file_name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

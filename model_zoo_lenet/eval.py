r"""Evaluate a LeNet5 checkpoint (or a ResNet18 one, --network resnet18) on the test split of MNIST-format data.

    python model_zoo_lenet/eval.py --device_target CPU --data_path data/fashion-mnist \
        --ckpt_path runs/lenet/checkpoint_lenet-10_469.ckpt

Accepts checkpoints written by train.py and by the MindSpore tutorial's accumulation code (which saved the
whole forward-backward cell, gradient buffers included); prints ============== {'Accuracy': ...} ==============.
"""
import argparse
import sys

from src.cpu_speed import apply_env_defaults

apply_env_defaults()  # must precede the MindSpore import

# pylint: disable=wrong-import-position
import mindspore as ms
from mindspore import nn
from mindspore.train import Accuracy, Model

from ms_accum import read_checkpoint
from ms_accum.trainers.checkpoint import load_into
from ms_accum.trainers.state import UPDATES_DONE, is_state_file
from ms_accum.tools.argtypes import OneLineParser, positive_int
from src.cli import run_cli, set_device
from src.dataset import create_dataset
from src.network import NETWORKS, create_network


def main(argv=None):
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device_target", default="CPU", choices=["Ascend", "GPU", "CPU"])
    parser.add_argument("--network", choices=list(NETWORKS), default="lenet5",
                        help="the network the checkpoint was trained with (train.py --network)")
    parser.add_argument("--data_path", default="data/fashion-mnist", help="directory with test/")
    parser.add_argument("--ckpt_path", required=True, help="checkpoint file to evaluate")
    parser.add_argument("--batch_size", type=positive_int, default=256,
                        help="samples per evaluation batch (default: %(default)s)")
    args = parser.parse_args(argv)
    set_device(args.device_target)
    ms.set_context(mode=ms.GRAPH_MODE)
    net = create_network(args.network)
    others = " or ".join(f"--network {name}" for name in NETWORKS if name != args.network)
    params = read_checkpoint(args.ckpt_path, arg_name="--ckpt_path")
    if is_state_file(params):  # a new user's trial took such an evaluation for the run's final one
        print(f"note: {args.ckpt_path!r} is a training state, written during a run after "
              f"{int(params[UPDATES_DONE].asnumpy())} updates: its weights are the newest update's, not a finished "
              f"epoch's (micro-batches of a window open then are not in them). train.py's epoch checkpoints are the "
              f"<prefix>-<epoch>_<update>.ckpt files beside it.", flush=True)
    load_into(net, params, args.ckpt_path, arg_name="--ckpt_path",
              what=f"a checkpoint of {NETWORKS[args.network]} (--network {args.network}; pass {others} for a "
                   f"checkpoint of that network)")
    dataset = create_dataset(args.data_path, args.batch_size, "test")
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  metrics={"Accuracy": Accuracy()})
    result = model.eval(dataset, dataset_sink_mode=False)
    print(f"============== {result} ==============", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

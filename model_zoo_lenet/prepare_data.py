"""Lay out MNIST-format data as DEST/train and DEST/test, uncompressed, as create_dataset and MindSpore expect.

    python model_zoo_lenet/prepare_data.py --source /usr/share/datasets/fashion-mnist --dest data/fashion-mnist

The source may hold the four IDX files plain or gzipped (Debian's dataset-fashion-mnist installs them gzipped;
MNIST uses the same names). --train_limit/--test_limit keep only the first samples (used to cut the sample
bundled under model_zoo_lenet/data/).
"""
import argparse
import os
import sys

from ms_accum.tools.argtypes import OneLineParser, positive_int
from src.cli import run_cli
from src.idx import DataError, copy_split, find_split

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def main(argv=None):
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=DEBIAN_FASHION_MNIST,
                        help="directory with the IDX files, plain or .gz (default: %(default)s)")
    parser.add_argument("--dest", required=True, help="output directory; train/ and test/ are created in it")
    parser.add_argument("--train_limit", type=positive_int, default=None, help="keep only the first N training samples")
    parser.add_argument("--test_limit", type=positive_int, default=None, help="keep only the first N test samples")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.source):
        hint = " Install it with 'apt-get install dataset-fashion-mnist'." \
            if args.source == DEBIAN_FASHION_MNIST else ""
        raise DataError(f"'--source' must be a directory of MNIST-format files, but {args.source!r} does not "
                        f"exist.{hint}")
    if os.path.exists(args.dest) and not os.path.isdir(args.dest):
        raise DataError(f"'--dest' must be a directory to lay train/ and test/ out in, but {args.dest!r} is a file: "
                        f"pass a directory (it is made if missing).")
    if find_split(args.source, "train") is None and all(
            os.path.isdir(os.path.join(args.source, split)) and find_split(os.path.join(args.source, split), split)
            for split in ("train", "test")):
        raise DataError(f"'--source' must be a directory of MNIST-format files, but {args.source!r} holds them "
                        f"laid out already, in train/ and test/: nothing to prepare, pass it to train.py and eval.py "
                        f"as '--data_path {args.source}'.")
    for split, limit in (("train", args.train_limit), ("test", args.test_limit)):
        copy_split(args.source, os.path.join(args.dest, split), split, limit)
    print(f"prepared {args.dest}/train and {args.dest}/test from {args.source}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

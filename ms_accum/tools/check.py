"""Check on your own model that one accumulated window equals one large-batch step.

    python -m ms_accum.check --network my_pkg.models:build_net --input-shape 3,32,32 --num-classes 10 \
        --batch-size 32 --accumulation-steps 4

The network factory is called after the same seed for each copy; one copy takes a large-batch step on a random
batch (normal floats, or with --input-ids VOCAB token ids), another the same batch as accumulation_steps
micro-batches through ms_accum, with the mean cross-entropy over labels 0..num_classes-1 or (--loss mse) the mean
squared error to normal targets of the network's output shape. Per parameter it prints the relative difference of
the gradient handed to the optimizer and of the updated parameter (elements whose gradient is rounding noise left
out, as adaptive optimizers move them by their learning rate either way), and a verdict. Exit code 0: equivalent
within --rtol; 1: not; 2: bad arguments.
"""
import argparse
import importlib
import sys

import numpy as np

import mindspore as ms
from mindspore import nn

from ..core.compiled import first_line
from .argtypes import OneLineParser, positive_float, positive_int
from .equivalence import CELLS, check_equivalence


def _load(spec):
    """'package.module:attribute' -> the attribute."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"'--network' must look like 'package.module:factory', but got {spec!r}.")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"'--network' {spec!r} could not be loaded: {err}. Is its directory on PYTHONPATH?") from err
    if not callable(factory):
        raise ValueError(f"'--network' {spec!r} must name what builds the network (a Cell class or a function "
                         f"returning a new Cell), but it is a {type(factory).__name__}.")
    return factory


def _build(factory, spec):
    """A network built by `factory`, or a ValueError naming '--network' if it raises or builds no Cell."""
    try:
        network = factory()
    except Exception as err:  # pylint: disable=broad-except  (the user's code: any error is told, naming the flag)
        raise ValueError(f"'--network' {spec!r} could not build the network: calling it with no arguments raised "
                         f"{type(err).__name__}: {first_line(err).rstrip('.')}. Name a Cell class or a function "
                         f"that returns a new Cell when called with no arguments.") from err
    if not isinstance(network, nn.Cell):
        raise ValueError(f"'--network' {spec!r} must build a mindspore.nn.Cell, but calling it returned a value of "
                         f"type {type(network).__name__}. Name a Cell class or a function that returns a new Cell.")
    return network


def _shape(text):
    """argparse type: one sample's shape, comma-separated ints >= 1."""
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"must be one sample's shape as comma-separated ints >= 1, for example "
                                         f"1,32,32, but got {text!r}")
    return shape


def main(argv=None):
    """Command-line entry point; returns the exit code."""
    parser = OneLineParser(prog="python -m ms_accum.check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", required=True, help="factory of the network, 'package.module:callable'")
    parser.add_argument("--input-shape", type=_shape, required=True, help="one sample's shape, for example 1,32,32")
    parser.add_argument("--input-ids", type=positive_int, default=None, metavar="VOCAB",
                        help="the network takes token ids: its inputs are int32 ids drawn from 0..VOCAB-1 instead of "
                             "normal floats (--input-shape is then one sample's ids, for example 16)")
    parser.add_argument("--num-classes", type=positive_int, default=None,
                        help="labels are drawn from 0..num_classes-1 (needed with --loss cross_entropy)")
    parser.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy",
                        help="cross_entropy: the sparse cross-entropy of the network's outputs (logits); mse: the "
                             "mean squared error to targets drawn from a normal distribution in the network's output "
                             "shape, for a regression network (default: %(default)s)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="the large batch (default: %(default)s)")
    parser.add_argument("--gradient-accumulation-steps", "--accumulation-steps", dest="accumulation_steps",
                        type=positive_int, default=4, help="N, the micro-batches the batch is split into")
    parser.add_argument("--optimizer", choices=["sgd", "momentum", "adam", "adamw"], default="momentum")
    parser.add_argument("--lr", type=positive_float, default=0.01)
    parser.add_argument("--cell", choices=list(CELLS), default="three_cells")
    parser.add_argument("--mode", choices=["graph", "pynative"], default="pynative")
    parser.add_argument("--rtol", type=positive_float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.loss == "cross_entropy" and args.num_classes is None:
        parser.error("the following arguments are required with --loss cross_entropy: --num-classes (or pass "
                     "--loss mse for a regression network)")
    shape = args.input_shape
    try:
        factory = _load(args.network)
        ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
        rng = np.random.default_rng(args.seed)
        if args.input_ids is None:
            images = rng.normal(size=(args.batch_size,) + shape).astype(np.float32)
        else:
            images = rng.integers(0, args.input_ids, size=(args.batch_size,) + shape).astype(np.int32)
        if args.loss == "cross_entropy":  # drawn here, after the images, as before --loss was an option
            labels = rng.integers(0, args.num_classes, size=args.batch_size).astype(np.int32)
        if args.accumulation_steps > args.batch_size:
            raise ValueError(f"'--gradient-accumulation-steps' must be <= '--batch-size' {args.batch_size} (each "
                             f"micro-batch holds at least one sample), but got {args.accumulation_steps}. Pass "
                             f"--batch-size {args.accumulation_steps} or more, or fewer accumulation steps.")
        logits = _probe(_build(factory, args.network), images[:1], shape, args.input_ids)
        if args.loss == "mse":
            if not isinstance(logits, ms.Tensor):
                raise ValueError(f"'--loss mse' needs a network that returns one Tensor, but {args.network!r} "
                                 f"returned a {type(logits).__name__}.")
            labels = rng.normal(size=(args.batch_size,) + tuple(logits.shape[1:])).astype(np.float32)
            loss = nn.MSELoss()
        else:
            outputs = logits.shape[-1] if isinstance(logits, ms.Tensor) and logits.ndim else args.num_classes
            if args.num_classes > outputs:
                raise ValueError(f"'--num-classes' must be at most the network's {outputs} outputs (the labels are "
                                 f"drawn from 0..num_classes-1 for its cross-entropy), but got {args.num_classes}. "
                                 f"Pass --num-classes {outputs} or fewer.")
            loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        optimizers = {"sgd": lambda p: nn.SGD(p, args.lr), "momentum": lambda p: nn.Momentum(p, args.lr, 0.9),
                      "adam": lambda p: nn.Adam(p, args.lr),
                      "adamw": lambda p: nn.AdamWeightDecay(p, args.lr, weight_decay=0.01)}
        report = check_equivalence(factory, loss, optimizers[args.optimizer], (images, labels), args.accumulation_steps,
                                   seed=args.seed, rtol=args.rtol, cell=args.cell)
    except (ValueError, TypeError) as err:
        print(f"python -m ms_accum.check: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.network}: one window of {args.accumulation_steps} micro-batches ({args.optimizer}, lr {args.lr}, "
          f"{args.mode}, {args.cell}{', mse' if args.loss == 'mse' else ''})")
    print(report)
    return 0 if report.passed else 1


def _probe(network, sample, shape, input_ids):
    """The network's output on one sample, or a ValueError naming '--input-shape' (and '--input-ids') if the network
    cannot take it (MindSpore's own message, a kernel's, comes with a C++ call stack and names no flag)."""
    try:
        return network(ms.Tensor(sample))
    except (ValueError, TypeError, RuntimeError) as err:
        kind = "float32 values" if input_ids is None else f"int32 ids below {input_ids}"
        ids = (" A network that takes token ids (an Embedding first) needs --input-ids VOCAB, its vocabulary's size."
               if input_ids is None else " Pass --input-ids no larger than the network's vocabulary.")
        raise ValueError(f"'--input-shape' must be one sample's shape as the network takes it, but the network "
                         f"could not run on a batch of one sample of shape {','.join(map(str, shape))} ({kind}): "
                         f"{first_line(err)} Pass the shape its first layer expects, without the batch dimension "
                         f"(for example 3,32,32 for a Conv2d over RGB images).{ids}") from err


if __name__ == "__main__":
    sys.exit(main())

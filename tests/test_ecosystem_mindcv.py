"""MindCV's own models, optimizer and loss, built by its factories, through every ms_accum path.

ResNet18 (BatchNorm) trains on micro-batches that are permutations of one set of images, so that BatchNorm's batch
statistics in training mode are the same in every micro-batch and in the large batch, for one window: on such data
(the same images under contradictory labels) a second window is chaotic in the weights, a perturbation of one
float32 spacing after the first window moving the second window's update by 0.83 of its largest element in the
reference alone, so no comparison of two windows means anything there. EdgeNeXt xx_small (LayerNorm, attention)
trains two windows of unequal micro-batches. Random initialisation: nothing is downloaded.
"""
import functools

import numpy as np
import pytest

import mindspore as ms

from ecosystem import PATHS, large_batch, load_weights, raw_sum, train_path, windows_of
from helpers import assert_equals_large_batch, params_of, update_errors

pytestmark = pytest.mark.ecosystem

mindcv = pytest.importorskip("mindcv", reason="MindCV is not installed: pip install mindcv==0.3.0 (bash "
                                               "scripts/setup.sh installs it)")

CLASSES, STEPS = 5, 3
MODELS = {
    # name: (image side, micro-batch sizes, whether the micro-batches must share their statistics); STEPS per window
    "resnet18": (64, (8,) * 3, True),
    "edgenext_xx_small": (64, (3, 1, 2, 2, 3, 1), False),
}


@functools.lru_cache(maxsize=None)
def initial_weights(name):
    ms.set_seed(0)
    return params_of(mindcv.create_model(name, num_classes=CLASSES))


def make(name):
    """MindCV's factories: the model (with the cached initial weights), its optimizer and its loss."""
    net = load_weights(mindcv.create_model(name, num_classes=CLASSES), initial_weights(name))
    optimizer = mindcv.create_optimizer(net.trainable_params(), opt="momentum", lr=0.005, momentum=0.9,
                                        weight_decay=1e-4)
    return net, mindcv.create_loss(name="CE", label_smoothing=0.1), optimizer


@functools.lru_cache(maxsize=None)
def micro_batches(name):
    side, sizes, shared_statistics = MODELS[name]
    rng = np.random.default_rng(7)
    base = rng.normal(size=(sizes[0], 3, side, side)).astype(np.float32)
    batches = []
    for size in sizes:
        images = base[rng.permutation(size)] if shared_statistics else \
            rng.normal(size=(size, 3, side, side)).astype(np.float32)
        batches.append((images, rng.integers(0, CLASSES, size=size).astype(np.int32)))
    return tuple(batches)


def reference(name):
    return large_batch(functools.partial(make, name))


def windows(name):
    return windows_of(micro_batches(name), STEPS)


# ResNet18 through every path in both modes. EdgeNeXt (whose compilation takes 30-50 s a path) once per engine
# front end that builds its own graphs: the three cells and Accumulator in PYNATIVE_MODE, and the driver in
# GRAPH_MODE. Model_ACCU runs the driver's engine cell and graphs, and the driver's cell is compiled in PYNATIVE_MODE
# too (compiled.py), so a driver or Model_ACCU case in the other mode would compile the same graphs again: what the
# model adds is whether each front end's graph takes it.
CASES = [(name, path, mode) for name in MODELS for path in PATHS for mode in ("pynative", "graph")
         if name == "resnet18" or (path, mode) in (("driver", "graph"), ("cells", "pynative"),
                                                   ("accumulator", "pynative"))]


@pytest.mark.slow
@pytest.mark.parametrize("name, path, mode", CASES, ids=[f"{mode}-{name}-{path}" for name, path, mode in CASES])
def test_mindcv_model_trains_as_the_large_batch(name, path, mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    got = train_path(path, functools.partial(make, name), list(micro_batches(name)), STEPS)
    assert_equals_large_batch(got, reference(name), windows(name), context=f"{name}, {path}, {mode}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_the_comparison_catches_the_raw_sum(name):
    """The tutorial's raw sum on the same model: the check above must be able to fail."""
    got = raw_sum(functools.partial(make, name), windows(name))
    errors = update_errors(got, reference(name)(windows(name)), reference(name)([]))
    assert max(errors.values()) > 0.5

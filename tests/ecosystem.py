"""Training other people's models through every ms_accum path, against an independent large-batch update.

`make()` builds (network, loss, optimizer) with the same initial weights each time; ``loss=None`` when the network
is itself the loss network. With ``token_loss=True`` that network returns ``(loss, num_items)``. The reference
(:func:`large_batch`) takes, per window, `value_and_grad` of the mean loss over the window's concatenated
micro-batches (a token loss: over its tokens) and one optimizer step, in PYNATIVE_MODE, without ms_accum; the tests
compare with it through helpers.assert_equals_large_batch, as every equivalence test of the suite does. Float32
accumulation sums each window's gradient in another order than the large batch does: measured up to 4.5e-6 of a
parameter's largest update on these models (the reference against itself with its micro-batches concatenated in
another order: 4.4e-6); the raw sum or a per-sequence weighting of token means is off by 1.2 to 54.
"""
import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

import paths
from helpers import computed_once, in_pynative

PATHS = ["driver", "model_accu", "cells", "accumulator"]


def trained_parameters(net):
    """name -> numpy copy of every trainable parameter (BatchNorm's moving statistics are not trained: accumulation
    updates them once per micro-batch, the large batch once; see docs/models.md)."""
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def load_weights(net, weights):
    """Give `net` the parameter values `weights` (name -> numpy array), as each path's fresh network needs."""
    ms.load_param_into_net(net, {name: ms.Parameter(Tensor(value), name=name) for name, value in weights.items()})
    return net


def loss_network(net, loss):
    return net if loss is None else nn.WithLossCell(net, loss)


def train_path(path, make, batches, steps, token_loss=False):
    """Train on `batches` (tuples of numpy arrays, one per micro-batch) through `path` (tests/paths.py; "cells" is
    its "three_cells") with `steps` micro-batches per update, in the current execution mode; returns the network's
    trained parameters."""
    net, loss, optimizer = make()
    paths.train({"cells": "three_cells"}.get(path, path), loss_network(net, loss), optimizer, batches, steps,
                returns_items=token_loss)
    return trained_parameters(net)


def windows_of(batches, steps):
    """`batches` in consecutive windows of `steps` micro-batches."""
    return [list(batches[start:start + steps]) for start in range(0, len(batches), steps)]


def large_batch(make, token_loss=False):
    """The reference of helpers.assert_equals_large_batch for these models: windows -> the trained parameters after,
    per window, value_and_grad of the loss on its concatenated micro-batches and one optimizer step, in
    PYNATIVE_MODE, without ms_accum. A process computes it once for the same `make` (a module-level function or a
    partial of one) and windows (helpers.computed_once): a model's tests share its references."""
    return lambda windows: _pynative_large_batch(make, windows, token_loss)


def raw_sum(make, windows):
    """The tutorial's raw sum, a wrong update the comparison must catch, written without ms_accum: per window, the
    gradients of each micro-batch's mean loss added up, not averaged, and one optimizer step on their sum (PYNATIVE);
    returns the trained parameters."""
    return in_pynative(_pynative_steps, make, windows, token_loss=False, summed=True)


@computed_once
def _pynative_large_batch(make, windows, token_loss):
    return _pynative_steps(make, windows, token_loss, summed=False)


def _pynative_steps(make, windows, token_loss, summed):
    """One optimizer step per window on the gradient of its concatenated micro-batches' loss, or with `summed` on
    the sum of its micro-batches' gradients."""
    net, loss, optimizer = make()
    loss_net = loss_network(net, loss)
    loss_net.set_train(True)
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters, has_aux=token_loss)
    for window in windows:
        grads = None
        for part in [[batch] for batch in window] if summed else [window]:
            _, part_grads = grad_fn(*(Tensor(np.concatenate(arrays)) for arrays in zip(*part)))
            grads = part_grads if grads is None else tuple(a + b for a, b in zip(grads, part_grads))
        optimizer(grads)
    return trained_parameters(net)

"""The peers ms_accum is measured against, written once: the MindSpore 2.x tutorial's accumulator (in one ``jit``
step, in two graphs, clipped, or with the start-up floor's checked window end) and model_zoo_lenet's LeNet5 in
PyTorch."""


TUTORIAL_CLIP_NORM = 1.0


STEP_NAMES = ("tutorial", "tutorial-clip", "tutorial-checked", "accumulator")  # the steps of step_parts


def step_parts(name, loss_net, optimizer, steps):
    """What the MindSpore 2.x training step of `name` ("tutorial", "tutorial-clip", "tutorial-checked" or
    "accumulator") runs per micro-batch: (the value_and_grad function, the accumulator, whether the accumulator
    takes the micro-batch's size). The tutorial divides the loss by N and calls its accumulator with the gradients
    ("tutorial-clip": the window's gradient clipped by MindSpore's ``ops.clip_by_global_norm`` before the
    optimizer, a pass over it as ms_accum's gradient norm is; "tutorial-checked": its window's end is
    :func:`checked_window_end`'s); ms_accum's takes the mean loss and ``Accumulator(grads, num_items)``."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    import ms_accum  # pylint: disable=import-outside-toplevel
    if name not in STEP_NAMES:
        raise ValueError(f"step_parts: the step must be one of {', '.join(STEP_NAMES)}, but got {name!r}")
    loss_net.set_train(True)
    if name in ("tutorial", "tutorial-clip", "tutorial-checked"):
        def divided_loss(x, y):
            return loss_net(x, y) / steps
        tutorial = _tutorial_class()(optimizer, steps, TUTORIAL_CLIP_NORM if name == "tutorial-clip" else None,
                                     checked=name == "tutorial-checked")
        return ms.value_and_grad(divided_loss, None, optimizer.parameters), tutorial, False
    return ms.value_and_grad(loss_net, None, optimizer.parameters), ms_accum.Accumulator(optimizer, steps), True


def step_cell(name, loss_net, optimizer, steps):
    """The MindSpore 2.x training step of `name` (see :func:`step_parts`) as a Cell: value_and_grad and the
    accumulator in one graph, called once per micro-batch (and compilable before it runs)."""
    from mindspore import nn, ops  # pylint: disable=import-outside-toplevel

    class Step(nn.Cell):
        """value_and_grad and the accumulator in one graph."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.grad_fn, self.accumulator, self.weighted = step_parts(name, loss_net, optimizer, steps)

        def construct(self, x, y):
            loss_value, grads = self.grad_fn(x, y)
            if self.weighted:  # a constant when compiled: no branch in the graph
                return ops.depend(loss_value, self.accumulator(grads, x.shape[0]))
            return ops.depend(loss_value, self.accumulator(grads))
    return Step()


def jit_step(name, loss_net, optimizer, steps):
    """The MindSpore 2.x training step of `name` (see :func:`step_parts`): value_and_grad and the accumulator
    inside one ``ms.jit`` function, called once per micro-batch."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    grad_fn, accumulator, weighted = step_parts(name, loss_net, optimizer, steps)

    @ms.jit
    def train_step(x, y):
        loss_value, grads = grad_fn(x, y)
        if weighted:  # a constant when compiled: no branch in the graph
            return ops.depend(loss_value, accumulator(grads, x.shape[0]))
        return ops.depend(loss_value, accumulator(grads))
    return train_step


def two_graph_steps(loss_net, optimizer, steps, checked=False, cells=False):
    """The tutorial's accumulation in two ``ms.jit`` functions: (value_and_grad of loss / N and the addition into
    the buffers, per micro-batch; the optimizer on the buffers and their reset from zeros, per window). The
    gradient function and the buffers are the tutorial step's own (:func:`step_parts`). With `checked` the
    window's end is :func:`checked_window_end`'s. With `cells` the same two graphs are two Cells instead, for
    GRAPH_MODE (benchmarks/lab/floor_as_cells.py: there they run 2.3 times faster on EdgeNeXt)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import nn, ops  # pylint: disable=import-outside-toplevel
    grad_fn, tutorial, _ = step_parts("tutorial-checked" if checked else "tutorial", loss_net, optimizer, steps)
    if cells:
        class MicroStep(nn.Cell):
            """value_and_grad of loss / N and the addition into the buffers."""

            def __init__(self):
                super().__init__(auto_prefix=False)
                self.grad_fn, self.tutorial = grad_fn, tutorial

            def construct(self, x, y):
                loss_value, grads = self.grad_fn(x, y)
                return ops.depend(loss_value, self.tutorial.add(grads))

        class WindowEnd(nn.Cell):
            """The window's end of the tutorial (or with `checked`, the start-up floor's)."""

            def __init__(self):
                super().__init__(auto_prefix=False)
                self.tutorial = tutorial

            def construct(self):
                return self.tutorial.end_window()
        return MicroStep(), WindowEnd()

    @ms.jit
    def micro_step(x, y):
        loss_value, grads = grad_fn(x, y)
        return ops.depend(loss_value, tutorial.add(grads))

    @ms.jit
    def window_end():
        return tutorial.end_window()
    return micro_step, window_end


def checked_window_end():
    """A function (hyper_map, buffers, optimizer, divisor, last_norm) -> a Tensor once done: a window's end that
    does what ms_accum's must for its promises, written with MindSpore and the per-parameter helpers of
    ``ms_accum/core/grad_ops.py`` only (no engine): the gradient's global norm (no temporary of a parameter's
    size) into `last_norm`, the buffers divided in place by the run-time `divisor`, the optimizer in a run-time
    branch that a non-finite norm skips, and the buffers cleared one after another instead of from a zeros copy
    (one parameter's zeros at a time). The start-up floor of docs/performance.md."""
    from mindspore import ops  # pylint: disable=import-outside-toplevel
    from ms_accum.core import grad_ops  # pylint: disable=import-outside-toplevel

    def end(hyper_map, buffers, optimizer, divisor, last_norm):
        inverse = 1.0 / divisor
        norm = grad_ops.global_norm(hyper_map, buffers) * inverse
        done = ops.depend(inverse, hyper_map(ops.partial(grad_ops.scale_in_place, inverse), buffers))
        done = ops.depend(done, ops.assign(last_norm, norm))
        if ops.isfinite(last_norm):
            done = ops.depend(done, optimizer(buffers))
        return ops.depend(done, grad_ops.clear_in_turn(buffers, done))
    return end


def _tutorial_class():
    """The tutorial's class (defined once MindSpore has loaded with the CPU settings)."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel
    from mindspore import Parameter, Tensor, ops  # pylint: disable=import-outside-toplevel

    @ms.jit_class
    class _Tutorial:
        """The MindSpore tutorial's accumulator: buffers and a zeros copy beside the parameters, a counter from 1,
        the optimizer stepped on the summed (loss / N) gradients every N-th call (clipped by their global norm with
        a `clip_norm`), the buffers reset from zeros. With `checked`, the window's end is
        :func:`checked_window_end`'s (a divisor of 1: the loss is divided by N already), without the zeros copy."""

        def __init__(self, optimizer, steps, clip_norm=None, checked=False):
            self.optimizer = optimizer
            self.clip_norm = clip_norm
            self.inner_grads = optimizer.parameters.clone(prefix="accumulate_", init="zeros")
            self.zeros = None if checked else optimizer.parameters.clone(prefix="zeros_", init="zeros")
            self.end = checked_window_end() if checked else None
            self.divisor = Parameter(Tensor(1.0, ms.float32), "checked_divisor") if checked else None
            self.last_norm = Parameter(Tensor(0.0, ms.float32), "checked_last_norm") if checked else None
            self.counter = Parameter(Tensor(1, ms.int32), "counter_")
            self.steps = steps
            self.map = ops.HyperMap()

        def add(self, grads):
            """The micro-batch's gradients added into the buffers."""
            return self.map(ops.partial(ops.assign_add), self.inner_grads, grads)

        def end_window(self):
            """The window's end: the checked one, or the tutorial's (the optimizer on the buffers, clipped with a
            `clip_norm`, then the buffers reset from zeros)."""
            if self.end is not None:  # a constant when compiled: the tutorial's own graph is unchanged
                return self.end(self.map, self.inner_grads, self.optimizer, self.divisor, self.last_norm)
            if self.clip_norm is None:  # the tutorial's lines
                self.optimizer(self.inner_grads)
            else:
                self.optimizer(ops.clip_by_global_norm(self.inner_grads, self.clip_norm))
            self.map(ops.partial(ops.assign), self.inner_grads, self.zeros)
            return True

        def __call__(self, grads):
            self.add(grads)
            if self.counter % self.steps == 0:
                self.end_window()
            ops.assign_add(self.counter, Tensor(1, ms.int32))
            return True
    return _Tutorial


def torch_lenet_update(config, images, labels, batch, steps):
    """update(k): the k-th update of `config` ('torch-plain-b', 'torch-accum' or 'torch-plain-Nb') on
    model_zoo_lenet's LeNet5 written in PyTorch (SGD with momentum 0.9), b*N samples, finished when it returns;
    it returns b*N. Accumulation follows PyTorch's usual recipe: loss / N backward per micro-batch, one step and
    zero_grad per window. Needs the optional group ``torch`` (``pip install -e .[torch]``)."""
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel

    class LeNet5(nn.Module):
        """model_zoo_lenet/src/lenet.py in PyTorch: two valid 5x5 convolutions, 2x2 max pooling, three dense
        layers."""

        def __init__(self, num_class=10):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.pool = nn.MaxPool2d(2, 2)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, num_class)

        def forward(self, x):
            x = self.pool(torch.relu(self.conv1(x)))
            x = self.pool(torch.relu(self.conv2(x)))
            x = torch.flatten(x, 1)
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    net = LeNet5()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    size = batch * steps if config == "torch-plain-Nb" else batch
    xs = [torch.from_numpy(images[i:i + size]) for i in range(0, len(images), size)]
    ys = [torch.from_numpy(labels[i:i + size]).long() for i in range(0, len(labels), size)]
    per_update = 1 if config == "torch-plain-Nb" else steps
    accumulate = config == "torch-accum"

    def update(k):
        for s in range(per_update):
            index = (k * per_update + s) % len(xs)
            if not accumulate:
                optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(xs[index]), ys[index])
            (loss / steps if accumulate else loss).backward()
            if not accumulate:
                optimizer.step()
        if accumulate:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss.item()
        return batch * steps
    return update

"""The PyTorch side of benchmarks/accumulation.py: the same LeNet5, data, batch sizes and optimizer.

Needs the optional dependency group ``torch`` (``pip install -e .[torch]``, PyTorch 2.13.0, CPU build).
Accumulation follows PyTorch's usual recipe: ``(loss * b / (N * b)).backward()`` per micro-batch (the gradients
add up in ``.grad``), one ``optimizer.step()`` and ``zero_grad()`` per window.
"""
import torch
from torch import nn


class LeNet5(nn.Module):
    """model_zoo_lenet/src/lenet.py in PyTorch: two valid 5x5 convolutions, 2x2 max pooling, three dense layers."""

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


def make_update(config, images, labels, batch, steps):
    """Return update(k): the k-th update of `config` ('torch-plain-b', 'torch-accum' or 'torch-plain-Nb'), b*N
    samples, finished when it returns; it returns b*N."""
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

"""LeNet5, as in MindSpore's model zoo (official/cv/lenet/src/lenet.py)."""
from mindspore import nn
from mindspore.common.initializer import Normal


class LeNet5(nn.Cell):
    """
    LeNet-5 for 32x32 single-channel images.

    Args:
        num_class (int): Number of classes. Default: 10.
        num_channel (int): Number of input channels. Default: 1.
        include_top (bool): Whether to include the fully connected head. Default: True.

    Inputs:
        - **x** (Tensor) - Images of shape (N, num_channel, 32, 32).

    Outputs:
        Tensor of shape (N, num_class): the logits (or the feature map if `include_top` is False).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> net = LeNet5()
    """

    def __init__(self, num_class=10, num_channel=1, include_top=True):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.include_top = include_top
        if self.include_top:
            self.flatten = nn.Flatten()
            self.fc1 = nn.Dense(16 * 5 * 5, 120, weight_init=Normal(0.02))
            self.fc2 = nn.Dense(120, 84, weight_init=Normal(0.02))
            self.fc3 = nn.Dense(84, num_class, weight_init=Normal(0.02))

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        if not self.include_top:
            return x
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)

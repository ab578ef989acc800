"""create_dataset: MNIST-format IDX files as batched LeNet inputs (32x32, normalised, CHW, int32 labels)."""
import os

import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import mindspore.dataset.vision as vision
from mindspore import dtype as mstype

from .idx import DataError, check_split_dir

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def check_data_path(data_path, split="train"):
    """The samples of `data_path/<split>/`, or a DataError naming '--data_path' if it is missing or malformed (what
    :func:`create_dataset` checks first; train.py checks it before planning the micro-batch too)."""
    if not os.path.isdir(data_path):
        holding = "train/ and test/" if split == "train" else "test/"
        found = "is a file" if os.path.exists(data_path) else "does not exist"
        raise DataError(f"'--data_path' must be a directory holding {holding}, but {data_path!r} "
                        f"{found}. Lay out Fashion-MNIST there with 'bash scripts/fashion_mnist.sh "
                        f".venv/bin/python' (data/fashion-mnist) or 'model_zoo_lenet/prepare_data.py --source DIR "
                        f"--dest {data_path}', or use the bundled sample: --data_path model_zoo_lenet/data/"
                        f"fashion_mnist_sample.")
    return check_split_dir(os.path.join(data_path, split), split)


def create_dataset(data_path, batch_size=32, split="train", shuffle=None, num_parallel_workers=1,
                   drop_remainder=None, num_samples=None, num_shards=None, shard_id=None, seed=None):
    """
    Build the LeNet input pipeline over `data_path/<split>/`.

    Args:
        data_path (str): Directory holding ``train/`` and ``test/`` with MNIST's file names, uncompressed.
        batch_size (int): Samples per batch. Default: 32.
        split (str): ``"train"`` or ``"test"``. Default: ``"train"``.
        shuffle (bool, optional): Default: True for train, False for test.
        num_parallel_workers (int): Workers for the map operations. Default: 1.
        drop_remainder (bool, optional): Drop a last incomplete batch. Default: True for train, False for test.
        num_samples (int, optional): Use only this many samples (per shard when sharded, as MindSpore counts).
            Default: all.
        num_shards (int, optional): Shards for data-parallel training. Default: None.
        shard_id (int, optional): This process's shard. Default: None.
        seed (int, optional): Shuffle seed (sets the global dataset seed). Default: None.

    Returns:
        Dataset with columns ``image`` (float32, N x 1 x 32 x 32) and ``label`` (int32, N).

    Raises:
        DataError: If the directory or its IDX files are missing or malformed, or the data set is empty.
        ValueError: If `batch_size` is not an int >= 1.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"For 'create_dataset', 'batch_size' must be an int >= 1, but got {batch_size!r}.")
    if split not in ("train", "test"):
        raise ValueError(f"For 'create_dataset', 'split' must be 'train' or 'test', but got {split!r}.")
    count = check_data_path(data_path, split)
    directory = os.path.join(data_path, split)
    train = split == "train"
    shuffle = train if shuffle is None else shuffle
    drop_remainder = train if drop_remainder is None else drop_remainder
    held = count // (num_shards or 1)
    usable = held if num_samples is None else min(held, num_samples)
    if usable == 0 or (drop_remainder and usable < batch_size):
        taken = "" if usable == held else f", of which --num_samples takes {usable}"
        raise DataError(f"'{directory}' must hold at least one batch of {batch_size} samples (--batch_size)"
                        f"{' per shard' if num_shards else ''}, but it holds {held}{taken}. Pass a smaller "
                        f"--batch_size, or more samples{' (--num_samples)' if taken else ''}.")
    if seed is not None:
        ds.config.set_seed(seed)
    mnist = ds.MnistDataset(directory, usage="all", shuffle=shuffle, num_samples=num_samples,
                            num_shards=num_shards, shard_id=shard_id)
    image_ops = [
        vision.Resize((32, 32), interpolation=vision.Inter.LINEAR),
        vision.Rescale(1.0 / 255.0, 0.0),
        vision.Rescale(1.0 / MNIST_STD, -MNIST_MEAN / MNIST_STD),
        vision.HWC2CHW(),
    ]
    mnist = mnist.map(operations=transforms.TypeCast(mstype.int32), input_columns="label",
                      num_parallel_workers=num_parallel_workers)
    mnist = mnist.map(operations=image_ops, input_columns="image", num_parallel_workers=num_parallel_workers)
    return mnist.batch(batch_size, drop_remainder=drop_remainder)

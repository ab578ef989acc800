"""The data the benchmarks train on: the bundled Fashion-MNIST sample as train.py prepares it, seeded random
micro-batches of each model's input shape, and datasets and windows over them."""
import numpy as np

from .paths import SAMPLE


def sample_arrays(count=None):
    """The bundled Fashion-MNIST sample's training images as train.py prepares them (float32 N x 1 x 32 x 32,
    normalised) and their int32 labels, in file order; repeated to `count` samples when given."""
    from src.dataset import create_dataset  # pylint: disable=import-outside-toplevel
    sample = create_dataset(SAMPLE, 1000, "train", shuffle=False)
    pairs = list(sample.create_tuple_iterator(num_epochs=1, output_numpy=True))
    images, labels = np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])
    if count is not None:
        reps = -(-count // len(images))
        images, labels = np.tile(images, (reps, 1, 1, 1))[:count], np.tile(labels, reps)[:count]
    return images, labels


TEXT_VOCAB = 50000


def random_batches(args, count, seed):
    """`count` micro-batches (inputs, int32 labels) of ``args.micro_batch`` for ``args.model`` from a generator
    seeded with `seed`: token ids for 'text', normal float32 inputs otherwise (64 x 256 for 'block', 1 x 32 x 32
    for 'lenet', 1024 for 'mlp' and 'tiny', 3 x ``args.image_size`` squared for a MindCV model)."""
    rng = np.random.default_rng(seed)
    size = args.micro_batch
    if args.model == "text":  # 64 token ids per sample
        return [(rng.integers(0, TEXT_VOCAB, size=(size, 64)).astype(np.int32),
                 rng.integers(0, args.classes, size=size).astype(np.int32)) for _ in range(count)]
    shape = {"block": (size, 64, 256), "lenet": (size, 1, 32, 32), "mlp": (size, 1024), "tiny": (size, 1024)}.get(
        args.model, (size, 3, args.image_size, args.image_size))
    return [(rng.normal(size=shape).astype(np.float32), rng.integers(0, args.classes, size=size).astype(np.int32))
            for _ in range(count)]


def dataset_of(batches):
    """A MindSpore dataset ('image', 'label') of the micro-batches `batches`, in order, batched as they are."""
    import mindspore.dataset as ds  # pylint: disable=import-outside-toplevel
    images, labels = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(len(batches[0][1]))


def window_of(batches, k, n):
    """The k-th run of `n` consecutive items of `batches`, cycling through them."""
    return [batches[(k * n + s) % len(batches)] for s in range(n)]

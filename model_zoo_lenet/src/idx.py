"""MNIST's IDX file format: the file names, header checks, and copying (gzipped or not) into a data directory.

No MindSpore import here, so the data can be laid out before MindSpore loads.
"""
import gzip
import os
import shutil
import struct

SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_MAGIC = {"images": 2051, "labels": 2049}


class DataError(ValueError):
    """A data directory is missing, incomplete or malformed."""


def _open(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_header(path):
    """Return (kind, count) of an IDX file ('images' or 'labels'), raising DataError if it is not one."""
    try:
        with _open(path) as f:
            head = f.read(8)
    except (OSError, EOFError) as err:
        raise DataError(f"'{path}' must be an MNIST IDX file, but it could not be read: {err}.") from err
    if len(head) < 8:
        raise DataError(f"'{path}' must be an MNIST IDX file, but it is only {len(head)} bytes long.")
    magic, count = struct.unpack(">II", head)
    for kind, value in _MAGIC.items():
        if magic == value:
            return kind, count
    raise DataError(f"'{path}' must be an MNIST IDX file (magic 2051 or 2049), but its magic number is {magic}.")


def find_split(directory, split):
    """Return the (images, labels) paths of `split` in `directory`, plain files first, then '.gz'."""
    found = []
    for name in SPLITS[split]:
        for candidate in (name, name + ".gz"):
            path = os.path.join(directory, candidate)
            if os.path.isfile(path):
                found.append(path)
                break
        else:
            return None
    return tuple(found)


def check_split_dir(directory, split):
    """
    Check that `directory` holds `split`'s two uncompressed IDX files with matching counts; return the count.

    Raises:
        DataError: naming the directory and the file names expected.
    """
    images, labels = SPLITS[split]
    if not os.path.isdir(directory):
        raise DataError(f"'--data_path' must contain a directory '{directory}' with the MNIST-format files "
                        f"{images} and {labels}, but it does not exist.")
    paths = find_split(directory, split)
    if paths is None:
        raise DataError(f"'{directory}' must contain the MNIST-format files {images} and {labels}, but "
                        f"has {sorted(os.listdir(directory))}.")
    if any(p.endswith(".gz") for p in paths):
        raise DataError(f"'{directory}' holds gzipped IDX files; MindSpore reads them uncompressed. Run "
                        f"'python model_zoo_lenet/prepare_data.py --source {directory} --dest DIR' and use DIR.")
    (kind_i, n_images), (kind_l, n_labels) = read_header(paths[0]), read_header(paths[1])
    if (kind_i, kind_l) != ("images", "labels") or n_images != n_labels:
        raise DataError(f"'{directory}' must hold {n_images} labels for its {n_images} images, but "
                        f"{paths[1]} is a {kind_l} file with {n_labels} entries.")
    return n_images


def copy_split(source_dir, dest_dir, split, limit=None):
    """Copy `split` from `source_dir` (plain or gzipped) into `dest_dir` uncompressed, keeping the first `limit`."""
    paths = find_split(source_dir, split)
    if paths is None:
        images, labels = SPLITS[split]
        raise DataError(f"'--source' must contain {images} and {labels} (or their .gz), but '{source_dir}' "
                        f"does not.")
    os.makedirs(dest_dir, exist_ok=True)
    for src, name in zip(paths, SPLITS[split]):
        kind, count = read_header(src)
        keep = count if limit is None else min(limit, count)
        item = 28 * 28 if kind == "images" else 1
        header = 16 if kind == "images" else 8
        tmp = os.path.join(dest_dir, f".{name}.partial")
        with _open(src) as fin, open(tmp, "wb") as fout:
            head = bytearray(fin.read(header))
            head[4:8] = struct.pack(">I", keep)
            fout.write(head)
            if limit is None:
                shutil.copyfileobj(fin, fout)
            else:
                fout.write(fin.read(keep * item))
        os.replace(tmp, os.path.join(dest_dir, name))

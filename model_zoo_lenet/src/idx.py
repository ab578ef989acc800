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
    """Return (kind, count, header bytes, bytes per item) of an IDX file ('images' or 'labels'), raising DataError
    if it is not one."""
    try:
        with _open(path) as f:
            head = f.read(16)
    except (OSError, EOFError) as err:
        raise DataError(f"'{path}' must be an MNIST IDX file, but it could not be read: {err}.") from err
    if len(head) < 8:
        raise DataError(f"'{path}' must be an MNIST IDX file, but it is only {len(head)} bytes long.")
    magic, count = struct.unpack(">II", head[:8])
    if magic == _MAGIC["labels"]:
        return "labels", count, 8, 1
    if magic == _MAGIC["images"] and len(head) == 16:
        rows, cols = struct.unpack(">II", head[8:])
        return "images", count, 16, rows * cols
    raise DataError(f"'{path}' must be an MNIST IDX file (magic 2051 or 2049), but its magic number is {magic}.")


def _check_whole(path, kind, count, header, item, size):
    """Refuse an IDX file whose `size` bytes hold fewer items than its header announces (a truncated download or
    copy): MindSpore's reader failed on it with a traceback, after the run had begun."""
    if size < header + count * item:
        raise DataError(f"'{path}' must hold the {count} {kind} its header announces ({header + count * item} "
                        f"bytes), but it has {size} bytes: it is truncated. Copy or download it again.")


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
    (kind_i, n_images, *_), (kind_l, n_labels, *_) = read_header(paths[0]), read_header(paths[1])
    if (kind_i, kind_l) != ("images", "labels") or n_images != n_labels:
        raise DataError(f"'{directory}' must hold {n_images} labels for its {n_images} images, but "
                        f"{paths[1]} is a {kind_l} file with {n_labels} entries.")
    for path in paths:
        _check_whole(path, *read_header(path), os.path.getsize(path))
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
        kind, count, header, item = read_header(src)
        keep = count if limit is None else min(limit, count)
        tmp = os.path.join(dest_dir, f".{name}.partial")
        try:  # what was read, compared with the header: a truncated source is not laid out
            with _open(src) as fin, open(tmp, "wb") as fout:
                head = bytearray(fin.read(header))
                head[4:8] = struct.pack(">I", keep)
                fout.write(head)
                if limit is None:
                    shutil.copyfileobj(fin, fout)
                else:
                    fout.write(fin.read(keep * item))
            _check_whole(src, kind, keep, header, item, os.path.getsize(tmp))
        except (DataError, EOFError, OSError) as err:
            os.remove(tmp)
            if isinstance(err, DataError):
                raise
            raise DataError(f"'{src}' must be a whole MNIST IDX file, but it could not be read to its end: {err}. "
                            f"Copy or download it again.") from err
        os.replace(tmp, os.path.join(dest_dir, name))

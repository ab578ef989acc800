"""MindSpore alone: one optimizer step on an embedding table whose gradient comes sparse (a RowTensor, from
nn.EmbeddingLookup(sparse=True)) or dense (the same table with target="DEVICE", sparse=False), for a batch that looks
the same row up more than once.

A probe kept in the lab, quoted in docs/models.md ("Sparse embeddings"): why a reference for a sparse model is
built dense. Run as ``.venv/bin/python benchmarks/lab/sparse_repeated_ids.py``; it prints, for nn.SGD and nn.Adam,
the largest difference between the two tables after the step, and for SGD row 1's change against -lr times its
gradient computed by hand (row 1 is looked up four times; the loss is the sum of the looked-up rows' squares, so
its gradient is 2 x 4 x row 1).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (benchmarks/, beside this folder)

import numpy as np  # noqa: E402

LR = 0.1
IDS = np.array([[1, 2, 1, 1], [3, 1, 2, 5]], np.int32)  # row 1 four times, row 2 twice
TABLE = np.arange(30, dtype=np.float32).reshape(10, 3) / 30


def stepped_table(sparse, optimizer):
    """The table after one jit-compiled step of `optimizer` ("sgd" or "adam")."""
    import mindspore as ms  # pylint: disable=import-outside-toplevel  (after harness.start_mindspore)
    from mindspore import Tensor, nn  # pylint: disable=import-outside-toplevel
    lookup = nn.EmbeddingLookup(10, 3, target="CPU" if sparse else "DEVICE", sparse=sparse)
    lookup.embedding_table.set_data(Tensor(TABLE))
    opt = {"sgd": nn.SGD, "adam": nn.Adam}[optimizer](lookup.trainable_params(), LR)

    def loss_of(ids):
        return (lookup(ids) ** 2).sum()

    grad_fn = ms.value_and_grad(loss_of, None, opt.parameters)

    @ms.jit
    def step(ids):
        loss, grads = grad_fn(ids)
        opt(grads)
        return loss

    step(Tensor(IDS))
    return lookup.embedding_table.asnumpy()


def main():
    harness.start_mindspore("graph")
    for optimizer in ("sgd", "adam"):
        dense, sparse = stepped_table(False, optimizer), stepped_table(True, optimizer)
        print(f"{optimizer}: largest difference between the sparse and the dense step: "
              f"{float(np.abs(dense - sparse).max()):.4g}")
        if optimizer == "sgd":
            by_hand = TABLE[1] - LR * 2 * 4 * TABLE[1]
            print(f"  row 1 by hand {np.round(by_hand, 5)}, dense {np.round(dense[1], 5)}, "
                  f"sparse {np.round(sparse[1], 5)}")


if __name__ == "__main__":
    main()

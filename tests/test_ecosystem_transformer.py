"""A causal transformer language model built from MindSpore's own layers, with a token loss over padded sequences
``(loss, num_items)``, through Accumulator and the driver in both modes: each window equals the large batch's mean
over its real tokens.

MindNLP 0.5.1's models are mindtorch modules whose weights are not MindSpore Parameters, so no MindSpore optimizer,
hence no ms_accum path, takes them (docs/ecosystem.md); this model stands in for them.
"""
import functools

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from ecosystem import large_batch, load_weights, train_path, windows_of
from helpers import assert_equals_large_batch, params_of, update_errors

pytestmark = pytest.mark.ecosystem

VOCAB, LENGTH, PAD = 40, 12, 0
STEPS = 3


class CausalLM(nn.Cell):
    """Token and position embeddings, two pre-norm transformer layers with a causal mask, a vocabulary head."""

    def __init__(self, dim=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = Parameter(initializer(Normal(0.02), (1, LENGTH, dim)), name="position")
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.layers = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm((dim,))
        self.head = nn.Dense(dim, VOCAB)
        future = np.triu(np.ones((LENGTH, LENGTH), np.bool_), k=1)
        self.causal = Tensor(np.where(future, -1e9, 0.0).astype(np.float32))

    def construct(self, ids):
        hidden = self.embed(ids) + self.position
        return self.head(self.norm(self.layers(hidden, src_mask=self.causal)))


class NextTokenLoss(nn.Cell):
    """Cross-entropy of each next token over the real (non-padding) targets: (their mean, their count)."""

    def __init__(self, network):
        super().__init__(auto_prefix=False)  # the parameters keep the language model's names
        self.network = network

    def construct(self, ids):
        logits = self.network(ids)[:, :-1]
        targets = ids[:, 1:]
        real = ops.cast(targets != PAD, ms.float32)
        losses = ops.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
        count = real.sum()
        return (losses * real.reshape(-1)).sum() / count, count


@functools.lru_cache(maxsize=None)
def initial_weights():
    ms.set_seed(0)
    return params_of(CausalLM())


def make(optimizer="adamw"):
    net = load_weights(CausalLM(), initial_weights())
    if optimizer == "adamw":
        # AdamWeightDecay's first step is lr (1 - beta1) g / (sqrt(1 - beta2) |g| + eps), of slope up to
        # lr (1 - beta1) / eps in g: at the default eps 1e-6 float32 rounding of a gradient element near 0 (about
        # 1e-9 here) moved its update by 1.2e-4 of the largest update; eps 1e-3 keeps that below 1e-6, so the
        # comparison measures the accumulated gradient, not the optimizer's conditioning.
        opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3, weight_decay=0.01, eps=1e-3)
    else:
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    return NextTokenLoss(net), None, opt


def padded_sequences(lengths, batch=3, seed=5):
    """Micro-batches of `batch` sequences each; sequence i of micro-batch k has lengths[k][i] real tokens, then
    padding."""
    rng = np.random.default_rng(seed)
    batches = []
    for micro in lengths:
        ids = np.full((batch, LENGTH), PAD, np.int32)
        for row, length in enumerate(micro):
            ids[row, :length] = rng.integers(1, VOCAB, size=length)
        batches.append((ids,))
    return batches


# Real tokens per sequence (the loss counts targets: length - 1 each): 30, 6, 19 | 12, 31, 3 targets per micro-batch.
LENGTHS = [(12, 12, 9), (3, 2, 4), (9, 8, 5), (6, 5, 4), (12, 11, 11), (2, 2, 2)]


def reference(optimizer):
    return large_batch(functools.partial(make, optimizer), token_loss=True)


@functools.lru_cache(maxsize=None)
def sequences():
    return tuple(padded_sequences(LENGTHS))


@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
@pytest.mark.parametrize("path", ["accumulator", "driver"])
def test_token_windows_equal_the_large_batch_s_token_mean(path, optimizer, exec_mode):
    got = train_path(path, functools.partial(make, optimizer), list(sequences()), STEPS, token_loss=True)
    assert_equals_large_batch(got, reference(optimizer), windows_of(sequences(), STEPS),
                              context=f"{path}, {optimizer}, {exec_mode}")


def test_weighting_by_sequences_instead_of_tokens_is_caught():
    """The per-sample weighting of the same token means (each micro-batch weighs its 3 sequences) is off."""
    got = train_path("accumulator", functools.partial(_per_sample, "momentum"), list(sequences()), STEPS)
    windows = windows_of(sequences(), STEPS)
    errors = update_errors(got, reference("momentum")(windows), reference("momentum")([]))
    assert max(errors.values()) > 0.1


class _MeanOnly(nn.Cell):
    def __init__(self, token_loss):
        super().__init__(auto_prefix=False)
        self.token_loss = token_loss

    def construct(self, ids):
        return self.token_loss(ids)[0]


def _per_sample(optimizer):
    loss_net, _, opt = make(optimizer)
    return _MeanOnly(loss_net), None, opt

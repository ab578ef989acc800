"""One rank of the DATA_PARALLEL tests, launched by msrun (see test_data_parallel.py and test_two_nodes.py).

Arguments: OUT SCENARIO [SCENARIO ...], each SCENARIO ``MODE:CELL:WINDOWS:STEPS[:OVERFLOW_RANK:OVERFLOW_WINDOW:
OVERFLOW_STEP]`` (:func:`scenario`). The scenarios run one after another in the same two processes (one launch,
one communication set-up: a launch costs both processes MindSpore's start), each saving this rank's parameters,
counters and per-window outputs to OUT/<scenario with '_' for ':'>/rank_<r>.npz (:func:`load`). In each, the rank
trains a copy of SmallConvNet with an accumulation cell on its own micro-batches (the union over ranks is what
single-process training sees). MODE is graph or pynative; in GRAPH_MODE the first scenario's graphs are saved to
OUT/graphs_<rank>. CELL:
'plain' TrainAccuStepsCell; 'dynamic' the loss-scale cell with a dynamic scale (an inf planted where OVERFLOW_*
say); 'model_accu' is 'plain' trained by Model_ACCU on a dataset of the rank's micro-batches; 'tokens' trains the
token tagger with a (loss, num_items) loss on micro-batches holding different numbers of real tokens on each rank,
with the cell choosing its mode itself; 'clip' is 'plain' with clip_norm=CLIP_NORM; 'noise' is 'plain' measuring
the noise scale, its outputs each window's (grad_sq, noise_trace). 'mean_false' sets gradients_mean=False and
trains 'plain', then an Accumulator in a jit step on a second copy of the network (saved as
'accumulator:<name>'); 'uneven_flush' trains only such an Accumulator, rank 0 on one micro-batch more than rank 1,
and flushes on both; 'uneven_epochs' gives Model_ACCU one micro-batch more on rank 0 and saves the refusal's
message as 'refusal' ('uneven_steps' gives rank 1 twice rank 0's N); 'driver' is 'plain''s network trained by
GradientAccumulation.train_process on a dataset of the rank's micro-batches, and 'driver_uneven_steps' is it given
'uneven_steps''s N and data (its refusal saved); 'plan' plans a micro-batch on both ranks
(:func:`plan_on_every_rank`); 'rule_<RULE>' trains test_lr_engine's softmax regression with N by its schedule and
lr_scaling=RULE (:func:`train_rule`; WINDOWS and STEPS are not read).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo_lenet"))

import source_cache  # noqa: E402  (tests/, this file's folder)
from src.cpu_speed import apply_env_defaults, set_mode  # noqa: E402

apply_env_defaults()
source_cache.install()  # each function's source read once, as in the test processes

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init, release  # noqa: E402

import ms_accum  # noqa: E402
from helpers import build, build_tagger, micro_batches, numpy_dataset, token_batches  # noqa: E402

RANKS_DATA_SEED = 7
TOKEN_COUNTS = (15, 4, 9, 11, 2, 17, 6, 13, 1, 18, 8, 3)  # real tokens of 18 slots, cycled over the stream
CLIP_NORM = 0.05  # well under the windows' gradient norms (about 0.5)


def rank_batches(rank, world, windows, steps, size=4):
    """Rank r's micro-batches: a slice of one global stream, so the union is known to every process."""
    everything = micro_batches([size * world] * (windows * steps), seed=RANKS_DATA_SEED)
    return [(x[rank * size:(rank + 1) * size], y[rank * size:(rank + 1) * size]) for x, y in everything]


def union_windows(windows, steps, world=2):
    """What single-process training sees: window w = every rank's micro-batches of window w."""
    per_rank = [rank_batches(r, world, windows, steps) for r in range(world)]
    return [[per_rank[r][w * steps + s] for r in range(world) for s in range(steps)] for w in range(windows)]


def rank_token_batches(rank, world, windows, steps):
    """Rank r's token micro-batches: micro-batch i of the global stream goes to rank i % world."""
    count = windows * steps * world
    everything = token_batches([TOKEN_COUNTS[i % len(TOKEN_COUNTS)] for i in range(count)], seed=RANKS_DATA_SEED)
    return everything[rank::world]


def train_tokens(cell, batches):
    """Every micro-batch through the cell in automatic mode; the update calls' outputs."""
    outputs = []
    for index, batch in enumerate(batches):
        result = cell(*map(Tensor, batch))
        if (index + 1) % cell.accumulation_steps == 0:
            outputs.append([float(np.asarray(result.asnumpy()).reshape(-1)[0])])
    return outputs


def scenario(mode, cell_kind, windows, steps, *overflow):
    """The argument naming one scenario (see the module's docstring)."""
    return ":".join(str(value) for value in (mode, cell_kind, windows, steps, *overflow))


def load(out, spec, world=2):
    """Every rank's saved arrays of scenario `spec` run with OUT `out`."""
    return [dict(np.load(os.path.join(out, spec.replace(":", "_"), f"rank_{r}.npz"))) for r in range(world)]


def main():
    out, specs = sys.argv[1], sys.argv[2:]
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    for index, spec in enumerate(specs):
        mode, cell_kind, windows, steps, *overflow = spec.split(":")
        set_mode(mode)
        ms.set_context(save_graphs=1 if index == 0 and mode == "graph" else 0,
                       save_graphs_path=os.path.join(out, f"graphs_{os.environ.get('RANK_ID', 'x')}"))
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     gradients_mean=cell_kind != "mean_false", device_num=world)
        target = os.path.join(out, spec.replace(":", "_"))
        os.makedirs(target, exist_ok=True)
        arrays = run_scenario(rank, world, cell_kind, int(windows), int(steps),
                              tuple(int(v) for v in overflow) or None)
        np.savez(os.path.join(target, f"rank_{rank}.npz"), **arrays)
        print(f"rank {rank}/{world} {spec} done", flush=True)
    print(f"rank {rank}/{world} done", flush=True)
    release()


def run_scenario(rank, world, cell_kind, windows, steps, overflow):
    """One scenario on this rank; the arrays it saves."""
    if cell_kind == "plan":
        return plan_on_every_rank(rank, world)
    if cell_kind.startswith("rule_"):
        return train_rule(rank, world, cell_kind[len("rule_"):])
    refusal = ""
    if cell_kind == "tokens":
        net, loss_net, opt = build_tagger("momentum")
    else:
        net, loss, opt = build("momentum")
        loss_net = nn.WithLossCell(net, loss)
    if cell_kind in ("uneven_steps", "driver_uneven_steps"):  # rank 1 given twice rank 0's N
        steps *= 1 + rank
    if cell_kind in ("driver", "driver_uneven_steps"):  # the driver builds its cell, and trains it on the data
        trainer = ms_accum.GradientAccumulation(loss_net, None, opt)
        cell = trainer.cell
        data = rank_batches(rank, world, windows, 2)[:windows * 2] if cell_kind == "driver_uneven_steps" else \
            rank_batches(rank, world, windows, steps)
        try:
            trainer.train_process(1, numpy_dataset(data), steps, ckpt_path=None)
        except ValueError as error:
            refusal = str(error)
        outputs = []
    elif cell_kind in ("plain", "tokens", "clip", "model_accu", "noise", "mean_false", "uneven_flush", "uneven_epochs",
                       "uneven_steps"):
        cell = ms_accum.TrainAccuStepsCell(loss_net, opt, accumulation_steps=steps,
                                           clip_norm=CLIP_NORM if cell_kind == "clip" else None,
                                           noise_scale=cell_kind == "noise")
    else:
        cell = ms_accum.TrainAccuStepsWithLossScaleCell(
            loss_net, opt, nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000), accumulation_steps=steps)
    if cell_kind in ("driver", "driver_uneven_steps"):
        pass
    elif cell_kind == "model_accu":
        ms_accum.Model_ACCU(cell).train(1, numpy_dataset(rank_batches(rank, world, windows, steps)),
                                        dataset_sink_mode=False)
        outputs = []
    elif cell_kind == "tokens":
        outputs = train_tokens(cell, rank_token_batches(rank, world, windows, steps))
    elif cell_kind == "uneven_flush":
        outputs = []
    elif cell_kind in ("uneven_epochs", "uneven_steps"):
        extra = 1 if rank == 0 and cell_kind == "uneven_epochs" else 0
        data = numpy_dataset(rank_batches(rank, world, windows + 1, 2)[:windows * 2 + extra])
        try:
            ms_accum.Model_ACCU(cell).train(1, data, dataset_sink_mode=False)
        except ValueError as error:
            refusal = str(error)
        outputs = []
    elif cell_kind == "noise":
        outputs = train_noise(cell, rank_batches(rank, world, windows, steps), windows, steps)
    else:
        outputs = train_windows(cell, rank_batches(rank, world, windows, steps), windows, steps, overflow, rank)
    arrays = {f"param:{p.name}": p.asnumpy() for p in net.get_parameters()}
    if cell_kind == "mean_false":
        trained = train_accumulator(rank_batches(rank, world, windows, steps)[:windows * steps], steps)
        arrays.update({f"accumulator:{name}": value for name, value in trained.items()})
    if cell_kind == "uneven_flush":
        extra = 1 if rank == 0 else 0
        trained = train_accumulator(rank_batches(rank, world, windows + 1, steps)[:windows * steps + extra], steps,
                                    flush=True)
        arrays.update({f"accumulator:{name}": value for name, value in trained.items()})
    arrays.update({f"opt:{p.name}": p.asnumpy() for p in opt.get_parameters()})
    arrays["outputs"] = np.array(outputs, np.float64)
    arrays["refusal"] = np.array(refusal)
    arrays["global_step"] = opt.global_step.asnumpy()
    arrays["accu_grads_zero"] = np.array(all(not g.asnumpy().any() for g in cell.accu_grads))
    return arrays


PLAN_PEAKS_MIB = {0: (100, 10), 1: (100, 14)}  # (fixed, per sample) by rank: rank 1's micro-batches cost more


def plan_on_every_rank(rank, world):
    """plan_micro_batch with world=2, each rank measuring its own peaks (PLAN_PEAKS_MIB): rank 0 alone would take
    micro-batch 8 of a 200 MiB budget (180 MiB), rank 1 only 4 (212 MiB at 8); both must take 4."""
    fixed, per_sample = PLAN_PEAKS_MIB[rank]
    plan = ms_accum.plan_micro_batch(lambda b: ms_accum.Measurement(b, (fixed + per_sample * b) * 2 ** 20), 32,
                                     "200MiB", devices=world, world=world, verbose=False)
    print(f"rank {rank}/{world} planned {plan}", flush=True)
    return {"plan": np.array([plan.micro_batch, plan.steps])}


def train_rule(rank, world, rule):
    """test_lr_engine's windows (N by its SCHEDULE), this rank's slice of each micro-batch, through a
    TrainAccuStepsCell with lr_scaling=`rule` (AdaScale measuring the noise scale) choosing its own mode; the
    weights before and after each window ('window:<w>:<i>', w = -1 before the first), the last factor and the
    progress."""
    from test_lr_engine import BASE_RATE, SCHEDULE, make_net, make_optimizer, rank_windows, weights
    net = make_net()
    optimizer = make_optimizer("momentum", net.trainable_params(), BASE_RATE["momentum"])
    loss_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = ms_accum.TrainAccuStepsCell(loss_net, optimizer, gradient_accumulation_steps=SCHEDULE,
                                       noise_scale=rule == "adascale", lr_scaling=rule)
    cell.set_train(True)
    arrays = {f"window:-1:{i}": value for i, value in enumerate(weights(net))}
    for index, window in enumerate(rank_windows(rank, world)):
        for x, y in window:
            cell(Tensor(x), Tensor(y))
        arrays.update({f"window:{index}:{i}": value for i, value in enumerate(weights(net))})
    arrays["factor"] = cell.accu_lr_factor.asnumpy()
    arrays["progress"] = np.array(cell.lr_state.progress)
    return arrays


def train_accumulator(batches, steps, flush=False):
    """A fresh copy of the network trained by an Accumulator in a jit step on `batches`, the open window applied at
    the end with `flush`; its parameters."""
    net, loss, opt = build("momentum")
    accumulator = ms_accum.Accumulator(opt, steps)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)

    @ms.jit
    def train_step(x, y):
        loss_value, grads = grad_fn(x, y)
        return loss_value, accumulator(grads, x.shape[0])

    for x, y in batches:
        train_step(Tensor(x), Tensor(y))
    if flush:
        accumulator.flush()
    return {p.name: p.asnumpy() for p in net.get_parameters()}


def train_noise(cell, batches, windows, steps):
    """Each window through the cell choosing its own mode; (grad_sq, noise_trace) after each window."""
    outputs = []
    for index, batch in enumerate(batches[:windows * steps]):
        cell(*map(Tensor, batch))
        if (index + 1) % steps == 0:
            outputs.append([float(value.asnumpy()) for value in cell.noise_records[:2]])
    return outputs


def train_windows(cell, batches, windows, steps, overflow, rank):
    """Each window with the mode set per micro-batch, an inf planted where `overflow` says; the update outputs."""
    outputs = []
    for w in range(windows):
        for s in range(steps):
            x, y = batches[w * steps + s]
            if overflow and overflow == (rank, w, s):
                x = x.copy()
                x[0, 0, 0, 0] = np.inf
            cell.set_accumulation(s < steps - 1)
            result = cell(Tensor(x), Tensor(y))
        outputs.append([float(np.asarray(r.asnumpy()).reshape(-1)[0]) for r in
                        (result if isinstance(result, tuple) else (result,))])
    return outputs


if __name__ == "__main__":
    main()

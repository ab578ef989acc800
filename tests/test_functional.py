"""Accumulator: the functional (value_and_grad) loop, in PYNATIVE and inside mindspore.jit, against the large
batch."""
from functools import partial

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, amp, nn

import ms_accum
from helpers import (assert_equals_large_batch, assert_params_equal, build, build_tagger, concat, large_batch,
                     micro_batches, params_of, reference_train, token_batches, token_reference)


def train(optimizer, batches, steps, style, weigh=True, flush=False, seed=0, loss_scaler=None):
    """Every micro-batch through an Accumulator, from Python or from a jit-compiled step; returns the network,
    the optimizer and the flags the accumulator returned."""
    net, loss, opt = build(optimizer, seed)
    loss_net = nn.WithLossCell(net, loss)

    def scaled_loss(x, y):
        return loss_scaler.scale(loss_net(x, y))

    grad_fn = ms.value_and_grad(loss_net if loss_scaler is None else scaled_loss, None, opt.parameters)
    accumulator = ms_accum.Accumulator(opt, steps, loss_scaler=loss_scaler)

    def step(x, y):
        _, grads = grad_fn(x, y)
        return accumulator(grads, x.shape[0]) if weigh else accumulator(grads)

    step = ms.jit(step) if style == "jit" else step
    flags = [bool(step(Tensor(x), Tensor(y)).asnumpy()) for x, y in batches]
    if flush:
        flags.append(bool(accumulator.flush().asnumpy()))
    return net, opt, flags, accumulator


STYLES = ["python", "jit"]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adamw"])
@pytest.mark.parametrize("sizes", [(4, 4, 4, 4), (5, 3, 4, 2)], ids=["equal", "unequal"])
def test_windows_equal_the_large_batch(sizes, optimizer, style):
    batches = micro_batches(sizes * 2, seed=12)
    net, opt, flags, _ = train(optimizer, batches, 4, style)
    assert_equals_large_batch(params_of(net), large_batch(optimizer), [batches[:4], batches[4:]],
                              context=f"{optimizer}, {sizes}, {style}")
    assert flags == [False, False, False, True] * 2
    assert opt.global_step.asnumpy()[0] == 2


@pytest.mark.parametrize("style", STYLES)
def test_without_num_items_every_micro_batch_weighs_the_same(style):
    """The tutorial's intent: the mean of the micro-batch gradients, whatever their sizes."""
    batches = micro_batches((5, 3, 4, 2), seed=13)
    net, _, _, _ = train("sgd", batches, 4, style, weigh=False)

    def mean_of_micro_batch_gradients(windows):
        ref_net, ref_loss, ref_opt = build("sgd")
        grad_fn = ms.value_and_grad(nn.WithLossCell(ref_net, ref_loss), None, ref_opt.parameters)
        for window in windows:
            grads = [grad_fn(Tensor(x), Tensor(y))[1] for x, y in window]
            ref_opt(tuple(Tensor(np.mean([g[i].asnumpy() for g in grads], axis=0)) for i in range(len(grads[0]))))
        return params_of(ref_net)
    assert_equals_large_batch(params_of(net), mean_of_micro_batch_gradients, [batches],
                              context=f"equal weights, {style}")


@pytest.mark.parametrize("style", STYLES)
def test_token_counts_weigh_the_micro_batches(style):
    batches = token_batches((15, 4, 9, 11, 2, 17))
    net, loss_net, opt = build_tagger()
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters, has_aux=True)
    accumulator = ms_accum.Accumulator(opt, 3)

    def step(x, labels, mask):
        (_, tokens), grads = grad_fn(x, labels, mask)
        return accumulator(grads, tokens)

    step = ms.jit(step) if style == "jit" else step
    for batch in batches:
        step(*map(Tensor, batch))
    assert_equals_large_batch(params_of(net), partial(token_reference, "momentum"), [batches[:3], batches[3:]],
                              context=f"tokens, {style}")


@pytest.mark.parametrize("style", STYLES)
def test_flush_applies_the_partial_window_with_its_own_weight(style):
    batches = micro_batches((4, 4, 4, 4, 3), seed=14)
    net, opt, flags, accumulator = train("momentum", batches, 2, style, flush=True)
    assert_equals_large_batch(params_of(net), large_batch("momentum"), [batches[:2], batches[2:4], batches[4:]],
                              context=f"flushed, {style}")
    assert flags == [False, True, False, True, False, True]
    assert not bool(accumulator.flush().asnumpy()), "an empty window has nothing to flush"
    assert opt.global_step.asnumpy()[0] == 3


@pytest.mark.parametrize("style", STYLES)
def test_drop_discards_the_partial_window(style):
    """drop(): the open window's gradients discarded, no step, and the window not counted; the next window is
    its own large batch."""
    batches = micro_batches([4, 3, 5, 4, 2])
    net, loss, opt = build("momentum")
    accumulator = ms_accum.Accumulator(opt, 3)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)

    def step(x, y):
        return accumulator(grad_fn(x, y)[1], x.shape[0])
    step = ms.jit(step) if style == "jit" else step
    for x, y in batches[:2]:
        step(Tensor(x), Tensor(y))
    assert int(accumulator.drop().asnumpy()) == 2
    assert int(accumulator.accu_windows.asnumpy()) == 0 and int(opt.global_step.asnumpy()[0]) == 0
    for x, y in batches[2:]:
        step(Tensor(x), Tensor(y))
    assert_equals_large_batch(params_of(net), partial(reference_train, "momentum"), [batches[2:]],
                              context=f"drop, {style}")


def test_learning_rate_schedule_advances_once_per_window():
    batches = micro_batches((4,) * 6, seed=15)
    net, loss, _ = build("sgd")
    opt = nn.SGD(net.trainable_params(), learning_rate=[0.1, 0.05, 0.025])
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    accumulator = ms_accum.Accumulator(opt, 2)
    for x, y in batches:
        accumulator(grad_fn(Tensor(x), Tensor(y))[1], len(y))
    assert opt.global_step.asnumpy()[0] == 3
    def large_batch_on_the_schedule(windows):
        ref_net, ref_loss, _ = build("sgd")
        ref_opt = nn.SGD(ref_net.trainable_params(), learning_rate=[0.1, 0.05, 0.025])
        step = nn.TrainOneStepCell(nn.WithLossCell(ref_net, ref_loss), ref_opt)
        for window in windows:
            step(*map(Tensor, concat(window)))
        return params_of(ref_net)
    assert_equals_large_batch(params_of(net), large_batch_on_the_schedule, [batches[0:2], batches[2:4], batches[4:6]],
                              context="schedule per window")


@pytest.mark.parametrize("style", STYLES)
def test_overflow_in_one_micro_batch_skips_the_window_and_halves_the_scale_once(style):
    batches = micro_batches((4,) * 6, seed=16)
    poisoned = [(x.copy(), y) for x, y in batches]
    poisoned[1][0][0, 0, 0, 0] = np.inf
    scaler = amp.DynamicLossScaler(2.0 ** 10, 2, 1000)
    net, opt, flags, accumulator = train("momentum", poisoned, 3, style, loss_scaler=scaler)
    assert flags == [False, False, True] * 2
    assert float(scaler.scale_value.asnumpy()) == 512.0, "the scale must be halved once, for the window"
    assert opt.global_step.asnumpy()[0] == 1, "the overflowing window must not step the optimizer"
    assert not bool(accumulator.last_overflow.asnumpy())
    assert_equals_large_batch(params_of(net), large_batch("momentum"), [batches[3:]],
                              context=f"window after the skipped one, {style}")


def test_graph_mode_calls_from_python_compile_once_and_skip_overflows():
    """Called from Python in GRAPH_MODE, the gradients must not be folded into the graph as constants: a NaN
    gradient was once read as 1.0 and the window applied."""
    ms.set_context(mode=ms.GRAPH_MODE)
    batches = micro_batches((4, 3, 4, 2), seed=17)
    net, opt, flags, accumulator = train("momentum", batches, 2, "python")
    assert_equals_large_batch(params_of(net), large_batch("momentum"), [batches[:2], batches[2:]],
                              context="graph mode, called from Python")
    assert len(accumulator.compile_cache) == 1, accumulator.compile_cache
    poisoned = [(x.copy(), y) for x, y in micro_batches((4,) * 4, seed=18)]
    poisoned[0][0][0, 0, 0, 0] = np.nan
    scaler = amp.DynamicLossScaler(2.0 ** 10, 2, 1000)
    net, opt, flags, _ = train("momentum", poisoned, 2, "python", loss_scaler=scaler)
    assert float(scaler.scale_value.asnumpy()) == 512.0 and opt.global_step.asnumpy()[0] == 1
    assert_equals_large_batch(params_of(net), large_batch("momentum"), [poisoned[2:]],
                              context="graph mode, after the skipped window")


@pytest.mark.parametrize("style", STYLES)
def test_gradients_of_the_wrong_parameters_are_refused_before_anything_is_added(style):
    _, _, opt = build("sgd")
    accumulator = ms_accum.Accumulator(opt, 2)
    grads = tuple(Tensor(np.ones(p.shape, np.float32)) for p in opt.parameters)

    def step(grads_in):
        return accumulator(grads_in)

    call = ms.jit(step) if style == "jit" else accumulator
    with pytest.raises(ValueError, match=r"For 'Accumulator', 'grads' must hold one gradient per optimizer "
                                         r"parameter \(4\), but got 3"):
        call(grads[:3])
    swapped = (grads[2],) + grads[1:2] + (grads[0],) + grads[3:]
    with pytest.raises(ValueError, match=r"'grads' must follow optimizer.parameters in order and shape, but "
                                         r"gradient 0 has shape \(4, 48\) where the parameter has \(3, 1, 3, 3\)"):
        call(swapped)
    assert not any(b.asnumpy().any() for b in accumulator.inner_grads), "a refused call added gradients"


def test_gradients_that_are_not_tensors_are_named():
    """Arrays computed outside MindSpore: MindSpore's own error printed the arrays and named no argument."""
    _, _, opt = build("sgd")
    accumulator = ms_accum.Accumulator(opt, 2)
    with pytest.raises(TypeError, match=r"For 'Accumulator', 'grads' must be a tuple of Tensors, one per optimizer "
                                        r"parameter, but gradient 0 is of type ndarray. Compute them with "
                                        r"mindspore.value_and_grad, or wrap arrays in mindspore.Tensor\."):
        accumulator([np.zeros(p.shape, np.float32) for p in opt.parameters], 8)
    assert not any(b.asnumpy().any() for b in accumulator.inner_grads), "a refused call added gradients"


@pytest.mark.parametrize("num_items, got, error", [
    ("8", "str", TypeError), (Tensor(np.ones(2, np.float32)), r"shape \(2,\)", ValueError),
    # a new user's trial: a mask's element weighed 1, in silence, where a Python bool was refused
    (Tensor(True), r"a bool Tensor\. Pass the count itself, for example a mask's sum \(mask\.sum\(\)\)", TypeError)])
def test_num_items_that_is_no_scalar_is_named_as_the_calls_argument(num_items, got, error):
    """It was refused as 'the second output of the loss network', which the Accumulator has none of. A value that is
    no number is a TypeError, as every other wrong type; a Tensor of another shape a ValueError."""
    _, _, opt = build("sgd")
    accumulator = ms_accum.Accumulator(opt, 2)
    with pytest.raises(error, match=rf"For 'Accumulator', 'num_items', the call's second argument, must be a "
                                    rf"scalar Tensor or a number \(the micro-batch's item count\), but got {got}\.$"):
        accumulator(tuple(ms.ops.zeros_like(p) for p in opt.parameters), num_items)
    assert not any(b.asnumpy().any() for b in accumulator.inner_grads), "a refused call added gradients"


@pytest.mark.parametrize("count", [np.int64, np.float32, lambda n: np.array(n, np.float32)],
                         ids=["int64", "float32", "0-d array"])
def test_numpy_scalars_are_numbers_of_items(count):
    """A new user's trial: np.int64(8), an array's element or length as NumPy gives it, was refused as 'a scalar
    Tensor or a number, but got int64'. It weighs as the number it is; a NumPy bool is still refused."""
    batches = micro_batches((5, 3, 4, 2) * 2, seed=12)
    net, loss, opt = build("sgd", 0)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    accumulator = ms_accum.Accumulator(opt, 4)
    for x, y in batches:
        accumulator(grad_fn(Tensor(x), Tensor(y))[1], count(len(x)))
    assert_equals_large_batch(params_of(net), large_batch("sgd"), [batches[:4], batches[4:]], context=str(count))
    with pytest.raises(TypeError, match=r"'num_items', the call's second argument, must be a scalar Tensor or a "
                                        r"number \(the micro-batch's item count\), but got bool\.$"):
        accumulator(tuple(ms.ops.zeros_like(p) for p in opt.parameters), np.bool_(True))


def test_accumulate_step_is_checked():
    _, _, opt = build("sgd")
    with pytest.raises(ValueError, match="For 'Accumulator', 'gradient_accumulation_steps' must be an int >= 1, but "
                                         "got 0"):
        ms_accum.Accumulator(opt, 0)
    with pytest.raises(ValueError, match="For 'Accumulator', 'accumulate_step' [(]gradient_accumulation_steps[)] "
                                         "must be "
                                         "an int >= 1, but got 0"):
        ms_accum.Accumulator(opt, accumulate_step=0)  # the tutorial's name, accepted and named in the message
    with pytest.raises(TypeError, match="For 'Accumulator', N must be given once, as 'gradient_accumulation_steps', "
                                        "but got 'gradient_accumulation_steps' and 'accumulate_step'"):
        ms_accum.Accumulator(opt, 2, accumulate_step=2)
    with pytest.raises(TypeError, match="For 'Accumulator', 'gradient_accumulation_steps' .* is required"):
        ms_accum.Accumulator(opt)
    with pytest.raises(TypeError, match="For 'Accumulator', 'optimizer' must be a mindspore.nn optimizer"):
        ms_accum.Accumulator(None, 2)
    with pytest.raises(TypeError, match=r"For 'Accumulator', 'loss_scaler' must be a loss-scale update cell .*"
                                        r"a mindspore.amp.LossScaler \(DynamicLossScaler, StaticLossScaler\), a "
                                        r"scale Tensor or None, but got int"):
        ms_accum.Accumulator(opt, 2, loss_scaler=1024)
    with pytest.raises(ValueError, match=r"For 'Accumulator', the loss scale of 'loss_scaler' must be a finite number "
                                         r"> 0, but it starts at nan"):
        ms_accum.Accumulator(opt, 2, loss_scaler=ms.amp.DynamicLossScaler(float("nan"), 2, 100))


@pytest.mark.parametrize("nonfinite", ["skip", "apply"])
def test_no_items_names_the_accumulator(nonfinite):
    """Raised from the window end's skip branch, or (nonfinite="apply": none) from a branch of its own."""
    net, loss, opt = build("sgd")
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    x, y = micro_batches((4,))[0]
    with pytest.raises(ValueError, match=r"For 'Accumulator', 'num_items' must be a finite number > 0 for every "
                                         r"micro-batch of a window, .* but of this window's 1 micro-batches 0 had "
                                         r"none .* and the smallest num_items was 0.*build a new "
                                         r"Accumulator"):
        ms_accum.Accumulator(opt, 1, nonfinite=nonfinite)(grad_fn(Tensor(x), Tensor(y))[1], 0)


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("given", ["number", "tensor-jit"])
def test_items_that_are_not_finite_are_refused_not_skipped(given, bad):
    """A NaN or inf num_items, as a Python number or a Tensor in the user's jit step, refuses the window: it was
    taken, and the window skipped as if its gradient had overflowed (a new user's trial, 2026-12-06)."""
    net, loss, opt = build("sgd")
    before = params_of(net)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    accumulator = ms_accum.Accumulator(opt, 2)
    (x, y), (x2, y2) = micro_batches((4, 4))

    def step(x, y, items):
        return accumulator(grad_fn(x, y)[1], items)

    if given == "tensor-jit":
        step, items = ms.jit(step), Tensor(float(bad), ms.float32)
    else:
        items = float(bad)
    step(Tensor(x), Tensor(y), 4.0 if given == "number" else Tensor(4.0, ms.float32))
    with pytest.raises(ValueError, match=r"'num_items' must be a finite number > 0 for every micro-batch of a "
                                         r"window, .* the smallest num_items was -inf \(omitted ones counted as "
                                         r"1; -inf stands for a NaN or an infinite one\)"):
        step(Tensor(x2), Tensor(y2), items)
    assert_params_equal(params_of(net), before, context="nothing applied")
    assert opt.global_step.asnumpy()[0] == 0


@pytest.mark.parametrize("path", ["accumulator", "three-cells"])
def test_a_window_compiles_without_mindspore_warning_of_a_lost_side_effect(capfd, path):
    """An output of the window's end unpacked and left unused made MindSpore 2.10 warn, on every user's first
    window, "ClearIsolatedNodes] Some side effect nodes were eliminated by mistake" (harmless, but alarming)."""
    net, loss, opt = build("sgd")
    (x, y), (x2, y2) = micro_batches((4, 4), seed=18)
    if path == "accumulator":
        grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
        accumulator = ms_accum.Accumulator(opt, 2)

        @ms.jit
        def step(x, y):
            return accumulator(grad_fn(x, y)[1], x.shape[0])
        step(Tensor(x), Tensor(y))
        assert bool(step(Tensor(x2), Tensor(y2)))
    else:
        grad_sum = opt.parameters.clone(prefix="grad_sum", init="zeros")
        forward_backward = ms_accum.TrainForwardBackward(nn.WithLossCell(net, loss), opt, grad_sum)
        forward_backward(Tensor(x), Tensor(y))
        forward_backward(Tensor(x2), Tensor(y2))
        ms_accum.TrainOptim(opt, grad_sum)()
    assert opt.global_step.asnumpy()[0] == 1
    err = capfd.readouterr().err
    assert "eliminated by mistake" not in err, err[-2000:]


@pytest.mark.parametrize("items", [(4, None), (4, 0)], ids=["mixed", "zero"])
def test_the_items_check_as_an_assert_stops_the_window(monkeypatch, items):
    """With MindSpore's compile cache on, the window's one items check is an Assert (a raise cannot be cached): a
    mixed or empty window still stops before the update, inside a jit step."""
    monkeypatch.setattr(ms_accum.core.engine, "compile_cache_on", lambda: True)
    net, loss, opt = build("sgd")
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    with pytest.warns(UserWarning, match="For 'Accumulator', MindSpore's compile cache is on, but it reloads a "
                                         "cached jit function wrongly"):  # a new user's second run trained nothing
        accumulator = ms_accum.Accumulator(opt, 2)
    assert accumulator.compile_cache_on

    @ms.jit
    def weighed(x, y, num_items):
        return accumulator(grad_fn(x, y)[1], num_items)

    @ms.jit
    def unweighed(x, y):
        return accumulator(grad_fn(x, y)[1])

    (x, y), (x2, y2) = micro_batches((4, 4), seed=17)
    before = params_of(net)
    weighed(Tensor(x), Tensor(y), Tensor(items[0], ms.float32))
    with pytest.raises(RuntimeError, match="assert failed"):
        if items[1] is None:
            unweighed(Tensor(x2), Tensor(y2))
        else:
            weighed(Tensor(x2), Tensor(y2), Tensor(items[1], ms.float32))
    assert_params_equal(params_of(net), before, context="nothing applied")
    assert opt.global_step.asnumpy()[0] == 0


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("ends_with", ["update", "flush"])
def test_a_window_mixing_given_and_omitted_items_is_refused(style, ends_with):
    """Omitted num_items weigh 1 each: beside item counts that is a silently wrong mean, so the window is refused
    before the update, whichever call (the window's last, or flush) would apply it."""
    net, loss, opt = build("sgd")
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    accumulator = ms_accum.Accumulator(opt, 3)

    def weighed(x, y):
        return accumulator(grad_fn(x, y)[1], x.shape[0])

    def unweighed(x, y):
        return accumulator(grad_fn(x, y)[1])

    if style == "jit":
        weighed, unweighed = ms.jit(weighed), ms.jit(unweighed)
    (x, y), (x2, y2), (x3, y3) = micro_batches((8, 4, 2), seed=16)
    before = params_of(net)
    weighed(Tensor(x), Tensor(y))
    unweighed(Tensor(x2), Tensor(y2))
    message = (r"For 'Accumulator', 'num_items' must be a finite number > 0 for every micro-batch of a window, and "
               r"given for every micro-batch or for none, but of this window's 2 micro-batches 1 had none .* and the "
               r"smallest num_items was 1.*The window was not applied")
    with pytest.raises(ValueError, match=message.replace(" 2 ", " 3 ") if ends_with == "update" else message):
        if ends_with == "update":
            weighed(Tensor(x3), Tensor(y3))
        else:
            accumulator.flush()
    assert_params_equal(params_of(net), before, context="nothing applied")
    assert opt.global_step.asnumpy()[0] == 0


def test_omitting_items_in_every_window_is_not_mixing():
    """A window of omitted items after a window of given ones (and the reverse) is not a mixed window."""
    net, loss, opt = build("sgd")
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, loss), None, opt.parameters)
    accumulator = ms_accum.Accumulator(opt, 2)
    batches = micro_batches((4, 4, 4, 4, 4, 4), seed=17)
    for index, (x, y) in enumerate(batches):
        grads = grad_fn(Tensor(x), Tensor(y))[1]
        accumulator(grads, 4) if index // 2 != 1 else accumulator(grads)  # pylint: disable=expression-not-assigned
    assert_equals_large_batch(params_of(net), large_batch("sgd"), [batches[:2], batches[2:4], batches[4:]],
                              context="given, omitted, given")
    assert opt.global_step.asnumpy()[0] == 3

"""Worker tensors in ordinary PyTorch workflows: torch.save/pickle, deepcopy, moves to the CPU.

Each case runs the same seeded code eagerly (the oracle) and with gt, and compares.
"""

import contextlib
import copy
import functools
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from models import mlp

import gt_core

SGD = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
ADAM = functools.partial(torch.optim.Adam, lr=1e-2)
OPTIMIZERS = pytest.mark.parametrize(
    "make_opt",
    [
        SGD,
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, foreach=True),
        ADAM,
        functools.partial(torch.optim.Adam, lr=1e-2, foreach=True),
    ],
    ids=["sgd-momentum", "sgd-momentum-foreach", "adam", "adam-foreach"],
)


def _ctx(on_worker):
    return gt_core.capture() if on_worker else contextlib.nullcontext()


def _data():
    return torch.randn(16, 32), torch.randn(16, 4)


def _steps(model, opt, x, y, n):
    losses = []
    for _ in range(n):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _trained(on_worker, make_opt=SGD, steps=3, model_fn=mlp):
    """(model, opt, x, y) after ``steps`` seeded steps, on the worker when ``on_worker``."""
    with _ctx(on_worker):
        torch.manual_seed(0)
        model = model_fn()
        opt = make_opt(model.parameters())
        x, y = _data()
        _steps(model, opt, x, y, steps)
    return model, opt, x, y


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _assert_same_tree(got, ref):
    """Same containers, keys and values; every tensor plain, of eager's type and flags."""
    assert type(got) is type(ref)
    if isinstance(ref, torch.Tensor):
        assert not gt_core.is_remote(got)
        assert got.requires_grad == ref.requires_grad
        torch.testing.assert_close(got.detach(), ref.detach(), atol=1e-6, rtol=1e-5)
    elif isinstance(ref, dict):
        assert list(got) == list(ref)
        for k in ref:
            _assert_same_tree(got[k], ref[k])
    elif isinstance(ref, list | tuple):
        assert len(got) == len(ref)
        for a, b in zip(got, ref, strict=True):
            _assert_same_tree(a, b)
    else:
        assert got == ref


# -- torch.save / pickle ------------------------------------------------------------------
def test_save_model_state_dict_loads_as_eager_tensors(process):
    ref, *_ = _trained(False)
    got, *_ = _trained(True)
    loaded = torch.load(_saved(got.state_dict()))
    _assert_same_tree(loaded, torch.load(_saved(ref.state_dict())))
    assert all(type(v) is torch.Tensor for v in loaded.values())
    assert all(gt_core.is_remote(p) for p in got.parameters())  # saving moved nothing


@pytest.mark.parametrize("make_opt", [SGD, ADAM], ids=["sgd-momentum", "adam"])
def test_save_optimizer_state_dict_loads_as_eager_tensors(process, make_opt):
    _, ref, *_ = _trained(False, make_opt)
    _, got, *_ = _trained(True, make_opt)
    loaded = torch.load(_saved(got.state_dict()))
    _assert_same_tree(loaded, torch.load(_saved(ref.state_dict())))
    assert loaded["state"]  # a few steps made state: momentum buffers, Adam's moments


def test_keep_vars_state_dict_saves_parameters(process):
    ref, *_ = _trained(False)
    got, *_ = _trained(True)
    loaded = torch.load(_saved(got.state_dict(keep_vars=True)))
    _assert_same_tree(loaded, torch.load(_saved(ref.state_dict(keep_vars=True))))
    assert all(type(v) is torch.nn.Parameter and v.requires_grad for v in loaded.values())


def test_pickle_nested_containers_keeps_sharing(process):
    def build():
        torch.manual_seed(0)
        a = torch.randn(3, requires_grad=True)
        b = torch.randn(2, 2) * 2
        return {"list": [a, (b, 1.5)], "again": a, "name": "x"}

    ref = pickle.loads(pickle.dumps(build()))
    with gt_core.capture():
        obj = build()
    got = pickle.loads(pickle.dumps(obj))
    _assert_same_tree(got, ref)
    assert got["list"][0] is got["again"]  # one object pickled once, as eager


@OPTIMIZERS
def test_load_back_inside_capture_and_train_on(inprocess, make_opt):
    """A checkpoint read outside a capture, loaded into a fresh model and optimizer in one."""

    def resume(on_worker):
        model, opt, x, y = _trained(on_worker, make_opt)
        sd, osd = torch.load(_saved(model.state_dict())), torch.load(_saved(opt.state_dict()))
        with _ctx(on_worker):
            torch.manual_seed(1)  # other initial values: what the checkpoint replaces
            model2 = mlp()
            opt2 = make_opt(model2.parameters())
            model2.load_state_dict(sd)
            opt2.load_state_dict(osd)
            losses = _steps(model2, opt2, x, y, 3)
        return model2, opt2, losses

    ref, ref_opt, ref_losses = resume(False)
    got, got_opt, got_losses = resume(True)
    for a, b in zip(got_losses, ref_losses, strict=True):
        assert_close(a, b)
    assert all(gt_core.is_remote(p) for p in got.parameters())
    _assert_same_tree(
        torch.load(_saved(got_opt.state_dict())), torch.load(_saved(ref_opt.state_dict()))
    )
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b)
    # the optimizer's state joined its parameters on the worker
    assert all(gt_core.is_remote(v) for s in got_opt.state.values() for v in s.values())


def test_torch_load_inside_capture_makes_worker_tensors(inprocess):
    ref, *_ = _trained(False)
    buf = _saved(ref.state_dict())
    with gt_core.capture():
        loaded = torch.load(buf)
        doubled = {k: v * 2 for k, v in loaded.items()}
    assert all(gt_core.is_remote(v) for v in loaded.values())
    for k, v in ref.state_dict().items():
        assert_close(loaded[k], v)
        assert_close(doubled[k], v * 2)


# -- deepcopy -----------------------------------------------------------------------------
@pytest.mark.parametrize("inside", [True, False], ids=["inside-capture", "outside-capture"])
def test_deepcopy_model_is_made_on_the_worker_and_independent(process, inside):
    def copy_and_train(on_worker):
        model, opt, x, y = _trained(on_worker)
        before = [p.cpu() if on_worker else p.detach().clone() for p in model.parameters()]
        syncs = _syncs() if on_worker else 0
        with _ctx(on_worker and inside):
            twin = copy.deepcopy(model)
            if on_worker:  # (inside: the capture's own end is a sync)
                assert _syncs() == syncs, "deepcopy fetched values: it should clone on the worker"
        with _ctx(on_worker):
            opt2 = SGD(twin.parameters())
            losses = _steps(twin, opt2, x, y, 3)
        for p, b in zip(model.parameters(), before, strict=True):
            assert_close(p, b)  # training the copy left the original alone
        return model, twin, losses

    ref, ref_twin, ref_losses = copy_and_train(False)
    got, got_twin, got_losses = copy_and_train(True)
    for a, b in zip(got_losses, ref_losses, strict=True):
        assert_close(a, b)
    for (name, a), (_, b) in zip(
        got_twin.named_parameters(), ref_twin.named_parameters(), strict=True
    ):
        assert gt_core.is_remote(a), name
        assert isinstance(a, torch.nn.Parameter) and isinstance(b, torch.nn.Parameter), name
        assert a.requires_grad == b.requires_grad, name
        assert_close(a, b)
    assert not set(map(id, got_twin.parameters())) & set(map(id, got.parameters()))


def _syncs():
    return gt_core.client.capture.session().counters["syncs"]


def test_deepcopy_keeps_grads_and_flags_as_eager(process):
    """Parameters: no .grad (Parameter.__deepcopy__); other leaves: .grad and attributes."""

    def build():
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(3, 2))
        t = torch.randn(3, 2, requires_grad=True)
        (w * t).sum().backward()
        t.note = "kept"
        return w, t

    rw, rt = build()
    with gt_core.capture():
        gw, gt = build()
    cw, ct = copy.deepcopy((rw, rt))
    dw, dt = copy.deepcopy((gw, gt))
    assert isinstance(dw, torch.nn.Parameter) and gt_core.is_remote(dw)
    assert (dw.grad is None) == (cw.grad is None)
    assert dt.requires_grad and dt.is_leaf and dt.note == "kept"
    assert gt_core.is_remote(dt.grad) and dt.grad is not gt.grad
    assert_close(dt.grad, ct.grad)
    assert_close(dw, cw)
    assert_close(dt, ct)


def test_deepcopy_respects_memo_tied_weights(process):
    def tied():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4))
        m[1].weight = m[0].weight
        return m

    with gt_core.capture():
        model = tied()
    twin = copy.deepcopy(model)
    assert twin[0].weight is twin[1].weight
    assert twin[0].weight is not model[0].weight
    assert_close(twin[0].weight, tied()[0].weight)


def test_shallow_copy_shares_the_value_as_eager(inprocess):
    def run(on_worker):
        with _ctx(on_worker):
            w = torch.nn.Parameter(torch.zeros(3))
            t = torch.zeros(2)
            cw, ct = copy.copy(w), copy.copy(t)
            with torch.no_grad():
                w.add_(1)
                t.add_(2)
        return cw, ct

    (rw, rt), (gw, gt) = run(False), run(True)
    assert gt_core.is_remote(gw) and gt_core.is_remote(gt)
    assert isinstance(gw, torch.nn.Parameter) == isinstance(rw, torch.nn.Parameter)
    assert gw.requires_grad == rw.requires_grad and gt.requires_grad == rt.requires_grad
    assert_close(gw, rw)  # the originals' in-place updates show through the copies
    assert_close(gt, rt)


def test_deepcopy_of_a_non_leaf_fails_as_eager(process):
    with gt_core.capture():
        y = torch.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(torch.ones(2, requires_grad=True) * 2)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(y)


@pytest.mark.parametrize("make_opt", [SGD, ADAM], ids=["sgd-momentum", "adam"])
def test_deepcopy_model_and_optimizer_together(process, make_opt):
    def copy_and_train(on_worker):
        model, opt, x, y = _trained(on_worker, make_opt)
        saved = torch.load(_saved(opt.state_dict()))
        with _ctx(on_worker):
            twin, twin_opt = copy.deepcopy((model, opt))
            state_copy = copy.deepcopy(opt.state_dict())
            losses = _steps(twin, twin_opt, x, y, 3)
        # the copies' steps changed neither the original optimizer's state nor its copy
        _assert_same_tree(torch.load(_saved(opt.state_dict())), saved)
        _assert_same_tree(torch.load(_saved(state_copy)), saved)
        assert set(twin_opt.state) == set(twin.parameters())
        return twin, losses

    ref, ref_losses = copy_and_train(False)
    got, got_losses = copy_and_train(True)
    for a, b in zip(got_losses, ref_losses, strict=True):
        assert_close(a, b)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b)


# -- moves to the CPU ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "move", [lambda m: m.cpu(), lambda m: m.to("cpu"), lambda m: m.to(torch.device("cpu"))]
)
def test_model_cpu_makes_plain_tensors(inprocess, move):
    ref, ref_opt, x, y = _trained(False)
    got, got_opt, *_ = _trained(True)
    params = list(got.parameters())
    uploads = gt_core.client.capture.session().counters["uploads"]
    assert move(got) is got
    assert gt_core.client.capture.session().counters["uploads"] == uploads  # nothing went back
    for (name, a), b in zip(got.named_parameters(), ref.parameters(), strict=True):
        assert not gt_core.is_remote(a), name
        assert type(a) is torch.nn.Parameter and a.requires_grad, name
        torch.testing.assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-5)
    # the same Parameter objects: the optimizer still holds them
    assert all(a is b for a, b in zip(got.parameters(), params, strict=True))
    assert all(a is b for a, b in zip(got_opt.param_groups[0]["params"], params, strict=True))
    # and the model now runs eagerly, as eager's model does
    with torch.no_grad():
        torch.testing.assert_close(got(x), ref(x), atol=1e-6, rtol=1e-5)


def test_model_cpu_moves_grads_and_buffers(inprocess):
    def build(on_worker):
        with _ctx(on_worker):
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
            m(torch.randn(5, 4)).sum().backward()
        return m

    ref, got = build(False), build(True)
    got.cpu()
    for (name, a), b in zip(got.state_dict().items(), ref.state_dict().values(), strict=True):
        assert type(a) is torch.Tensor, name
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert type(a.grad) is torch.Tensor
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_model_cpu_with_swap_on_conversion(inprocess):
    ref, *_ = _trained(False)
    got, *_ = _trained(True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        got.cpu()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert type(a) is torch.nn.Parameter
        torch.testing.assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-5)


def test_model_cpu_inside_capture_fetches(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        model.cpu()  # .cpu() is an explicit fetch, in a capture too
    torch.manual_seed(0)
    ref = mlp()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert type(a) is torch.nn.Parameter
        torch.testing.assert_close(a.detach(), b.detach())


def test_model_to_device_inside_capture_stays_on_the_worker(inprocess):
    """In a capture, cpu is the device proxies report: `model.to(device)` must not fetch."""

    def run(on_worker):
        with _ctx(on_worker):
            torch.manual_seed(0)
            model = mlp()
            device = next(model.parameters()).device
            model.to(device)
            x = torch.randn(2, 32).to(device)
            return model, x, model(x.to("cpu"))

    _, _, ref = run(False)
    model, x, out = run(True)
    assert all(gt_core.is_remote(p) for p in model.parameters())
    assert gt_core.is_remote(x) and gt_core.is_remote(out)
    assert_close(out, ref)


def test_tensor_to_cpu_fetches_outside_capture(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        x = torch.randn(3, 4)
        y = x * 3
    torch.manual_seed(0)
    ref = torch.randn(3, 4) * 3
    moved = (y.cpu(), y.to("cpu"), y.to(torch.device("cpu")), y.to(device="cpu"))
    for got in (*moved, y.to("cpu", copy=True), y.to("cpu", non_blocking=True)):
        assert type(got) is torch.Tensor
        torch.testing.assert_close(got, ref)
    as_double = y.to("cpu", torch.float64)
    assert type(as_double) is torch.Tensor and as_double.dtype == torch.float64
    torch.testing.assert_close(as_double, ref.double())


def test_to_dtype_and_to_tensor_still_record(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        x = torch.randn(3, 4)
        other = torch.zeros(2, dtype=torch.float64)
        syncs = _syncs()
        a = x.to(torch.float64)
        b = x.to(other)
        c = x.to(dtype=torch.float16)
        d = x.to("cpu", torch.float64)  # in a capture, cpu is the worker: a recorded cast
        assert _syncs() == syncs
    torch.manual_seed(0)
    ref = torch.randn(3, 4)
    for got, want in ((a, ref.double()), (b, ref.double()), (c, ref.half()), (d, ref.double())):
        assert gt_core.is_remote(got)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)
    # outside a capture, a cast stays on the worker too
    e = a.to(torch.float32)
    assert gt_core.is_remote(e)
    torch.testing.assert_close(e.cpu(), ref)


def test_fetched_value_does_not_follow_later_steps(inprocess):
    """A value fetched (in-process worker included) is a copy: later in-place ops leave it."""
    with gt_core.capture():
        x = torch.zeros(3)
        before = x.cpu()
        x.add_(1)
    torch.testing.assert_close(before, torch.zeros(3))
    torch.testing.assert_close(x.cpu(), torch.ones(3))

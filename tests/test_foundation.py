"""Plain PyTorch on the worker, equal to eager (the oracle) op for op."""

import functools
import os
import signal
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from models import Block, SmallCNN, mlp, train

import gt_core


def _compare(make_model, make_opt, make_data, loss_fn, steps=6, atol=1e-6, **kw):
    ref, ref_losses = train(make_model, make_opt, make_data, loss_fn, steps, on_worker=False, **kw)
    got, got_losses = train(make_model, make_opt, make_data, loss_fn, steps, on_worker=True, **kw)
    assert all(gt_core.is_remote(p) for p in got.parameters())
    assert got_losses == pytest.approx(ref_losses, abs=atol)
    for (name, a), b in zip(got.state_dict().items(), ref.state_dict().values(), strict=True):
        assert_close(a, b, atol=atol, name=name)
    return got


def _mlp_data():
    return torch.randn(16, 32), torch.randn(16, 4)


@pytest.mark.parametrize(
    "make_opt",
    [
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, foreach=True),
        functools.partial(torch.optim.Adam, lr=1e-2),
        functools.partial(torch.optim.Adam, lr=1e-2, foreach=False),
        functools.partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1),
        functools.partial(torch.optim.AdamW, lr=1e-2, foreach=False),
    ],
    ids=["sgd-momentum", "sgd-nesterov-foreach", "adam", "adam-forloop", "adamw", "adamw-forloop"],
)
def test_mlp_optimizers_match_eager(inprocess, make_opt):
    _compare(mlp, make_opt, _mlp_data, F.mse_loss, steps=8)


def test_a_training_loop_in_capture_runs_on_a_worker_process(process):
    with gt_core.capture():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        for _ in range(20):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    _, ref = train(
        mlp,
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
        _mlp_data,
        F.mse_loss,
        20,
        False,
    )
    assert loss.item() == ref[-1]
    assert gt_core.is_remote(next(model.parameters()))
    assert gt_core.worker().pid != os.getpid()
    assert gt_core.worker().alive


def test_small_cnn_with_batchnorm_and_dropout(inprocess):
    got = _compare(
        SmallCNN,
        functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        lambda: (torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,))),
        F.cross_entropy,
        steps=5,
    )
    assert gt_core.is_remote(got.bn.running_mean)


def test_transformer_block(inprocess):
    _compare(
        Block,
        functools.partial(torch.optim.AdamW, lr=1e-3),
        lambda: (torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12))),
        lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()),
        steps=4,
        atol=1e-5,
    )


def test_inplace_through_views_reaches_the_base(inprocess):
    def work():
        a = torch.arange(12.0).reshape(3, 4)
        a.t()[1].mul_(10)  # column 1 of a, through a transposed view
        a[:, 2:].add_(torch.ones(3, 2))
        b = a.view(-1)
        b[0] = -1.0
        c = a.clone()
        c.t_()  # in place, changes metadata
        c.unsqueeze_(0)
        d = torch.zeros(3, 4)
        d.index_add_(0, torch.tensor([0, 2]), torch.ones(2, 4))
        e = torch.ones(4).expand(3, 4).contiguous()
        return a, b, c, d, e, a.unbind(1)[3]

    ref = work()
    with gt_core.capture():
        got = work()
    assert got[2].shape == (1, 4, 3)
    for g, r in zip(got, ref, strict=True):
        assert gt_core.is_remote(g)
        assert_close(g, r)


@pytest.mark.parametrize("worker", ["inprocess", "process"])
def test_an_out_tensor_the_op_resizes_takes_the_results_shape(request, worker):
    """``out=torch.empty(0)`` (torch's way to reuse an out tensor of another size): the op
    resizes it. The proxy's storage was its first size, and restriding it failed."""
    request.getfixturevalue(worker)

    def work():
        w = torch.arange(12.0).reshape(3, 4)
        a, b, c = torch.empty(0), torch.empty(0), torch.empty(0, dtype=torch.long)
        torch.cumsum(w, 1, out=a)
        torch.mm(w, w.t(), out=b)
        torch.argmax(w, 0, out=c)
        d = torch.empty(0)
        torch.add(w[0], 1, out=d)
        d.mul_(2)  # (the resized tensor goes on being used)
        return a, b, c, d

    want = work()
    with gt_core.capture():
        got = work()
    for g, w in zip(got, want, strict=True):
        assert gt_core.is_remote(g) and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.cpu(), w)


def test_data_dependent_ops_and_sync_points(inprocess):
    def work():
        x = torch.tensor([[0.0, 1.5, -2.0], [3.0, 0.0, 4.0]])
        return (
            x.nonzero(),
            torch.masked_select(x, x > 0),
            torch.unique(torch.tensor([3, 1, 3, 2])),
            x[x > 1],
            x.sum(),
        )

    ref = work()
    with gt_core.capture():
        got = work()
        assert bool(got[4] > 0) is True
        assert got[4].item() == pytest.approx(6.5)
        assert got[0].tolist() == ref[0].tolist()
        assert (got[1].numpy() == ref[1].numpy()).all()
        plain = got[3].cpu()
    assert type(plain) is torch.Tensor and torch.equal(plain, ref[3])
    for g, r in zip(got, ref, strict=True):
        assert torch.equal(g.cpu(), r)
    assert f"{got[4]:.2f}" == "6.50"


def test_print_shows_values_and_says_worker(inprocess, capsys):
    with gt_core.capture():
        x = torch.arange(3.0, requires_grad=True)
        y = (x * 2).sum()
        print(y)
    out = capsys.readouterr().out
    assert "tensor(6." in out and "grad_fn=<SumBackward0>" in out and "gt worker tensor" in out


def test_proxies_work_outside_and_across_captures(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
    # Outside capture: ops on proxies stay on the worker.
    loss = F.mse_loss(model(x), y)
    assert gt_core.is_remote(loss)
    loss.backward()
    opt.step()
    with gt_core.capture():
        for _ in range(3):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.manual_seed(0)
    ref, rx, ry = mlp(), torch.randn(16, 32), torch.randn(16, 4)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for _ in range(4):
        ropt.zero_grad()
        F.mse_loss(ref(rx), ry).backward()
        ropt.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert_close(a, b)


def test_to_worker_moves_an_eager_model_in_place(inprocess):
    torch.manual_seed(0)
    model = mlp()
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ropt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    F.mse_loss(model(x), y).backward()  # optimizer state created eagerly, then moved
    opt.step()
    F.mse_loss(ref(x), y).backward()
    ropt.step()
    first = next(model.parameters())
    assert gt_core.to_worker(model) is model
    assert next(model.parameters()) is first and gt_core.is_remote(first)
    gt_core.to_worker(opt)
    assert all(gt_core.is_remote(v) for s in opt.state.values() for v in s.values())
    for _ in range(3):
        for m, o in ((model, opt), (ref, ropt)):
            o.zero_grad()
            F.mse_loss(m(x), y).backward()  # x, y are plain: uploaded once
            o.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert_close(a, b)
    t = gt_core.to_worker(torch.ones(2))
    assert gt_core.is_remote(t) and t.sum().item() == 2


def test_module_to_dtype_rebinds_parameters(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        m = mlp().double()
        out = m(torch.randn(2, 32, dtype=torch.float64))
    assert out.dtype == torch.float64 and gt_core.is_remote(m[0].weight)
    torch.manual_seed(0)
    ref = mlp().double()
    assert_close(out, ref(torch.randn(2, 32, dtype=torch.float64)))


def test_worker_memory_is_bounded_over_a_long_loop(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        counts = []
        for i in range(60):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i % 20 == 19:
                counts.append(gt_core.worker().stats()["values"])
    assert counts[0] == counts[-1], counts
    assert counts[0] < 20


def test_client_does_not_wait_between_ops(inprocess):
    s = gt_core.client.capture.session()
    with gt_core.capture():
        x = torch.randn(8, 8)
        syncs = s.counters["syncs"]
        for _ in range(50):
            x = (x @ x).tanh()
        assert s.counters["syncs"] == syncs  # 100 ops, no round trip
        x.sum().item()
        assert s.counters["syncs"] == syncs + 1


def test_worker_op_error_is_raised_at_next_sync_with_same_type(inprocess):
    with gt_core.capture():
        x = torch.randn(4, 3)
        bad = x[torch.tensor([7])]  # index out of range: only the real kernel knows
        with pytest.raises(IndexError, match="out of bounds") as info:
            bad.sum().item()
        assert "gt worker" in "".join(getattr(info.value, "__notes__", []))
        # later, independent work continues
        assert (x * 0).sum().item() == 0


def test_bad_shapes_raise_at_the_call_like_eager(inprocess):
    with gt_core.capture():
        a, b = torch.randn(2, 3), torch.randn(4, 5)
        with pytest.raises(RuntimeError, match="must have same reduction dim|cannot be multiplied"):
            torch.mm(a, b)


def test_unknown_option_is_a_clear_error(inprocess):
    with pytest.raises(gt_core.ConfigError, match="threshold"):
        with gt_core.capture(threshold=1):
            pass


def test_worker_crash_is_reported_then_restart_trains_again(process):
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        pid = gt_core.worker().pid
        with pytest.raises(gt_core.WorkerDied, match="SIGSEGV") as info:
            for i in range(50):
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                if i == 3:
                    os.kill(pid, signal.SIGSEGV)
                    t0 = time.monotonic()
                loss.item()
        assert time.monotonic() - t0 < 2.0
        assert "restart()" in str(info.value)
    with pytest.raises(gt_core.GTError, match="worker"):
        model(x).sum().item()
    # once the death is known, using its tensors fails at once (not at some later sync),
    # printing one says what happened, and the next capture starts a fresh worker
    with pytest.raises(gt_core.WorkerDied, match="SIGSEGV"):
        x + 1
    assert "its worker died" in repr(x)
    assert not gt_core.worker().alive
    with gt_core.capture():
        assert torch.zeros(3).tolist() == [0.0, 0.0, 0.0]
    assert gt_core.worker().alive and gt_core.worker().pid != pid
    with pytest.raises(gt_core.WorkerLost):
        model(x)
    model2, losses = train(
        mlp, functools.partial(torch.optim.SGD, lr=0.05), _mlp_data, F.mse_loss, 5, True
    )
    _, ref = train(
        mlp, functools.partial(torch.optim.SGD, lr=0.05), _mlp_data, F.mse_loss, 5, False
    )
    assert losses == ref


def test_worker_killed_and_op_error_in_process_worker(process):
    with gt_core.capture():
        x = torch.randn(4, 3)
        with pytest.raises(IndexError):
            x[torch.tensor([9])].sum().item()
        assert x.shape == (4, 3) and x.sum().item() == pytest.approx(x.cpu().sum().item())
        os.kill(gt_core.worker().pid, signal.SIGKILL)
        with pytest.raises(gt_core.WorkerDied, match="SIGKILL"):
            x.sum().item()
    gt_core.worker().restart()


def test_the_objects_alive_before_a_capture_are_out_of_the_collectors_way_until_it_ends():
    """Frozen while captures run (each full collection would walk them all), and collectable
    again after the last one; a cycle made inside a capture is still collected there."""
    import gc

    import gt_core

    class Cycle:
        pass

    before = gc.get_freeze_count()
    with gt_core.capture():
        assert gc.get_freeze_count() > before
        with gt_core.capture():
            pass
        assert gc.get_freeze_count() > before  # (an inner capture's end changes nothing)
        a = Cycle()
        a.me = a
        ref = __import__("weakref").ref(a)
        del a
        gc.collect()
        assert ref() is None
    assert gc.get_freeze_count() == before


def _made(n: int) -> list:
    """``n`` objects the collector tracks, as a model built inside the capture would be."""
    return [[i] for i in range(n)]  # (lists: a dict of atomic values is not tracked)


def test_a_steps_objects_made_inside_the_capture_are_set_aside_at_its_first_jitted_call():
    """A model built inside the capture (one %%gt cell for everything): the collector would
    walk it at every full collection in the step's first calls. A jitted function's first
    call sets the objects alive then aside, once per capture; a later one does not."""
    import gc

    import gt_core

    before = gc.get_freeze_count()
    with gt_core.capture(auto_compile=False):
        frozen = gc.get_freeze_count()
        model = _made(5000)
        w = torch.randn(4, 4)
        step = gt_core.jit(lambda x: (x @ w).sum())
        step(torch.randn(2, 4)).item()
        aside = gc.get_freeze_count()
        assert aside >= frozen + 5000
        more = _made(5000)
        gt_core.jit(lambda x: (x * 2).sum())(torch.randn(3)).item()  # (another function)
        step(torch.randn(2, 4)).item()
        assert gc.get_freeze_count() < aside + 5000  # once per capture
        del model, more
    assert gc.get_freeze_count() == before
    with gt_core.capture(auto_compile=False):  # a new capture sets aside again
        frozen = gc.get_freeze_count()
        model = _made(5000)
        gt_core.jit(lambda x: (x + 1).sum())(torch.randn(3)).item()
        assert gc.get_freeze_count() >= frozen + 5000
        del model
    assert gc.get_freeze_count() == before


def test_a_steps_objects_are_set_aside_when_the_first_plan_comes(process):
    """Without jit: the worker's first plan (its hot path found) is the step's first sight."""
    import gc

    import gt_core

    before = gc.get_freeze_count()
    with gt_core.capture(auto_compile=True, threshold=5, backend="eager"):
        frozen = gc.get_freeze_count()
        made = _made(5000)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 32), torch.randn(8, 4)
        for _ in range(12):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        gt_core.wait()
        assert gt_core.report().to_data()["hot_paths"], "no hot path: no plan came"
        assert gc.get_freeze_count() >= frozen + 5000
        del made
    assert gc.get_freeze_count() == before

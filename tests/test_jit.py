"""gt_core.jit: replayed calls leave the tensor state a run of the function would, or refuse."""

import contextlib
import functools
import inspect
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from models import TRANSFORMER, mlp
from torch import nn

import gt_core
from gt_bench.workloads import step_fn, training_step
from gt_core.client import capture as _capture
from gt_core.client.patches import patch_capturable
from gt_core.stream.instructions import RUN


def _jit_events(state=None):
    """jit's transitions (into ``state``), but an audit's (a replaying key stays replaying)."""
    return [
        e
        for e in gt_core.events_log().snapshot()
        if e["type"] == "jit"
        and e.get("trigger") != "audited"
        and (state is None or e["state"] == state)
    ]


@contextlib.contextmanager
def _capturable():
    """Eager's capturable optimizers on the CPU, as inside a capture (the oracle needs them)."""
    patch_capturable(True)
    try:
        yield
    finally:
        patch_capturable(False)


def _run(make_model, make_opt, make_data, loss_fn, steps, on_worker, *, jit, sched=None, seed=0):
    """Train ``steps`` with a step function (jitted when ``jit``); (params, losses)."""
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(seed)
        model = make_model()
        opt = make_opt(model.parameters())
        scheduler = sched(opt) if sched else None
        x, y = make_data()
        step = training_step(model, opt, loss_fn)
        fn = gt_core.jit(step) if jit else step
        losses = []
        for _ in range(steps):
            losses.append(fn(x, y))
            if scheduler is not None:
                scheduler.step()
        losses = [float(v.item()) for v in losses]
        params = [
            p.detach().cpu() if gt_core.is_remote(p) else p.detach() for p in model.parameters()
        ]
        state = [
            v.cpu() if gt_core.is_remote(v) else v
            for s in opt.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor)
        ]
    return params, losses, state, fn


MLP = dict(
    make_model=lambda: mlp(16, 32, 4),
    make_opt=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
    make_data=lambda: (torch.randn(8, 16), torch.randn(8, 4)),
    loss_fn=F.mse_loss,
)
ADAMW = dict(
    MLP,
    make_opt=lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01), capturable=True),
)


@pytest.fixture
def one_thread():
    """Client and worker on one intra-op thread each: the transformer's reductions (layer norm,
    embedding backward) round differently with 1 and 2 threads, with or without gt."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gt_core.configure(worker_threads=1)
    gt_core.worker().restart()
    yield
    torch.set_num_threads(threads)
    gt_core.configure(worker_threads=None)
    gt_core.worker().restart()


def _replayed(fn) -> int:
    return sum(e.replayed for e in fn.entries.values())


@pytest.mark.parametrize(
    "workload, sched",
    [
        (MLP, None),
        (ADAMW, lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)),
        (TRANSFORMER, None),
    ],
    ids=["mlp-sgd-momentum", "mlp-adamw-cosine", "transformer"],
)
def test_replayed_training_equals_eager_bit_for_bit(process, one_thread, workload, sched):
    gt_core.configure(backend="eager", auto_compile=True)
    with _capturable():
        want, want_losses, want_state, _ = _run(
            **workload, steps=40, on_worker=False, jit=False, sched=sched
        )
    got, losses, state, fn = _run(**workload, steps=40, on_worker=True, jit=True, sched=sched)
    assert _replayed(fn) >= 36, _jit_events()
    assert losses == want_losses
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(state, want_state, strict=True):
        assert torch.equal(a, b)


@pytest.mark.inductor
@pytest.mark.parametrize(
    "workload, sched",
    [
        (MLP, None),
        (ADAMW, lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)),
        (TRANSFORMER, None),
    ],
    ids=["mlp-sgd-momentum", "mlp-adamw-cosine", "transformer"],
)
def test_replayed_training_with_inductor_is_close_to_eager(process, workload, sched):
    gt_core.configure(backend="inductor", auto_compile=True)
    with _capturable():
        want, _, _, _ = _run(**workload, steps=200, on_worker=False, jit=False, sched=sched)
    with gt_core.capture():
        got, _, _, fn = _run(**workload, steps=200, on_worker=True, jit=True, sched=sched)
        gt_core.wait(compiles=True)
    assert _replayed(fn) >= 190
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_grads_left_by_the_step_are_where_eager_leaves_them(inprocess):
    """zero_grad before backward: the step leaves fresh .grad tensors behind each call."""

    def run(on_worker):
        with gt_core.capture() if on_worker else contextlib.nullcontext():
            torch.manual_seed(0)
            model, (x, y) = mlp(16, 32, 4), (torch.randn(8, 16), torch.randn(8, 4))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)

            def step(x, y):
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                return loss

            fn = gt_core.jit(step) if on_worker else step
            for _ in range(10):
                fn(x, y)
            return [p.grad.cpu() if on_worker else p.grad for p in model.parameters()], fn

    want, _ = run(False)
    got, fn = run(True)
    assert _replayed(fn) >= 6
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_a_sync_inside_the_step_refuses_replay_and_runs_the_python(inprocess):
    with gt_core.capture():
        w = torch.ones(4, requires_grad=True)
        seen = []

        @gt_core.jit
        def step(x):
            loss = (w * x).sum()
            seen.append(loss.item())
            return loss

        for i in range(6):
            step(torch.full((4,), float(i)))
    assert seen == [0.0, 4.0, 8.0, 12.0, 16.0, 20.0]  # every call ran its Python
    (refused,) = _jit_events("refused")
    assert "a sync inside the step" in refused["reason"]
    lines, first = inspect.getsourcelines(
        test_a_sync_inside_the_step_refuses_replay_and_runs_the_python
    )
    line = first + next(i for i, t in enumerate(lines) if "loss.item()" in t)
    assert f"the last at {__file__}:{line})" in refused["reason"]  # (the user's line)


def test_a_checkpointed_dropout_under_jit_equals_eager(inprocess):
    """torch.utils.checkpoint reads the generator's state each call (a sync: replay refused,
    saying so) and recomputes the forward's dropout mask from it: eager's values."""
    from torch.utils.checkpoint import checkpoint

    def make():
        torch.manual_seed(0)
        lin = nn.Linear(8, 8)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)

        def step(x):
            y = checkpoint(lambda x: F.dropout(lin(x), 0.5), x, use_reentrant=False)
            loss = y.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return lin, step

    xs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    lin, step = make()
    want = [step(x).item() for x in xs], lin.weight.detach().clone()
    with gt_core.capture():
        lin, step = make()
        jitted = gt_core.jit(step)
        got = [jitted(x).item() for x in xs], lin.weight.detach().cpu()
    assert got[0] == want[0] and torch.equal(got[1], want[1])
    (refused,) = _jit_events("refused")
    assert "torch.utils.checkpoint" in refused["reason"]


def test_a_python_number_that_changes_refuses_replay_naming_op_and_values(inprocess):
    with gt_core.capture():
        w = torch.ones(3)
        scale = [1.0]

        @gt_core.jit
        def step():
            scale[0] *= 2
            return w * scale[0]

        outs = [step().tolist() for _ in range(5)]
    assert outs == [[2.0] * 3, [4.0] * 3, [8.0] * 3, [16.0] * 3, [32.0] * 3]
    (refused,) = _jit_events("refused")
    assert "aten.mul.Tensor" in refused["reason"] and "2.0 -> 4.0" in refused["reason"]


def test_frozen_numbers_are_listed(inprocess):
    with gt_core.capture():
        w = torch.ones(3)

        @gt_core.jit
        def step():
            return w.add(1.0, alpha=0.5)

        for _ in range(4):
            out = step()
        assert out.tolist() == [1.5] * 3
    (ready,) = _jit_events("replaying")
    assert {"op": "aten.add.Tensor", "arg": "alpha", "value": 0.5, "count": 1} in ready["frozen"]


def _recompiles():
    return [e for e in gt_core.events_log().snapshot() if e["type"] == "recompile"]


def test_a_new_batch_size_is_a_new_key_and_records_again(inprocess):
    with gt_core.capture():
        w = torch.ones(5, 3)

        @gt_core.jit
        def f(x):
            return (x @ w).relu()

        for b in (4, 4, 4, 4, 2, 2, 2, 2, 4):
            x = torch.arange(b * 5.0).reshape(b, 5)
            assert torch.equal(f(x).cpu(), (x.cpu() @ torch.ones(5, 3)).relu())
    assert len(f.entries) == 2
    assert _replayed(f) >= 3
    (e,) = _recompiles()  # the second key's block, against the first's: what changed
    assert "shape" in e["reason"] and "[4, 5]" in e["reason"] and "[2, 5]" in e["reason"], e


def test_the_same_step_detected_then_jitted_is_no_recompile(inprocess):
    """A jit call and a detected period of the same step are cut differently (the loss the
    loop drops is freed inside a period, after a call): not a recompile the user could act on."""
    gt_core.configure(auto_compile=True, background=False, threshold=3)
    with gt_core.capture():
        step, x, y = step_fn(8, args=True)
        for _ in range(12):
            loss = step(x, y)
        plain = {p["signature"] for p in gt_core.report().to_data()["hot_paths"]}
        jitted = gt_core.jit(step)
        for _ in range(6):
            loss = jitted(x, y)
        loss.item()
    cut_by_jit = {p["signature"] for p in gt_core.report().to_data()["hot_paths"]} - plain
    assert plain and cut_by_jit and _replayed(jitted) >= 2  # two blocks: the forms differ
    assert not [e for e in _recompiles() if e["signature"] in cut_by_jit]


def test_a_replaced_parameter_runs_the_python_with_a_reason(inprocess):
    with gt_core.capture():
        holder = {"w": torch.ones(3)}

        @gt_core.jit
        def f(x):
            return x * holder["w"]

        x = torch.ones(3)
        for _ in range(4):
            f(x)
        holder["w"] = torch.ones(4) * 2  # other metadata under the same name
        out = f(torch.ones(4))  # a new key (x's shape) records; the old key is not replayed
        assert out.tolist() == [2.0] * 4
        holder["w"] = torch.full((3,), 3.0)  # same metadata, another tensor: read where it is
        assert f(x).tolist() == [3.0] * 3
        assert not _jit_events("re-recording")
        holder["w"] = torch.full((1,), 5.0)  # other metadata under the old key: the Python runs
        assert f(x).tolist() == [5.0] * 3
    (ran,) = _jit_events("re-recording")
    why = ran["reason"]
    assert "entry 'w'" in why and "no longer fits" in why and "shape=(1,)" in why, why


def test_an_input_with_other_metadata_under_the_same_key_is_never_replayed(inprocess):
    with gt_core.capture():
        holder = {"w": torch.ones(3)}

        @gt_core.jit
        def f(x):
            return x * holder["w"]

        x = torch.ones(3)
        for _ in range(4):
            f(x)
        holder["w"] = torch.ones(3, dtype=torch.float64)
        out = f(x)
        assert out.dtype == torch.float64 and out.tolist() == [1.0] * 3
    ran = _jit_events("re-recording")
    assert ran and "no longer fits" in ran[0]["reason"]


def test_replayed_calls_in_flight_are_bounded(process, monkeypatch):
    from gt_core.client.jit import replay as _replay

    waits = []
    t = _capture.session().transport
    real = t.wait_mark
    monkeypatch.setattr(t, "wait_mark", lambda m: (waits.append(m), real(m)))
    with gt_core.capture():
        w = torch.ones(64, 64)

        @gt_core.jit
        def f(x):
            return (x @ w).tanh()

        x = torch.ones(64, 64)
        for _ in range(200):
            x = f(x)
        total = x.sum().item()
    entry = next(iter(f.entries.values()))
    assert entry.replayed >= 190
    assert len(entry.marks) <= _replay.IN_FLIGHT // _replay.MARK_EVERY
    window = _replay.IN_FLIGHT // _replay.MARK_EVERY
    assert len(waits) >= entry.replayed // _replay.MARK_EVERY - window
    want = torch.ones(64, 64)
    for _ in range(200):
        want = (want @ torch.ones(64, 64)).tanh()
    assert total == pytest.approx(want.sum().item())


def test_worker_death_during_replay_is_an_error_then_a_fresh_worker(process):
    with pytest.raises(gt_core.WorkerDied):
        with gt_core.capture():
            w = torch.ones(8)

            @gt_core.jit
            def f(x):
                return x * w

            for i in range(40):
                if i == 10:
                    os.kill(gt_core.worker().pid, signal.SIGKILL)
                    gt_core.worker()  # (no wait: the next replay or sync finds out)
                f(w).sum().item()
    with gt_core.capture():
        assert (torch.ones(2) * 2).tolist() == [2.0, 2.0]


def test_outside_a_capture_a_jitted_function_is_an_ordinary_call():
    f = gt_core.jit(lambda x: x + 1)
    assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.parametrize("workload", [MLP, TRANSFORMER], ids=["mlp", "transformer"])
def test_a_replayed_call_is_one_message_whatever_the_steps_size(process, monkeypatch, workload):
    """What a replayed call costs the client does not grow with the step's ops: the MLP's
    41 and the transformer's ~300 ops each go out as one batch per call (a RUN and frees)."""
    gt_core.configure(backend="eager", auto_compile=True)
    with gt_core.capture():
        torch.manual_seed(0)
        model = workload["make_model"]()
        opt = workload["make_opt"](model.parameters())
        x, y = workload["make_data"]()

        @gt_core.jit
        def step(x, y):
            loss = workload["loss_fn"](model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        for _ in range(10):
            step(x, y)
        (entry,) = step.entries.values()
        assert entry.recipe is not None, _jit_events()
        batches = []
        transport = _capture.session().transport
        real = transport.send
        monkeypatch.setattr(transport, "send", lambda b: (batches.append(b), real(b))[1])
        for _ in range(20):
            step(x, y)
        monkeypatch.undo()
        step(x, y).item()
    assert len(batches) == 20
    assert all(sum(ins.code == RUN for ins in b) == 1 and len(b) <= 4 for b in batches)


def test_after_an_unfit_input_recording_starts_over_and_replay_resumes(inprocess):
    with gt_core.capture():
        holder = {"w": torch.ones(3)}

        @gt_core.jit
        def f(x):
            return x * holder["w"]

        x = torch.ones(3)
        for _ in range(6):
            f(x)
        holder["w"] = torch.ones(3, dtype=torch.float64)
        f(x)  # unfit: runs the Python
        holder["w"] = torch.full((3,), 2.0)
        for _ in range(8):
            out = f(x)
        assert out.tolist() == [2.0] * 3
    (entry,) = f.entries.values()
    assert entry.refused is None and entry.recipe is not None


def _forward(x):  # a helper at module level: the model it reads is a global of its own
    return _HELPED(x)


def test_state_reached_through_helper_functions_is_replayed(inprocess):
    """A step that calls a helper (a global function reading a global model; a closure
    around the optimizer) replays, and trains as eager does."""
    global _HELPED

    def train(on_worker):
        global _HELPED
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            _HELPED = torch.nn.Linear(4, 2)
            opt = torch.optim.SGD(_HELPED.parameters(), lr=0.1, momentum=0.9)

            def update():
                opt.step()
                opt.zero_grad()

            def step(x, y):
                loss = F.mse_loss(_forward(x), y)
                loss.backward()
                update()
                return loss

            fn = gt_core.jit(step) if on_worker else step
            x, y = torch.randn(8, 4), torch.randn(8, 2)
            losses = [float(fn(x, y).item()) for _ in range(12)]
            params = [p.detach().cpu().clone() for p in _HELPED.parameters()]
        return losses, params, fn

    want, want_params, _ = train(False)
    got, params, fn = train(True)
    assert _replayed(fn) >= 8, _jit_events()
    assert got == want
    for a, b in zip(params, want_params, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reader", ["the step", "a helper"])
def test_a_global_rebound_to_another_object_runs_the_python(inprocess, reader):
    """A global the step reads, itself or through a helper it calls, is checked at each call:
    rebound to another model, the call runs the Python, never a replay of the old model."""
    global _HELPED
    with gt_core.capture():
        _HELPED = torch.nn.Linear(3, 2)
        f = gt_core.jit((lambda x: _HELPED(x)) if reader == "the step" else (lambda x: _forward(x)))
        x = torch.ones(1, 3)
        for _ in range(4):
            f(x)
        _HELPED = torch.nn.Linear(3, 2)
        want = _HELPED(x).cpu()
        assert torch.equal(f(x).cpu(), want)
        assert any("no longer fits" in (e.get("reason") or "") for e in _jit_events("re-recording"))


def test_the_fast_input_lookup_agrees_with_the_checked_one(inprocess, monkeypatch):
    """A replayed call reads its inputs in flat passes where everything is as the last calls
    found it (_inputs_fast); each read is checked here against _inputs, which checks each."""
    from gt_core.client.jit import replay as _replay

    fast, checked = _replay._inputs_fast, _replay.inputs
    compared = []

    def both(entry, leaves):
        ids = fast(entry, leaves)
        if ids is not None:
            compared.append((ids, checked(entry, leaves)))
        return ids

    monkeypatch.setattr(_replay, "_inputs_fast", both)
    sgd = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
    _run(mlp, sgd, lambda: (torch.randn(8, 32), torch.randn(8, 4)), F.mse_loss, 12, True, jit=True)
    assert len(compared) >= 5, f"only {len(compared)} fast lookups: the check checks little"
    assert all(a == b for a, b in compared), compared[:2]
    assert not _jit_events("re-recording")

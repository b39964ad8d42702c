"""gt_core.jit's lifecycle table, its typed reasons, and the audit that catches what no rule
foresaw; each against eager PyTorch as the oracle."""

import collections
import contextlib
import copy
import math
import warnings

import pytest
import torch
from conftest import assert_close
from torch import nn

import gt_core
from gt_bench.workloads import training_step
from gt_core.observe.jit_states import TRANSITIONS, JitReason, JitState, Trigger, next_state


def _events():
    return [e for e in gt_core.events_log().snapshot() if e["type"] == "jit"]


def _params(model):
    return [p.detach().cpu().clone() for p in model.parameters()]


def _close(a, b, tol=1e-5):
    worst = max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
    assert worst <= tol, worst


# -- the table ---------------------------------------------------------------------------
def test_every_state_is_reached_from_recording_and_only_by_the_table():
    reached, frontier = {JitState.RECORDING}, [JitState.RECORDING]
    while frontier:
        s = frontier.pop()
        for (a, _), b in TRANSITIONS.items():
            if a is s and b not in reached:
                reached.add(b)
                frontier.append(b)
    assert reached == set(JitState)
    with pytest.raises(ValueError, match="no transition from refused on prepared"):
        next_state(JitState.REFUSED, Trigger.PREPARED)


def test_a_reason_renders_its_words_and_travels_as_data():
    r = JitReason("python_number", op="aten.mul.Tensor", arg="argument 1", old=2.0, new=4.0)
    assert "aten.mul.Tensor (argument 1)" in r.text() and "(2.0 -> 4.0)" in r.text()
    assert JitReason.from_data(r.to_data()) == r
    assert r.explain()["id"] == "jit_python_number" and r.explain()["fix"]
    with pytest.raises(ValueError, match="unknown reason kind"):
        JitReason("no such kind")


# -- the audit ---------------------------------------------------------------------------
def _scaled_loop(on_worker, scale_of, audit=4, boxed=False):
    """16 calls of ``x * w * scale_of(cfg)``; ``cfg["base"]`` becomes 1.5 before call 9
    (``boxed``: the item of ``cfg["box"]`` instead, a deque: a container jit's walk does not
    enter)."""
    gt_core.configure(jit_audit=audit)
    cfg = {"base": 0.25, "box": collections.deque([0.25])}
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        w = torch.ones(4)
        outs = []

        def step(x):
            return x * w * scale_of(cfg)

        fn = gt_core.jit(step) if on_worker else step
        for i in range(16):
            if i == 9:
                if boxed:
                    cfg["box"][0] = 1.5
                else:
                    cfg["base"] = 1.5
            outs.append(fn(torch.full((4,), float(i))).cpu())
    return outs, fn


def test_a_python_number_the_step_reads_is_compared_before_each_replay(inprocess):
    """A number an op was passed that a reachable value held on both recorded calls is read
    again before each replay (the block holds it as recorded): a change records again."""
    want, _ = _scaled_loop(False, lambda cfg: cfg["base"])
    got, fn = _scaled_loop(True, lambda cfg: cfg["base"], audit=0)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    (changed,) = [e for e in _events() if (e.get("cause") or {}).get("kind") == "value_changed"]
    assert "(entry 'base' of a dict: 0.25 -> 1.5)" in changed["reason"]


def test_an_audit_catches_a_frozen_number_no_rule_saw_and_stops_replay(inprocess):
    """A number the step computes from a value where no walk looks is frozen by the
    contract; once it changes, the next audited call makes another block: replay stops,
    with what differed."""
    want, _ = _scaled_loop(False, lambda cfg: cfg["box"][0] * 2, boxed=True)
    got, fn = _scaled_loop(True, lambda cfg: cfg["box"][0] * 2, boxed=True)
    (entry,) = fn.entries.values()
    assert entry.state is JitState.REFUSED
    assert entry.reason.kind == "audit_differed" and "(0.5 -> 3.0)" in entry.reason.what
    differed = [e for e in _events() if e.get("trigger") == "audit-differed"]
    assert len(differed) == 1 and differed[0]["cause"]["kind"] == "audit_differed"
    # The audited call and every call after it ran the Python: eager's numbers from there.
    for i in range(12, 16):
        assert torch.equal(got[i], want[i]), i
    assert entry.audited >= 2 and entry.replayed >= 5


def test_a_module_switched_to_eval_is_never_replayed_in_train_mode(inprocess):
    """Dropout in train mode, then eval(): each mode's calls equal eager's."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
            fn = gt_core.jit(model) if on_worker else model
            x = torch.ones(4, 8)
            outs = []
            for i in range(12):
                model.train(i < 6)
                with torch.no_grad():  # (a jitted module: its forward's state is reached)
                    outs.append(fn(x).cpu())
        return outs, fn

    want, _ = run(False)
    got, fn = run(True)
    for i in range(6, 12):  # (train mode draws from the worker's generator, as eager's)
        assert torch.equal(got[i], want[i]), i
    assert any((e.get("cause") or {}).get("kind") == "value_changed" for e in _events())
    (entry,) = fn.entries.values()
    assert entry.replayed >= 4, _events()


def test_grads_left_in_place_where_the_recorded_calls_found_none_accumulate_as_eager(inprocess):
    """Recorded with .grad None (zero_grad(set_to_none) after each call), then the loop
    stops zeroing: backward adds to the grads it finds. A replay of the recorded block would
    overwrite them; the call runs and records instead, and every grad equals eager's."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(4, 8), torch.randn(4, 2)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            fn = gt_core.jit(step) if on_worker else step
            for i in range(12):
                fn(x, y)
                if i < 6:  # (from the seventh call on, the grads accumulate)
                    opt.step()
                    opt.zero_grad()
            return [p.grad.detach().cpu().clone() for p in model.parameters()], fn

    want, _ = run(False)
    got, fn = run(True)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    causes = [(e.get("cause") or {}) for e in _events()]
    assert any(c.get("kind") == "unfit" and ".grad" in c.get("place", "") for c in causes)
    assert sum(e.replayed for e in fn.entries.values()) >= 5, _events()


def test_audits_are_sampled_and_each_is_an_event(inprocess):
    gt_core.configure(jit_audit=8)
    with gt_core.capture():
        torch.manual_seed(0)
        model = nn.Linear(6, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(8, 6), torch.randn(8, 3)

        step = gt_core.jit(training_step(model, opt, nn.functional.mse_loss))

        for _ in range(40):
            step(x, y)
    (entry,) = step.entries.values()
    audited = [e for e in _events() if e.get("trigger") == "audited"]
    assert entry.audited == len(audited) >= 4  # the first replay, then one in 8
    assert entry.state is JitState.REPLAYING and entry.replayed >= 30
    assert gt_core.report().to_data()["jit"][0]["audited"] == entry.audited


# -- settings ----------------------------------------------------------------------------
def _adamw_loop(on_worker, lrs, groups_equal=True):
    """AdamW over two param groups; each call's lr per group from ``lrs(i)``."""
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 4))
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}])
        torch.manual_seed(1)
        x, y = torch.randint(0, 10, (16,)), torch.randn(16, 4)  # rows 10..19 never used

        step = training_step(model, opt, nn.functional.mse_loss)

        fn = gt_core.jit(step) if on_worker else step
        for i in range(24):
            for g, lr in zip(opt.param_groups, lrs(i), strict=True):
                g["lr"] = lr
            fn(x, y)
        return _params(model), fn


def test_a_zero_learning_rate_replays_adam_as_eager_never_into_nan(inprocess):
    """torch's capturable Adam divides by the step size: at lr 0 it makes NaN where a
    gradient's running square is zero (unused embedding rows). jit records the optimizer as
    written, so a warmup from 0 and a decay to 0 replay, and give eager's numbers."""

    def lrs(i):
        lr = 0.0 if i in (0, 1, 12, 23) else 1e-2 * (1 + math.cos(i))
        return (lr, lr)

    want, _ = _adamw_loop(False, lrs)
    got, fn = _adamw_loop(True, lrs)
    assert all(torch.isfinite(p).all() for p in got)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    (entry,) = fn.entries.values()
    assert entry.replayed >= 18  # (of 24: the first four record, as for any step)


def test_two_groups_whose_lr_parts_after_recording_are_recorded_again(inprocess):
    """Both groups had one lr while recorded, so a number could come from either; once they
    differ the call records again, and each group's lr then flows on its own."""

    def lrs(i):
        return (1e-2 / (i + 1),) * 2 if i < 8 else (1e-2 / (i - 6), 1e-3 * i)

    want, _ = _adamw_loop(False, lrs)
    got, fn = _adamw_loop(True, lrs)
    _close(got, want)
    (entry,) = fn.entries.values()
    kinds = [e["cause"]["kind"] for e in _events() if e.get("cause")]
    assert "settings_parted" in kinds and entry.state is JitState.REPLAYING
    assert entry.replayed >= 12


@pytest.mark.parametrize("lr", [1e-2, "tensor"], ids=["lr=1e-2", "lr=torch.tensor(1e-2)"])
@pytest.mark.parametrize("schedule", ["StepLR", "OneCycleLR", "LambdaLR-warmup"])
def test_a_scheduler_stepped_inside_the_step_is_stepped_by_each_replay(inprocess, schedule, lr):
    """The scheduler's step is known Python: a replay steps it after its RUN, as the call
    would have, so the next call's settings are eager's (a replay that skipped it ran every
    later call on a stale learning rate, without a word). With a tensor learning rate the
    scheduler's own ops (it fills the tensor, keeps clones) run outside the block too."""
    make_lr = (lambda: torch.tensor(1e-2)) if lr == "tensor" else (lambda: lr)

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
            opt = torch.optim.AdamW(model.parameters(), lr=make_lr())
            sched = {
                "StepLR": lambda: torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5),
                "OneCycleLR": lambda: torch.optim.lr_scheduler.OneCycleLR(opt, 0.05, 30),
                "LambdaLR-warmup": lambda: torch.optim.lr_scheduler.LambdaLR(
                    opt, lambda i: min(1.0, i / 4)
                ),
            }[schedule]()
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                return loss

            fn = gt_core.jit(step) if on_worker else step
            for _ in range(24):
                fn(x, y)
            return _params(model), fn, sched.last_epoch

    want, _, want_epoch = run(False)
    got, fn, epoch = run(True)
    _close(got, want)
    assert epoch == want_epoch == 24
    (entry,) = fn.entries.values()
    assert entry.replayed >= 12, _events()


@pytest.mark.parametrize("lr", [0.1, "tensor"], ids=["lr=0.1", "lr=torch.tensor(0.1)"])
def test_work_after_the_schedulers_step_in_the_step_is_never_dropped(inprocess, lr):
    """The scheduler stepped before the optimizer (torch warns of that order): the
    optimizer's step reads the settings the scheduler changed (with a tensor lr, it comes
    after the block would end), so the step is not replayed; its Python runs, and the
    numbers are eager's."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Linear(8, 4)
            rate = torch.tensor(0.1) if lr == "tensor" else lr
            opt = torch.optim.SGD(model.parameters(), lr=rate, momentum=0.9)
            sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                nn.functional.mse_loss(model(x), y).backward()
                sched.step()
                opt.step()
                opt.zero_grad()

            fn = gt_core.jit(step) if on_worker else step
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (the order's warning)
                for _ in range(10):
                    fn(x, y)
            return _params(model)

    want = run(False)
    got = run(True)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    kinds = [e["cause"]["kind"] for e in _events() if e.get("cause")]
    assert "after_scheduler" in kinds, kinds


_AFTER_SCHEDULER = {  # work after a float-lr scheduler's step that reads nothing it changed
    "trainer-order": lambda model, opt, loss: (model.zero_grad(), loss.detach())[1],
    "zero-grad-then-clone": lambda model, opt, loss: (opt.zero_grad(), loss.clone() * 2)[1],
    "grad-norm-logged": lambda model, opt, loss: torch.stack(
        [p.detach().norm() for p in model.parameters()]
    ).sum(),
}


@pytest.mark.parametrize("after", list(_AFTER_SCHEDULER))
@pytest.mark.parametrize("schedule", ["linear-warmup", "OneCycleLR"])
def test_work_after_a_pure_schedulers_step_stays_in_the_block_equal_to_eager(
    inprocess, after, schedule
):
    """transformers' Trainer steps optimizer, scheduler, then ``model.zero_grad()`` and
    returns ``loss.detach()``: with float settings the scheduler's step is Python alone, so
    the work after it is in the block (it reads nothing the scheduler changed) and the
    step replays; each replay steps the scheduler after its RUN."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            lrs = torch.optim.lr_scheduler
            sched = (
                lrs.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 5))
                if schedule == "linear-warmup"
                else lrs.OneCycleLR(opt, 0.05, 40)
            )
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                sched.step()
                return _AFTER_SCHEDULER[after](model, opt, loss)

            fn = gt_core.jit(step) if on_worker else step
            outs = [fn(x, y).item() for _ in range(20)]
            return _params(model), outs, fn, sched.last_epoch

    want, want_outs, _, want_epoch = run(False)
    got, outs, fn, epoch = run(True)
    _close(got, want, tol=0)
    assert outs == want_outs and epoch == want_epoch == 20
    (entry,) = fn.entries.values()
    assert entry.refused is None and entry.replayed >= 12, _events()


def test_a_recurrent_hidden_state_rebound_in_a_global_tuple_is_replayed(inprocess):
    """``global hidden; hidden = tuple(t.detach() ...); out, hidden = lstm(x, hidden)``: the
    step binds the name anew to a tuple of its outputs; a replay makes that tuple too."""
    ns = {}
    src = """
import torch
import torch.nn.functional as F
from torch import nn

def train(steps, jit):
    global hidden
    torch.manual_seed(0)
    lstm, head = nn.LSTM(6, 12, batch_first=True), nn.Linear(12, 6)
    params = [*lstm.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    hidden = (torch.zeros(1, 4, 12), torch.zeros(1, 4, 12))

    def step(x, y):
        global hidden
        hidden = tuple(t.detach() for t in hidden)
        out, hidden = lstm(x, hidden)
        loss = F.mse_loss(head(out), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    fn = jit(step)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        fn(torch.randn(4, 5, 6, generator=g), torch.randn(4, 5, 6, generator=g))
    return [p.detach().cpu() for p in params] + [hidden[0].detach().cpu()], fn
"""
    exec(compile(src, "<lstm loop>", "exec"), ns)
    want, _ = ns["train"](14, lambda f: f)
    with gt_core.capture():
        got, fn = ns["train"](14, gt_core.jit)
    _close(got, want)
    (entry,) = fn.entries.values()
    assert entry.state is JitState.REPLAYING and entry.replayed >= 8, _events()


def test_a_tensor_learning_rate_that_may_be_zero_never_makes_capturable_adam_nan(inprocess):
    """lr=torch.tensor(...) made in the capture is a worker tensor: jit cannot see whether a
    warmup left it at zero without a sync, so its group runs as written (never NaN)."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 4))
            opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.001))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, i / 2))
            x, y = torch.randint(0, 8, (16,)), torch.randn(16, 4)

            step = training_step(model, opt, nn.functional.mse_loss)

            fn = gt_core.jit(step) if on_worker else step
            for _ in range(8):
                fn(x, y)
                sched.step()
            return _params(model), fn

    want, _ = run(False)
    got, fn = run(True)
    assert all(torch.isfinite(p).all() for p in got)
    _close(got, want)


def test_a_grad_filled_for_recording_that_gets_no_gradient_is_left_empty_as_eager(inprocess):
    """Micro-batches accumulate over calls; one call's Python leaves a weight out. The grad
    jit filled with zeros for that call's recording is emptied again, so the optimizer skips
    the weight as eager's does (an update with a zero grad would still move it: momentum)."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            a, b = nn.Linear(4, 4), nn.Linear(4, 4)
            opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1, momentum=0.9)
            x, use_b = torch.randn(2, 4), [True]

            def step(x):
                y = a(x)
                if use_b[0]:
                    y = b(y)
                y.square().mean().backward()

            fn = gt_core.jit(step) if on_worker else step
            for i in range(9):
                use_b[0] = i % 3 != 2  # (b left out of every third micro-batch)
                fn(x)
                if i % 3 == 1:
                    opt.step()
                    opt.zero_grad()
            grads = [p.grad is None for p in b.parameters()]
            return _params(a) + _params(b), grads

    (want, want_none), (got, got_none) = run(False), run(True)
    assert got_none == want_none
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x, y)


def test_a_setting_that_steers_python_or_leaves_its_knob_is_marked_steered():
    """A comparison, a truth value, a rounding or a math function of a setting is followed no
    further: the setting is steered (it never flows by its origin alone)."""
    from gt_core.client.jit.knob import Knob, steered
    from gt_core.client.jit.settings import wrapped

    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1, weight_decay=0.0, momentum=0.9)
    marks: set = set()
    with wrapped([opt], {}, marks):
        g = opt.param_groups[0]
        lr, wd, mom = g["lr"], g["weight_decay"], g["momentum"]
        assert type(-lr * 2) is Knob and not marks  # (arithmetic is followed)
        assert not wd != 0
        math.sqrt(mom)
    assert steered(marks)[0] == {(0, "weight_decay"), (0, "momentum")}
    assert type(opt.param_groups[0]["lr"]) is float  # (put back)


def _sgd_loop(on_worker, change, forward=None, calls=16, **opt_args):
    """SGD on a small model for ``calls`` calls; ``change(i, opt)`` before each call writes
    the settings the loop changes (outside the step, as a scheduler stepped per epoch)."""
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), **opt_args)
        x, y = torch.randn(16, 8), torch.randn(16, 4)

        def step(x, y):
            loss = nn.functional.mse_loss(model(x), y)
            if forward is not None:
                loss = forward(loss, opt)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn = gt_core.jit(step) if on_worker else step
        for i in range(calls):
            change(i, opt)
            fn(x, y)
        return _params(model), fn


def _set(key, when, value):
    def change(i, opt):
        if i == when:
            for g in opt.param_groups:
                g[key] = value

    return change


def test_a_learning_rate_changed_after_recording_flows_by_origin_without_recording_again(
    inprocess,
):
    """lr constant while the step records, then halved (a StepLR stepped per epoch): the
    numbers the optimizer computed from it were lifted by their origin, so the replay sends
    them anew; no call records again, and every parameter is eager's."""
    change = _set("lr", 8, 0.05)
    want, _ = _sgd_loop(False, change, lr=0.1, momentum=0.9)
    got, fn = _sgd_loop(True, change, lr=0.1, momentum=0.9)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    (entry,) = fn.entries.values()
    assert entry.replayed >= 16 - 4, _events()
    assert not [e for e in _events() if e.get("trigger") == "setting-changed"]


def test_a_weight_decay_of_zero_turned_on_later_records_again(inprocess):
    """SGD skips its weight decay where it is 0 (``if weight_decay != 0``): no number of the
    block comes from it, so it is compared, and turned on later the call records again (the
    block has no op to send it to)."""
    change = _set("weight_decay", 8, 1e-2)
    want, _ = _sgd_loop(False, change, lr=0.1, weight_decay=0.0)
    got, _ = _sgd_loop(True, change, lr=0.1, weight_decay=0.0)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    causes = [e["cause"] for e in _events() if e.get("cause")]
    assert any(c["kind"] == "setting_changed" and "weight_decay" in c["arg"] for c in causes)


def test_a_setting_the_forward_computes_with_is_compared_where_the_block_holds_it(inprocess):
    """The step scales its loss by the learning rate it reads: that number, outside the
    optimizer's step, is frozen in the block, so lr stays compared and a change records
    again (sent anew in the optimizer's numbers only, the loss would keep the old lr)."""
    change = _set("lr", 8, 0.05)

    def forward(loss, opt):
        return loss * opt.param_groups[0]["lr"]

    want, _ = _sgd_loop(False, change, forward, lr=0.1, momentum=0.9)
    got, _ = _sgd_loop(True, change, forward, lr=0.1, momentum=0.9)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert any(e.get("trigger") == "setting-changed" for e in _events())


def test_a_setting_the_steps_python_branches_on_is_compared_not_sent(inprocess):
    """The step branches on its optimizer's momentum (which the optimizer's numbers also
    take): the comparison steers Python, so momentum is compared before each replay; sent
    into the block by its origin alone, the lowered momentum would keep the old branch."""
    change = _set("momentum", 8, 0.3)

    def forward(loss, opt):
        return loss * 2 if opt.param_groups[0]["momentum"] > 0.5 else loss

    want, _ = _sgd_loop(False, change, forward, lr=0.1, momentum=0.9)
    got, _ = _sgd_loop(True, change, forward, lr=0.1, momentum=0.9)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    causes = [e["cause"] for e in _events() if e.get("cause")]
    assert any(c["kind"] == "setting_changed" and "momentum" in c["arg"] for c in causes)


# -- the state a loop changes between calls: each change against eager -----------------------
def _checkpoint(i, model, opt, kept):
    if i == 2:
        kept["m"], kept["o"] = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    if i == 8:  # (resumed from the checkpoint, as after a restart)
        model.load_state_dict(kept["m"])
        opt.load_state_dict(kept["o"])


def _stop_zeroing(i, model, opt, kept):
    if i < 6:
        opt.zero_grad()


def _eval_then_train(i, model, opt, kept):
    model.train(not 5 <= i < 8)


def _weights_written(i, model, opt, kept):
    if i == 6:
        with torch.no_grad():
            model[0].weight.mul_(0.5)


def _optimizer_state_cleared(i, model, opt, kept):
    if i == 7:
        opt.state.clear()  # (momentum buffers gone: made anew at the next step)


def _parameter_rebound(i, model, opt, kept):
    if i == 6:  # (the optimizer keeps stepping the old one: eager's semantics, odd as they are)
        model[2].bias = nn.Parameter(torch.zeros(4))


BETWEEN_CALLS = {
    "checkpoint-restored": _checkpoint,
    "stop-zeroing": _stop_zeroing,
    "eval-then-train": _eval_then_train,
    "weights-written-in-place": _weights_written,
    "optimizer-state-cleared": _optimizer_state_cleared,
    "parameter-rebound": _parameter_rebound,
}


@pytest.mark.parametrize("change", list(BETWEEN_CALLS))
def test_state_the_loop_changes_between_calls_is_never_replayed_stale(inprocess, change):
    """The family of the grads left in place: the loop changes what the step reaches between
    calls (a checkpoint restored, zeroing stopped, eval mode, weights written, optimizer state
    cleared, a parameter rebound). Each way ends with eager's parameters and grads."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.25), nn.Linear(16, 4))
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                return loss

            fn = gt_core.jit(step) if on_worker else step
            kept: dict = {}
            losses = []
            for i in range(14):
                BETWEEN_CALLS[change](i, model, opt, kept)
                losses.append(fn(x, y).item())
            grads = [None if p.grad is None else p.grad.detach().cpu() for p in model.parameters()]
            return _params(model), grads, losses

    want, got = run(False), run(True)
    for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)
    assert got[2] == want[2]


# -- arguments sliced from one tensor: views at moving offsets ----------------------------------
def _sliced(on_worker, returns_view, starts):
    """A step fed ``data[s : s + 8]`` for each ``s`` in ``starts`` (the BPTT and manual-batch
    idioms); with ``returns_view`` the step returns its argument's first row as well."""
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        data = torch.randn(64, 4)

        def step(xb):
            loss = model(xb).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return (loss, xb[0]) if returns_view else loss

        fn = gt_core.jit(step) if on_worker else step
        outs = [fn(data[s : s + 8]) for s in starts]
        if returns_view:
            outs = [(loss.item(), row.storage_offset(), row.cpu()) for loss, row in outs]
        else:
            outs = [loss.item() for loss in outs]
        return outs, _params(model), fn


def test_batches_sliced_from_one_tensor_replay_as_one_key_equal_to_eager(inprocess):
    """Views of one tensor at successive offsets are one call key (the block reads them
    wherever they begin): a BPTT loop replays instead of recording every call anew."""
    starts = range(0, 56, 4)
    want, want_params, _ = _sliced(False, False, starts)
    got, params, fn = _sliced(True, False, starts)
    assert got == want
    _close(params, want_params, tol=0)
    (entry,) = fn.entries.values()
    assert entry.refused is None and entry.replayed >= len(starts) - 4


def test_a_view_of_the_argument_returned_at_moving_offsets_is_refused_not_misplaced(inprocess):
    """A returned view of the argument follows its offset: replayed, it would sit where the
    recorded call's did. Refused with that reason; every call as eager, offsets too."""
    starts = range(0, 40, 4)
    want, want_params, _ = _sliced(False, True, starts)
    got, params, fn = _sliced(True, True, starts)
    for (la, oa, ra), (lb, ob, rb) in zip(got, want, strict=True):
        assert la == lb and oa == ob and torch.equal(ra, rb)
    _close(params, want_params, tol=0)
    (entry,) = fn.entries.values()
    assert entry.replayed == 0 and entry.reason.kind == "follows_offset"
    r = entry.reason  # (each row 4 elements: successive batches 16 apart)
    assert r.new - r.old == 16 and f"a result at offset {r.old} -> {r.new}" in r.text()


def test_an_argument_recorded_at_one_offset_is_recorded_again_at_another(inprocess):
    """Both recorded calls at one offset: the block is known there alone (a returned view
    would sit there), so a call at another offset records again rather than replay; that
    recording, at another offset than the one before it, shows the view follows it."""
    starts = [0, 0, 0, 0, 0, 8, 8, 8, 16, 0]
    want, want_params, _ = _sliced(False, True, starts)
    got, params, fn = _sliced(True, True, starts)
    for (la, oa, ra), (lb, ob, rb) in zip(got, want, strict=True):
        assert la == lb and oa == ob and torch.equal(ra, rb)
    _close(params, want_params, tol=0)
    (entry,) = fn.entries.values()
    assert entry.replayed >= 1 and entry.reason.kind == "follows_offset"
    moved = [e["reason"] for e in _events() if e["trigger"] == "unfit"]
    assert moved and "(at storage offset 32, recorded at 0)" in moved[0]


# -- settings of an optimizer the loop steps outside the step ------------------------------------
@pytest.mark.parametrize("uses", [None, "lr", "beta1"], ids=["ignores", "scales-by-lr", "branches"])
def test_an_optimizer_stepped_outside_the_step_has_only_what_the_step_used_compared(
    inprocess, uses
):
    """Micro-batches accumulated over calls, the optimizer and a OneCycleLR (lr and betas
    change every step) stepped by the loop: a step that never reads them is not recorded
    again when they change. One that scales its loss by the lr has it flow into the block;
    one that branches on beta1 has it compared, and records again when it changes."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.05, 20)
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y) / 2
                if uses == "lr":
                    loss = loss * opt.param_groups[0]["lr"]
                if uses == "beta1" and opt.param_groups[0]["betas"][0] < 0.9:
                    loss = loss * 2
                loss.backward()
                return loss.detach()

            fn = gt_core.jit(step) if on_worker else step
            losses = []
            for i in range(24):
                losses.append(fn(x, y).item())
                if i % 2 == 1:
                    opt.step()
                    sched.step()
                    opt.zero_grad()
            return _params(model), losses, fn

    want, want_losses, _ = run(False)
    got, losses, fn = run(True)
    _close(got, want, tol=0)
    assert losses == want_losses
    (entry,) = fn.entries.values()
    changed = [e["reason"] for e in _events() if e["trigger"] == "setting-changed"]
    if uses == "beta1":
        assert changed and all("group 0 betas" in c for c in changed), changed
    else:
        assert not changed and entry.refused is None and entry.replayed >= 18, _events()
        assert (0, "lr") in entry.recipe.flowing if uses == "lr" else not entry.recipe.flowing


# -- Python numbers in the step's own state, changed by the loop ------------------------------
class _Knobs:
    """A trainer-like object holding the numbers a step reads."""

    def __init__(self):
        self.lr, self.thr, self.inner, self.on = 0.1, 1.0, 2, True


def _hand_sgd(k, model):
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-k.lr)


def _clamped(k, model):  # (a number that flows and is tested: min(lr, 0.06) each call)
    lr = k.lr if k.lr < 0.06 else 0.06
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)


def _threshold(k, model):
    scale = 2.0 if k.thr > 0.5 else 0.5
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.05 * scale)


def _inner_steps(k, model):
    for _ in range(k.inner):
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.02)


def _flag(k, model):
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.05 if k.on else -0.01)


def _float_of(k, model):  # (float() of it: what the Python does next is not followed)
    lr = round(float(k.lr), 6)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)


# (the step's update, the loop's change after call i, how jit ends: replaying, or refused for)
UPDATES = {
    "hand-sgd": (_hand_sgd, lambda k, i: setattr(k, "lr", k.lr * 0.7) if i % 3 == 2 else None, None),
    "clamped": (_clamped, lambda k, i: setattr(k, "lr", k.lr * 0.8), None),
    "threshold": (_threshold, lambda k, i: setattr(k, "thr", k.thr - 0.2) if i % 2 else None, None),
    "inner-steps": (_inner_steps, lambda k, i: setattr(k, "inner", 3) if i == 6 else None, None),
    "flag": (_flag, lambda k, i: setattr(k, "on", i < 7), None),
    # (the number float() gave is not followed: each value of it is recorded anew)
    "float-of": (_float_of, lambda k, i: setattr(k, "lr", k.lr * 0.7) if i == 7 else None, None),
}  # fmt: skip


@pytest.mark.parametrize("update", list(UPDATES))
def test_python_numbers_the_loop_changes_are_never_replayed_stale(inprocess, update):
    """The family of a hand-written update's learning rate: a float, an int or a bool in
    the step's state that the loop changes between calls, read by arithmetic (it flows), a
    comparison (its outcome is checked), ``range()`` or ``float()`` (compared). Every call's
    loss and the parameters are eager's."""
    body, change, refused = UPDATES[update]

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model, k = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)), _Knobs()
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y)
                model.zero_grad()
                loss.backward()
                body(k, model)
                return loss.detach()

            fn = gt_core.jit(step) if on_worker else step
            losses = []
            for i in range(16):
                losses.append(fn(x, y).item())
                change(k, i)
            return _params(model), losses, fn

    (want, want_losses, _), (got, losses, fn) = run(False), run(True)
    assert losses == want_losses
    _close(got, want, tol=0)
    (entry,) = fn.entries.values()
    if refused is None:
        assert entry.state is JitState.REPLAYING and entry.replayed >= 4, _events()
    else:
        assert entry.state is JitState.REFUSED and entry.reason.kind == refused, _events()


def test_a_hand_written_learning_rate_flows_once_it_changed_and_a_threshold_is_checked(
    inprocess,
):
    """The learning rate of a hand-written update flows from where the step reads it once two
    recorded calls saw it differ (later changes replay); a threshold crossed records again,
    saying which test came out otherwise."""

    def run(on_worker, thr_at):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model, lr, cfg = nn.Linear(8, 4), [0.2], {"thr": 1.0}
            x, y = torch.randn(16, 8), torch.randn(16, 4)

            def step(x, y):
                loss = nn.functional.mse_loss(model(x), y) * (2.0 if cfg["thr"] > 0.5 else 1.0)
                model.zero_grad()
                loss.backward()
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr[0])
                return loss.detach()

            fn = gt_core.jit(step) if on_worker else step
            losses = []
            for i in range(20):
                losses.append(fn(x, y).item())
                lr[0] *= 0.9  # (every call)
                cfg["thr"] = thr_at(i)
            return losses, fn

    for thr_at in (lambda i: 1.0, lambda i: 1.0 - 0.1 * i):
        want, _ = run(False, thr_at)
        got, fn = run(True, thr_at)
        assert got == want
    (entry,) = fn.entries.values()
    assert entry.replayed >= 8, _events()
    prepared = [e for e in _events() if e["trigger"] == "prepared"]
    assert "attribute" not in str(prepared[-1]["flowing"])  # (a list's item: its words)
    assert any("entry 0 of a list" in f for e in prepared for f in e["flowing"]), prepared
    flips = [e for e in _events() if (e.get("cause") or {}).get("kind") == "test_flips"]
    assert flips and "> 0.5 is False now, True when recorded" in flips[0]["reason"], flips


def test_no_hot_path_is_searched_inside_a_jit_call(inprocess):
    """An audited call runs its Python recorded, as the first two did; its instructions are
    the jit block's, so no period is searched inside them: an optimizer's alike
    per-parameter updates, with a learning rate a schedule changes every call, became a new
    hot path (reported as a recompile) at each audit. Its results stay eager's."""

    def run(on_worker):
        gt_core.configure(jit_audit=4, auto_compile=True, background=False, threshold=3)
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
            opt = torch.optim.AdamW(model.parameters(), lr=0.01)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
            x = torch.randn(16, 8)

            def step():
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                return loss

            fn = gt_core.jit(step) if on_worker else step
            for _ in range(40):
                fn()
            return [p.detach().clone() for p in model.parameters()], fn

    want, _ = run(False)
    got, fn = run(True)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b)
    (entry,) = fn.entries.values()
    assert entry.audited >= 5 and entry.replayed >= 20
    data = gt_core.report().to_data()
    assert [p["signature"] for p in data["hot_paths"]] == [entry.sig]
    assert [e for e in data["events"] if e["type"] == "recompile"] == []

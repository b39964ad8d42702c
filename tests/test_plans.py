"""The client matches hot blocks itself and sends each occurrence as one RUN."""

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from models import mlp

import gt_core
from gt_core import events as ev
from gt_core.client.plans.plan_match import PlanMatcher
from gt_core.hotpath.judge import _MAX_PROBES
from gt_core.observe.metrics import MIN_BASELINE
from gt_core.observe.status import Status
from gt_core.stream.canonical import FreeEntry, OpEntry
from gt_core.stream.instructions import FREE, OP, PUT, RUN, Free, Op, Put, Ref
from gt_core.stream.lift import Scalar
from gt_core.stream.plan import Plan, Slot, expand
from gt_core.worker_process.cpu_share import CpuShare as _CpuShare

# -- the matcher on its own ----------------------------------------------------------------
# mm(in0, in1) -> t0; mul(t0, <lifted float>) -> t1; free t0; add_(in0, t1, alpha=1)
PLAN = Plan(
    "sig",
    (
        OpEntry("op", 0, (Slot("i", 0), Slot("i", 1)), {}, (0,)),
        OpEntry("op", 1, (Slot("t", 0), Scalar(0)), {}, (1,)),
        FreeEntry("free", Slot("t", 0)),
        OpEntry("op", 2, (Slot("i", 0), Slot("t", 1)), {"alpha": 1}, (None,)),
    ),
    n_inputs=2,
    n_scalars=1,
)


def occurrence(a=1, b=2, base=10, scale=0.5, alpha=1):
    return [
        Op(OP, 0, (Ref(a), Ref(b)), {}, (base,)),
        Op(OP, 1, (Ref(base), scale), {}, (base + 1,)),
        Free(FREE, base),
        Op(OP, 2, (Ref(a), Ref(base + 1)), {"alpha": alpha}, (None,)),
    ]


def replay():
    out, ready = [], []
    r = PlanMatcher(out.append, lambda: ready.append(len(out)))
    r.offer("sig", PLAN)
    return r, out, ready


def test_a_whole_occurrence_becomes_one_run_that_expands_back():
    r, out, ready = replay()
    for ins in occurrence() + occurrence(base=20, scale=0.25):
        r.feed(ins)
    assert out == [(RUN, "sig", [1, 2], [10, 11], [0.5]), (RUN, "sig", [1, 2], [20, 21], [0.25])]
    assert ready == [1, 2]  # sent at once: the worker starts while the client goes on
    assert expand(PLAN, [1, 2], [20, 21], [0.25]) == occurrence(base=20, scale=0.25)


@pytest.mark.parametrize(
    "broken",
    [
        occurrence(a=1, b=1),  # one value under two input names
        occurrence(alpha=2),  # a constant that is not lifted differs
        occurrence()[:2] + [Put(PUT, 99, None)] + occurrence()[2:],  # an upload cuts it
        [  # a wrong value
            Op(OP, 0, (Ref(1), Ref(2)), {}, (10,)),
            Op(OP, 1, (Ref(7), 0.5), {}, (11,)),
        ],
    ],
    ids=["aliased-inputs", "constant", "barrier", "wrong-value"],
)
def test_a_mismatch_sends_the_instructions_unchanged_in_order(broken):
    r, out, _ = replay()
    for ins in broken:
        r.feed(ins)
    r.release()  # what a flush does with an occurrence still in progress
    assert out == broken
    assert r.runs == 0


def test_an_occurrence_may_begin_at_the_instruction_that_broke_the_last():
    r, out, _ = replay()
    first = occurrence()[:1]  # mm ... then a new mm starts over
    for ins in first + occurrence(base=20):
        r.feed(ins)
    assert out == first + [(RUN, "sig", [1, 2], [20, 21], [0.5])]


def test_a_withdrawn_plan_is_not_matched():
    r, out, _ = replay()
    r.offer("sig", None)
    for ins in occurrence():
        r.feed(ins)
    assert out == occurrence()


def test_a_free_from_outside_the_occurrence_waits_for_its_run():
    """An input freed midway (a call's temporary argument, freed with the call's frame or when
    the call returns, as the interpreter chooses) and a value the block never met: their
    frees go out after the RUN, so the occurrence still completes."""
    r, out, _ = replay()
    occ = occurrence()
    for ins in occ[:2] + [Free(FREE, 2), Free(FREE, 77)] + occ[2:]:
        r.feed(ins)
    assert out == [(RUN, "sig", [1, 2], [10, 11], [0.5]), Free(FREE, 2), Free(FREE, 77)]


def test_a_free_of_a_value_the_occurrence_made_out_of_place_breaks_it_in_order():
    r, out, _ = replay()
    occ = occurrence()
    broken = occ[:2] + [Free(FREE, 11)] + occ[2:]  # t1 freed before the plan frees t0
    for ins in broken:
        r.feed(ins)
    r.release()
    assert out == broken and r.runs == 0


def test_a_released_occurrence_sends_the_frees_it_held_after_its_instructions():
    r, out, _ = replay()
    occ = occurrence()
    for ins in occ[:2] + [Free(FREE, 2)]:
        r.feed(ins)
    r.release()  # a flush midway
    assert out == occ[:2] + [Free(FREE, 2)]


# -- through the worker ----------------------------------------------------------------------
@pytest.fixture
def hot(inprocess):
    gt_core.configure(auto_compile=True, background=False, threshold=3)


def _train(steps, on_worker, batch=16, opt=None, sched=None, body=None, sync_every=0):
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = mlp()
        o = (opt or (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)))(model.parameters())
        s = sched(o) if sched else None
        n = batch(0) if callable(batch) else batch
        x, y = torch.randn(n, 32), torch.randn(n, 4)
        losses = []
        for i in range(steps):
            xb, yb = (x, y) if not callable(batch) else (x[: batch(i)], y[: batch(i)])
            out = model(xb)
            if body is not None:
                out = body(i, out)
            loss = F.mse_loss(out, yb)
            loss.backward()
            o.step()
            o.zero_grad()
            if s is not None:
                s.step()
            if sync_every and i % sync_every == 0:
                losses.append(loss.item())
        losses.append(loss.item())
        params = [
            p.detach().cpu() if gt_core.is_remote(p) else p.detach() for p in model.parameters()
        ]
    return params, losses


def _sent(session):
    """Count what the client sends: {"ops": OP instructions, "runs": RUN instructions}."""
    counts = {"ops": 0, "runs": 0}
    send = session.transport.send

    def counting(batch):
        counts["ops"] += sum(1 for ins in batch if ins.code == OP)
        counts["runs"] += sum(1 for ins in batch if ins.code == RUN)
        send(batch)

    session.transport.send = counting
    return counts


def test_training_steps_travel_as_one_message_each_and_match_eager(hot):
    counts = _sent(gt_core.client.capture.session())
    params, losses = _train(40, True)
    ref, ref_losses = _train(40, False)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert losses == pytest.approx(ref_losses)
    runs = gt_core.client.capture.session().matcher.runs
    assert runs >= 30, f"only {runs} of 40 steps were sent as one message"
    assert counts["runs"] == runs
    # before the plan arrived every op travelled on its own; after it, none did
    assert counts["ops"] < (40 - runs + 1) * 40
    compiled = [e for e in gt_core.report().to_data()["events"] if e["type"] == ev.ITERATION]
    assert sum(e["kind"] == "compiled" for e in compiled) >= runs - 3


@pytest.mark.parametrize("flush_at", [2, 512])
def test_thousands_of_tensors_freed_at_once_go_out_in_order(hot, flush_at):
    """Many proxies dying at once (a list of tensors dropped mid-training) are sent as frees
    batch after batch, with the plan live or not: no stack overflow, the worker forgets them
    all, and training still equals eager."""
    gt_core.configure(flush_at=flush_at)
    junk = {}

    def body(i, out):
        if i == 12:
            junk["xs"] = [torch.ones(2) for _ in range(3000)]
        if i == 13:
            junk.clear()  # 3000 frees pending at the next op, in the middle of a step
        return out

    try:
        params, losses = _train(24, True, body=body)
        held = gt_core.worker().stats()["values"]
    finally:
        gt_core.configure(flush_at=512)
    ref, ref_losses = _train(24, False, body=body)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert losses == pytest.approx(ref_losses)
    assert held < 100, held  # the 3000 are gone from the worker


def test_every_step_is_one_run_when_the_dropped_loss_begins_the_block(hot):
    """The loss a step returns and the caller drops is freed after the step's last free.

    Detected with a sync per step, the block begins with that free; unsynced, it arrives while
    the previous occurrence completes. It must start the next occurrence, not be sent alone
    (which sent every other step op by op).
    """
    with gt_core.capture() as s:
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = torch.randn(16, 32), torch.randn(16, 4)

        def step():
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        for _ in range(20):
            step().item()
        runs = s.matcher.runs
        for _ in range(20):
            step()
        assert s.matcher.runs - runs >= 19, f"{s.matcher.runs - runs} of 20 steps sent as one run"
        step().item()


def _loop(on_worker: bool, adam: bool = False, steps: int = 36):
    """SGD momentum (or Adam with a cosine schedule: lifted scalars); an op more in steps 24
    and 31; from step 28 on, a batch of another size (new tensors, no new op: only their
    metadata differs)."""
    with gt_core.capture() if on_worker else contextlib.nullcontext():
        torch.manual_seed(0)
        model = mlp()
        if adam:
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
        else:
            opt, sched = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), None
        data = {
            16: (torch.randn(16, 32), torch.randn(16, 4)),
            8: (torch.randn(8, 32), torch.randn(8, 4)),
        }
        losses = []
        for i in range(steps):
            x, y = data[16 if i < 28 else 8]
            out = model(x)
            if i in (24, 31):
                out = out * 1.0
            loss = F.mse_loss(out, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            if i % 7 == 0:
                losses.append(loss.item())
        losses.append(loss.item())
        params = [
            p.detach().cpu() if gt_core.is_remote(p) else p.detach() for p in model.parameters()
        ]
    return params, losses


def _stream(client_match: bool, adam: bool) -> tuple:
    """Every instruction the worker is told to run (RUNs expanded by their plans), the result."""
    gt_core.worker().restart()  # ids from 1 again, plans learned afresh
    gt_core.reset()
    gt_core.configure(client_match=client_match)
    sent = []
    s = gt_core.client.capture.session()
    send = s.transport.send

    def spying(batch):
        for ins in batch:
            if ins.code == RUN:
                sent.extend(expand(s.matcher.plans[ins.sig], ins.inputs, ins.produced, ins.scalars))
            else:
                sent.append(ins)
        send(batch)

    s.transport.send = spying
    params, losses = _loop(True, adam)
    return [ins for ins in sent if ins.code in (OP, FREE)], params, losses


@pytest.mark.parametrize("adam", [False, True], ids=["sgd-momentum", "adam-cosine"])
def test_following_plans_sends_exactly_the_stream_recording_would(hot, adam):
    """Ops recorded by following a plan (the client's steady state) and occurrences that leave
    it midway (an op more, inputs of another size) reach the worker as the same instructions,
    in the same order, with the same ids, as without plans; the results are eager's."""
    with_plans, params, losses = _stream(True, adam)
    r = gt_core.client.capture.session().matcher
    runs, followed = r.runs, r.followed
    without, _, _ = _stream(False, adam)
    assert runs >= 10 and followed >= 10 * 30, (runs, followed)
    ref, ref_losses = _loop(False, adam)
    assert losses == pytest.approx(ref_losses)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert len(with_plans) == len(without)
    for k, (a, b) in enumerate(zip(with_plans, without, strict=True)):
        assert repr(a) == repr(b), f"instruction {k}: {a} with plans, {b} without"


def test_plans_never_reach_the_event_log(hot):
    _train(20, True)
    types = {e["type"] for e in gt_core.events_log().snapshot()}
    assert ev.PLAN not in types and ev.DETECTED in types


def test_same_ops_on_other_shapes_run_correctly_and_withdraw_the_plan(hot):
    # batch 16 until hot, then 8 (a smaller last batch, a new size): the same ops, other shapes
    sizes = lambda i: 16 if i < 20 else 8  # noqa: E731
    params, losses = _train(30, True, batch=sizes)
    ref, ref_losses = _train(30, False, batch=sizes)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert losses == pytest.approx(ref_losses)
    s = gt_core.client.capture.session()
    assert s.matcher.runs >= 1
    blocks = gt_core.report().to_data()["hot_paths"]
    assert len(blocks) == 2  # the new size is a block of its own, found by the worker


def test_a_step_given_a_temporary_batch_follows_the_plan_its_held_batches_made(hot):
    """Batches held by a list make the plan (each freed after the step); then each batch is a
    temporary freed inside the step's call: the same block, every step one RUN."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            w, acc = torch.randn(16, 8), torch.zeros(16, 8)
            X = torch.randn(20 * 16, 8)

            def step(x):
                y = torch.tanh(x * w)
                acc.mul_(0.5).add_(y).sub_(y.mean())

            for x in X.split(16):  # held by the list: freed after each step
                step(x)
            if on_worker:
                gt_core.wait(compiles=True, timeout=60)
                runs = gt_core.client.capture.session().matcher.runs
            for i in range(20):
                step(X[i * 16 : (i + 1) * 16] * 1.0)  # a temporary: freed with step's frame
            out = acc.cpu()
            if on_worker:
                return out, gt_core.client.capture.session().matcher.runs - runs
            return out, None

    got, runs = run(True)
    want, _ = run(False)
    assert_close(got, want)
    assert runs == 20


def test_a_step_that_differs_midway_runs_its_instructions_eagerly(hot):
    # every 4th step has an extra op in the middle of the block, and a sync inside it
    def body(i, out):
        if i % 4 == 3:
            out = out * 1.0
            out.sum().item()
        return out

    params, losses = _train(30, True, body=body)
    ref, ref_losses = _train(30, False, body=body)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert losses == pytest.approx(ref_losses)
    assert gt_core.client.capture.session().matcher.runs >= 5


def test_adam_with_a_schedule_sends_lifted_scalars_in_the_run(hot):
    adam = lambda p: torch.optim.Adam(p, lr=1e-2)  # noqa: E731
    cosine = lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=50)  # noqa: E731
    params, losses = _train(30, True, opt=adam, sched=cosine)
    ref, ref_losses = _train(30, False, opt=adam, sched=cosine)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert gt_core.client.capture.session().matcher.runs >= 15
    data = gt_core.report().to_data()
    assert sum(e["type"] == ev.COMPILE_FINISHED for e in data["events"]) == 1


def test_client_match_off_sends_every_op(hot):
    gt_core.configure(client_match=False)
    counts = _sent(gt_core.client.capture.session())
    params, _ = _train(20, True)
    ref, _ = _train(20, False)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert gt_core.client.capture.session().matcher.runs == 0 and counts["runs"] == 0
    assert gt_core.report().to_data()["hot_paths"][0]["compiled_runs"] >= 10


def test_plans_cross_to_a_worker_process(process):
    gt_core.configure(auto_compile=True, background=False, threshold=3)
    # a loss logged every few steps: the plan arrives while the loop runs (without any
    # sync the client could record all 40 steps before the worker has run the first)
    params, losses = _train(40, True, sync_every=4)
    ref, ref_losses = _train(40, False, sync_every=4)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert losses == pytest.approx(ref_losses)
    assert gt_core.client.capture.session().matcher.runs >= 10


@pytest.mark.parametrize("window_s", [3600.0, 0.0], ids=["an-hour", "none"])
def test_iteration_timings_travel_together_and_a_sync_brings_them_all(hot, monkeypatch, window_s):
    # Timings wait up to _EVENTS_EVERY_S for one another: a window no step outlasts however
    # busy the machine, or none at all, so what is sent depends on the window alone.
    monkeypatch.setattr("gt_core.hotpath.outbox._EVENTS_EVERY_S", window_s)
    s = gt_core.client.capture.session()
    published = []
    on_events = s.transport._on_events

    def counting(events):
        published.append(len(events))
        on_events(events)

    s.transport._on_events = counting
    s.transport.engine.outbox.publish = counting
    _train(60, True)  # ends with loss.item(): a sync
    iterations = [e for e in gt_core.events_log().snapshot() if e["type"] == ev.ITERATION]
    assert len(iterations) >= 50  # none held back after the sync
    if window_s:  # far fewer messages than steps
        assert len(published) < len(iterations) / 2, published
    else:  # each step's timing on its own
        assert len(published) > len(iterations) / 2, published


# -- the worker process's share of the CPU ------------------------------------------------
def test_the_worker_inbox_knows_when_the_client_waits():
    import multiprocessing as mp

    from gt_core.worker_process.serve import _Inbox

    a, b = mp.Pipe()
    for msg in [("batch", [1]), ("req", "fetch", 3), ("batch", [2])]:
        a.send(msg)
    inbox = _Inbox(b)
    assert inbox.next() == ("batch", [1]) and inbox.requests == 1  # a request waits behind it
    assert inbox.next() == ("req", "fetch", 3) and inbox.requests == 0
    assert inbox.next() == ("batch", [2]) and inbox.requests == 0


def test_the_worker_inbox_knows_when_a_jit_client_far_ahead_waits_for_a_mark():
    """gt_core.jit posts marks without waiting; one that says which earlier mark the client
    waits for next means the client waits until the worker has passed that one."""
    import multiprocessing as mp

    from gt_core.client.jit.replay import IN_FLIGHT
    from gt_core.client.jit.replay import MARK_EVERY as _MARK_EVERY
    from gt_core.worker_process.serve import _Inbox

    a, b = mp.Pipe()
    inbox = _Inbox(b)
    window = IN_FLIGHT // _MARK_EVERY
    for rid in range(window):  # the client runs ahead: not waiting
        a.send(("batch", [rid]))
        a.send(("mark", rid, None))
    assert not inbox.waited()
    a.send(("mark", window, 0))  # one too many in flight: it waits for mark 0
    assert inbox.waited()
    for rid in range(window):
        assert inbox.next() == ("batch", [rid]) and inbox.waits == (rid == 0)
        assert inbox.next() == ("mark", rid, None) and not inbox.waits  # answered: it goes on
    assert inbox.next() == ("mark", window, 0) and not inbox.waits


@pytest.mark.parametrize("duplex", [True, False], ids=["socket", "pipe"])
def test_the_worker_inbox_reads_every_frame_whole(duplex):
    """Frames read in bulk (a socket) or one by one (a plain pipe) come out whole and in
    order: small ones arriving together, one larger than a read, one split across reads."""
    import multiprocessing as mp
    import threading

    from gt_core.worker_process import serve

    reader, writer = mp.Pipe(duplex=duplex)
    if duplex:
        reader, writer = writer, reader  # (a duplex pipe's two ends are alike)
    inbox = serve._Inbox(reader)
    assert (inbox.sock is not None) == duplex
    big = ("batch", [bytes(range(256)) * (3 * serve._READ // 256)])
    msgs = [("batch", [1]), ("mark", 7, None), big, ("req", 9, "fetch", 3), ("batch", [2])]
    sender = threading.Thread(target=lambda: [writer.send(m) for m in msgs])
    sender.start()
    got = [inbox.next() for _ in msgs]
    sender.join()
    assert got == msgs
    assert inbox.requests == 0 and not inbox.waited()
    writer.close()
    with pytest.raises(EOFError):
        inbox.next()


@pytest.fixture
def two_threads():
    """torch's intra-op threads set to two for the test, as on a 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_compiled_runs_leave_a_core_to_the_client_and_eager_ops_keep_eagers_count(two_threads):
    from gt_core.worker_process.cpu_share import CpuShare as _CpuShare

    share = _CpuShare(torch.device("cpu"))
    share.set(client_waits=False)  # the client records beside the worker
    assert torch.get_num_threads() == 2  # eager ops: eager's count (its rounding), always
    assert share.choose("a") is None and torch.get_num_threads() == 1  # a compiled run: one
    share.release()
    assert torch.get_num_threads() == 2
    share.set(client_waits=True, compiling=True)  # a compile (its process) gets a core
    assert share.choose("a") is None and torch.get_num_threads() == 1
    share.release()
    share.set(client_waits=False, compiling=True)  # never fewer than one
    assert share.choose("a") is None and torch.get_num_threads() == 1
    share.release()
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert not _CpuShare(torch.device("cpu")).active  # one thread: nothing to share


def test_a_worker_process_starts_with_openmp_threads_that_spin_briefly(process, monkeypatch):
    """Spinning OpenMP threads of the worker hold a core the client's recording wants."""
    import psutil

    from gt_core.worker_process.cpu_share import SPIN, worker_environment

    assert psutil.Process(process.pid).environ().get("GOMP_SPINCOUNT") == SPIN
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with worker_environment(OMP_NUM_THREADS="1"):
        assert (os.environ["GOMP_SPINCOUNT"], os.environ["OMP_NUM_THREADS"]) == (SPIN, "1")
    assert "GOMP_SPINCOUNT" not in os.environ and os.environ["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice stands
    with worker_environment():
        assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    with worker_environment():
        assert os.environ["GOMP_SPINCOUNT"] == "7"


def test_each_block_keeps_the_thread_count_it_ran_faster_with_while_the_client_waits(two_threads):
    from gt_core.worker_process.cpu_share import CpuShare as _CpuShare

    share = _CpuShare(torch.device("cpu"))
    share.set(client_waits=False)
    assert share.choose("a") is None  # the client records beside it: nothing to choose
    share.set(client_waits=True)
    fast = {"small": 1, "big": 2}  # the count each block runs faster with
    tried = {"small": [], "big": []}
    for _ in range(2 * _CpuShare.TRIALS):
        for block, best in fast.items():
            share.set(client_waits=True)
            n = share.choose(block)
            assert torch.get_num_threads() == n
            tried[block].append(n)
            settled = share.learn(block, n, 1.0 if n == best else 1.6)
            assert settled == (len(tried[block]) > 2 * _CpuShare.TRIALS)  # trials: not samples
    for block, best in fast.items():
        assert sorted(set(tried[block])) == [1, 2]  # both counts were tried
        share.set(client_waits=True)
        assert share.choose(block) == best and torch.get_num_threads() == best
        assert share.learn(block, best, 1.0)  # chosen: its runs are the block's samples
    share.set(client_waits=True, compiling=True)  # one thread left: no choice to make
    assert share.choose("big") is None and torch.get_num_threads() == 1


def test_a_sync_that_arrives_after_its_run_gives_the_block_every_core(two_threads):
    from gt_core.worker_process.cpu_share import CpuShare as _CpuShare

    share = _CpuShare(torch.device("cpu"))
    share.set(client_waits=False)  # the RUN came alone: the client records beside it
    waits = [False]
    share.recheck = lambda: waits[0]
    assert share.choose("a") is None and torch.get_num_threads() == 1
    waits[0] = True  # the client's .item() came in behind the RUN
    assert share.choose("a") in (1, 2) and share.waits  # the thread trials: it waits now
    share.set(client_waits=False, compiling=True)
    assert share.choose("a") is None and torch.get_num_threads() == 1  # a compile: one core


def test_compiled_runs_ask_the_cpu_share_for_their_thread_count(hot):
    class Share:  # what the worker process's _CpuShare is asked, and told
        def __init__(self):
            self.asked, self.told, self.waits, self.released = [], [], True, 0

        def choose(self, block):
            self.asked.append(block)
            return 1

        def learn(self, block, n, ms):
            self.told.append((block, n, ms))
            return len(self.told) > 3  # the first three runs tried a thread count

        def release(self):
            self.released += 1

    share = Share()
    gt_core.client.capture.session().transport.engine.cpu_share = share
    params, _ = _train(20, True)
    ref, _ = _train(20, False)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert share.asked and len(share.told) == len(share.asked) == share.released
    assert all(block == share.asked[0] and n == 1 and ms > 0 for block, n, ms in share.told)
    (block,) = gt_core.client.capture.session().transport.engine.blocks.values()
    assert len(block.samples[("compiled", (True, False))]) == len(share.told) - 3


class _Share:
    """A stand-in for the worker process's _CpuShare: the client waits, no thread choice."""

    waits = True

    def choose(self, block):
        return None

    def learn(self, block, n, ms):
        return True

    def release(self):
        pass


def _engine():
    return gt_core.client.capture.session().transport.engine


@pytest.mark.parametrize("client_waits_later", [True, False])
def test_a_regression_check_compares_runs_made_while_the_cpu_was_shared_alike(
    hot, fixed_times, client_waits_later
):
    class Share(_Share):  # the client waits for the eager runs, then perhaps records beside
        def choose(self, block):  # asked for compiled runs only
            self.waits = client_waits_later

    gt_core.configure(regression_samples=5)
    fixed_times(eager=1.0, compiled=2.0)  # always reverted
    _engine().cpu_share = Share()
    _train(30, True)
    (block,) = gt_core.client.capture.session().transport.engine.blocks.values()
    kinds = [e["kind"] for e in gt_core.report().events if e["type"] == ev.ITERATION]
    assert block.judged, kinds
    # Eager runs timed after the compile as the baseline: the one timed before it ran while
    # the client waited, comparable only if it still does.
    # (of the two eager runs before the compile, the second counts where the client still
    # waits: the first was its eager graph's first run; no probe warms the graph up, it ran)
    assert block.probed == MIN_BASELINE - (1 if client_waits_later else 0), kinds
    (revert,) = [e for e in gt_core.report().events if e["type"] == ev.REVERT]
    runs = (
        "the client waiting for each"
        if client_waits_later
        else "each beside the client's recording"
    )
    assert revert["reason"].endswith(f"over 5 runs ({runs})"), revert["reason"]


def test_a_regression_check_judges_compiled_runs_against_eager_ones_in_their_condition(
    hot, fixed_times
):
    """Eager runs while the client waits are fast, runs beside its recording slow: compiled
    runs beside it are slower than the first, faster than the second, which decide."""

    class Share(_Share):
        def choose(self, block):  # compiled runs from now on: the client records beside
            self.waits = False

    share = _engine().cpu_share = Share()
    gt_core.configure(regression_samples=5)
    fixed_times(eager=lambda: 1.0 if share.waits else 4.0, compiled=2.0)
    _train(30, True)
    (block,) = _engine().blocks.values()
    assert block.judged and block.probed == MIN_BASELINE  # beside the recording
    # never compared (the first eager run, its graph's first, is no sample at all)
    assert list(block.samples[("eager", (True, False))]) == [1.0]
    assert list(block.samples[("eager", (False, False))]) == [4.0] * MIN_BASELINE
    assert block.status == Status.COMPILED
    assert not [e for e in gt_core.report().events if e["type"] == ev.REVERT]


@pytest.mark.parametrize(
    ("eager_ms", "compiled_ms", "status"), [(1.0, 2.0, "reverted"), (2.0, 1.0, "compiled")]
)
def test_a_regression_check_whose_condition_keeps_changing_stops_probing_and_uses_all_runs(
    hot, fixed_times, eager_ms, compiled_ms, status
):
    class Share(_Share):  # compiled runs beside the client's recording, eager ones while it waits
        reads = 2  # of waits since the last compiled run began (it reads it twice)

        @property
        def waits(self):
            self.reads += 1
            return self.reads > 2

        def choose(self, block):  # a compiled run begins
            self.reads = 0

    gt_core.configure(regression_samples=5)
    timer = fixed_times(eager=eager_ms, compiled=compiled_ms)
    _engine().cpu_share = Share()
    _train(40, True)
    (block,) = _engine().blocks.values()
    assert block.judged and block.probed == _MAX_PROBES  # then no more probes
    assert block.status == status
    reverts = [e for e in gt_core.report().events if e["type"] == ev.REVERT]
    if status == "reverted":
        (revert,) = reverts
        assert revert["reason"].endswith("(all of them)"), revert["reason"]
        assert (revert["eager_ms"], revert["compiled_ms"]) == (eager_ms, compiled_ms)
    else:  # kept: every eager run after the compile was a probe, and compiled from then on
        after = timer.kinds[timer.kinds.index("compiled") :]
        assert not reverts and after.count("eager") == _MAX_PROBES, after
        assert after[-1] == "compiled"


def test_a_regression_check_waits_for_a_compile_beside_the_runs_to_end(hot, fixed_times):
    """Compiled runs beside another compile look faster than they are here (the compile slows
    runs unevenly): no verdict from them; after it ends, the compiled block is slower than
    eager and goes back to eager."""
    engine = _engine()

    class Share(_Share):
        runs = 0

        def choose(self, block):  # a compiled run begins: the first 8 beside a compile
            self.runs += 1
            engine.compiler.compiling = 1 if self.runs <= 8 else 0

    engine.cpu_share = Share()
    gt_core.configure(regression_samples=5)
    fixed_times(eager=1.0, compiled=lambda: 0.5 if engine.compiler.compiling else 2.0)
    params, _ = _train(40, True)
    (block,) = engine.blocks.values()
    assert len(block.samples[("compiled", (True, True))]) == 8  # timed, never judged
    assert block.judged and block.status == Status.REVERTED
    (revert,) = [e for e in gt_core.report().events if e["type"] == ev.REVERT]
    assert revert["compiled_ms"] == 2.0 and revert["reason"].endswith(
        "(the client waiting for each)"
    )
    for a, b in zip(params, _train(40, False)[0], strict=True):
        assert_close(a, b)


def test_runs_trying_a_thread_count_are_not_samples_of_the_compiled_block(hot, fixed_times):
    """The runs with the worse thread count (here all slow) leave the judge's samples alone."""

    class Share(_Share):
        told = 0

        def learn(self, block, n, ms):
            self.told += 1
            return self.told > _CpuShare.TRIALS  # the first runs try a thread count

    share = _engine().cpu_share = Share()
    gt_core.configure(regression_samples=3)
    fixed_times(eager=2.0, compiled=lambda: 50.0 if share.told < _CpuShare.TRIALS else 1.0)
    _train(30, True)
    (block,) = _engine().blocks.values()
    assert block.judged and block.status == Status.COMPILED
    assert 50.0 not in block.samples[("compiled", (True, False))]
    assert block.compiled_ms.count(50.0) == _CpuShare.TRIALS  # shown, just not judged
    assert not [e for e in gt_core.report().events if e["type"] == ev.REVERT]


def test_client_match_turned_back_on_gets_the_plans_again(hot):
    gt_core.configure(client_match=False)
    _train(20, True)
    assert gt_core.client.capture.session().matcher.runs == 0
    gt_core.configure(client_match=True)
    params, _ = _train(20, True)
    ref, _ = _train(20, False)
    for a, b in zip(params, ref, strict=True):
        assert_close(a, b)
    assert gt_core.client.capture.session().matcher.runs >= 10


def test_a_run_input_fits_only_with_every_field_of_its_metadata():
    from gt_core.stream.meta import all_fit, value_meta

    t = torch.randn(4, 3)
    metas = [value_meta(t)]
    assert all_fit({1: t}, [1], metas)
    assert not all_fit({}, [1], metas)  # freed, or never computed
    for other in (
        torch.randn(3, 4),
        t.t().contiguous().t(),
        t.double(),
        torch.randn(12)[:12].view(4, 3)[:, :2],
    ):
        assert not all_fit({1: other}, [1], metas), other
    assert all_fit({1: t, 2: t}, [1, 2], metas * 2)


def test_a_one_element_dims_stride_is_free_on_both_sides():
    """Client and worker answer "is this the block's input?" alike: a dimension of one
    element addresses nothing, so its stride may be anything; any other stride may not."""
    from gt_core.stream.meta import all_fit, fits, tensor_meta, value_meta

    t = torch.randn(4, 1, 3)  # strides (3, 3, 1)
    odd = torch.randn(1, 4, 3).transpose(0, 1)  # the same elements' layout: (3, 12, 1)
    assert t.stride() != odd.stride()
    assert all_fit({1: odd}, [1], [value_meta(t)])
    assert fits(value_meta(odd), value_meta(t)) and fits(tensor_meta(odd), value_meta(t)[:3])
    moved = torch.randn(3, 1, 4).transpose(0, 2)  # (4, 1, 3) with strides (1, 4, 4)
    assert not all_fit({1: moved}, [1], [value_meta(t)])
    assert not fits(value_meta(moved), value_meta(t))
    assert not fits(value_meta(t), value_meta(t)._replace(device=torch.device("meta")))


def test_inputs_that_differ_only_in_a_one_element_stride_run_the_compiled_block(hot):
    """A loop whose batch comes with another stride on a one-element dim in some steps runs
    its block compiled in every step, equal to eager, instead of leaving the plan."""

    def run(on_worker):
        ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
        with ctx:
            torch.manual_seed(0)
            model = torch.nn.Linear(3, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            xs = [torch.randn(4, 1, 3), torch.randn(1, 4, 3).transpose(0, 1)]  # (3,3,1), (3,12,1)
            for i in range(24):
                model(xs[i % 2]).square().mean().backward()
                opt.step()
                opt.zero_grad()
            if on_worker:
                gt_core.wait()
            return [p.detach().clone() for p in model.parameters()]

    got, ref = run(True), run(False)
    for a, b in zip(got, ref, strict=True):
        assert_close(a, b)
    (p,) = gt_core.report().to_data()["hot_paths"]
    assert p["compiled_runs"] >= 15, p


def test_an_eager_graphs_first_run_is_neither_a_baseline_nor_a_probe():
    """FX's generated code and the kernels' first calls make an eager graph's first run many
    times slower than the next: it is no sample, and a probe it was is run again. A graph
    that ran before (its check, an eager run) is warm: the probes are the ones wanted."""
    from types import SimpleNamespace

    from gt_core.hotpath.blocks import Block
    from gt_core.hotpath.judge import Judge

    said = []
    outbox = SimpleNamespace(emit=lambda *a, **k: said.append(k.get("kind")))
    judge = Judge(outbox, SimpleNamespace(compiling=0), SimpleNamespace(regression_samples=5))
    block = Block(SimpleNamespace(sig="b"))
    block.want_probes(2)
    judge.eager_ran(block, 50.0, first=True)
    assert (block.probe, block.probed, dict(block.samples)) == (2, 1, {})
    judge.eager_ran(block, 5.0)
    judge.eager_ran(block, 6.0)
    assert (block.probe, block.probed) == (0, 3)
    assert list(block.samples[("eager", None)]) == [5.0, 6.0]
    assert said == ["eager"] * 3  # (each shown in the report, the first too)


def test_an_eager_run_begun_beside_the_blocks_compile_is_no_baseline_when_it_ends_after():
    """A run that began while its block compiled and ended after the compile did was slowed
    by it for most of its time: shown as a run beside the compile, never an eager baseline."""
    from types import SimpleNamespace

    from gt_core.hotpath.blocks import Block
    from gt_core.hotpath.judge import Judge

    said = []
    outbox = SimpleNamespace(emit=lambda *a, **k: said.append(k.get("kind")))
    judge = Judge(outbox, SimpleNamespace(compiling=0), SimpleNamespace(regression_samples=5))
    block = Block(SimpleNamespace(sig="b"))
    block.move(Status.COMPILING)
    block.move(Status.COMPILED)  # (the compile ended as the run went on)
    judge.eager_ran(block, 49.0, beside=True)
    judge.eager_ran(block, 5.0)
    assert said == ["compiling", "eager"]
    assert list(block.samples[("eager", None)]) == [5.0] and list(block.eager_ms) == [5.0]

"""Faults a notebook user meets: Ctrl-C, nesting, threads, lost errors, a dead or stalled worker.

Each test is a probe of an adversarial user: what it does must end in eager's numbers or a
clear error, never a wrong value, a crash of the kernel or an error that goes missing.
"""

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from conftest import until
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import gt_core
from gt_core.client import capture as _capture
from gt_core.observe.report import summarize


class _Interrupter:
    """Sends SIGINT to the main thread when ``when()`` holds, or after ``delay`` seconds.

    Used inside ``contextlib.suppress(KeyboardInterrupt)`` around the code interrupted, and
    joined inside it too, so the signal can only land there.
    """

    def __init__(self, when=None, delay: float | None = None):
        self.when, self.delay = when, delay
        self.cancelled = threading.Event()
        self.sent = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        if self.when is not None:
            if not until(lambda: self.when() or self.cancelled.is_set()):
                return
        elif self.cancelled.wait(self.delay):
            return
        if not self.cancelled.is_set():
            self.sent = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def join(self):
        self.cancelled.set()
        self.thread.join()


def _train(steps: int, seed: int = 0, sync: bool = False) -> list[torch.Tensor]:
    """A small MLP trained with SGD momentum; its parameters at the end (proxies in a capture)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sync:
            loss.item()
    return [p.detach() for p in model.parameters()]


def _equal_to_eager(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu() if gt_core.is_remote(g) else g, w, atol=1e-6, rtol=1e-5)


# -- Ctrl-C ---------------------------------------------------------------------------------
def test_an_interrupted_sync_never_returns_another_requests_answer(process):
    with gt_core.capture():
        big = torch.ones(300, 300)
    t = gt_core.worker()
    os.kill(t.pid, signal.SIGSTOP)  # the worker cannot answer: the interrupt lands in the wait
    transport = _capture.session().transport
    try:
        with contextlib.suppress(KeyboardInterrupt):
            sender = _Interrupter(when=lambda: transport.waiting == "fetch")
            try:
                big.cpu()
                pytest.fail("the sync was not interrupted")
            finally:
                sender.join()
        assert sender.sent
    finally:
        os.kill(t.pid, signal.SIGCONT)
    # The late answer (a 300x300 tensor) arrives now and is dropped; each sync gets its own.
    with gt_core.capture():
        assert torch.equal(torch.ones(2).cpu(), torch.ones(2))
        assert torch.zeros(3).tolist() == [0.0, 0.0, 0.0]
        assert (torch.arange(4.0) * 2).sum().item() == 12.0
    assert t.alive


@pytest.mark.parametrize("seed", range(12))
def test_ctrl_c_anywhere_in_a_training_cell_leaves_a_session_equal_to_eager(process, seed):
    """Interrupts at random points (recording, plans followed, syncs); the next cell is eager's."""
    gt_core.configure(auto_compile=True, backend="eager", threshold=3, background=False)
    rng = random.Random(seed)
    with contextlib.suppress(KeyboardInterrupt):
        sender = _Interrupter(delay=rng.uniform(0.0, 0.4))
        try:
            with gt_core.capture():
                _train(400, seed=seed, sync=seed % 2 == 0)
        finally:
            sender.join()
    want = _train(30, seed=100 + seed)
    with gt_core.capture():
        got = _train(30, seed=100 + seed)
    _equal_to_eager(got, want)


def test_a_held_interrupt_is_raised_at_the_next_op_not_lost(inprocess):
    from gt_core.client import interrupt as _interrupt

    with gt_core.capture():
        a = torch.ones(3)
        _interrupt.STATE["pending"] = True  # as the handler leaves it inside gt's own code
        with pytest.raises(KeyboardInterrupt):
            a + 1
        assert (a * 2).tolist() == [2.0, 2.0, 2.0]


def test_an_interrupt_inside_gt_code_is_held_and_outside_it_is_not():
    from gt_core.client import interrupt as _interrupt
    from gt_core.client import session as _session

    assert _interrupt._in_gt(_frame_in(_session))
    assert not _interrupt._in_gt(sys._getframe())  # this file is the user's


def _frame_in(module):
    """A frame whose code lives in ``module``'s file."""
    code = compile("import sys\nf = sys._getframe()", module.__file__, "exec")
    ns: dict = {}
    exec(code, ns)
    return ns["f"]


# -- nesting and threads --------------------------------------------------------------------
def test_nested_capture_reenters_the_active_one(inprocess):
    with gt_core.capture() as outer:
        with gt_core.capture() as inner:
            x = torch.ones(3) * 2
        assert inner is outer
        y = x + 1
    assert y.tolist() == [3.0, 3.0, 3.0]


def test_nested_capture_with_other_options_is_a_clear_error(inprocess):
    with gt_core.capture():
        with pytest.raises(gt_core.CaptureError, match="outermost capture"):
            with gt_core.capture(threshold=3):
                pass
        assert (torch.ones(2) + 1).tolist() == [2.0, 2.0]


def test_a_gt_cell_that_enters_capture_runs(inprocess):
    shell = start_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gt_jupyter")
    try:
        r = shell.run_cell(
            "%%gt\nimport torch, gt_core\nwith gt_core.capture():\n    z = torch.ones(3) * 2\n",
            store_history=False,
        )
        assert r.success, r.error_in_exec
        assert shell.user_ns["z"].tolist() == [2.0, 2.0, 2.0]
    finally:
        shell.run_line_magic("unload_ext", "gt_jupyter")


def test_manual_seed_in_a_capture_on_another_thread(inprocess):
    out = {}

    def work():
        with gt_core.capture():
            torch.manual_seed(3)
            out["x"] = torch.randn(4).cpu()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    torch.manual_seed(3)
    assert torch.equal(out["x"], torch.randn(4))


def test_three_threads_training_at_once_equal_eager(process):
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(3)]
    inits = [
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        for _ in range(3)
    ]

    def train(model, x, y, steps=40):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    import copy

    want = [train(copy.deepcopy(m), x, y) for m, (x, y) in zip(inits, data, strict=True)]
    got: dict = {}
    errors = []

    def work(i):
        try:
            with gt_core.capture():
                m = copy.deepcopy(inits[i])
                gt_core.to_worker(m)
                got[i] = [p.cpu() for p in train(m, *data[i])]
        except Exception as exc:  # pragma: no cover (shown by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(3):
        _equal_to_eager(got[i], want[i])


def test_overlapping_captures_restore_manual_seed(inprocess):
    original = torch.manual_seed
    inside, leave = threading.Event(), threading.Event()

    def other():
        with gt_core.capture():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with gt_core.capture():
        pass
    leave.set()
    t.join()
    assert torch.manual_seed is original
    assert torch.random.manual_seed is original


# -- the random state -----------------------------------------------------------------------
def test_a_seed_set_before_the_capture_reaches_the_worker_and_comes_back(process):
    torch.manual_seed(5)
    with gt_core.capture():
        inside = torch.randn(4).cpu()
    after = torch.randn(4)
    torch.manual_seed(5)
    assert torch.equal(inside, torch.randn(4))
    assert torch.equal(after, torch.randn(4))  # not the capture's first draw again


# -- errors are never lost ------------------------------------------------------------------
def test_a_worker_error_without_a_sync_is_raised_at_the_end_of_the_capture(process):
    with pytest.raises(RuntimeError) as info:
        with gt_core.capture():
            big = torch.empty(10**12)  # fails on the worker only
            big = big + 1
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "aten.empty" in notes
    assert "big = torch.empty(10**12)" in notes  # the user's line
    errors = [e for e in gt_core.events_log().snapshot() if e["type"] == "worker.error"]
    assert errors and "big = torch.empty" in errors[-1]["where"]
    with gt_core.capture():  # the session goes on
        assert (torch.ones(2) * 3).tolist() == [3.0, 3.0]


def test_a_fault_inside_the_worker_engine_is_an_error_and_the_session_goes_on(
    inprocess, monkeypatch
):
    """A fault of gt's own while the worker runs an instruction (here: the hot-path engine
    recording it) is that instruction's error at the next sync; the worker serves on."""
    from gt_core.stream.instructions import OP

    data = torch.arange(3.0)
    with gt_core.capture():
        x = gt_core.to_worker(data)
        history = _capture.session().transport.engine.history
        append, faults = history.append, []

        def faulty(ins, *args):
            if ins.code == OP and not faults:
                faults.append(ins)
                raise RuntimeError("gt test: a fault of the engine")
            return append(ins, *args)

        monkeypatch.setattr(history, "append", faulty)
        y = x * 2
        with pytest.raises(RuntimeError, match="a fault of the engine"):
            y.cpu()
        assert (x + 1).tolist() == [1.0, 2.0, 3.0]
        with pytest.raises(RuntimeError, match="never computed"):
            y.cpu()
    assert faults


def test_a_gt_cell_with_a_worker_error_and_no_sync_shows_it(process):
    shell = start_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gt_jupyter")
    try:
        r = shell.run_cell(
            "%%gt --show none\nimport torch\nbig = torch.empty(10**12)\n", store_history=False
        )
        assert not r.success
        assert "aten.empty" in "\n".join(getattr(r.error_in_exec, "__notes__", []))
        r = shell.run_cell(
            "%%gt --show none\nw = (torch.ones(2) + 1).tolist()\n", store_history=False
        )
        assert r.success, r.error_in_exec
        assert shell.user_ns["w"] == [2.0, 2.0]
    finally:
        shell.run_line_magic("unload_ext", "gt_jupyter")


# -- a dead or stalled worker ---------------------------------------------------------------
def test_after_the_worker_dies_the_next_capture_starts_a_fresh_one(process, capfd):
    with gt_core.capture():
        old = torch.ones(3)
    pid = gt_core.worker().pid
    os.kill(pid, signal.SIGKILL)
    assert until(lambda: not gt_core.worker().alive)
    with gt_core.capture():
        fresh = torch.ones(3) + 1
    assert fresh.tolist() == [2.0, 2.0, 2.0]
    assert gt_core.worker().pid != pid
    err = capfd.readouterr().err.strip().splitlines()
    said = [line for line in err if "started a fresh one" in line]
    assert len(said) == 1 and "SIGKILL" in said[0]
    with pytest.raises(gt_core.WorkerLost):
        old.tolist()


def test_a_stalled_worker_is_named_and_the_wait_stays_interruptible(process, capfd, monkeypatch):
    with gt_core.capture():
        x = torch.ones(2)
    transport = _capture.session().transport
    monkeypatch.setattr(transport, "stall_s", 0.2)
    os.kill(transport.pid, signal.SIGSTOP)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            sender = _Interrupter(when=lambda: "still waiting" in capfd.readouterr().err)
            try:
                x.tolist()
            finally:
                sender.join()
        assert sender.sent
    finally:
        os.kill(transport.pid, signal.SIGCONT)
    assert x.tolist() == [1.0, 1.0]


def test_status_tells_a_dead_worker_from_a_compiling_one():
    events = [
        {"type": "hotpath.detected", "t": 1, "signature": "s1", "ops": [], "n_ops": 9},
        {"type": "compile.started", "t": 2, "signature": "s1"},
        {"type": "worker", "t": 3, "state": "died", "cause": "it was killed by SIGKILL"},
    ]
    (p,) = summarize(events)["hot_paths"]
    assert p["status"] == "failed"
    assert "worker died" in p["fallback_reason"]


_EXITS = """
import os, sys, torch, gt_core
gt_core.configure(backend="inductor", auto_compile=True)
with gt_core.capture():
    x = torch.ones(3) + 1
print(x.tolist())
print(os.getpid(), flush=True)
{end}
"""


@pytest.mark.parametrize("end", ["pass", "os.kill(gt_core.worker().pid, 9)"])
def test_no_compile_process_or_temp_folder_outlives_the_worker(tmp_path, end):
    env = dict(os.environ, TMPDIR=str(tmp_path), GT_DEVICE="cpu")
    script = textwrap.dedent(_EXITS.format(end=end))
    r = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    leftover = lambda: [p.name for p in tmp_path.iterdir() if p.name.startswith("gt-compile-")]  # noqa: E731
    assert until(lambda: not leftover(), 30), leftover()
    assert until(lambda: not _compile_procs(tmp_path), 30), _compile_procs(tmp_path)


def _compile_procs(tmp_path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if str(tmp_path) in line and "_compile_proc" in line]

"""A GPU worker times runs with events it reads once they have happened: it never waits.

Without a GPU the device is a fake one here: each run's end event happens only ``LAG`` runs
later (a device running behind its launches), and asking a run's time before it has
happened is counted as a wait for the device (a sync); a session's runs make none.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models import mlp

import gt_core
from gt_core import events as ev
from gt_core.hotpath import clock

LAG = 2


class LaggingDevice:
    """Runs that end LAG launches after they start; every time read in launch order."""

    def __init__(self, ms: dict):
        self.ms = ms  # kind -> milliseconds each of its runs takes
        self.launched = 0
        self.waits = 0  # times read before their runs ended: syncs with the device
        self.kinds: list[str] = []

    def timer(self, kind: str, fn, *args):
        out = fn(*args)
        self.kinds.append(kind)
        self.launched += 1
        return out, clock.Pending(
            _Event(self, 0.0, None), _Event(self, self.ms[kind], self.launched)
        )

    def finish(self) -> None:  # everything launched has run (what a sync would wait for)
        self.launched += LAG


class _Event:
    def __init__(self, device: LaggingDevice, ms: float, run: int | None):
        self.device, self.at, self.run = device, ms, run

    def query(self) -> bool:
        return self.run is None or self.device.launched >= self.run + LAG

    def synchronize(self) -> None:  # (waiting: the device runs what was launched)
        if not self.query():
            self.device.waits += 1
            self.device.finish()

    def elapsed_time(self, end: _Event) -> float:
        return end.at - self.at


@pytest.fixture
def lagging(inprocess):
    gt_core.configure(
        auto_compile=True, backend="aot_eager", background=False, threshold=3, regression_samples=3
    )

    def install(eager: float, compiled: float) -> LaggingDevice:
        device = LaggingDevice({"eager": eager, "compiled": compiled})
        gt_core.client.capture.session().transport.engine.timer = device.timer
        return device

    yield install
    gt_core.configure(auto_compile=False, background=True, threshold=5, backend="eager")


def _train(install, steps: int):
    with gt_core.capture():
        device = None
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        losses = []
        for _ in range(steps):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)
            if device is None:
                device = install()  # (from the second step: the first made the model)
        return device, [t.item() for t in losses], gt_core.report()


@pytest.mark.parametrize("eager, compiled, verdict", [(2.0, 1.0, ev.KEPT), (1.0, 2.0, ev.REVERT)])
def test_the_judge_decides_on_times_read_after_their_runs_ended_never_waiting(
    lagging, eager, compiled, verdict
):
    device, _, report = _train(lambda: lagging(eager, compiled), steps=30)
    assert device.waits == 0
    verdicts = [e for e in report.events if e["type"] in (ev.KEPT, ev.REVERT)]
    assert [e["type"] for e in verdicts] == [verdict]
    assert (verdicts[0]["eager_ms"], verdicts[0]["compiled_ms"]) == (eager, compiled)
    ran = [(e["kind"], e["ms"]) for e in report.events if e["type"] == ev.ITERATION]
    # Every time read, in the order the runs ran, each as long as its kind takes; the last
    # LAG runs' times not read yet (their runs have not ended on the device).
    assert [k for k, _ in ran] == device.kinds[: len(ran)]
    assert len(device.kinds) - LAG <= len(ran) < len(device.kinds)
    assert all(ms == device.ms[k] for k, ms in ran)


def test_a_run_whose_time_is_known_at_once_is_taken_at_once_and_after_pending_ones():
    taken = []
    t = clock.Timings()
    t.then(1.0, taken.append)
    assert taken == [1.0]
    device = LaggingDevice({"compiled": 5.0})
    _, pending = device.timer("compiled", lambda: None)
    t.then(pending, taken.append)
    t.then(2.0, taken.append)  # (after the pending one: the order the runs ran)
    t.settle()
    assert taken == [1.0]
    device.finish()
    t.settle()
    assert taken == [1.0, 5.0, 2.0]


def test_a_cuda_worker_times_with_events_a_cpu_worker_with_the_wall_clock():
    assert clock.for_device(torch.device("cuda", 0)) is clock.events
    assert clock.for_device(torch.device("cpu")) is clock.wall

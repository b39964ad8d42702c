"""A worker group started by torchrun (2 gloo ranks on this machine, one thread each) behind
a remote worker's listener: a client connects to rank 0, and every rank runs its stream.
Eager on one process is the oracle."""

import os
import signal
import sys

import psutil
import pytest
import torch
from conftest import start_listener, until

import gt_core
from gt_bench.workloads import mlp, training_step

KEY = b"a-torchrun-test-key-0123456789"
STEPS = 12


class Torchrun:
    """``torchrun --standalone --nproc-per-node=2 -m gt_core.worker_process --listen 127.0.0.1:0``."""

    def __init__(self, key_file):
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        self.proc, self.address = start_listener(
            [torchrun, "--standalone", "--nproc-per-node=2"], key_file, OMP_NUM_THREADS="1"
        )
        self.seen = set()

    def processes(self) -> list:
        kids = psutil.Process(self.proc.pid).children(recursive=True)
        self.seen |= {p.pid for p in kids}
        return kids

    def workers(self) -> list:
        """The ranks' worker processes now (not the ranks, nor multiprocessing's trackers)."""
        out = []
        for p in self.processes():
            try:
                if "spawn_main" in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out


@pytest.fixture
def torchrun(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    gt_core.worker().stop()
    t = Torchrun(key_file)
    yield t
    gt_core.worker().stop()
    kids = t.processes()
    t.proc.terminate()
    t.proc.communicate(timeout=60)
    _, alive = psutil.wait_procs(kids, timeout=30)
    assert not alive, f"processes outlived torchrun: {alive}"


def _train(on_worker: bool):
    torch.manual_seed(0)
    model = mlp(32, 16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with gt_core.signal.context("batch") if on_worker else _nothing():
        x, y = torch.randn(32, 32), torch.randn(32, 4)
    step = training_step(model, opt, torch.nn.functional.mse_loss)
    for _ in range(STEPS):
        loss = step(x, y)
    return [p.detach().cpu() for p in model.parameters()], loss.item()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_torchrun_group_runs_the_clients_stream_sharded_and_replicated(torchrun):
    want, want_loss = _train(on_worker=False)
    for shard in ({"batch": 0}, {}):
        gt_core.configure(
            backend="aot_eager", threshold=3, regression_samples=10**4, workers=2, shard=shard
        )
        gt_core.connect(torchrun.address, authkey=KEY)
        with gt_core.capture():
            got, got_loss = _train(on_worker=True)
        assert got_loss == pytest.approx(want_loss, abs=1e-5)
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=0)
        gt_core.wait()
        ranks = gt_core.report().to_data()["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1], ranks
        pids = {p.pid for p in torchrun.workers()}
        for r in ranks:  # each rank is a worker process of torchrun's, and ran the step compiled
            assert r["pid"] in pids and r["world"] == 2
            assert r["compiled_runs"] > 0, r  # (the drain brought every rank's events)
            if shard:
                assert r["comm_per_step"]["all_reduce"]["count"] > 0, r
        gt_core.worker().stop()  # the client leaves: the ranks' workers end, torchrun stays
        assert until(lambda: not torchrun.workers(), 30), torchrun.workers()
    assert torchrun.proc.poll() is None


def _rank(rank: int) -> dict:
    return gt_core.report().to_data()["ranks"][rank]


def test_a_killed_rank_is_one_line_and_the_next_client_gets_a_fresh_group(torchrun):
    gt_core.configure(workers=2, shard={}, auto_compile=False)
    gt_core.connect(torchrun.address, authkey=KEY)
    with gt_core.capture():
        a = torch.ones(3) + 1
        assert a.sum().item() == 6.0
        gt_core.wait()
        rank1 = _rank(1)["pid"]
        os.kill(rank1, signal.SIGKILL)
        assert until(lambda: not gt_core.worker().alive, 20)
        with pytest.raises(
            gt_core.WorkerDied, match=r"^gt remote worker .*died: .*rank 1 .*ended"
        ) as info:
            a.sum().item()
        assert "\n" not in str(info.value)
    assert until(lambda: len(torchrun.workers()) == 0, 30), torchrun.workers()
    with gt_core.capture():  # a fresh group for the next client
        assert (torch.ones(2) * 3).sum().item() == 6.0


def test_workers_must_be_the_groups_size(torchrun):
    gt_core.configure(workers=3, shard={})
    with pytest.raises(gt_core.ConfigError, match=r"^workers=3 is not accepted; expected 2 "):
        gt_core.connect(torchrun.address, authkey=KEY)
    gt_core.configure(workers=1)

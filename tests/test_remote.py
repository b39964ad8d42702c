"""The remote worker over 127.0.0.1: `python -m gt_core.worker_process` served in a subprocess."""

import os
import pickle
import signal
import socket
import sys

import psutil
import pytest
import torch
from conftest import start_listener, until
from IPython.core.error import UsageError

import gt_core
from gt_bench.workloads import mlp
from gt_core.options import from_env

KEY = b"a-test-key-0123456789abcdef"


class Server:
    """``python -m gt_core.worker_process --listen 127.0.0.1:0`` in a subprocess; its port, its lines."""

    def __init__(self, key_file):
        self.proc, self.address = start_listener([sys.executable], key_file)
        self.port = int(self.address.rsplit(":", 1)[1])
        self.seen = {self.proc.pid}  # its pid and its workers' (see workers)

    def workers(self) -> list:
        kids = psutil.Process(self.proc.pid).children(recursive=True)
        self.seen |= {p.pid for p in kids}
        return kids

    def stop(self) -> str:
        """End it (SIGTERM) and its worker processes; what it said on stderr."""
        kids = self.workers() if self.proc.poll() is None else []
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        gone, alive = psutil.wait_procs(kids, timeout=30)
        assert not alive, f"worker processes outlived their listener: {alive}"
        return err


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(KEY + b"\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def server(key_file):
    gt_core.worker().stop()
    s = Server(key_file)
    yield s
    gt_core.worker().stop()
    s.stop()
    left = [n for n in os.listdir("/dev/shm") if n.split("-")[2:3] in [[str(p)] for p in s.seen]]
    assert not left, left


def _train(steps, on_worker, jit=False):
    torch.manual_seed(0)
    model = mlp(784, 256, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(128, 784), torch.randn(128, 10)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = gt_core.jit(step) if jit else step
    if on_worker:
        with gt_core.capture():
            gt_core.to_worker(model)
            x, y = gt_core.to_worker(x), gt_core.to_worker(y)
            for _ in range(steps):
                loss = fn(x, y)
            loss = loss.item()
    else:
        for _ in range(steps):
            loss = fn(x, y).item()
    return [p.detach().cpu() for p in model.parameters()], loss, fn


def test_quickstart_loop_on_a_remote_worker_equals_eager_and_compiles(server):
    gt_core.configure(backend="aot_eager", threshold=3, background=False, regression_samples=10**4)
    w = gt_core.connect(server.address, authkey=KEY)
    assert w.pid in [p.pid for p in server.workers()]  # the worker is the listener's child
    got, got_loss, _ = _train(40, on_worker=True)
    want, want_loss, _ = _train(40, on_worker=False)
    assert got_loss == pytest.approx(want_loss, abs=1e-6)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)
    gt_core.wait(compiles=True)
    paths = gt_core.report().to_data()["hot_paths"]
    assert any(p["status"] == "compiled" and p["compiled_runs"] > 0 for p in paths), paths
    # jit over the same connection: replays, equal to eager
    got, _, fn = _train(30, on_worker=True, jit=True)
    want, _, _ = _train(30, on_worker=False)
    assert sum(e.replayed for e in fn.entries.values()) > 0
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)


def test_a_wrong_authkey_is_refused_in_one_line_and_nothing_runs(server):
    with pytest.raises(gt_core.RemoteRefused, match="refused this client's authkey") as info:
        gt_core.connect(server.address, authkey=b"not the key")
    assert "\n" not in str(info.value)
    assert until(lambda: not server.workers(), 10)  # no worker process was started for it
    with socket.create_connection(("127.0.0.1", server.port), timeout=10):  # says nothing
        gt_core.connect(server.address, authkey=KEY)  # the listener goes on serving
    with gt_core.capture():
        assert (torch.ones(3) * 2).sum().item() == 6.0
    gt_core.worker().stop()
    err = server.stop()
    assert "refused 127.0.0.1:" in err and "wrong authkey" in err, err
    assert "during authentication" in err, err  # the silent one, dropped after a few seconds


class _Crafted:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big", signed=True) + payload


def test_a_crafted_pickle_is_never_loaded_before_authentication(server, tmp_path):
    marker = str(tmp_path / "unpickled")
    crafted = pickle.dumps(_Crafted(marker))
    assert len(crafted) < 256  # it fits where the listener reads the challenge's answer
    for when in ("as the answer to the challenge", "before reading the challenge"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            if when.startswith("as"):
                s.recv(4096)  # the challenge
            s.sendall(_frame(crafted) * 3)
            s.settimeout(10)
            try:
                while s.recv(4096):  # the listener's refusal, then its close
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
    assert not os.path.exists(marker)  # (loading it would have made this folder)
    assert not server.workers()
    gt_core.connect(server.address, authkey=KEY)
    with gt_core.capture():
        assert torch.arange(4.0).sum().item() == 6.0
    assert not os.path.exists(marker)


def test_a_killed_remote_worker_is_one_line_and_a_fresh_capture_reconnects(server, capsys):
    gt_core.connect(server.address, authkey=KEY)
    with gt_core.capture():
        a = torch.ones(4)
    old = gt_core.worker().pid
    os.kill(old, signal.SIGKILL)
    assert until(lambda: not gt_core.worker().alive, 10)
    with pytest.raises(gt_core.WorkerDied, match=r"^gt remote worker .*at 127\.0\.0\.1:") as info:
        a.sum().item()  # its proxies say so, in one line
    assert "\n" not in str(info.value) and "connection closed" in str(info.value)
    with gt_core.capture():  # a fresh capture connects again: a fresh worker there
        assert torch.ones(2).sum().item() == 2.0
    assert gt_core.worker().pid != old
    assert "started a fresh one" in capsys.readouterr().err
    with pytest.raises(gt_core.WorkerLost):
        a.sum()
    # the listener itself gone: the next capture says so, and what to do
    server.stop()
    assert until(lambda: not gt_core.worker().alive, 10)
    with pytest.raises(gt_core.RemoteRefused, match="cannot reach the remote worker") as info:
        with gt_core.capture():
            pass
    assert "python -m gt_core.worker_process --listen" in str(info.value)


def test_gt_worker_tcp_and_the_authkey_file_option(server, key_file, monkeypatch):
    opts = from_env({"GT_WORKER": f"tcp://{server.address}", "GT_AUTHKEY_FILE": str(key_file)})
    assert opts.worker == f"tcp://{server.address}" and opts.authkey_file == str(key_file)
    with pytest.raises(gt_core.ConfigError, match=r"^GT_WORKER='tcp://nohost' .*tcp://HOST:PORT"):
        from_env({"GT_WORKER": "tcp://nohost"})
    gt_core.configure(worker=opts.worker, authkey_file=opts.authkey_file)
    with gt_core.capture():
        assert (torch.ones(3) + 1).sum().item() == 6.0
    assert gt_core.worker().pid in [p.pid for p in server.workers()]
    gt_core.worker().stop()
    gt_core.configure(authkey_file=None)
    with pytest.raises(gt_core.RemoteRefused, match="needs its authkey"):
        with gt_core.capture():
            pass


def test_gt_connect_line_magic(server, key_file):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gt_jupyter")
    try:
        with pytest.raises(UsageError, match="refused this client's authkey"):
            bad = key_file.parent / "bad"
            bad.write_bytes(b"wrong")
            ip.run_line_magic("gt", f"connect {server.address} --authkey-file {bad}")
        with pytest.raises(UsageError, match="expected %gt connect HOST:PORT"):
            ip.run_line_magic("gt", "connect")
        out = ip.run_line_magic("gt", f"connect {server.address} --authkey-file {key_file}")
        assert f"tcp://{server.address}" in str(out)
        r = ip.run_cell("%%gt --no-compile\nimport torch\nz = (torch.ones(5) * 3).sum().item()\n")
        assert r.success, r.error_in_exec
        assert ip.user_ns["z"] == 15.0
    finally:
        ip.run_line_magic("unload_ext", "gt_jupyter")
        ip.config.pop("GT", None)

"""Inductor compiles in a process of their own (gt_core.compile.process)."""

import os
import pickle
import shutil
import signal

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from conftest import assert_close, until
from models import mlp

import gt_core
from gt_core import events as ev
from gt_core.compile import block_cache
from gt_core.compile.process import CompileProcess, CompileProcessDied
from gt_core.compile.repair import evictions, retrying, whole_elf
from gt_core.options import from_env
from gt_core.stream.meta import value_meta


def _events(kind):
    return [e for e in gt_core.report().to_data()["events"] if e["type"] == kind]


def _train(on_worker: bool, before: int = 8, after: int = 6):
    """Adam + cosine schedule (lifted scalars); on the worker, wait for the compile midway."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    losses = []
    for i in range(before + after):
        if on_worker and i == before:
            gt_core.wait(compiles=True)  # compiled: the next occurrences run compiled
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.item())
    return model, losses


def _check_compiled_in_process_and_equal():
    ref, ref_losses = _train(False)
    with gt_core.capture():
        got, losses = _train(True)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert [e["where"] for e in _events(ev.COMPILE_STARTED)] == ["process"]
    assert len(_events(ev.COMPILE_FINISHED)) == 1 and not _events(ev.COMPILE_FAILED)


@pytest.fixture
def inductor_background(inprocess):
    gt_core.configure(
        auto_compile=True,
        backend="inductor",
        background=True,
        threshold=3,
        regression_samples=10_000,
    )
    yield
    gt_core.configure(auto_compile=False, backend="eager", regression_samples=5)


@pytest.mark.inductor
def test_block_compiled_in_the_compile_process_equals_eager(inductor_background):
    _check_compiled_in_process_and_equal()
    runs = [e["kind"] for e in _events(ev.ITERATION)]
    assert runs.count("compiled") >= 5  # every occurrence after the wait


@pytest.mark.inductor
def test_a_compile_mode_reaches_the_compile_process_as_inductors_config(inductor_background):
    """A mode's options are inductor config, which standalone_compile takes as its config
    patches (given as compile_fx's own arguments, every mode but the default failed)."""
    gt_core.configure(mode="max-autotune-no-cudagraphs")
    try:
        _check_compiled_in_process_and_equal()
    finally:
        gt_core.configure(mode=None)


@pytest.mark.inductor
def test_spawned_worker_warms_the_compile_process_and_its_blocks_equal_eager(process):
    """The product's path: a worker spawned for inductor imports and warms before serving."""
    gt_core.configure(
        auto_compile=True,
        backend="inductor",
        background=True,
        threshold=3,
        regression_samples=10_000,
    )
    try:
        gt_core.worker().restart()  # spawned with these options: warms at its start
        gt_core.reset()
        _check_compiled_in_process_and_equal()
    finally:
        gt_core.configure(auto_compile=False, backend="eager", regression_samples=5)
        gt_core.worker().restart()


# g++ as it is, except the first link of an inductor kernel (a ``*.main.so``) while
# GT_TEST_STOP_LINK names a folder not made yet: that link makes the folder, creates its output
# empty (what the linker does first, and all a link killed early leaves), says so, and stops
# there until its process group is killed.
_STOPPING_GXX = """#!/bin/sh
out=""
prev=""
for a in "$@"; do
    if [ "$prev" = "-o" ]; then out="$a"; fi
    prev="$a"
done
case "$out" in
    *.main.so)
        if [ -n "$GT_TEST_STOP_LINK" ] && mkdir "$GT_TEST_STOP_LINK" 2>/dev/null; then
            : > "$out"
            : > "$GT_TEST_STOP_LINK/linking"
            kill -STOP $$
        fi
        ;;
esac
exec {gxx} "$@"
"""


def _sgd(steps: int, wait_at: int | None = None):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    for i in range(steps):
        if i == wait_at:
            gt_core.wait(compiles=True)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.inductor
def test_a_compile_cut_short_never_poisons_a_later_one(inductor_background, tmp_path, monkeypatch):
    """A block's compile killed while it links a kernel (the worker stopped, the kernel
    restarted: the compile process's group is killed) leaves that kernel's ``.so`` empty in
    inductor's cache, where every later compile of it would load it. The same block compiled
    in a fresh compile process removes it, says so in an event, and compiles, equal to eager."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++ (inductor's C++ compiler here)")
    bin_dir, cache, stop = tmp_path / "bin", tmp_path / "inductor", tmp_path / "stop"
    bin_dir.mkdir()
    (bin_dir / "g++").write_text(_STOPPING_GXX.format(gxx=gxx))
    (bin_dir / "g++").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))  # a cache of the test's own
    monkeypatch.setenv("GT_TEST_STOP_LINK", str(stop))

    with gt_core.capture():
        _sgd(6)
        gt_core.wait()  # the steps reach the worker: the block is hot, its compile starts
        assert until((stop / "linking").exists, timeout=300), "the block's compile never linked"
    gt_core.worker().stop()  # kills the compile process's group mid-link
    damaged = sorted(str(p) for p in cache.rglob("*.main.so") if not whole_elf(str(p)))
    assert damaged, "the compile cut short left no damaged kernel"

    monkeypatch.delenv("GT_TEST_STOP_LINK")
    gt_core.reset()
    ref = _sgd(10)
    with gt_core.capture():
        got = _sgd(10, wait_at=6)
        for a, b in zip(got.parameters(), ref.parameters(), strict=True):
            assert_close(a, b, atol=1e-5)
    assert [e["reason"] for e in _events(ev.COMPILE_FAILED)] == []
    assert len(_events(ev.COMPILE_FINISHED)) == 1
    evicted = _events(ev.CACHE_EVICTED)
    assert set(damaged) <= {f for e in evicted for f in e["files"]}
    assert all("file too short" in e["reason"] for e in evicted)
    assert all(whole_elf(f) for f in damaged)  # built again, whole
    (p,) = gt_core.report().to_data()["hot_paths"]
    assert p["status"] == "compiled" and p["compiled_runs"] > 0


def test_only_damaged_files_in_inductors_cache_are_evicted(tmp_path, monkeypatch):
    """A failure naming damaged files of the cache evicts them and runs again, one retry per
    file it meets; one naming whole files, or files outside the cache, is raised as it was."""
    import _ctypes  # an extension module: a whole ELF shared object

    cache = tmp_path / "inductor"
    (cache / "ab").mkdir(parents=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    data = open(_ctypes.__file__, "rb").read()
    whole, cut, empty = (cache / "ab" / f"c{name}.main.so" for name in ("whole", "cut", "empty"))
    whole.write_bytes(data)
    cut.write_bytes(data[: len(data) // 2])
    empty.write_bytes(b"")
    outside = tmp_path / "cempty.main.so"
    outside.write_bytes(b"")
    assert whole_elf(str(whole)) and not whole_elf(str(cut)) and not whole_elf(str(empty))

    calls = []

    def compile_():
        calls.append(1)
        if empty.exists():
            raise ImportError(f"{empty}: file too short")
        if cut.exists():
            raise RuntimeError("InductorError") from OSError(f"{cut}: invalid ELF header")
        return "compiled"

    with evictions() as evicted:
        assert retrying(compile_) == "compiled"
    assert len(calls) == 3
    assert [e["files"] for e in evicted] == [[str(empty)], [str(cut)]]
    assert whole.exists()

    for named in (whole, outside):

        def fails(named=named):
            raise ImportError(f"{named}: file too short")

        with evictions() as evicted, pytest.raises(ImportError):
            retrying(fails)
        assert named.exists() and evicted == []


def test_a_closed_compile_process_is_never_started_again():
    """A warm-up cut short by close() asked for the process again: it outlived its worker."""
    cp = CompileProcess()
    cp.start()
    pid = cp.pid
    assert pid is not None
    cp.close()
    assert cp.pid is None
    with pytest.raises(RuntimeError, match="compile process was closed"):
        cp.start()
    with pytest.raises(RuntimeError, match="compile process was closed"):
        cp.warm()
    assert cp.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.inductor
def test_compile_process_reports_errors_and_survives_its_own_death(monkeypatch):
    monkeypatch.setattr(block_cache, "enabled", lambda: False)  # (each compile in the process)
    cp = CompileProcess()
    try:
        g = fx.Graph()
        a, b = g.placeholder("a"), g.placeholder("b")
        g.output((g.call_function(torch.ops.aten.mm.default, (a, b)),))
        gm = fx.GraphModule(torch.nn.Module(), g)
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        fn, seconds = cp.compile_graph(gm, [x, w], None)
        assert_close(fn(x, w)[0], x @ w)
        assert seconds > 0
        first = cp.pid

        # A graph that cannot compile: the worker gets the compile process's reason.
        with pytest.raises(RuntimeError, match="mm|size|shape"):
            cp.compile_graph(gm, [torch.randn(3, 4), torch.randn(5, 6)], None)
        assert cp.pid == first  # an error is not a death

        # The process dies while compiling: a clear error, and the next compile starts a new one.
        class Exit:
            def __reduce__(self):
                return (os._exit, (3,))

        with pytest.raises(CompileProcessDied, match="exit code 3.*started again"):
            cp._compile(("graph", pickle.dumps(Exit())), [], None)
        fn, _ = cp.compile_graph(gm, [x, w], None)
        assert_close(fn(x, w)[0], x @ w)
        assert cp.pid not in (None, first)

        # Killed between compiles: started again, no error.
        os.kill(cp.pid, signal.SIGKILL)
        cp._proc.wait(timeout=10)
        fn, _ = cp.compile_graph(gm, [x, w], None)
        assert_close(fn(x, w)[0], x @ w)
    finally:
        cp.close()
    assert cp.pid is None


@pytest.mark.parametrize("background, where", [(True, "thread"), (False, "inline")])
def test_where_a_compile_runs_is_in_its_event(inprocess, background, where):
    import test_perf_paths  # noqa: F401  (registers the counting backend)

    gt_core.configure(
        auto_compile=True, backend="gt_counting_lift", background=background, threshold=3
    )
    try:
        with gt_core.capture():
            _train(True)
    finally:
        gt_core.configure(auto_compile=False, backend="eager", background=True, threshold=5)
    assert [e["where"] for e in _events(ev.COMPILE_STARTED)] == [where]


def test_compile_process_option_from_env():
    assert from_env({}).compile_process is True
    assert from_env({"GT_COMPILE_PROCESS": "0"}).compile_process is False


def test_a_capture_without_inductor_stops_the_compile_process(inprocess):
    gt_core.configure(backend="inductor", auto_compile=True, background=True)
    try:
        with gt_core.capture():
            engine = gt_core.client.capture.session().transport.engine
            assert engine.compile_process() is not None
        with gt_core.capture(backend="eager"):
            assert (
                engine.compiler._process is None
            )  # a warm-up of a spawned worker is cut short too
    finally:
        gt_core.configure(auto_compile=False, backend="eager")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """Inductor's cache, and gt's block cache beside it, in a folder of the test's own."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    return tmp_path / "gt_blocks"


def _mm_job(rows=3):
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output((g.call_function(torch.ops.aten.mm.default, (a, b)),))
    x, w = torch.randn(rows, 4), torch.randn(4, 5)
    metas = [value_meta(t) for t in (x, w)]
    return ("graph", pickle.dumps(fx.GraphModule(torch.nn.Module(), g))), metas, (x, w)


@pytest.mark.inductor
def test_a_block_compiled_again_is_loaded_from_gt_s_cache_not_compiled(own_cache):
    """A fresh worker (a notebook's cell run again) loads what an earlier one compiled: no
    compile process starts; a kept artifact that does not load is compiled anew; another
    block's metadata is another key."""
    job, metas, (x, w) = _mm_job()
    first = CompileProcess()
    try:
        fn, _, info = first._compile(job, metas, None)
        assert info["cache"] != "kept" and first.pid is not None
        made = {k: v for k, v in info["phases"].items() if k != "load"}
    finally:
        first.close()
    assert_close(fn(x, w)[0], x @ w)
    assert len(list(own_cache.glob("*.bin"))) == 1

    again = CompileProcess()
    try:
        fn, _, info = again._compile(job, metas, None)
        assert info["cache"] == "kept" and again.pid is None  # (loaded: nothing compiled)
        assert list(info["phases"]) == ["load"] and info["kept_phases"] == made  # (what it saved)
        assert_close(fn(x, w)[0], x @ w)

        (kept,) = own_cache.glob("*.bin")
        kept.write_bytes(b"not an artifact")
        fn, _, info = again._compile(job, metas, None)
        assert info["cache"] != "kept" and again.pid is not None
        assert_close(fn(x, w)[0], x @ w)
        assert kept.read_bytes() != b"not an artifact"  # (kept anew)

        other, other_metas, (x2, _) = _mm_job(rows=6)
        fn, _, info = again._compile(other, other_metas, None)
        assert info["cache"] != "kept" and len(list(own_cache.glob("*.bin"))) == 2
        assert_close(fn(x2, w)[0], x2 @ w)
    finally:
        again.close()


def test_the_block_cache_key_holds_the_job_its_metadata_and_options():
    job, metas, _ = _mm_job()
    k = block_cache.key(job, metas, {})
    assert k == block_cache.key(job, list(metas), {})
    assert k != block_cache.key(_mm_job(rows=4)[0:2][0], _mm_job(rows=4)[1], {})
    assert k != block_cache.key(job, metas, {"triton.cudagraphs": True})
    assert block_cache.key(("graph", lambda: 0), metas, {}) is None  # (does not pickle)


def test_the_block_cache_follows_inductors_cache_dir(tmp_path, monkeypatch):
    """A block kept beside one inductor cache is not found beside another (its kernels are
    not there: loading it would build them in the worker, outside the compile process)."""
    job, metas, _ = _mm_job()
    k = block_cache.key(job, metas, {})
    art = tmp_path / "a.bin"
    art.write_bytes(b"artifact")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "one"))
    block_cache.keep(k, str(art), {"phases": {}})
    assert block_cache.lookup(k, str(tmp_path / "got.bin")) is not None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "two"))
    assert block_cache.lookup(k, str(tmp_path / "got.bin")) is None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "one"))
    assert block_cache.lookup(k, str(tmp_path / "got.bin")) == {"phases": {}}


def test_a_block_retired_while_it_compiles_is_cancelled_and_compiles_again_if_revived(
    inductor_background, monkeypatch
):
    """A hot path retired while its block compiles (a longer period took its instructions)
    stops that compile: the block is hot again, an event says why, the report notes it; and
    a block revived later compiles again. (The compile here waits until it is no longer
    wanted, as a long cold compile would.)"""
    import threading
    import time

    from gt_core.compile.process import CompileCancelled
    from gt_core.observe.report import Status

    started, asked, calls = threading.Event(), [], []

    def slow(self, *args, wanted=None, **kwargs):
        started.set()
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("compiled again")  # (the revived block's compile: it ends here)
        while wanted():
            asked.append(1)
            time.sleep(0.01)
        raise CompileCancelled("no longer wanted: stopped while it compiled")

    monkeypatch.setattr(CompileProcess, "compile_block", slow)
    monkeypatch.setattr(CompileProcess, "warm", lambda self: None)
    with gt_core.capture():
        _sgd(6)
        gt_core.wait()
        assert started.wait(30), "the block's compile never started"
        engine = gt_core.client.capture.session().transport.engine
        (block,) = [b for b in engine.blocks.values() if b.status == Status.COMPILING]
        engine.matcher.retire(block, "a test retired it")
        assert until(lambda: _events(ev.COMPILE_CANCELLED), timeout=30)
        assert block.status == Status.HOT and block.compile_due and asked
        (e,) = _events(ev.COMPILE_CANCELLED)
        assert e["signature"] == block.sig and "a test retired it" in e["reason"]
        (p,) = gt_core.report().to_data()["hot_paths"]
        assert p["status"] == "retired" and any("compile cancelled" in n for n in p["notes"])
        assert _events(ev.COMPILE_FAILED) == []
        engine.matcher.revive(block, "a test revived it", client_match=True)
        _sgd(6)
        gt_core.wait()
        assert until(lambda: _events(ev.COMPILE_FAILED), timeout=30)
        assert len(_events(ev.COMPILE_STARTED)) == 2 and len(calls) == 2  # (compiled again)
        assert "compiled again" in _events(ev.COMPILE_FAILED)[0]["reason"]


@pytest.mark.inductor
def test_a_compile_no_longer_wanted_stops_the_compile_process_under_it(own_cache):
    """The compile process is stopped under a compile that is no longer wanted (with the C++
    builds it started); the next compile starts it again and equals eager."""
    from gt_core.compile.process import CompileCancelled

    job, metas, (x, w) = _mm_job()
    cp = CompileProcess()
    try:
        asked = []

        def wanted():
            asked.append(cp.pid)
            return len(asked) < 3  # (wanted at the start, then no more)

        with pytest.raises(CompileCancelled, match="stopped while it compiled"):
            cp._compile(job, metas, None, wanted=wanted)
        assert cp.pid is None and asked[1] is not None  # (it ran, and was stopped)
        assert not list(own_cache.glob("*.bin"))  # (nothing kept)
        with pytest.raises(CompileCancelled, match="not started"):
            cp._compile(job, metas, None, wanted=lambda: False)
        assert cp.pid is None
        fn, _, info = cp._compile(job, metas, None, wanted=lambda: True)
        assert_close(fn(x, w)[0], x @ w)
    finally:
        cp.close()

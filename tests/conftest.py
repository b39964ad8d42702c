import os

os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
# CPU eager is the oracle, compared to 1e-6: workers (and the benchmarks' subprocesses) run on
# the CPU even where a GPU is; the gpu-marked tests choose CUDA themselves.
os.environ.setdefault("GT_DEVICE", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

import gt_core  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_options():
    """Each test starts from the options the one before it started from: none leaks config.

    (A test that set dynamic=True once made a later test compile through Dynamo instead of
    calling inductor directly, depending on the order the tests ran in.)
    """
    from gt_core.client import capture as _capture

    saved = _capture._options()
    yield
    with _capture._lock:
        _capture._state["options"] = saved
        _capture._apply_log(saved)


def use_inprocess(**extra) -> None:
    """A fresh in-process worker (same executor code, no second process), options for logic
    tests; ``extra``: more options."""
    gt_core.worker().stop()
    # Regression reverts judge measured times: logic tests keep them out of reach (the revert
    # tests set their own sample counts and give the runs fixed times: fixed_times).
    gt_core.configure(
        worker="inprocess",
        backend="eager",
        auto_compile=False,
        threshold=5,
        min_seq=8,
        regression_samples=10_000,
        **extra,
    )


@pytest.fixture
def inprocess():
    """A fresh in-process worker (same executor code, no second process): fast logic tests."""
    use_inprocess()
    gt_core.reset()
    yield gt_core.worker()
    gt_core.worker().stop()


class FixedTimes:
    """Engine.timer for regression-check tests: each run of a kind takes the ms given for it.

    ``eager`` and ``compiled``: milliseconds, or a function of nothing called per run (times
    that depend on what the test's fake CPU share says). The judge then decides on these
    numbers alone, however busy the machine is; the runs themselves still run.
    """

    def __init__(self, eager, compiled):
        self.ms = {"eager": eager, "compiled": compiled}
        self.kinds: list[str] = []  # of the runs timed, in order

    def __call__(self, kind: str, fn, *args):
        out = fn(*args)
        self.kinds.append(kind)
        ms = self.ms[kind]
        return out, ms() if callable(ms) else ms


@pytest.fixture
def fixed_times(inprocess):
    """fixed_times(eager=1.0, compiled=2.0): the in-process engine's runs take these ms."""

    def install(eager, compiled) -> FixedTimes:
        timer = FixedTimes(eager, compiled)
        gt_core.client.capture.session().transport.engine.timer = timer
        return timer

    return install


@pytest.fixture(scope="session")
def _process_worker():
    yield
    gt_core.worker().stop()


@pytest.fixture
def process(_process_worker):
    """The real spawned worker process (kept across tests; restarted if a test killed it).

    Reverts judge measured times, which a loaded machine moves: as for ``inprocess``, they are
    out of reach unless a test sets its own sample count (and gives the runs fixed times)."""
    gt_core.configure(
        worker="process", backend="eager", auto_compile=False, regression_samples=10_000
    )
    w = gt_core.worker()
    if not w.alive or w.pid == os.getpid():
        w.restart()
    gt_core.reset()
    return w


def assert_close(a, b, atol=1e-6, rtol=1e-5, name=None):
    """Compare a worker result with the eager oracle (both brought to plain tensors); ``name``
    says which value differed."""
    a = a.cpu() if gt_core.is_remote(a) else a
    b = b.cpu() if gt_core.is_remote(b) else b
    msg = None if name is None else (lambda m: f"{name}: {m}")
    torch.testing.assert_close(a.detach(), b.detach(), atol=atol, rtol=rtol, msg=msg)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (``rep_call``): fixtures see whether it failed."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def until(cond, timeout: float = 30.0) -> bool:
    """Poll ``cond`` until it holds (a bound on waiting for another process, not a timing)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def group():
    """Options for a 2-rank worker group (test_group, test_shard); afterwards no rank,
    segment or folder of it is left."""
    gt_core.worker().stop()
    gt_core.configure(
        backend="aot_eager", auto_compile=True, threshold=3, regression_samples=10_000
    )
    gt_core.reset()
    seen: list = []
    yield seen
    from gt_core.client import capture as _capture

    s = _capture._state["session"]
    last = s.transport if s is not None else None
    gt_core.worker().stop()
    for t in [*seen, *([last] if last is not None else [])]:
        procs = getattr(t, "procs", [])
        assert until(lambda procs=procs: not any(p.is_alive() for p in procs), 30)
        pids = {p.pid for p in procs}
        left = [n for n in os.listdir("/dev/shm") if n.split("-")[2:3] in [[str(p)] for p in pids]]
        assert not left, left
        assert not os.path.exists(t._dir)


def line_of(fn, marker: str) -> str:
    """'file:line' of the line of ``fn``'s source that ends with ``# marker``."""
    import inspect

    src, first = inspect.getsourcelines(fn)
    k = next(i for i, s in enumerate(src) if s.rstrip().endswith("# " + marker))
    return f"{fn.__code__.co_filename}:{first + k}"


def start_listener(command: list, key_file, **env) -> tuple:
    """(process, "127.0.0.1:PORT") of ``python -m gt_core.worker_process --listen 127.0.0.1:0`` run
    as ``command`` (its launcher: the interpreter, or torchrun), once it says where it
    listens."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    proc = subprocess.Popen(
        [*command, "-m", "gt_core.worker_process", "--listen", "127.0.0.1:0"]
        + ["--authkey-file", str(key_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("gt remote worker: listening on 127.0.0.1:"), line
    return proc, f"127.0.0.1:{int(line.rsplit(':', 1)[1])}"


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and gt's events empty before and after (tests of the user's compiles)."""
    import torch  # noqa: PLC0415

    torch._dynamo.reset()
    gt_core.reset()
    yield
    torch._dynamo.reset()


class ManualClock:
    """A clock a test moves by hand (``t``, seconds): timings without sleeps or load."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def moved(sig: str, to: str, t: float, was: str = "hot") -> dict:
    """The event a worker emits as a hot path ``sig`` moves from ``was`` to ``to`` at ``t``
    (events.STATE): a synthetic log's status comes from these, as a real one's does."""
    return {"type": "hotpath.state", "t": t, "signature": sig, "status": to, "was": was}

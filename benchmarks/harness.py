"""A benchmark harness fair by construction: each way in a process of its own, in rounds.

    python benchmarks/harness.py WORKLOAD [WORKLOAD ...] [--ways eager,compile,gt,jit]
        [--rounds 5] [--steps 40] [--first 200] [--backend inductor] [--json PATH]

WORKLOAD: ``mlp``; ``zoo:NAME`` for a ``transformers`` model of ``gt_bench.zoo`` (a tiny
random config, its training step with SGD momentum on a fixed batch); ``corpus:NAME`` for a
real loop of ``gt_bench/corpus`` (its DataLoader, schedule and the rest of its idioms:
each step a new batch); ``corpus`` for all of them.

How it keeps the figures fair:
  * every run of a way is a fresh Python process, and the rounds interleave the ways (the
    order turns each round), so a slow minute of the machine falls on every way alike;
  * no gt process is alive while eager or torch.compile run: each run's processes carry a
    token in their environment (gt's worker inherits it), the harness waits until none is
    left after a run, and refuses to time eager or torch.compile while any process of gt is
    alive (``Unfair``);
  * eager and torch.compile run at one thread and at every core; the best eager of a round
    is that round's baseline, and each way's ratio is taken per round, then its median and
    spread (the lowest and highest round);
  * two figures per way: ``settled`` (ms per step once compiled, checked and judged: gt's
    worker waited for, then warm-up calls, then chunks of calls each ending in a sync; the
    median chunk) and ``first`` (seconds for the first steps of a fresh loop, the compile
    included, ending in a sync: what a user exploring in a notebook sees);
  * each run's CPU seconds (its own and its children's: gt's worker); the date, the machine,
    torch's version, and whether inductor's cache was warm when the rounds began.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, replace

import psutil

TOKEN = "GT_HARNESS_RUN"  # in the environment of each run's processes (and gt's worker)
WAYS = ("eager", "compile", "gt", "jit")
BASELINES = ("eager", "compile")  # timed with no gt process alive, at 1 thread and all cores
SETTLE = 30  # calls after gt's compile: its checks and the judge run there, untimed
CHUNK = 10  # settled calls per sync


class Unfair(RuntimeError):
    """A baseline would be timed beside a process of gt (which holds a core)."""


class Failed(RuntimeError):
    """A run of a way raised (torch.compile of a step it cannot trace, say): the way's
    figure is its error, and the other ways go on."""


@dataclass(frozen=True)
class Run:
    """One run of one way: what the child process is told."""

    workload: str
    way: str
    threads: int
    steps: int = 40
    first: int = 200
    backend: str = "inductor"


@dataclass
class Figures:
    """What one run measured."""

    settled_ms: float  # ms per step, settled
    first_s: float  # seconds for the first ``first`` steps of the fresh loop, compile included
    cpu_s: float  # CPU seconds of the run's processes
    loss: float  # the last loss (compared across ways: the same loop)
    # gt's ways: the largest block's state at the end and the runs from its compiled
    # function's arrival to the judge's verdict (None: no verdict)
    block: str | None = None
    settle_runs: int | None = None


@dataclass
class Row:
    """One way (at one thread count) over the rounds."""

    way: str
    threads: int
    runs: list[Figures] = field(default_factory=list)
    settled_ratio: list[float] = field(default_factory=list)  # best eager / this, per round
    first_ratio: list[float] = field(default_factory=list)
    failed: str | None = None  # why a run of this way failed (its last line): not timed since

    def summary(self) -> dict:
        if not self.runs:
            return {"way": self.way, "threads": self.threads, "failed": self.failed}
        return {
            "way": self.way,
            "threads": self.threads,
            "settled_ms": statistics.median(r.settled_ms for r in self.runs),
            "first_s": statistics.median(r.first_s for r in self.runs),
            "cpu_s": statistics.median(r.cpu_s for r in self.runs),
            "settled_x_eager": _spread(self.settled_ratio),
            "first_x_eager": _spread(self.first_ratio),
            "loss": self.runs[-1].loss,
            "blocks": [r.block for r in self.runs],  # per round: the same verdict each time?
            "settle_runs": [r.settle_runs for r in self.runs],
            "failed": self.failed,
        }


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "low": min(xs), "high": max(xs), "rounds": len(xs)}


# -- the rounds ---------------------------------------------------------------------------
def plan(ways: tuple, rounds: int, cores: int) -> list[list[tuple[str, int]]]:
    """Per round, the (way, threads) runs in order: the ways turned by one each round; the
    baselines at one thread and at ``cores``, the others at ``cores``."""
    out = []
    for r in range(rounds):
        turned = ways[r % len(ways) :] + ways[: r % len(ways)]
        runs = []
        for way in turned:
            counts = (1, cores) if way in BASELINES and cores > 1 else (cores,)
            runs += [(way, t) for t in counts]
        out.append(runs)
    return out


def measure(workload: str, ways=WAYS, rounds: int = 5, run=None, alive=None, cores=None, **kw):
    """Every way of ``workload`` over ``rounds`` interleaved rounds: {(way, threads): Row}.
    ``run(Run) -> Figures`` runs one (default: a child process); ``alive() -> list`` names the
    processes of gt alive now (default: psutil); both are injectable for tests."""
    run = run or run_child
    alive = alive or gt_processes
    cores = cores or os.cpu_count() or 1
    rows: dict[tuple[str, int], Row] = {}
    for order in plan(tuple(ways), rounds, cores):
        got = {}
        for way, threads in order:
            row = rows.setdefault((way, threads), Row(way, threads))
            if row.failed is not None:
                continue  # (a way that failed once is not run again: its error is the figure)
            if way in BASELINES:
                left = alive()
                if left:
                    raise Unfair(
                        f"harness: {way} would be timed while {len(left)} process(es) of gt "
                        f"are alive ({', '.join(map(str, left[:3]))}); end them first"
                    )
            try:
                got[(way, threads)] = run(Run(workload, way, threads, **kw))
            except Failed as exc:
                row.failed = str(exc)
        base = [f for (way, _), f in got.items() if way == "eager"]
        best_settled = min(f.settled_ms for f in base) if base else None
        best_first = min(f.first_s for f in base) if base else None
        for key, f in got.items():
            row = rows[key]
            row.runs.append(f)
            if best_settled is not None:
                row.settled_ratio.append(best_settled / f.settled_ms)
                row.first_ratio.append(best_first / f.first_s)
    return rows


def gt_processes() -> list[int]:
    """The pids of processes of gt alive now: a harness run's (its token in the
    environment) or any whose command line names gt_core."""
    me, out = os.getpid(), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] == me:
            continue
        try:
            cmd = " ".join(p.info["cmdline"] or ())
            if "gt_core" in cmd or TOKEN in p.environ():
                out.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def run_child(r: Run, timeout: float = 900) -> Figures:
    """``r`` in a fresh Python process; returns once it and every process it started ended."""
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN: token, "OMP_NUM_THREADS": str(r.threads)}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(asdict(r))]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    _wait_gone(token)
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:]
        raise Failed(f"{r.way} raised: {last[0].strip()[:160] if last else done.returncode}")
    return Figures(**json.loads(done.stdout.strip().splitlines()[-1]))


def _wait_gone(token: str, timeout: float = 30.0) -> None:
    """Until no process carries ``token`` (gt's worker ending after its client); past
    ``timeout``, those left are killed (said on stderr)."""
    end = time.monotonic() + timeout
    while True:
        left = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.environ().get(TOKEN) == token:
                    left.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not left:
            return
        if time.monotonic() > end:
            print(f"harness: killing {len(left)} process(es) left by a run", file=sys.stderr)
            for p in left:
                p.kill()
            return
        time.sleep(0.1)


# -- one run, in the child ----------------------------------------------------------------
def workload_step(name: str):
    """(step, iterate) of workload ``name``: ``iterate(fn)`` runs one iteration of its loop
    with ``fn`` as its step (``step`` itself, jitted or compiled) and returns the loss."""
    if name.startswith("zoo:"):
        from gt_bench import zoo

        z = zoo.build(name.removeprefix("zoo:"))
        return z.step, lambda fn: fn(*z.batch)
    if name.startswith("corpus:"):
        from gt_bench import corpus

        loop = corpus.build(name.removeprefix("corpus:"))
        return loop.step, loop.one
    if name == "mlp":  # (the MLP 784-256-10 with SGD momentum at batch 128)
        from gt_bench.workloads import step_fn

        step, x, y = step_fn(128, "mlp", args=True)
        return step, lambda fn: fn(x, y)
    raise ValueError(f"harness: unknown workload {name!r}: expected mlp, zoo:NAME or corpus:NAME")


def workloads(names: list[str]) -> list[str]:
    """The names given, ``corpus`` standing for every loop of the corpus."""
    from gt_bench import corpus

    out = []
    for n in names:
        out += [f"corpus:{c}" for c in corpus.names()] if n == "corpus" else [n]
    return out


def child(r: Run) -> Figures:
    """One way of one workload, timed in this process."""
    import torch

    torch.set_num_threads(r.threads)
    if r.way in ("gt", "jit"):
        import gt_core

        with gt_core.capture(backend=r.backend, auto_compile=True, background=True):
            step, iterate = workload_step(r.workload)
            fn = gt_core.jit(step) if r.way == "jit" else step
            call = lambda: iterate(fn)  # noqa: E731
            got = _timed(call, r, settle=lambda: gt_core.wait(compiles=True, timeout=600))
            return replace(got, **largest_block(gt_core.report().to_data()))
    step, iterate = workload_step(r.workload)
    fn = torch.compile(step, backend=r.backend) if r.way == "compile" else step
    return _timed(lambda: iterate(fn), r, settle=lambda: None)


def _timed(call, r: Run, settle, clock=time.perf_counter) -> Figures:
    """The first ``r.first`` iterations of the fresh loop (compile included) to a sync; then
    settled: ``settle()``, SETTLE untimed iterations, and ``r.steps`` iterations in chunks
    of CHUNK, each chunk ending in a sync; the median chunk per iteration."""
    t0, c0 = clock(), _cpu()
    for _ in range(r.first):
        loss = call()
    loss.item()
    first = clock() - t0
    settle()
    for _ in range(SETTLE):
        loss = call()
    loss.item()
    chunks = []
    for _ in range(max(1, r.steps // CHUNK)):
        t = clock()
        for _ in range(CHUNK):
            loss = call()
        value = loss.item()
        chunks.append((clock() - t) / CHUNK * 1e3)
    return Figures(statistics.median(chunks), first, _cpu() - c0, value)


def largest_block(data: dict) -> dict:
    """The block of most ops in a gt report's data: its state and the runs it took to settle."""
    paths = sorted(data["hot_paths"], key=lambda p: p.get("n_ops", 0))
    if not paths:
        return {"block": None, "settle_runs": None}
    p = paths[-1]
    return {"block": str(p["status"]), "settle_runs": (p.get("settled") or {}).get("runs")}


def _cpu() -> float:
    """CPU seconds of this process and of its children (gt's worker), so far."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for p in me.children(recursive=True):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total


# -- the report ---------------------------------------------------------------------------
def machine() -> dict:
    """Where and when: the date, the machine, torch, and whether inductor's cache was warm."""
    import torch

    # (inductor's default, as torch makes it: the temp dir and the user's name)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"
    )
    warm = os.path.isdir(cache) and any(os.scandir(cache))
    return {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.system()}",
        "gpu": None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "inductor_cache": "warm" if warm else "cold",
    }


# Every way runs the same loop from the same seeds, so its last loss is eager's up to the
# compilers' rounding over a few hundred steps; one further off computed something else.
LOSS_RTOL = 1e-2


def wrong(rows: dict) -> dict:
    """(way, threads) -> its last loss, for each way whose last loss (of its last round) is
    not eager's (NaN, or off by more than LOSS_RTOL): its times compare nothing."""
    eager = [r.runs[-1].loss for (way, _), r in rows.items() if way == "eager" and r.runs]
    if not eager:
        return {}
    ref = eager[0]
    return {
        key: r.runs[-1].loss
        for key, r in rows.items()
        if r.runs and not math.isclose(r.runs[-1].loss, ref, rel_tol=LOSS_RTOL, abs_tol=1e-6)
    }


def table(workload: str, rows: dict) -> str:
    """The rows as text: per way, its settled ms and its ratio to the best eager (median,
    low-high over rounds), the first steps' seconds and ratio, CPU seconds; then each way
    whose last loss is not eager's, said as such."""
    lines = [
        f"{workload}",
        f"  {'way':<16}{'settled ms':>11}{'x eager (low-high)':>22}"
        f"{'first s':>9}{'x eager (low-high)':>22}{'cpu s':>8}",
    ]
    for (way, threads), row in sorted(rows.items(), key=lambda kv: WAYS.index(kv[0][0])):
        if not row.runs:
            lines.append(f"  {way + f' {threads}t':<16}failed: {row.failed}")
            continue
        s = row.summary()
        a, b = s["settled_x_eager"], s["first_x_eager"]
        lines.append(
            f"  {way + f' {threads}t':<16}{s['settled_ms']:>11.2f}"
            f"{_ratio(a):>22}{s['first_s']:>9.2f}{_ratio(b):>22}{s['cpu_s']:>8.1f}"
        )
    for (way, threads), row in sorted(rows.items(), key=lambda kv: WAYS.index(kv[0][0])):
        if row.runs and way in ("gt", "jit"):
            lines.append(f"  {way} {threads}t: {_verdicts(row.runs)}")
    eager = next((r.runs[-1].loss for (w, _), r in rows.items() if w == "eager" and r.runs), None)
    for (way, threads), loss in sorted(wrong(rows).items()):
        lines.append(
            f"  ! {way} {threads}t: its last loss {loss:.6g} is not eager's {eager:.6g}: it "
            "computed something else, and its times compare nothing"
        )
    return "\n".join(lines)


def _verdicts(runs: list[Figures]) -> str:
    """Its largest block's state in each round and the runs it took to settle: ``compiled
    in 5 of 5 rounds, settled after 11 runs (10-12)``."""
    states = [r.block or "no block" for r in runs]
    words = ", ".join(
        f"{s} in {states.count(s)} of {len(states)} rounds" for s in dict.fromkeys(states)
    )
    settled = [r.settle_runs for r in runs if r.settle_runs is not None]
    if settled:
        m = statistics.median(settled)
        words += f", settled after {m:g} runs ({min(settled)}-{max(settled)})"
    return "its largest block " + words


def _ratio(s: dict) -> str:
    return f"{s['median']:.2f}x ({s['low']:.2f}-{s['high']:.2f})"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--first", type=int, default=200)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(asdict(child(Run(**json.loads(a.child))))))
        return {}
    where = machine()
    print(", ".join(f"{k} {v}" for k, v in where.items() if v is not None))
    out = {"where": where, "workloads": {}}
    for w in workloads(a.workloads):
        rows = measure(
            w, tuple(a.ways.split(",")), a.rounds, steps=a.steps, first=a.first, backend=a.backend
        )
        print(table(w, rows), flush=True)
        off = wrong(rows)
        out["workloads"][w] = [
            {**r.summary(), "loss_is_eagers": key not in off} for key, r in rows.items()
        ]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

"""gt_core.jit against eager: a training step replayed without its Python (one run, medians).

    python benchmarks/jit.py [--quick] [--steps N] [--repeats R] [--sizes 8,128,1024]
                             [--backend inductor]

The MLP 784→256→10 with SGD momentum, per batch size:

  eager ms       the step run eagerly on plain tensors (ms per step, no sync), with torch's
                 default thread count, and with one thread ("eager 1t"): on a loaded machine
                 eager's OpenMP threads wait for each other and one thread can be far faster
  jit ms         the same step through ``@gt_core.jit`` in a capture, its block compiled,
                 the worker running beside the client (total time / steps, one sync at the end)
  speedup        the faster eager / jit ms (> 1: faster than eager at its best thread count)
  sync ...       the same with ``loss.item()`` every step
  client µs      the client's time per replayed call (its own clock, median)

Eager and jit repetitions alternate; each figure is the median over the repetitions.

Then the client's µs per replayed call for the transformer block (300 ops a step) beside the
MLP's (41): a replayed call costs the same whatever the step's size. Ratios are taken side by
side in this run; timings on a shared CPU vary ±30% between runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gt_core
from gt_bench.workloads import step_fn


def _mlp(batch: int):
    return step_fn(batch, "mlp", args=True)


def _transformer(batch: int):
    return step_fn(batch, "transformer", args=True)


def _eager(make, batch: int, steps: int, sync: bool, threads: int | None = None) -> float:
    if threads is not None:
        was = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return _eager(make, batch, steps, sync)
        finally:
            torch.set_num_threads(was)
    step, x, y = make(batch)
    for _ in range(10):
        step(x, y)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(x, y)
        if sync:
            loss.item()
    loss.item()
    return (time.perf_counter() - t0) / steps * 1e3


def _jit(make, batch: int, steps: int, sync: bool) -> tuple[float, float | None]:
    """(ms per step, the client's µs per replayed call) through gt_core.jit."""
    with gt_core.capture():
        step, x, y = make(batch)
        f = gt_core.jit(step)
        for _ in range(20):
            f(x, y)
        gt_core.wait(compiles=True, timeout=600)  # the block compiled, as in a long run
        for _ in range(10):
            f(x, y).item()
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = f(x, y)
            if sync:
                loss.item()
        loss.item()
        ms = (time.perf_counter() - t0) / steps * 1e3
    stats = [e.stats() for e in f.entries.values() if e.replayed]
    client = stats[0]["client_ms"] * 1e3 if stats and stats[0]["client_ms"] else None
    refused = [e.refused for e in f.entries.values() if e.refused]
    if refused:
        raise SystemExit(f"jit refused to replay: {refused[0]}")
    return ms, client


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps, batch 8 only (a smoke run)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="8,128,1024")
    ap.add_argument("--backend", default="inductor")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps, a.repeats, a.sizes = 40, 1, "8"
    gt_core.configure(backend=a.backend, auto_compile=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    print(
        f"gt_core.jit benchmark: MLP 784-256-10, SGD momentum, {a.steps} steps x {a.repeats}, "
        f"backend {a.backend}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    head = (
        f"{'batch':>6} {'eager ms':>9} {'eager 1t':>9} {'jit ms':>8} {'speedup':>8}"
        f" {'sync eager':>11} {'sync 1t':>8} {'sync jit':>9} {'sync x':>7} {'client µs':>10}"
    )
    print(head)
    for b in sizes:
        rows = []
        for _ in range(a.repeats):
            e = _eager(_mlp, b, a.steps, False)
            j, client = _jit(_mlp, b, a.steps, False)
            e1 = _eager(_mlp, b, a.steps, False, threads=1)
            es = _eager(_mlp, b, a.steps, True)
            js, _ = _jit(_mlp, b, a.steps, True)
            es1 = _eager(_mlp, b, a.steps, True, threads=1)
            rows.append((e, e1, j, es, es1, js, client or float("nan")))
        e, e1, j, es, es1, js, client = (statistics.median(c) for c in zip(*rows, strict=True))
        print(
            f"{b:>6} {e:>9.3f} {e1:>9.3f} {j:>8.3f} {min(e, e1) / j:>7.2f}x {es:>11.3f} "
            f"{es1:>8.3f} {js:>9.3f} {min(es, es1) / js:>6.2f}x {client:>10.1f}"
        )
    _, mlp_client = _jit(_mlp, 8, a.steps, False)
    _, tr_client = _jit(_transformer, 8, a.steps, False)
    print(
        f"client µs per replayed call: MLP (41 ops) {mlp_client:.1f}, "
        f"transformer (~300 ops) {tr_client:.1f}"
    )


if __name__ == "__main__":
    main()

"""A worker group against one worker: what the engine costs per step (one run, medians).

    python benchmarks/distributed.py [--quick] [--steps N] [--batch B] [--backend aot_eager]

The MLP 784→256→10 with SGD momentum at batch 1024, the step under ``gt_core.jit`` in a
capture, its block compiled, ms per step (total time / steps, one sync at the end):

  eager ms     the step on plain tensors in this process, with one intra-op thread (as each
               worker has; with torch's default count a loaded machine makes it far slower)
  1 worker     ``capture(workers=1)``: one worker process (``worker_threads=1``, as each rank)
  2 ranks      ``capture(workers=2)``: two ranks of one gloo group, each running the whole
               step (replicated: every rank computes what one worker does)
  2 sharded    ``capture(workers=2, shard={"batch": 0})``: the batch uploaded inside
               ``gt_core.signal.context("batch")``, each rank holding half of it (DTensor
               ``Shard(0)``), the parameters whole; the step as DTensor runs it (its
               gradients all-reduced, the ops without a sharding rule run replicated)
  ratio        2 ranks / 1 worker and 2 sharded / 1 worker (> 1: that much more per step)

Each rank has one intra-op thread. On a machine with two cores the client and two ranks
share them, so expect no gain: the figure says what a group costs, not what it saves.
Timings on a shared CPU vary ±30% between runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gt_core
from gt_bench.workloads import step_fn
from gt_core.observe.ranks import rows


def _eager(batch: int, steps: int) -> float:
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _eager_run(batch, steps)
    finally:
        torch.set_num_threads(was)


def _eager_run(batch: int, steps: int) -> float:
    step, x, y = step_fn(batch, "mlp", args=True)
    for _ in range(5):
        step(x, y)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(x, y)
    loss.item()
    return (time.perf_counter() - t0) * 1e3 / steps


def _on_workers(batch: int, steps: int, workers: int, shard: bool = False) -> tuple[float, list]:
    """(ms per step, each rank's line) through gt_core.jit on ``workers`` ranks (``shard``:
    the batch sharded on axis 0)."""
    gt_core.worker().stop()
    gt_core.reset()
    sharding = {"shard": {"batch": 0}} if shard else {}
    with gt_core.capture(workers=workers, worker_threads=1, **sharding):
        step, x, y = step_fn(batch, "mlp", args=True)
        if shard:  # the batch uploaded again inside the sharded signal
            with gt_core.signal.context("batch"):
                x, y = gt_core.to_worker(x.cpu()), gt_core.to_worker(y.cpu())
        fn = gt_core.jit(step)
        for _ in range(12):  # recorded, detected, compiled, replayed
            fn(x, y)
        gt_core.wait(compiles=True)
        for _ in range(5):
            fn(x, y)
        fn(x, y).item()
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = fn(x, y)
        loss.item()
        ms = (time.perf_counter() - t0) * 1e3 / steps
    ranks = gt_core.report().to_data().get("ranks", [])
    gt_core.worker().stop()
    return ms, ranks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few steps, one repetition (CI)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--backend", default="aot_eager")
    a = p.parse_args()
    steps, repeats = (10, 1) if a.quick else (a.steps, a.repeats)
    gt_core.configure(backend=a.backend, threshold=3, regression_samples=10**6)
    eager, one, two, sharded, ranks = [], [], [], [], {}
    for _ in range(repeats):
        eager.append(_eager(a.batch, steps))
        one.append(_on_workers(a.batch, steps, 1)[0])
        ms, ranks["2 ranks"] = _on_workers(a.batch, steps, 2)
        two.append(ms)
        ms, ranks["2 sharded"] = _on_workers(a.batch, steps, 2, shard=True)
        sharded.append(ms)
    e, o, t, s = (statistics.median(v) for v in (eager, one, two, sharded))
    print(f"MLP 784-256-10, batch {a.batch}, {steps} steps x {repeats}, backend {a.backend}")
    print(
        f"{'eager ms':>10} {'1 worker ms':>12} {'2 ranks ms':>11} {'ratio':>7} "
        f"{'2 sharded ms':>13} {'ratio':>7}"
    )
    print(f"{e:10.2f} {o:12.2f} {t:11.2f} {t / o:6.2f}x {s:13.2f} {s / o:6.2f}x")
    for name, lines in ranks.items():
        for r, row in zip(lines, rows(lines), strict=True):
            step = "-" if r["step_ms"] is None else f"{r['step_ms']:.2f}"
            print(
                f"  {name}, rank {r['rank']}: block {step} ms on the rank, "
                f"{r['compiled_runs']} compiled runs, collectives per step "
                f"{row['collectives/step']}, {row['bytes/step']}, inputs {r['placements']}"
            )


if __name__ == "__main__":
    torch.manual_seed(0)
    main()

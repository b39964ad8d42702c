"""No compile stall: step times while the hot block compiles in the background.

    python benchmarks/stall.py [--quick] [--batch 128] [--backend inductor]

Trains the MLP (784→256→10, SGD momentum) through the worker process with background
compilation and a `.item()` every step. Prints, side by side from this run: the worker's
eager time of the block before compiling, during compiling and compiled (from gt's
iteration events), the client's step time in the same phases, and the worst step during
compilation as a multiple of the eager median (target: ≤ 3×).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import gt_core
from gt_core import events as ev


def run(
    batch: int, backend: str, max_s: float, after: int | None, process: bool
) -> tuple[list, list]:
    """([(wall-clock start, seconds)] of the client's steps, the report's events).

    ``after``: steps run once compiled (None: as many as ran until then, the baseline the
    runs beside the compile are compared with).
    """
    gt_core.reset()
    steps = []
    with gt_core.capture(backend=backend, background=True, compile_process=process):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch, 784), torch.randn(batch, 10)
        t_end, compiled_at = time.perf_counter() + max_s, None
        while time.perf_counter() < t_end:
            t0, wall = time.perf_counter(), time.time()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            steps.append((wall, time.perf_counter() - t0))
            if compiled_at is None and len(steps) % 5 == 0:
                gt_core.wait()
                if any(
                    e["type"] == ev.COMPILE_FINISHED for e in gt_core.report().to_data()["events"]
                ):
                    compiled_at = len(steps)
            if compiled_at is not None and len(steps) >= compiled_at + (after or compiled_at):
                break
        gt_core.wait()
    return steps, gt_core.report().to_data()["events"]


def eager_median(batch: int, steps: int = 60) -> float:
    """Milliseconds per step of the same loop in plain eager PyTorch (the oracle's speed)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 784), torch.randn(batch, 10)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[steps // 3 :]) * 1e3


def _pct(xs, q):
    return sorted(xs)[min(len(xs) - 1, len(xs) * q // 100)] if xs else float("nan")


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick", action="store_true", help="aot_eager backend, a few seconds (CI smoke run)"
    )
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument(
        "--thread",
        action="store_true",
        help="compile in a thread of the worker (as before the compile process; GT_COMPILE_PROCESS=0)",
    )
    args = ap.parse_args(argv)
    backend, max_s, after = (
        ("aot_eager", 20.0, 10) if args.quick else (args.backend, args.max_seconds, None)
    )
    if args.thread:  # the worker is spawned with it: no compile process warmed at its start
        gt_core.configure(compile_process=False)
    steps, events = run(args.batch, backend, max_s, after, not args.thread)
    it = [e for e in events if e["type"] == ev.ITERATION]
    by = {k: [e["ms"] for e in it if e["kind"] == k] for k in ("eager", "compiling", "compiled")}
    fin = [e for e in events if e["type"] == ev.COMPILE_FINISHED]
    where = next((e.get("where") for e in events if e["type"] == ev.COMPILE_STARTED), None)
    print(
        f"MLP 784→256→10 + SGD momentum, batch {args.batch}, backend {backend}, torch {torch.__version__}, "
        f"worker device {gt_core.worker().device}"
    )
    print(
        f"compile: {fin[0]['seconds']:.1f} s in the background ({where})"
        if fin
        else "compile: did not finish in time"
    )
    print(f"{'worker block ms':<22} {'runs':>5} {'median':>8} {'max':>8}")
    for k, v in by.items():
        print(f"  {k:<20} {len(v):>5} {_med(v):>8.3f} {max(v, default=float('nan')):>8.3f}")
    eager = eager_median(args.batch)
    started = next((e["t"] for e in events if e["type"] == ev.COMPILE_STARTED), float("inf"))
    finished = fin[0]["t"] if fin else float("inf")
    during = [d * 1e3 for w, d in steps if w + d >= started and w <= finished]
    after_ = [d * 1e3 for w, d in steps if w > finished]
    worst_w = max(by["compiling"], default=float("nan"))
    worst_c = max(during, default=float("nan"))
    print(f"eager PyTorch step (same run): {eager:.3f} ms")
    print(
        f"worst worker block run while compiling: {worst_w:.3f} ms = {worst_w / eager:.1f}x eager (target ≤ 3x)"
    )
    slow = [m for m in by["compiling"] if m > 3 * eager]
    print(
        f"worker block runs while compiling slower than 3x eager: {len(slow)} of {len(by['compiling'])}"
        f" (p99 {_pct(by['compiling'], 99):.3f} ms)"
    )
    # The same measure with no compile in flight: what this machine does on its own.
    quiet = by["compiled"]
    slow_q = [m for m in quiet if m > 3 * eager]
    print(
        f"worker block runs after, no compile in flight: {len(slow_q)} of {len(quiet)} slower than"
        f" 3x eager, worst {max(quiet, default=float('nan')):.3f} ms (p99 {_pct(quiet, 99):.3f} ms)"
    )
    print(
        f"client steps (each with a sync) while compiling: {len(during)}, median {_med(during):.3f} ms, "
        f"worst {worst_c:.3f} ms = {worst_c / eager:.1f}x eager; after: median {_med(after_):.3f} ms"
    )
    gt_core.worker().stop()


if __name__ == "__main__":
    main()

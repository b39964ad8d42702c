"""Client overhead: µs per recorded op and step time through the worker vs eager (one run).

    python benchmarks/overhead.py [--quick] [--steps N] [--sizes 8,128,1024]

Figures are medians over repeats, ratios taken side by side in this run (timings on a
shared CPU vary ±30% between runs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import gt_core


def mlp_step_loop(batch: int, steps: int, on_worker: bool, **options) -> tuple[float, int]:
    """(seconds per step on the client side, ops recorded per step)."""
    ctx = gt_core.capture(**options) if on_worker else _Null()
    with ctx:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch, 784), torch.randn(batch, 10)
        for _ in range(3):  # warm the metadata cache / allocator
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.item()
        s = gt_core._capture.session() if on_worker else None
        ops0 = s.counters["ops"] if s else 0
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        t_client = time.perf_counter() - t0
        loss.item()
        t_total = time.perf_counter() - t0
        ops = (s.counters["ops"] - ops0) / steps if s else 0
    return t_client / steps, t_total / steps, ops


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="8,128,1024")
    ap.add_argument(
        "--quick", action="store_true", help="batch 8, 10 steps, one repeat (CI smoke run)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.sizes = 10, 1, "8"
    print(
        f"MLP 784→256→10, SGD momentum, {args.steps} steps x {args.repeats} repeats, torch {torch.__version__}"
    )
    print(
        "recording only (auto_compile off): the client's cost and the step time through the worker"
    )
    print(
        f"{'batch':>6} {'ops/step':>9} {'µs/op client':>13} {'eager ms':>9} {'gt ms':>8} {'gt/eager':>9}"
    )
    for b in (int(s) for s in args.sizes.split(",")):
        eager, client, total, ops = [], [], [], 0
        for _ in range(args.repeats):
            eager.append(mlp_step_loop(b, args.steps, False)[1])
            c, t, ops = mlp_step_loop(b, args.steps, True, auto_compile=False)
            client.append(c)
            total.append(t)
        e, c, t = (statistics.median(v) * 1e3 for v in (eager, client, total))
        print(f"{b:>6} {ops:>9.0f} {c * 1e3 / ops:>13.1f} {e:>9.3f} {t:>8.3f} {t / e:>8.2f}x")
    gt_core.worker().stop()


if __name__ == "__main__":
    main()

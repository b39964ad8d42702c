"""Ops the client records per second, alone, in the three states recording can be in.

    python benchmarks/recording.py [--quick] [--steps N] [--repeats R]

A small MLP's training step (64→64→10, SGD momentum: autograd and the optimizer's Python
run as in eager), recorded through gt with the worker's batches dropped, so that the
client's own cost is what is timed (an in-process worker serves the warm-up):

  followed       the steady state: each step one hot block's occurrence, followed from
                 its plan (a capture after the session's first)
  unmatched      no plan: every op recorded and sent as an instruction (the same capture,
                 the plans dropped)
  first capture  the session's first capture before any plan came: every op also sited as
                 it is recorded (gt_core.client.plans.early_sites), for a plan that comes late

Timed in the recording thread's CPU time. Per state the median and the best of the repeats
(on a shared CPU the best is the steadier figure); the ratios are the medians', side by side
in one run (timings on a shared CPU vary ±30% between runs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gt_core
from gt_core.client.capture import session as live_session


def _step_fn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 64), torch.randn(8, 10)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def _steps(step, n: int):
    """``n`` steps, each step's loss kept until the next one's (the block's frees as found)."""
    loss = None
    for _ in range(n):
        loss = step()
    return loss


def _ops_per_s(step, s, steps: int) -> float:
    ops, t0 = s.counters["ops"], time.thread_time()
    _steps(step, steps)
    return (s.counters["ops"] - ops) / (time.thread_time() - t0)


def _fresh() -> None:
    gt_core.worker().stop()
    gt_core.reset()


def one_run(steps: int) -> dict[str, float]:
    """Ops per second in each state, from fresh workers."""
    out = {}
    _fresh()
    with gt_core.capture():  # the first capture; no plan ever comes (nothing reaches the worker)
        s = live_session()
        s.transport.send = lambda batch: None
        step = _step_fn()
        _ops_per_s(step, s, 5)  # (the metadata cache, as in a step of the steady state)
        out["first capture"] = _ops_per_s(step, s, steps)
    _fresh()
    with gt_core.capture():
        step = _step_fn()
        _steps(step, 20).item()  # found, sited, followed from its plan
    with gt_core.capture():
        s = live_session()
        s.transport.send = lambda batch: None
        _steps(step, 5)  # (a capture's first steps: its first occurrence cut by its start)
        runs = s.matcher.runs
        out["followed"] = _ops_per_s(step, s, steps)
        if s.matcher.runs - runs < steps - 1:
            raise RuntimeError(
                f"{s.matcher.runs - runs} of {steps} steps sent as one RUN: not followed"
            )
        s.matcher.forget()
        out["unmatched"] = _ops_per_s(step, s, steps)
    _fresh()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="30 steps, one repeat (CI smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 30, 1
    gt_core.configure(worker="inprocess", backend="eager", auto_compile=True, threshold=3)
    runs = [one_run(args.steps) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    best = {k: max(r[k] for r in runs) for k in runs[0]}
    print(
        f"MLP 64→64→10 step, SGD momentum, client alone, {args.steps} steps x "
        f"{args.repeats} repeats, torch {torch.__version__}"
    )
    print(f"{'state':<14} {'ops/s':>9} {'µs/op':>7} {'best ops/s':>11} {'vs followed':>12}")
    for k in ("followed", "unmatched", "first capture"):
        print(
            f"{k:<14} {med[k]:>9.0f} {1e6 / med[k]:>7.2f} {best[k]:>11.0f} "
            f"{med['followed'] / med[k]:>11.2f}x"
        )


if __name__ == "__main__":
    main()

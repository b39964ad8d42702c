"""The MLP training step compiled as one block by gt vs eager vs a hand-written one-graph step.

    python benchmarks/hotpath.py [--steps N] [--batches 128,1024] [--backend inductor]

All three run in this process's run, side by side; medians of per-step times in the steady
state, compile time and the break-even iteration from gt's own events.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value

import gt_core


def make(batch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return model, torch.randn(batch, 784), torch.randn(batch, 10)


def eager_steps(batch, steps):
    model, x, y = make(batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return times


def one_graph_steps(batch, steps, backend):
    model, x, y = make(batch)
    params = {k: v.detach() for k, v in model.named_parameters()}
    bufs = {k: torch.zeros_like(v) for k, v in params.items()}

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    @torch.compile(backend=backend)
    def step(p, b, x, y):
        g, loss = grad_and_value(loss_fn)(p, x, y)
        for k in p:
            b[k].mul_(0.9).add_(g[k])
            p[k].sub_(0.01 * b[k])
        return loss

    t0 = time.perf_counter()
    step(params, bufs, x, y)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(params, bufs, x, y)
        times.append(time.perf_counter() - t0)
    return times, compile_s


def gt_steps(batch, steps, backend):
    gt_core.reset()
    times = []
    # Compiling on the critical path here, so the steady state is reached within the run
    # (background compilation is measured by the no-stall benchmark of issue 7).
    with gt_core.capture(backend=backend, background=False):
        model, x, y = make(batch)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()  # a sync per step: the time includes the worker's part
            times.append(time.perf_counter() - t0)
    data = gt_core.report().to_data()
    return times, data


def break_even(times_gt, eager_median):
    saved = 0.0
    for i, t in enumerate(times_gt):
        saved += eager_median - t
        if i > 0 and saved > 0 and t < eager_median:
            return i
    return None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batches", default="128,1024")
    ap.add_argument("--backend", default="inductor")
    args = ap.parse_args(argv)
    print(f"MLP 784→256→10 + SGD momentum, {args.steps} steps, backend {args.backend}, torch {torch.__version__}, "
          f"device {gt_core.worker().device}")
    print(f"{'batch':>6} {'eager ms':>9} {'gt ms':>7} {'1-graph ms':>11} {'gt vs eager':>12} {'gt vs 1-graph':>14} "
          f"{'gt compile s':>13} {'break-even':>11}")
    for b in (int(s) for s in args.batches.split(",")):
        tail = args.steps // 3
        e = statistics.median(eager_steps(b, args.steps)[-tail:]) * 1e3
        gt_t, data = gt_steps(b, args.steps, args.backend)
        g = statistics.median(gt_t[-tail:]) * 1e3
        og_t, _ = one_graph_steps(b, args.steps, args.backend)
        o = statistics.median(og_t[-tail:]) * 1e3
        paths = data["hot_paths"]
        comp = paths[0]["compile_seconds"] if paths else None
        be = break_even([t * 1e3 for t in gt_t], e)
        print(f"{b:>6} {e:>9.3f} {g:>7.3f} {o:>11.3f} {e / g:>11.2f}x {o / g:>13.2f}x "
              f"{(comp or float('nan')):>13.1f} {str(be):>11}")
        for p in paths:
            print(f"        hot path {p['signature']}: {p['status']}, {p['n_ops']} ops, "
                  f"{p['compiled_runs']} compiled runs, worker eager {p['eager_median_ms']} ms, "
                  f"compiled {p['compiled_median_ms']} ms")
    gt_core.worker().stop()


if __name__ == "__main__":
    main()

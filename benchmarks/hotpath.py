"""Training steps compiled as one block by gt vs eager (vs a hand-written one-graph step).

    python benchmarks/hotpath.py [--quick] [--steps N] [--batches 8,128,1024] [--backend inductor]
                                 [--workloads mlp,transformer,mlp-adam]

The issue-7 table: the MLP (784→256→10, SGD momentum) and the transformer block of
tests/models.py, eager and through gt (a `.item()` every step), side by side in one run;
medians of per-step times in the steady state (the last third), compile time and the
break-even iteration from gt's own events. For the MLP also a one-graph torch.func step;
mlp-adam is the MLP with Adam and a cosine LR schedule (its changing scalars are lifted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value

import gt_core

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from models import Block  # noqa: E402  (the workloads shared by tests and benchmarks)


def make(batch, workload="mlp"):
    """(model, x, y, loss function) of a workload, built from seed 0."""
    torch.manual_seed(0)
    workload = workload.removesuffix("-adam")
    if workload == "transformer":
        model = Block()
        x, y = torch.randint(0, 50, (batch, 12)), torch.randint(0, 50, (batch, 12))
        return model, x, y, lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    return model, torch.randn(batch, 784), torch.randn(batch, 10), F.mse_loss


def make_opt(model, workload):
    """SGD with momentum; for 'mlp-adam', Adam with a cosine LR schedule (lifted scalars)."""
    if workload == "mlp-adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), None


def eager_steps(batch, steps, workload="mlp"):
    model, x, y, loss_fn = make(batch, workload)
    opt, sched = make_opt(model, workload)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        times.append(time.perf_counter() - t0)
    return times


def one_graph_steps(batch, steps, backend):
    model, x, y, _ = make(batch)
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


def gt_steps(batch, steps, backend, workload="mlp"):
    gt_core.reset()
    times = []
    # Compiling on the critical path here, so the steady state is reached within the run
    # (background compilation is measured by benchmarks/stall.py).
    with gt_core.capture(backend=backend, background=False):
        model, x, y, loss_fn = make(batch, workload)
        opt, sched = make_opt(model, workload)
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
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
    ap.add_argument(
        "--quick", action="store_true", help="aot_eager, batch 8, 30 steps (CI smoke run)"
    )
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batches", default="8,128,1024")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--workloads", default="mlp,transformer,mlp-adam")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batches, args.backend = 30, "8", "aot_eager"
    print(
        f"training steps (SGD momentum; mlp-adam: Adam + cosine LR), {args.steps} steps, backend {args.backend}, torch {torch.__version__}, "
        f"worker device {gt_core.worker().device}; steady state = median of the last third"
    )
    print(
        f"{'workload':<12} {'batch':>6} {'eager ms':>9} {'gt ms':>7} {'1-graph ms':>11} {'gt vs eager':>12} "
        f"{'gt compile s':>13} {'break-even':>11}"
    )
    for workload in args.workloads.split(","):
        for b in (int(s) for s in args.batches.split(",")):
            tail = args.steps // 3
            e = statistics.median(eager_steps(b, args.steps, workload)[-tail:]) * 1e3
            gt_t, data = gt_steps(b, args.steps, args.backend, workload)
            g = statistics.median(gt_t[-tail:]) * 1e3
            o = float("nan")
            if workload == "mlp":  # the one-graph step is written for SGD momentum
                og_t, _ = one_graph_steps(b, args.steps, args.backend)
                o = statistics.median(og_t[-tail:]) * 1e3
            paths = data["hot_paths"]
            comp = paths[0]["compile_seconds"] if paths else None
            be = break_even([t * 1e3 for t in gt_t], e)
            print(
                f"{workload:<12} {b:>6} {e:>9.3f} {g:>7.3f} {o:>11.3f} {e / g:>11.2f}x "
                f"{(comp or float('nan')):>13.1f} {str(be):>11}"
            )
            compiles = sum(e["type"] == "compile.finished" for e in data["events"])
            recompiles = sum(e["type"] == "recompile" for e in data["events"])
            print(
                f"{'':<19} compiles {compiles}, recompiles {recompiles} (a new batch size is one)"
            )
            for p in paths:
                print(
                    f"{'':<19} hot path {p['signature']}: {p['status']}, {p['n_ops']} ops, "
                    f"{p['compiled_runs']} compiled runs, worker eager {p['eager_median_ms']} ms, "
                    f"compiled {p['compiled_median_ms']} ms"
                )
    gt_core.worker().stop()


if __name__ == "__main__":
    main()

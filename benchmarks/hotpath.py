"""Training steps compiled as one block by gt vs eager (vs a hand-written one-graph step).

    python benchmarks/hotpath.py [--quick] [--steps N] [--batches 8,128,1024] [--backend inductor]
                                 [--workloads mlp,transformer,mlp-adam]

The table: the MLP (784→256→10, SGD momentum) and the transformer block of
gt_bench/workloads.py, eager and through gt (a `.item()` every step; "no-sync": the same steps with
one `.item()` at the end, so client and worker overlap), side by side in one run;
medians of per-step times in the steady state (the last third), compile time and the
break-even iteration from gt's own events. For the MLP and the transformer also a
hand-written one-graph step (torch.func grad_and_value and the SGD-momentum update in one
compiled function), and how gt compares with it; mlp-adam is the MLP with Adam and a cosine LR
schedule (its changing scalars are lifted), for which no one-graph step is written.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.func import functional_call, grad_and_value

import gt_core
from gt_bench.workloads import make, step_fn


def eager_steps(batch, steps, workload="mlp"):
    step = step_fn(batch, workload)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


# The workloads with a hand-written one-graph step: it is written for SGD with momentum.
ONE_GRAPH = {"mlp", "transformer"}


def one_graph_steps(batch, steps, backend, workload="mlp"):
    """Times of a one-graph step: grad_and_value and the SGD-momentum update, compiled whole."""
    model, x, y, loss = make(batch, workload)
    params = {k: v.detach() for k, v in model.named_parameters()}
    bufs = {k: torch.zeros_like(v) for k, v in params.items()}

    def loss_fn(p, x, y):
        return loss(functional_call(model, p, (x,)), y)

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
        step = step_fn(batch, workload)
        for _ in range(steps):
            t0 = time.perf_counter()
            step().item()  # a sync per step: the time includes the worker's part
            times.append(time.perf_counter() - t0)
        # The same steps with nothing waiting on the worker (a loss logged now and then):
        # the client records step i+1 while the worker runs step i.
        n = max(steps // 3, 1)
        t0 = time.perf_counter()
        for _ in range(n - 1):
            step()
        step().item()
        no_sync = (time.perf_counter() - t0) / n
    data = gt_core.report().to_data()
    return times, data, no_sync


def _fmt(v, spec, unit=""):
    return "-" if v is None else format(v, spec) + unit


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
        f"training steps (SGD momentum; mlp-adam: Adam + cosine LR), {args.steps} steps, "
        f"backend {args.backend}, torch {torch.__version__}, "
        f"worker device {gt_core.worker().device}; steady state = median of the last third; "
        "gt vs eager = eager ms / gt ms, gt vs 1-graph = 1-graph ms / gt ms (>1: gt faster)"
    )
    print(
        f"{'workload':<12} {'batch':>6} {'eager ms':>9} {'gt ms':>7} {'1-graph ms':>11} "
        f"{'gt vs eager':>12} {'gt vs 1-graph':>14} {'no-sync ms':>11} {'no-sync vs eager':>17} "
        f"{'gt compile s':>13} {'break-even':>11}"
    )
    for workload in args.workloads.split(","):
        for b in (int(s) for s in args.batches.split(",")):
            tail = args.steps // 3
            e = statistics.median(eager_steps(b, args.steps, workload)[-tail:]) * 1e3
            gt_t, data, ns = gt_steps(b, args.steps, args.backend, workload)
            ns *= 1e3
            g = statistics.median(gt_t[-tail:]) * 1e3
            o = None
            if workload in ONE_GRAPH:
                og_t, _ = one_graph_steps(b, args.steps, args.backend, workload)
                o = statistics.median(og_t[-tail:]) * 1e3
            # this run's paths (a worker kept from the last workload still lists its old ones)
            paths = [p for p in data["hot_paths"] if p["compiled_runs"] + p["eager_runs"]]
            main = max(paths, key=lambda p: p["compiled_runs"] + p["eager_runs"], default=None)
            comp = main["compile_seconds"] if main else None
            be = break_even([t * 1e3 for t in gt_t], e)
            print(
                f"{workload:<12} {b:>6} {e:>9.3f} {g:>7.3f} {_fmt(o, '.3f'):>11} "
                f"{e / g:>11.2f}x {_fmt(None if o is None else o / g, '.2f', 'x'):>14} "
                f"{ns:>11.3f} {e / ns:>16.2f}x {_fmt(comp, '.1f'):>13} {_fmt(be, 'd'):>11}"
            )
            if o is None:
                print(
                    f"{'':<19} no 1-graph step: it is hand-written for SGD momentum only, "
                    f"and {workload} trains with Adam and a cosine LR schedule"
                )
            compiles = sum(e["type"] == "compile.finished" for e in data["events"])
            recompiles = sum(e["type"] == "recompile" for e in data["events"])
            print(
                f"{'':<19} compiles {compiles}, recompiles {recompiles} (a new batch size is one)"
            )
            for p in paths:
                print(
                    f"{'':<19} hot path {p['signature']}: {p['status']}, {p['n_ops']} ops, "
                    f"{p['compiled_runs']} compiled runs, "
                    f"worker eager {_fmt(p['eager_median_ms'], '.3f')} ms, "
                    f"compiled {_fmt(p['compiled_median_ms'], '.3f')} ms"
                )
    gt_core.worker().stop()


if __name__ == "__main__":
    main()

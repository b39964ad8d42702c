"""Launch-bound training steps on a GPU: eager vs gt's compiled block (CUDA graphs or not).

    python benchmarks/gpu.py [--steps N] [--batches 8,128] [--workloads mlp,transformer]
                             [--modes reduce-overhead,default]

Needs a CUDA device (it says so and exits 2 without one). The MLP (784→256→10) and the
transformer block of gt_bench/workloads.py, SGD with momentum, small batches: each step is a few
dozen tiny kernels, so eager is bound by launches and Python, which is what CUDA graphs remove.
Per workload, batch and mode, medians in the steady state, side by side in one run:

  eager ms      the step run eagerly on the GPU, loss.item() every step
  gt ms         the same step through gt, loss.item() every step (client + worker + GPU)
  no-sync ms    through gt with one loss.item() at the end (client and worker overlap)
  block ms      the compiled block alone on the worker (its own events: call to GPU done)
  block vs eager   eager ms / block ms: what compiling the whole step gives on the GPU
  gt vs eager      eager ms / no-sync ms: what the user sees end to end
  jit ms        the step through ``@gt_core.jit`` (replayed: no Python per step), one sync at
                the end, its block compiled with the same mode
  jit vs eager     eager ns ms / jit ms: what a user who wraps the step sees
  cudagraphs    whether inductor records the block as CUDA graphs (gt's compile event), and
                if it skipped them, its reasons
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import gt_core
from gt_bench.workloads import step_fn


def timed_steps(step, steps: int) -> tuple[float, float]:
    """(median ms with loss.item() every step, ms per step with one sync at the end)."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        step()
    step().item()
    return statistics.median(times) * 1e3, (time.perf_counter() - t0) / steps * 1e3


def eager(batch: int, steps: int, workload: str) -> tuple[float, float]:
    step = step_fn(batch, workload, device="cuda")
    for _ in range(10):
        step().item()
    return timed_steps(step, steps)


def through_gt(batch: int, steps: int, workload: str, mode: str | None) -> dict:
    """The steady state of the step compiled by gt with ``mode``, and the block's figures."""
    gt_core.worker().restart()  # a fresh worker per mode: its compiled blocks stay with it
    gt_core.reset()
    with gt_core.capture(backend="inductor", mode=mode, background=False):
        step = step_fn(batch, workload)
        for _ in range(200):  # until the step runs compiled
            step().item()
            hot = _main_block()
            if hot and hot["compiled_runs"] >= 10:
                break
        synced, no_sync = timed_steps(step, steps)
    hot = _main_block()
    return {
        "gt": synced,
        "no_sync": no_sync,
        "block": hot["compiled_median_ms"] if hot else None,
        "status": hot["status"] if hot else "not detected",
        "compile_s": hot["compile_seconds"] if hot else None,
        "cudagraphs": (hot["cudagraphs"] or "not asked for") if hot else "-",
        "skips": hot["cudagraph_skips"] if hot else [],
    }


def through_jit(batch: int, steps: int, workload: str, mode: str | None) -> float:
    """ms per step of the step under ``gt_core.jit`` once its block is compiled (no sync)."""
    gt_core.worker().restart()
    gt_core.reset()
    with gt_core.capture(backend="inductor", mode=mode, background=False):
        f = gt_core.jit(step_fn(batch, workload))
        for _ in range(20):
            f()
        gt_core.wait(compiles=True, timeout=600)
        return timed_steps(f, steps)[1]


def _main_block() -> dict | None:
    paths = gt_core.report().to_data()["hot_paths"]
    return max(paths, key=lambda p: p["compiled_runs"] + p["eager_runs"], default=None)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batches", default="8,128")
    ap.add_argument("--workloads", default="mlp,transformer")
    ap.add_argument("--modes", default="reduce-overhead,default")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device; none here (the CPU table is hotpath.py)")
        return 2
    w = gt_core.worker()
    print(
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, worker device "
        f"{w.device}; SGD momentum, {args.steps} steps; medians of the steady state; "
        "ratios are eager ms / gt ms (>1: gt faster)"
    )
    print(
        f"{'workload':<12} {'batch':>6} {'mode':<16} {'eager ms':>9} {'eager ns ms':>12} "
        f"{'gt ms':>7} {'no-sync ms':>11} {'block ms':>9} {'block vs eager':>15} "
        f"{'gt vs eager':>12} {'jit ms':>7} {'jit vs eager':>13} {'compile s':>10}  cudagraphs"
    )
    for workload in args.workloads.split(","):
        for b in (int(s) for s in args.batches.split(",")):
            e, e_ns = eager(b, args.steps, workload)
            for mode in args.modes.split(","):
                m = None if mode == "default" else mode
                r = through_gt(b, args.steps, workload, m)
                j = through_jit(b, args.steps, workload, m)
                block = r["block"]
                cg_text = r["cudagraphs"] + (f" ({'; '.join(r['skips'])})" if r["skips"] else "")
                print(
                    f"{workload:<12} {b:>6} {mode:<16} {e:>9.3f} {e_ns:>12.3f} {r['gt']:>7.3f} "
                    f"{r['no_sync']:>11.3f} {_fmt(block, '.3f'):>9} "
                    f"{_fmt(None if not block else e / block, '.2f'):>14}x "
                    f"{e / r['no_sync']:>11.2f}x {j:>7.3f} {e_ns / j:>12.2f}x "
                    f"{_fmt(r['compile_s'], '.1f'):>10}  "
                    f"{r['status']}; {cg_text}"
                )
    w.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

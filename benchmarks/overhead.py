"""The client's cost per recorded op, and how well client and worker overlap (one run).

    python benchmarks/overhead.py [--quick] [--steps N] [--repeats R] [--sizes 8,128,1024]
                                  [--backend inductor]

The MLP 784→256→10 with SGD momentum, in the steady state (its step compiled as one hot
block, sent by the client as one message per step). Per batch size, medians over repeats:

  eager ms     the step run eagerly on plain tensors
  client ms    the client's time per step through gt (autograd and the optimizer's Python,
               recording, matching, sending), the worker running beside it
  µs/op        client ms / ops per step, all in; eager's own µs/op beside it for scale
  alone µs/op  the same with the worker's share of the CPU taken away (its batches are
               dropped, measured last): the client's own cost per recorded op
  floor µs/op  the same step on tensors that only know their metadata (a subclass whose
               __torch_dispatch__ returns a cached output template, nothing recorded or
               sent): what intercepting each op in Python costs any per-op client, gt's
               included; autograd and the optimizer's Python run as for gt
  worker ms    the compiled block's median on the worker (its own events)
  no-sync ms   a step through gt when nothing waits on the worker (total time / steps)
  sync ms      a step through gt with loss.item() every step
  overlap      (client + worker) / no-sync: 2.0 means perfect overlap, 1.0 none

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


def _step_fn(batch: int, floor: bool = False):
    """The MLP training step; with ``floor``, on _Floor tensors (they only know metadata)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    x, y = torch.randn(batch, 784), torch.randn(batch, 10)
    if floor:
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                mod._parameters[name] = torch.nn.Parameter(_Floor.like(p))
        x, y = _Floor.like(x), _Floor.like(y)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def _per_step(step, steps: int) -> float:
    """Seconds per step over ``steps`` steps, nothing synced."""
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


class _Floor(torch.Tensor):
    """Metadata only: each op's outputs come from a template found once on meta tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    _templates: dict = {}

    @staticmethod
    def __new__(cls, meta):
        shape, stride, dtype = meta
        r = torch.Tensor._make_wrapper_subclass(cls, shape, strides=stride, dtype=dtype)
        r._m = meta
        return r

    @classmethod
    def like(cls, t: torch.Tensor) -> _Floor:
        return cls((tuple(t.shape), t.stride(), t.dtype))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = (func, _floor_key(args), _floor_key(tuple(kwargs.items())))
        t = cls._templates.get(key)
        if t is None:
            t = cls._templates[key] = _floor_template(func, args, kwargs)
        return _floor_build(t, args)


def _floor_key(a):
    if type(a) is _Floor:
        return a._m
    if type(a) in (list, tuple):
        return tuple(_floor_key(x) for x in a)
    return (type(a), a)


def _floor_meta(a):
    if type(a) is _Floor:
        return torch.empty_strided(a._m[0], a._m[1], dtype=a._m[2], device="meta")
    if type(a) in (list, tuple):
        return type(a)(_floor_meta(x) for x in a)
    return a


def _floor_template(func, args, kwargs):
    margs = [_floor_meta(a) for a in args]
    out = func(*margs, **{k: _floor_meta(v) for k, v in kwargs.items()})

    def template(o):
        if isinstance(o, torch.Tensor):
            for i, m in enumerate(margs):
                if o is m:
                    return ("alias", i)
            return ("new", (tuple(o.shape), o.stride(), o.dtype))
        if type(o) in (list, tuple):
            return (type(o), [template(x) for x in o])
        return ("value", o)

    return template(out)


def _floor_build(t, args):
    kind = t[0]
    if kind == "new":
        return _Floor(t[1])
    if kind == "alias":
        return args[t[1]]
    if kind == "value":
        return t[1]
    return kind(_floor_build(x, args) for x in t[1])


def floor(batch: int, steps: int) -> float:
    """Seconds per step of the step on _Floor tensors."""
    return local(batch, steps, floor=True)


def local(batch: int, steps: int, floor: bool = False) -> float:
    """Seconds per step in this process: eager, or on _Floor tensors."""
    step = _step_fn(batch, floor)
    for _ in range(5):
        step()
    return _per_step(step, steps)


def through_gt(batch: int, steps: int, backend: str) -> dict:
    """Client, no-sync and sync step times of the compiled steady state, and the block's figures."""
    gt_core.worker().restart()  # each repeat from a fresh worker, as a new notebook would
    gt_core.reset()
    with gt_core.capture(backend=backend, background=False):
        step = _step_fn(batch)
        while True:  # until the step runs compiled, sent as one message
            for _ in range(10):
                step()
            step().item()
            hot = _main_block()
            if hot and hot["compiled_runs"] >= 3 or len(gt_core.events_log()) > 10_000:
                break
        s = gt_core.client.capture.session()
        ops0, runs0 = s.counters["ops"], s.matcher.runs
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        t1 = time.perf_counter()
        step().item()
        t2 = time.perf_counter()
        ops = (s.counters["ops"] - ops0) / (steps + 1)
        runs = s.matcher.runs - runs0
        synced = []
        for _ in range(steps):
            t = time.perf_counter()
            step().item()
            synced.append(time.perf_counter() - t)
        hot = _main_block()
        s.transport.send = lambda batch: None  # the worker gets nothing more: the client alone
        alone = _per_step(step, steps)
    gt_core.worker().stop()
    return {
        "client": (t1 - t0) / steps,
        "alone": alone,
        "no_sync": (t2 - t0) / (steps + 1),
        "sync": statistics.median(synced),
        "ops": ops,
        "runs": runs,
        "worker": (hot["compiled_median_ms"] or float("nan")) / 1e3 if hot else float("nan"),
        "status": hot["status"] if hot else "not detected",
    }


def _main_block() -> dict | None:
    """The hot path that ran most often (the training step)."""
    paths = gt_core.report().to_data()["hot_paths"]
    return max(paths, key=lambda p: p["compiled_runs"] + p["eager_runs"], default=None)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="8,128,1024")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="aot_eager, batch 8, 20 steps, one repeat (CI smoke run)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.sizes, args.backend = 20, 1, "8", "aot_eager"
    print(
        f"MLP 784→256→10, SGD momentum, steady state (compiled with {args.backend}), "
        f"{args.steps} steps x {args.repeats} repeats, torch {torch.__version__}, "
        f"worker device {gt_core.worker().device}"
    )
    print(
        f"{'batch':>6} {'ops/step':>9} {'eager ms':>9} {'client ms':>10} {'µs/op':>6} "
        f"{'eager µs/op':>12} {'alone µs/op':>12} {'floor µs/op':>12} {'worker ms':>10} {'no-sync ms':>11} "
        f"{'sync ms':>8} {'overlap':>8} {'no-sync/eager':>14} {'sync/eager':>11}"
    )
    for b in (int(s) for s in args.sizes.split(",")):
        rows = []
        for _ in range(args.repeats):
            rows.append(
                {
                    "eager": local(b, args.steps),
                    "floor": floor(b, args.steps),
                    **through_gt(b, args.steps, args.backend),
                }
            )
        m = {
            k: statistics.median(r[k] for r in rows) * 1e3
            for k in rows[0]
            if k not in ("ops", "runs", "status")
        }
        ops = rows[-1]["ops"]
        us = {k: m[k] * 1e3 / ops for k in ("client", "eager", "alone", "floor")}
        overlap = (m["client"] + m["worker"]) / m["no_sync"]
        print(
            f"{b:>6} {ops:>9.0f} {m['eager']:>9.3f} {m['client']:>10.3f} {us['client']:>6.1f} "
            f"{us['eager']:>12.1f} {us['alone']:>12.1f} {us['floor']:>12.1f} {m['worker']:>10.3f} {m['no_sync']:>11.3f} "
            f"{m['sync']:>8.3f} {overlap:>8.2f} {m['eager'] / m['no_sync']:>13.2f}x "
            f"{m['eager'] / m['sync']:>10.2f}x"
        )
        r = rows[-1]
        print(
            f"{'':>6} block {r['status']}; {r['runs']} of {args.steps} unsynced steps sent as one message"
        )
    print("no-sync/eager and sync/eager: eager time / gt time (>1: gt faster)")
    print(
        "floor: no client that intercepts each op in Python can record a step faster; "
        "eager / floor bounds what gt can reach where the client decides the step time"
    )
    gt_core.worker().stop()


if __name__ == "__main__":
    main()

"""The compilation benchmark: four workloads, eager vs gt (auto-compile) vs torch.compile.

    python -m gt_core.bench [--quick] [--iters N] [--backend NAME] [--json PATH]

Every workload runs eagerly, through gt, and (where one exists) as a hand-written
``torch.compile`` step, side by side in one run; per-iteration times are medians of the
steady state (the last third), so ratios are comparable even on a noisy machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import gt_core

__all__ = ["WORKLOADS", "run", "Result", "main"]


# -- workloads: make() -> (step, params); step() runs one iteration, returns a scalar tensor --
def matmul_chain():
    ws = [torch.randn(256, 256) / 16 for _ in range(6)]
    x = torch.randn(64, 256)

    def step():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return h.sum()

    return step


def mlp_training():
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(128, 784), torch.randn(128, 10)

    def step():
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


class _Attention(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(x)


def attention_training():
    model = _Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 32, 64)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def mixed_ops():
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    idx = torch.arange(0, 128, 2)

    def step():
        h = torch.sigmoid(a * 1.5 + b) - torch.relu(a - b) * 0.5
        h = h.softmax(-1) + h.index_select(0, torch.remainder(idx + 1, 128)).mean(0)
        return (h.cumsum(-1)[:, -1] - h.amax(-1)).abs().sum()

    return step


WORKLOADS: dict[str, Callable] = {
    "matmul chain": matmul_chain,
    "MLP training step": mlp_training,
    "attention block": attention_training,
    "mixed operations": mixed_ops,
}
# Steps torch.compile can take whole (training steps break at loss.backward()).
_COMPILABLE = {"matmul chain", "mixed operations"}


@dataclass
class Result:
    """One workload's figures (times in ms unless named otherwise)."""

    workload: str
    iters: int
    eager_ms: float
    gt_ms: float
    torch_compile_ms: float | None
    gt_warmup_s: float
    gt_compile_s: float | None
    break_even: int | None
    eager_total_s: float
    gt_total_s: float
    speedup: float
    status: str
    verdict: str


def _steady(times: list[float]) -> float:
    return statistics.median(times[-max(3, len(times) // 3) :]) * 1e3


def _time_loop(step, iters: int, sync) -> list[float]:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sync(step())
        times.append(time.perf_counter() - t0)
    return times


def run(name: str, iters: int, backend: str, progress=None) -> Result:
    """Run one workload eagerly, through gt and with torch.compile; return its figures."""
    make = WORKLOADS[name]
    torch.manual_seed(0)
    step = make()
    eager = _time_loop(step, iters, lambda t: t.item())
    e = _steady(eager)
    if progress:
        progress(f"{name}: eager {e:.3f} ms")

    gt_core.reset()
    with gt_core.capture(backend=backend, auto_compile=True, background=True):
        torch.manual_seed(0)
        step = make()
        gt_times = _time_loop(step, iters, lambda t: t.item())
    data = gt_core.report().to_data()
    g = _steady(gt_times)
    paths = sorted(data["hot_paths"], key=lambda p: -p["compiled_runs"])
    top = paths[0] if paths else None
    compile_s = top["compile_seconds"] if top else None
    status = top["status"] if top else "no hot path"
    if progress:
        progress(f"{name}: gt {g:.3f} ms ({status})")

    tc = None
    if name in _COMPILABLE:
        torch.manual_seed(0)
        compiled = torch.compile(make(), backend=backend)
        tc = _steady(_time_loop(compiled, iters, lambda t: t.item()))
        torch._dynamo.reset()

    # Warmup: the gt iterations before its per-iteration time settles near the steady state.
    warm = next((i for i, t in enumerate(gt_times) if t * 1e3 <= 1.5 * g), len(gt_times))
    be = _break_even(gt_times, e / 1e3)
    speedup = e / g
    verdict = ("faster" if speedup >= 1.1 else "on par" if speedup >= 0.9 else "slower") + (
        "" if status == "compiled" else f" ({status})"
    )
    return Result(
        workload=name,
        iters=iters,
        eager_ms=e,
        gt_ms=g,
        torch_compile_ms=tc,
        gt_warmup_s=sum(gt_times[:warm]),
        gt_compile_s=compile_s,
        break_even=be,
        eager_total_s=sum(eager),
        gt_total_s=sum(gt_times),
        speedup=speedup,
        status=status,
        verdict=verdict,
    )


def _break_even(gt_times: list[float], eager_s: float) -> int | None:
    """First iteration after which gt's cumulative time is below eager's."""
    total = 0.0
    for i, t in enumerate(gt_times):
        total += t
        if total <= eager_s * (i + 1) and i > 0:
            return i
    return None


def table(results: list[Result]) -> str:
    head = (
        f"{'workload':<19} {'eager ms':>9} {'gt ms':>8} {'compile ms':>11} {'gt speedup':>11} "
        f"{'gt compile s':>13} {'warmup s':>9} {'break-even':>11}  verdict"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        tc = f"{r.torch_compile_ms:.3f}" if r.torch_compile_ms is not None else "-"
        cs = f"{r.gt_compile_s:.1f}" if r.gt_compile_s is not None else "-"
        rows.append(
            f"{r.workload:<19} {r.eager_ms:>9.3f} {r.gt_ms:>8.3f} {tc:>11} {r.speedup:>10.2f}x "
            f"{cs:>13} {r.gt_warmup_s:>9.2f} {str(r.break_even):>11}  {r.verdict}"
        )
    return "\n".join(rows)


def main(argv=None) -> list[Result]:
    ap = argparse.ArgumentParser(
        prog="python -m gt_core.bench", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--quick", action="store_true", help="few iterations, aot_eager: a smoke run in seconds"
    )
    ap.add_argument(
        "--iters", type=int, default=None, help="iterations per workload (default 200, quick 30)"
    )
    ap.add_argument(
        "--backend", default=None, help="torch.compile backend (default inductor, quick aot_eager)"
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument(
        "--only", metavar="NAME", action="append", help="run only this workload (repeatable)"
    )
    args = ap.parse_args(argv)
    iters = args.iters or (30 if args.quick else 200)
    backend = args.backend or ("aot_eager" if args.quick else "inductor")
    names = args.only or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r}; expected one of {', '.join(WORKLOADS)}")

    def progress(msg):
        print(f"  … {msg}", file=sys.stderr, flush=True)

    print(
        f"gt benchmark: {iters} iterations, backend {backend}, torch {torch.__version__}, "
        f"worker device {gt_core.worker().device}, {time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    results = [run(n, iters, backend, progress) for n in names]
    print(table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"backend": backend, "iters": iters, "results": [asdict(r) for r in results]},
                f,
                indent=1,
            )
    return results


if __name__ == "__main__":
    main()
    gt_core.worker().stop()

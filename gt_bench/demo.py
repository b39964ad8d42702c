"""A short demo: train an MLP through the worker, compile its hot path, print what happened.

python -m gt_bench.demo [--steps N] [--backend NAME]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import gt_core


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--backend", default="inductor")
    args = ap.parse_args(argv)

    def run(on_worker: bool):
        ctx = gt_core.capture(backend=args.backend, background=False) if on_worker else _null()
        with ctx:
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
            )
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x, y = torch.randn(128, 784), torch.randn(128, 10)
            for _ in range(args.steps):
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            return loss.item()

    t0 = time.perf_counter()
    eager = run(False)
    t_eager = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = run(True)
    t_gt = time.perf_counter() - t0
    w = gt_core.worker()
    print(f"worker pid {w.pid} on {w.device} (this process: {__import__('os').getpid()})")
    print(f"final loss: eager {eager:.6f}, through gt {ours:.6f}, |diff| {abs(eager - ours):.2e}")
    print(
        f"wall time for {args.steps} steps: eager {t_eager:.2f} s, gt {t_gt:.2f} s (includes compiling)"
    )
    print(gt_core.report())
    w.stop()


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()

"""Flat memory over long runs: the client's and the worker's RSS while a small MLP trains.

    python benchmarks/memory.py [--quick] [--steps 100000] [--every 10000] [--backend aot_eager]

Trains an MLP (32→64→4, SGD) for ``--steps`` steps inside ``gt_core.capture()`` with the
worker process, no sync per step and one (``loss.item()``) every ``--every`` steps. At each
of those syncs it prints both processes' resident memory (psutil) and its growth since the
first one, after warm-up (the compile is done by then). Flat means growth under 5 MB over
the run (the limit printed at the end); before the bound, the client's log grew about
280 bytes a step (28 MB per 100k steps).
"""

from __future__ import annotations

import argparse
import time

import psutil
import torch
import torch.nn.functional as F

import gt_core

FLAT_MB = 5.0  # growth after warm-up that still counts as flat (allocator noise)


def _mb(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 2**20


def run(steps: int, every: int, backend: str) -> list[tuple]:
    """[(step, client MB, worker MB, events kept, events received, seconds)] at each sync."""
    gt_core.reset()
    rows = []
    client = psutil.Process()
    with gt_core.capture(backend=backend):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        worker = psutil.Process(gt_core.worker().pid)
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step % every == 0:
                loss.item()
                gt_core.wait()
                log = gt_core.events_log()
                rows.append(
                    (
                        step,
                        _mb(client),
                        _mb(worker),
                        len(log.snapshot()),
                        len(log),
                        time.perf_counter() - t0,
                    )
                )
                print(_line(rows[-1], rows[0]), flush=True)
    return rows


def _line(row: tuple, first: tuple) -> str:
    step, c, w, kept, received, s = row
    return (
        f"{step:>9} {c:>9.1f} {c - first[1]:>+8.1f} {w:>9.1f} {w - first[2]:>+8.1f}"
        f" {kept:>7} {received:>9} {s:>7.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000, help="training steps (default 100000)")
    ap.add_argument("--every", type=int, default=10_000, help="steps between syncs and prints")
    ap.add_argument("--backend", default="aot_eager", help="torch.compile backend (aot_eager)")
    ap.add_argument("--quick", action="store_true", help="3000 steps, a sync every 1000")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.every = 3000, 1000
    if args.steps < args.every or args.every < 1:
        ap.error(f"expected --steps >= --every >= 1, got {args.steps} and {args.every}")
    print(
        f"gt memory: {args.steps} steps, MLP 32→64→4 SGD, backend {args.backend}, "
        f"a sync every {args.every}, torch {torch.__version__}"
    )
    print(
        f"{'step':>9} {'client MB':>9} {'growth':>8} {'worker MB':>9} {'growth':>8}"
        f" {'kept':>7} {'events':>9} {'s':>7}"
    )
    rows = run(args.steps, args.every, args.backend)
    first, last = rows[0], rows[-1]
    grown = {"client": last[1] - first[1], "worker": last[2] - first[2]}
    data = gt_core.report().to_data()
    runs = sum(p["occurrences"] for p in data["hot_paths"])
    print(
        f"growth after step {first[0]}: client {grown['client']:+.1f} MB, worker "
        f"{grown['worker']:+.1f} MB (flat: under {FLAT_MB:g} MB); hot path runs counted {runs}, "
        f"events kept {last[3]} of {last[4]}"
    )
    for who, mb in grown.items():
        if mb >= FLAT_MB:
            print(f"NOT FLAT: the {who} grew {mb:.1f} MB over {last[0] - first[0]} steps")


if __name__ == "__main__":
    main()

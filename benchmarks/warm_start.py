"""Warm start: detection-to-compiled time of the MLP step, cold vs warm on-disk cache (item 6).

    python benchmarks/warm_start.py [--quick] [--backend inductor]

Runs the same training loop twice, each in a new Python process with a new worker (as a
second run of a notebook would), sharing one fresh inductor cache directory: the first run
compiles cold, the second finds the FX graph in inductor's on-disk cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(backend: str, steps: int) -> None:
    import torch
    import torch.nn.functional as F

    import gt_core
    from gt_core import events as ev

    t0 = time.perf_counter()
    with gt_core.capture(backend=backend, background=True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(128, 784), torch.randn(128, 10)
        for _ in range(steps):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        loss.item()
        gt_core.wait(compiles=True, timeout=600)
    events = gt_core.report().to_data()["events"]
    first = {}
    for e in events:
        first.setdefault(e["type"], e)
    done = first.get(ev.COMPILE_FINISHED)
    out = {
        "device": gt_core.worker().device,
        "detect_to_compiled_s": done["t"] - first[ev.DETECTED]["t"] if done else None,
        "compile_s": done["seconds"] if done else None,
        "total_s": time.perf_counter() - t0,
    }
    gt_core.worker().stop()
    print("RESULT " + json.dumps(out), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick", action="store_true", help="aot_eager (no disk cache): checks the script runs"
    )
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    backend = "aot_eager" if args.quick else args.backend
    if args.child:
        child(backend, args.steps)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="gt-warm-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="1")
        for run in ("cold", "warm"):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--backend",
                backend,
                "--steps",
                str(args.steps),
            ]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode or line is None:
                sys.exit(
                    f"{run} run failed (status {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
                )
            results.append((run, json.loads(line[7:])))
    print(
        f"MLP 784→256→10 step, backend {backend}, worker device {results[0][1]['device']}, "
        "each run a new process and worker, one shared fresh inductor cache"
    )
    print(f"{'run':<6} {'detection→compiled s':>21} {'compile s':>10} {'whole run s':>12}")
    for run, r in results:
        d, c = r["detect_to_compiled_s"], r["compile_s"]
        print(
            f"{run:<6} {d if d is None else round(d, 2):>21} {c if c is None else round(c, 2):>10} {r['total_s']:>12.1f}"
        )
    cold, warm = results[0][1]["detect_to_compiled_s"], results[1][1]["detect_to_compiled_s"]
    if cold and warm:
        print(f"warm start: {cold / warm:.1f}x faster from detection to compiled")


if __name__ == "__main__":
    main()

"""What gt_core.jit's audit costs: the same replayed step with audits one in N, and none but
the first after each recording (``jit_audit=0``).

    python benchmarks/jit_audit.py [--rounds 5] [--calls 256] [--every 0,64,16,4]

An audited call runs the step's Python recorded instead of sending one RUN, then compares
the two; its cost is a recorded call's minus a replayed one's, spread over N calls. Every
setting runs in each round (interleaved, a fresh capture each), after 16 warm-up calls;
the figure is the median over rounds of each setting's ms per call divided by the no-audit
setting's in the same round, with the rounds' spread. Only gt runs here (no eager figure),
so no other process competes with a timed eager run. The worker runs blocks uncompiled
(``backend="eager"``): the audit's cost is the client's, whatever the block's speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gt_core
from gt_bench.workloads import step_fn


def _ms_per_call(workload: str, batch: int, every: int, calls: int) -> float:
    gt_core.configure(backend="eager", auto_compile=False, jit_audit=every)
    with gt_core.capture():
        step, x, y = step_fn(batch, workload, args=True)
        fn = gt_core.jit(step)
        for _ in range(16):
            loss = fn(x, y)
        loss.item()
        t0 = time.perf_counter()
        for _ in range(calls):
            loss = fn(x, y)
        loss.item()
        t1 = time.perf_counter()
        (entry,) = fn.entries.values()
        assert entry.state == "replaying", entry.reason
    return (t1 - t0) * 1e3 / calls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=256)
    ap.add_argument("--every", default="0,64,16,4")
    args = ap.parse_args(argv)
    every = [int(x) for x in args.every.split(",")]
    print(f"{'workload':<18} {'audit':>8} {'ms/call':>8} {'cost':>8} {'spread':>16}")
    for workload, batch in (("mlp", 8), ("mlp", 128), ("transformer", 8)):
        ms: dict[int, list[float]] = {n: [] for n in every}
        for _ in range(args.rounds):
            for n in every:
                ms[n].append(_ms_per_call(workload, batch, n, args.calls))
        base = ms[every[0]]
        for n in every:
            ratios = [a / b for a, b in zip(ms[n], base, strict=True)]
            said = "first only" if n == 0 else f"1 in {n}"
            print(
                f"{workload + ' b' + str(batch):<18} {said:>8} {statistics.median(ms[n]):8.3f} "
                f"{statistics.median(ratios):7.3f}x "
                f"[{min(ratios):.3f}, {max(ratios):.3f}]".rjust(18)
            )


if __name__ == "__main__":
    main()

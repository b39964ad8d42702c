"""The models people use: eager, plain gt, gt_core.jit and torch.compile of the same step.

    python benchmarks/models.py [--quick] [--iters N] [--only NAME ...] [--json PATH]

Each ``transformers`` model of gt_bench.zoo (tiny random configs, nothing downloaded; the
``models`` extra), one training step on a fixed batch with SGD momentum, run four ways side
by side in one run (``python -m gt_bench.bench --models``): ms per step (medians of the
steady state), speedups over eager, compile seconds, and the final loss and parameters
against eager's. Ratios are taken in one run; timings on a shared CPU vary ±30% between runs.
"""

from __future__ import annotations

import sys

import gt_core
from gt_bench import bench

if __name__ == "__main__":
    try:
        bench.main(["--models", *sys.argv[1:]])
    finally:
        gt_core.worker().stop()

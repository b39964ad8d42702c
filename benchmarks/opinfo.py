"""PyTorch's OpInfo samples (float32, CPU) through a gt worker process, compared with eager.

    python benchmarks/opinfo.py [--quick] [--ops add,mul,...] [--limit N] [--json PATH]

Needs ``expecttest`` (PyTorch's test helpers import it). Prints the share of samples equal to
eager, the count of each outcome, and the samples that are not, grouped by op. The rules
(what counts as equal, random ops, skipped samples) are in tests/_opinfo.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import gt_core

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import _opinfo  # noqa: E402

QUICK = (
    "add,mul,sum,mean,amax,sort,reshape,permute,cat,index_select,gather,nonzero,matmul,"
    "nn.functional.conv2d,softmax,fft.ifft,normal,empty_like,where,unique"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="samples per op (default: all)")
    ap.add_argument("--json", default=None, help="write every outcome to this file")
    ap.add_argument("--quick", action="store_true", help="the first 3 samples of 20 ops")
    args = ap.parse_args()
    if args.quick:
        args.ops = args.ops or QUICK
        args.limit = args.limit or 3

    gt_core.configure(worker="process", device="cpu", auto_compile=False, backend="eager")
    db = _opinfo.op_db()
    if args.ops:
        wanted = set(args.ops.split(","))
        db = [o for o in db if o.name in wanted]
    t0 = time.perf_counter()
    outcomes = []
    for opinfo in db:
        outcomes += _opinfo.run_op(opinfo, args.limit)
    seconds = time.perf_counter() - t0

    counts = collections.Counter(o.kind for o in outcomes)
    compared = sum(n for kind, n in counts.items() if kind != _opinfo.EAGER_RAISES)
    passed = sum(counts[k] for k in _opinfo.PASSED)
    print(f"gt OpInfo sweep: {len(db)} ops, {len(outcomes)} samples, {seconds:.0f} s")
    print(
        f"equal to eager: {passed} of {compared} compared samples "
        f"({100 * passed / max(compared, 1):.2f}%; random ops with seeded values unequal "
        f"but shapes and dtypes equal count as equal: {counts[_opinfo.RANDOM]})"
    )
    for kind in (*_opinfo.PASSED, _opinfo.NOT_EQUAL, _opinfo.GT_ERROR, _opinfo.DIED):
        print(f"  {kind:13s} {counts[kind]}")
    print(f"  {'(skipped: eager raises)':13s} {counts[_opinfo.EAGER_RAISES]}")
    bad = collections.defaultdict(list)
    for o in outcomes:
        if o.kind in (_opinfo.NOT_EQUAL, _opinfo.GT_ERROR, _opinfo.DIED):
            bad[o.op].append(o)
    if bad:
        print("\nnot equal, by op:")
    for op, items in sorted(bad.items()):
        print(f"  {op}: {len(items)} sample(s)")
        for o in items[:3]:
            print(f"    #{o.index} {o.kind}: {o.detail[:160]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([o.__dict__ for o in outcomes], f, indent=1)


if __name__ == "__main__":
    main()

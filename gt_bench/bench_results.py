"""What ``python -m gt_bench.bench`` gives: one :class:`Result` per workload, and the table
that shows them side by side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby

__all__ = ["RTOL", "Result", "table"]

# Final loss and parameters, relative to eager's; beyond it the table says so. Hundreds of
# training steps compound inductor's float reassociation to ~1e-3 (gt and a hand-written
# torch.compile alike, measured here); a wrong result is off by O(1).
RTOL = 1e-2


@dataclass
class Result:
    """One workload's figures: ms per iteration, totals in s, speedups as eager / other."""

    workload: str
    iters: int
    eager_ms: float
    gt_ms: float
    torch_compile_ms: float | None
    speedup: float  # gt's
    torch_compile_speedup: float | None
    eager_total_s: float
    gt_total_s: float
    torch_compile_total_s: float | None
    gt_warmup_s: float
    gt_compile_s: float | None
    break_even: int | None
    gt_rel_diff: float  # gt's final loss vs eager's
    torch_compile_rel_diff: float | None  # the largest over the final loss and the parameters
    status: str
    verdict: str
    jit_ms: float | None = None  # the step through gt_core.jit (replayed calls, one sync)
    jit_speedup: float | None = None
    torch_compile_error: str | None = None  # why torch.compile of the step did not run


def _agrees(r: Result) -> str:
    """'ok', or which run's final state is beyond RTOL of eager's, and by how much."""
    off = [
        f"{who} {d:.1e}"
        for who, d in (("gt", r.gt_rel_diff), ("tc", r.torch_compile_rel_diff))
        if d is not None and not d <= RTOL  # nan is off too
    ]
    text = "DIFFERS: " + ", ".join(off) if off else "ok"
    if r.torch_compile_error is not None:
        text += f"; tc {r.torch_compile_error[:70]}"
    return text


def _fmt(v, spec: str, unit: str = "") -> str:
    return "-" if v is None else format(v, spec) + unit


# (group, header, cell) of each column; a group's title is drawn over its headers.
_COLUMNS: list[tuple[str, str, Callable[[Result], str]]] = [
    ("", "workload", lambda r: r.workload),
    ("ms per iteration", "eager", lambda r: _fmt(r.eager_ms, ".3f")),
    ("ms per iteration", "gt", lambda r: _fmt(r.gt_ms, ".3f")),
    ("ms per iteration", "jit", lambda r: _fmt(r.jit_ms, ".3f")),
    ("ms per iteration", "torch.compile", lambda r: _fmt(r.torch_compile_ms, ".3f")),
    ("speedup", "gt", lambda r: _fmt(r.speedup, ".2f", "x")),
    ("speedup", "jit", lambda r: _fmt(r.jit_speedup, ".2f", "x")),
    ("speedup", "torch.compile", lambda r: _fmt(r.torch_compile_speedup, ".2f", "x")),
    ("total s", "eager", lambda r: _fmt(r.eager_total_s, ".2f")),
    ("total s", "gt", lambda r: _fmt(r.gt_total_s, ".2f")),
    ("total s", "torch.compile", lambda r: _fmt(r.torch_compile_total_s, ".2f")),
    ("gt", "compile s", lambda r: _fmt(r.gt_compile_s, ".1f")),
    ("gt", "warmup s", lambda r: _fmt(r.gt_warmup_s, ".2f")),
    ("gt", "break-even it", lambda r: _fmt(r.break_even, "d")),
    ("", "vs eager", _agrees),
    ("", "verdict", lambda r: r.verdict),
]


def table(results: list[Result]) -> str:
    """The results as a text table, with a legend under it."""
    cells = [[cell(r) for *_, cell in _COLUMNS] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, (_, h, _) in enumerate(_COLUMNS)]
    spans = [[i for i, _ in grp] for _, grp in groupby(enumerate(_COLUMNS), lambda c: c[1][0])]

    def width(span: list[int]) -> int:
        return sum(widths[i] for i in span) + 2 * (len(span) - 1)

    for span in spans:  # widen a group's last column where its title is wider than the group
        widths[span[-1]] += max(0, len(_COLUMNS[span[0]][0]) + 2 - width(span))

    def line(row: list[str]) -> str:
        last = len(row) - 1
        return "  ".join(
            c.ljust(w) if i in (0, last) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    over = "  ".join(
        f" {g} ".center(width(s), "-") if (g := _COLUMNS[s[0]][0]) else " " * width(s)
        for s in spans
    )
    head = line([h for _, h, _ in _COLUMNS])
    return "\n".join(
        [
            over.rstrip(),
            head,
            "-" * len(head),
            *(line(row) for row in cells),
            "ms per iteration: median of the steady state (the last third); speedup: eager ms"
            " / that ms (>1: faster than eager).",
            "jit: the step through gt_core.jit once its block is compiled and settled (replayed"
            " calls, a sync every 10 so client and worker overlap; the median 10).",
            "torch.compile: the whole step function compiled by hand (training steps split at"
            " backward). vs eager: final loss (gt), final loss and parameters (torch.compile,"
            f" 'tc') within {RTOL:g} relative.",
        ]
    )

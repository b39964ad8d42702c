"""PyTorch's OpInfo samples through the gt worker, each compared with eager PyTorch.

For each sample: eager ``op(input, *args, **kwargs)`` on a copy of the sample; then the same
inside ``gt_core.capture()`` with every tensor moved to the worker, its results brought back
with ``.cpu()``. Both sides are seeded alike, so random ops draw the same numbers when the
worker runs the same aten ops in the same order.

Rules:
- a sample whose eager call raises is skipped (``eager raises``);
- floating and complex results compare with ``torch.testing.assert_close`` (its float32
  tolerances, NaNs equal), integer and bool results exactly, other values with ``==``;
- ops whose values are undefined (``UNDEFINED``: uninitialized memory) compare shapes and
  dtypes only;
- a sample is random when two eager runs with different seeds differ; it counts as equal
  when its seeded values are, else as ``random`` when shapes and dtypes match (the values
  are draws of another generator order, not a wrong result);
- anything the gt side raises that eager did not is ``gt error``; a worker that dies is
  ``worker died``, and the worker is restarted for the next sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import gt_core

EQUAL, NOT_EQUAL, GT_ERROR, DIED = "equal", "not equal", "gt error", "worker died"
RANDOM, EAGER_RAISES = "random", "eager raises"
PASSED = (EQUAL, RANDOM)

# Values are whatever memory held: only their shapes and dtypes are defined.
UNDEFINED = frozenset(
    {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
)
SEED = 1234


@dataclass
class Outcome:
    """One sample's result: its op, its index among the op's samples, the outcome, why."""

    op: str
    index: int
    kind: str
    detail: str = ""


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_map(fn, y) for y in x)
    if isinstance(x, tuple):  # a namedtuple or torch.return_types structseq
        return tuple(_map(fn, y) for y in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return x


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def _home(t: torch.Tensor) -> torch.Tensor:
    return t.cpu() if gt_core.is_remote(t) else t


def _leaves(x, out: list) -> list:
    if isinstance(x, (list, tuple)):
        for y in x:
            _leaves(y, out)
    else:
        out.append(x)
    return out


def difference(got, want, values: bool = True) -> str | None:
    """Why ``got`` differs from ``want`` (None: equal); ``values=False``: shapes and dtypes."""
    a, b = _leaves(got, []), _leaves(want, [])
    if len(a) != len(b):
        return f"{len(a)} results, eager has {len(b)}"
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor):
                return f"result {k}: {type(x).__name__}, eager a tensor"
            if x.layout != y.layout:
                return f"result {k}: layout {x.layout}, eager {y.layout}"
            if x.dtype != y.dtype or x.shape != y.shape:
                return f"result {k}: {x.dtype}{list(x.shape)}, eager {y.dtype}{list(y.shape)}"
            if not values:
                continue
            if y.layout != torch.strided:
                x, y = x.to_dense(), y.to_dense()
            x, y = x.detach(), y.detach()
            if y.dtype.is_floating_point or y.dtype.is_complex:
                try:
                    torch.testing.assert_close(x, y, equal_nan=True)
                except AssertionError as exc:
                    lines = str(exc).strip().splitlines()
                    return f"result {k}: " + "; ".join(ln.strip() for ln in lines[:4])
            elif not torch.equal(x, y):
                return f"result {k}: {int((x != y).sum())} of {y.numel()} elements differ"
        elif values and x != y and not (_nan(x) and _nan(y)):
            return f"result {k}: {x!r}, eager {y!r}"
    return None


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _eager(op, sample, seed: int):
    torch.manual_seed(seed)
    inp, args, kwargs = _map(_copy, (sample.input, sample.args, sample.kwargs))
    return op(inp, *args, **kwargs)


def _on_worker(op, sample):
    with gt_core.capture():
        inp, args, kwargs = _map(gt_core.to_worker, (sample.input, sample.args, sample.kwargs))
        torch.manual_seed(SEED)  # seeds the worker's generator too
        return _map(_home, op(inp, *args, **kwargs))


def run_sample(opinfo, sample, index: int) -> Outcome:
    """The outcome of one sample (the worker is restarted if it died)."""
    name = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
    op = opinfo.op
    try:
        want = _eager(op, sample, SEED)
    except Exception as exc:
        return Outcome(name, index, EAGER_RAISES, f"{type(exc).__name__}: {exc}"[:200])
    try:
        got = _on_worker(op, sample)
        gt_core.worker().stats()  # a sync: an error still held for this sample is raised here
    except gt_core.WorkerDied as exc:
        gt_core.worker().restart()
        return Outcome(name, index, DIED, str(exc)[:300])
    except Exception as exc:
        _settle()
        return Outcome(name, index, GT_ERROR, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        if not gt_core.worker().alive:
            gt_core.worker().restart()
    if opinfo.name in UNDEFINED:
        why = difference(got, want, values=False)
        return Outcome(name, index, EQUAL if why is None else NOT_EQUAL, why or "")
    why = difference(got, want)
    if why is None:
        return Outcome(name, index, EQUAL)
    try:
        random = difference(_eager(op, sample, SEED + 1), want) is not None
    except Exception:
        random = False
    if random and difference(got, want, values=False) is None:
        return Outcome(name, index, RANDOM, why)
    return Outcome(name, index, NOT_EQUAL, why)


def _settle() -> None:
    """Take any error the worker still holds from a failed sample: the next one starts clean."""
    try:
        gt_core.worker().stats()
    except gt_core.WorkerDied:
        gt_core.worker().restart()
    except Exception:
        pass


def run_op(opinfo, limit: int | None = None) -> list[Outcome]:
    """The outcomes of ``opinfo``'s float32 CPU samples (the first ``limit`` of them)."""
    out = []
    for i, sample in enumerate(opinfo.sample_inputs("cpu", torch.float32)):
        if limit is not None and i >= limit:
            break
        out.append(run_sample(opinfo, sample, i))
    return out


def op_db() -> list:
    """OpInfos that support float32 on the CPU."""
    from torch.testing._internal.common_methods_invocations import op_db as db

    return [o for o in db if torch.float32 in o.supported_dtypes("cpu")]

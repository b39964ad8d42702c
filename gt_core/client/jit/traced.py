"""How a jitted step records: as torch.compile traces it.

A recorded call's numbers are frozen into the block it makes. Library code keeps fewer of
them when it believes it is being compiled (see ``as_traced``).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["as_traced", "zero_lr"]


@contextlib.contextmanager
def as_traced(opts, forced: list, skipped: list):
    """A recorded call runs library code as torch.compile traces it: the paths behind
    ``torch.compiler.is_compiling()`` (``transformers`` skips data-dependent checks there),
    and the step's optimizers ``capturable`` (Adam's bias corrections are tensor ops on
    its step count, not a new Python number each call that replay would freeze). The
    optimizers' own setting is restored after the call; ``forced`` gets the indices of the
    param groups made capturable, ``skipped`` those left as written for their zero lr.

    Never a group whose learning rate may be zero: torch's capturable Adam (AdamW, ...)
    divides by the step size, and makes NaN where a gradient's running square is zero, where
    the optimizer as written leaves the parameter as it is (a warmup from lr 0 does this).
    A learning rate that is a worker tensor may be. Where a group's may be, the whole call
    runs as written: not traced either (torch's optimizers keep their step count a tensor
    when compiling, which rounds otherwise), so its numbers are eager's."""
    groups = [g for opt in opts for g in opt.param_groups]
    plain = [i for i, g in enumerate(groups) if g.get("capturable") is False]
    skipped += [i for i in plain if zero_lr(groups[i])]
    if skipped:  # (the call runs exactly as written: it syncs, and is not replayed)
        yield
        return
    for i in plain:
        groups[i]["capturable"] = True
        forced.append(i)
    try:
        with _compiling():
            yield
    finally:
        for i in forced:
            groups[i]["capturable"] = False


def zero_lr(group: dict) -> bool:
    """Whether a param group's learning rate may be zero: a Python zero, a host tensor
    holding zero, or a worker tensor (its value is on the worker: reading it would be a
    sync, so it may be)."""
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor):
        return hasattr(lr, "_gt_id") or lr.item() == 0  # (a host tensor: no sync)
    return type(lr) in (float, int) and lr == 0


@contextlib.contextmanager
def _compiling():
    """``torch.compiler.is_compiling()`` true inside: torch.compile's own session context
    where this torch has it (2.13), else the flag it sets (older releases)."""
    session = getattr(torch.compiler, "_compile_session_context", None)
    if session is not None:
        with session():
            yield
        return
    old = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = old

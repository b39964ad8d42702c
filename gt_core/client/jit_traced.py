"""How a jitted step records: as torch.compile traces it; and the optimizer settings it reads.

A recorded call's numbers are frozen into the block it makes. Library code keeps fewer of
them when it believes it is being compiled (see ``as_traced``); the optimizer settings that
stay numbers (``lr``) are compared before every replay (``knobs``).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["as_traced", "knobs", "optimizers"]

_NOT_KNOBS = ("params", "capturable")  # (capturable: set while recording, see as_traced)


def optimizers(objs) -> list:
    """The optimizers among ``objs`` and what they hold (LR schedulers, dicts, lists), once each."""
    found: dict = {}

    def visit(x, depth):
        if isinstance(x, torch.optim.Optimizer):
            found.setdefault(id(x), x)
        elif isinstance(x, torch.optim.lr_scheduler.LRScheduler):
            found.setdefault(id(x.optimizer), x.optimizer)
        elif depth < 2 and isinstance(x, dict):
            for v in list(x.values()):
                visit(v, depth + 1)
        elif depth < 2 and isinstance(x, (list, tuple)):
            for v in x:
                visit(v, depth + 1)

    for obj in objs:
        visit(obj, 0)
    return list(found.values())


@contextlib.contextmanager
def as_traced(opts):
    """A recorded call runs library code as torch.compile traces it: the paths behind
    ``torch.compiler.is_compiling()`` (``transformers`` skips data-dependent checks there),
    and the step's optimizers ``capturable`` (Adam's bias corrections are tensor ops on
    its step count, not a new Python number each call that replay would freeze). The
    optimizers' own setting is restored after the call."""
    groups = [g for opt in opts for g in opt.param_groups if g.get("capturable") is False]
    for g in groups:
        g["capturable"] = True
    try:
        with _compiling():
            yield
    finally:
        for g in groups:
            g["capturable"] = False


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


def knobs(opts, flowing=frozenset()) -> list:
    """The Python settings of ``opts``' param groups (lr, betas, weight decay...), but those
    ``flowing`` into the block as inputs ((group index, key): see jit_knobs)."""
    groups = [group for opt in opts for group in opt.param_groups]
    return [
        tuple((k, v) for k, v in group.items() if k not in _NOT_KNOBS and (i, k) not in flowing)
        for i, group in enumerate(groups)
    ]

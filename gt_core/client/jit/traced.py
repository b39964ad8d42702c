"""How a jitted step records: as torch.compile traces it, its optimizers as written.

A recorded call's numbers are frozen into the block it makes, unless they flow (see
``settings`` and ``program``). Library code keeps fewer of them when it believes it is being
compiled (see ``as_traced``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

__all__ = ["as_traced"]


@contextlib.contextmanager
def as_traced(spans: list | None = None, at=None, stepped: set | None = None):
    """A recorded call runs library code as torch.compile traces it: the paths behind
    ``torch.compiler.is_compiling()`` (``transformers`` skips data-dependent checks there).

    Not an optimizer's step: it runs as written, so its numbers are eager's to the bit.
    Compiled, torch's optimizers keep their step count a tensor and compute their bias
    corrections on it in float32, which rounds otherwise (Adam's steps of lr turn that into
    differences of 1e-5 where a gradient is near zero); as written they read the step count
    as a number (from its shadow: no sync, see ``program``), and the numbers computed from it
    flow into a replayed block.

    ``spans`` collects [start, end) of each optimizer step, as ``at()`` tells positions (the
    recorded instructions so far): the numbers ops there are passed are the optimizer's;
    ``stepped`` the ids of the optimizers that stepped."""
    was: list[bool] = []

    def pre(opt, args, kwargs):
        was.append(torch.compiler._is_compiling_flag)
        torch.compiler._is_compiling_flag = False
        if spans is not None:
            spans.append([at(), None])
        if stepped is not None:
            stepped.add(id(opt))

    def post(opt, args, kwargs):
        torch.compiler._is_compiling_flag = was.pop()
        if spans is not None and spans and spans[-1][1] is None:
            spans[-1][1] = at()

    hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        with _compiling():
            yield
    finally:
        for h in hooks:
            h.remove()


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

"""The catalogue's general advice for gt_core.jit, per kind of event.

A jit reason is a typed record (``jit_states.JitReason``) that renders its own sentence and
fix; nothing here matches its words. These entries are the advice for a kind as a whole
(a refusal, a re-recording, numbers kept frozen, a step jit would speed up): what a table
shows where it has no record to render.
"""

from __future__ import annotations

from gt_core.observe.cause import Cause

__all__ = ["JIT_CAUSES"]

JIT_CAUSES: tuple[Cause, ...] = (
    Cause(
        "jit_refused",
        ("jit_refused",),
        r"",
        "gt_core.jit does not replay this function",
        "the function keeps running its Python (its block still compiles); to replay it, keep "
        "syncs out of the step, and pass numbers that change as an optimizer's settings (a "
        "float lr a scheduler steps flows into the block) or as tensors the step uses as tensors",
    ),
    Cause(
        "jit_re-recording",
        ("jit_re-recording",),
        r"",
        "replay stopped for a reason that may pass (an input no longer fits, a setting the "
        "block holds changed): that call ran its Python and was recorded",
        "nothing, if the change was meant: recording starts over and replay resumes once "
        "two calls record the same block. To keep replaying, update tensors in place "
        "(p.copy_(new)) rather than binding a new one",
    ),
    Cause(
        "jit_frozen",
        ("jit_frozen",),
        r"",
        "a replay keeps Python numbers as recorded",
        "nothing, if these stay as they are; a number you change later (a learning rate) must "
        "be a tensor the step reads, or replays keep the old value",
    ),
    Cause(
        "jit_would_save",
        ("jit_would_save",),
        r"",
        "the step's Python costs more on the client than its block on the worker",
        "wrap the step in @gt_core.jit: once two calls recorded the same block, a call sends "
        "one message instead of running its Python (see the 05_jit notebook and its contract)",
    ),
)

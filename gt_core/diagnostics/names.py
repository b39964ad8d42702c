"""Whose compile a Dynamo record is (the user's or gt's own), the name to show for it, and
where in the user's code a Dynamo text points.

Dynamo names what it compiled by code object (``forward``, ``torch_dynamo_resume_in_step_at_12``,
its wrapper around modules); the user knows the function they compiled (``KVForecaster``,
``step``). :class:`Names` maps one to the other and remembers it by frame id and by code, for
the records and log lines that carry only one of them.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import threading

from gt_core.diagnostics import stance as _stance
from gt_core.diagnostics import torch_hooks as hooks

__all__ = [
    "USER_FRAME",
    "Names",
    "in_gt",
    "innermost_user",
    "is_ours",
    "last_user_frame",
    "user_call",
]

_GT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gt_core
_EXAMPLES = os.path.join(_GT_DIR, "examples")  # user code, though it ships with gt
USER_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<src>[^\n]*)'
)


def in_gt() -> bool:
    """Whether gt's own code runs here: its in-process worker, or one of its compile threads."""
    return _stance.in_worker.active or threading.current_thread().name.startswith("gt-")


def is_ours(m) -> bool:
    """A compile of gt's own (its in-process worker, its compile threads, its code)."""
    f = m.co_filename or ""
    return in_gt() or (f.startswith(_GT_DIR) and not f.startswith(_EXAMPLES))


def last_user_frame(reason: str) -> tuple[str, str]:
    """(``file:line``, source line) of the last user frame a Dynamo text names, or ('', '')."""
    frames = list(USER_FRAME.finditer(reason or ""))
    if not frames:
        return "", ""
    m = frames[-1]
    return f"{m['file']}:{m['line']}", m["src"].strip()


def _is_user_file(filename: str, torch_dir: str) -> bool:
    if filename.startswith("<") or (torch_dir and filename.startswith(torch_dir)):
        return False
    return not filename.startswith(_GT_DIR) or filename.startswith(_EXAMPLES)


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(torch.__file__) if getattr(torch, "__file__", None) else ""


def innermost_user(frames: list[tuple[str, int, str]]) -> tuple[str, int, str] | None:
    """The innermost of ``frames`` (``(file, line, source)``, outermost first) in the user's
    code: not torch's (a torch.nn module's forward) nor gt's."""
    torch_dir = _torch_dir()
    return next((f for f in reversed(frames) if _is_user_file(f[0], torch_dir)), None)


def user_call() -> tuple[str, str]:
    """(``file:line``, source line) of the innermost user frame on this thread's stack: while
    Dynamo compiles a call, the line that called the compiled function. ('', '') if none."""
    torch_dir = _torch_dir()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if _is_user_file(filename, torch_dir):
            source = linecache.getline(filename, frame.f_lineno).strip()
            return f"{filename}:{frame.f_lineno}", source
        frame = frame.f_back
    return "", ""


def _qualname(co_name: str, filename: str, lineno: int) -> str:
    """``Class.method`` for a method (its class found in the source), else the name."""
    lines = linecache.getlines(filename)
    if not lines or not 0 < lineno <= len(lines):
        return co_name
    line = lines[lineno - 1]
    indent = len(line) - len(line.lstrip())
    for prev in reversed(lines[: lineno - 1]):
        stripped = prev.lstrip()
        if not stripped or stripped.startswith(("#", "@")):
            continue
        depth = len(prev) - len(stripped)
        if depth < indent:
            m = re.match(r"class\s+(\w+)", stripped)
            return f"{m[1]}.{co_name}" if m else co_name
    return co_name


class Names:
    """Display names seen so far: by Dynamo frame id, by (file, code name), and the last."""

    def __init__(self):
        self.by_frame: dict[str, str] = {}
        self.by_code: dict[tuple, str] = {}
        self.last = "?"

    def of_record(self, m, frame: str) -> str:
        """The name of a compile record's function; it becomes the last name (and the frame's)."""
        co, f = m.co_name, m.co_filename or ""
        if co is None:  # a failed compile (the recompile limit): named by its frame's compiles
            self.last = self.by_frame.get(frame, self.last)
            return self.last
        resume = hooks.RESUME.match(co)
        if resume:
            name = self.by_code.get((f, resume["fn"]), resume["fn"])
        elif hooks.is_module_wrapper(f):
            name = _stance.entry_name() or "module"  # a torch.nn module, wrapped by Dynamo
        else:
            name = _stance.owner_of(f, co, m.co_firstlineno or 0) or _qualname(
                co, f, m.co_firstlineno or 0
            )
            if name.endswith(".forward"):  # torch.compile(model): named by its class
                name = name[: -len(".forward")]
            self.by_code[(f, co)] = name
        self.by_frame[frame] = self.last = name
        return name

    def of_frame(self, frame: str, default: str | None = None) -> str:
        """The name of a frame's function; ``default`` (else the last name) if not seen."""
        return self.by_frame.get(frame, self.last if default is None else default)

    def of_code(self, filename: str, co_name: str) -> str:
        """The name of a code object's function, or its code name if not seen."""
        return self.by_code.get((filename, co_name), co_name)

"""Ctrl-C inside gt's own bookkeeping is held until that bookkeeping is consistent again.

A KeyboardInterrupt raised between two lines of the recorder, the plan matcher or a pipe
write would leave half an instruction, a matcher between two entries or half a message on
the pipe: later results could differ from eager without an error. So while a capture is
active in the main thread, SIGINT goes through :func:`_on_sigint`. When the innermost frame
that is neither torch's nor the standard library's is gt's own code, the interrupt is held
and raised at the next safe point (:func:`check`: the next recorded op, the next request, the
end of the capture). Anywhere else (the user's code, torch's Python, a wait for the worker
marked with :func:`interruptible`) it is raised at once, as without gt.
"""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
import threading

import torch

__all__ = ["held", "check", "interruptible", "STATE", "GT_DIR", "LIBRARY_DIRS", "user_line"]

GT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # gt_core
LIBRARY_DIRS = tuple(
    p + os.sep
    for p in {
        os.path.dirname(os.path.abspath(torch.__file__)),
        os.path.abspath(sysconfig.get_paths()["stdlib"]),
    }
)
_OURS = (GT_DIR, *LIBRARY_DIRS)


def user_line(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the innermost frame, from ``depth`` up, that is neither gt's, torch's
    nor the standard library's: the user's line (or a library's, such as transformers')."""
    f = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_OURS) and not name.startswith("<frozen"):
            return name, f.f_lineno
        f = f.f_back
    return None


_SAFE: set = set()  # code objects of gt's waits: an interrupt there is raised at once
STATE = {"pending": False, "depth": 0, "previous": None}
_lock = threading.Lock()


def interruptible(fn):
    """Mark ``fn`` as a wait an interrupt may end at once (gt's state is consistent there)."""
    _SAFE.add(fn.__code__)
    return fn


def check() -> None:
    """Raise the interrupt held since gt's state was last inconsistent, if there is one."""
    if STATE["pending"]:
        STATE["pending"] = False
        raise KeyboardInterrupt


def _in_gt(frame) -> bool:
    """True when the innermost frame that is not torch's or the stdlib's is gt's own."""
    while frame is not None:
        code = frame.f_code
        if code in _SAFE:
            return False
        name = code.co_filename
        if name.startswith(GT_DIR):
            return True
        if not name.startswith(LIBRARY_DIRS) and not name.startswith("<frozen"):
            return False
        frame = frame.f_back
    return False


def _on_sigint(signum, frame) -> None:
    if _in_gt(frame):
        STATE["pending"] = True
        return
    STATE["pending"] = False
    previous = STATE["previous"]
    if callable(previous) and previous is not _on_sigint:
        previous(signum, frame)
    else:
        raise KeyboardInterrupt


class held:
    """While entered (in the main thread), a Ctrl-C inside gt's code is held (see module doc).

    Re-entrant; the handler that was there before is restored when the outermost exits,
    unless someone replaced ours meanwhile.
    """

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            self.on = False
            return self
        self.on = True
        with _lock:
            if STATE["depth"] == 0:
                try:
                    STATE["previous"] = signal.signal(signal.SIGINT, _on_sigint)
                except (ValueError, OSError):  # not the main interpreter
                    self.on = False
                    return self
            STATE["depth"] += 1
        return self

    def __exit__(self, *exc):
        if not self.on:
            return False
        with _lock:
            STATE["depth"] -= 1
            if STATE["depth"] == 0:
                if signal.getsignal(signal.SIGINT) is _on_sigint:
                    signal.signal(signal.SIGINT, STATE["previous"] or signal.default_int_handler)
                STATE["previous"] = None
        return False

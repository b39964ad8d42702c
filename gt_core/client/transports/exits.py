"""Why a worker process ended, and what a live one is doing, in words."""

from __future__ import annotations

import signal

__all__ = ["exit_reason", "doing"]


def exit_reason(code: int | None) -> str:
    """Why a worker ended, in words, from its exit code (None: it has not exited)."""
    if code is None:
        return "its connection broke"
    if code >= 0:
        return f"it exited with status {code}"
    try:
        why = f"it was killed by {signal.Signals(-code).name}"
    except ValueError:
        why = f"it was killed by signal {-code}"
    if -code == signal.SIGKILL:
        why += " (out of memory, or killed from outside)"
    return why


def doing(pid: int) -> str:
    """What a process is doing, in words, from its state in /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "it is busy with the work sent before"
    if state in ("T", "t"):
        return "it is stopped (SIGSTOP or a debugger); resume it with SIGCONT"
    if state == "D":
        return "it is waiting on the disk or a device"
    return "it is busy with the work sent before"

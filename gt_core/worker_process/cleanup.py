"""What the client does on the worker's side once the worker is gone, however it went."""

from __future__ import annotations

from gt_core.compile.process import end_group

__all__ = ["end_compile_process"]


def end_compile_process(pid: int, folder: str | None) -> None:
    """End a dead worker's compile process (its C++ builds too) and remove its folder."""
    end_group(pid, folder)

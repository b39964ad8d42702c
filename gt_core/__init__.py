"""gt: plain PyTorch on a worker process, its hot paths found and compiled.

The client's names load on first use (PEP 562), so ``import gt_core.observe`` and the
widget layer read plain data without importing torch; ``gt_core.capture`` imports it.
"""

from __future__ import annotations

from gt_core import signal
from gt_core.diagnostics import diagnostics
from gt_core.errors import (
    CaptureError,
    CompiledRunFailed,
    ConfigError,
    GTError,
    OutputMismatch,
    RemoteRefused,
    UnsupportedOperation,
    WorkerDied,
    WorkerLost,
)
from gt_core.observe import events
from gt_core.options import Options

# The client's public names (they import torch) -> the module that defines each. No
# subpackage may be named like one of them: its import would bind the module over the name.
_CLIENT = {
    "capture": "gt_core.client.capture",
    "worker": "gt_core.client.capture",
    "WorkerHandle": "gt_core.client.capture",
    "to_worker": "gt_core.client.moves",
    "report": "gt_core.client.capture",
    "reset": "gt_core.client.capture",
    "wait": "gt_core.client.capture",
    "configure": "gt_core.client.capture",
    "config": "gt_core.client.capture",
    "events_log": "gt_core.client.capture",
    "jit": "gt_core.client.jit",
    "connect": "gt_core.client.transports.connect",
    "is_remote": "gt_core.client.recording.proxy",
    "Proxy": "gt_core.client.recording.proxy",
}

__all__ = [
    "capture",
    "jit",
    "diagnostics",
    "worker",
    "connect",
    "WorkerHandle",
    "to_worker",
    "is_remote",
    "report",
    "reset",
    "wait",
    "configure",
    "config",
    "events_log",
    "events",
    "signal",
    "Proxy",
    "Options",
    "GTError",
    "ConfigError",
    "WorkerDied",
    "WorkerLost",
    "RemoteRefused",
    "UnsupportedOperation",
    "CompiledRunFailed",
    "OutputMismatch",
    "CaptureError",
]


def __getattr__(name: str):
    where = _CLIENT.get(name)
    if where is None:
        raise AttributeError(f"module 'gt_core' has no attribute {name!r}")
    import importlib  # noqa: PLC0415 (kept out of the package's namespace)

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

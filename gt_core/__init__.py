"""gt: plain PyTorch on a worker process, its hot paths found and compiled."""

from . import events, signal
from ._capture import (
    WorkerHandle,
    capture,
    config,
    configure,
    events_log,
    report,
    reset,
    to_worker,
    wait,
    worker,
)
from ._jit import jit
from ._proxy import Proxy, is_remote
from .config import Options
from .diagnostics import diagnostics
from .errors import (
    CaptureError,
    CompiledRunFailed,
    ConfigError,
    GTError,
    UnsupportedOperation,
    WorkerDied,
    WorkerLost,
)

__all__ = [
    "capture",
    "jit",
    "diagnostics",
    "worker",
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
    "UnsupportedOperation",
    "CompiledRunFailed",
    "CaptureError",
]

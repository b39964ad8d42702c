"""gt: plain PyTorch on a worker process, its hot paths found and compiled."""

from gt_core import signal
from gt_core.client.capture import (
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
from gt_core.client.jit import jit
from gt_core.client.proxy import Proxy, is_remote
from gt_core.config import Options
from gt_core.diagnostics import diagnostics
from gt_core.errors import (
    CaptureError,
    CompiledRunFailed,
    ConfigError,
    GTError,
    UnsupportedOperation,
    WorkerDied,
    WorkerLost,
)
from gt_core.observe import events

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

"""The package's error types: one base, each naming what was expected, what came, what to do."""

from __future__ import annotations

__all__ = [
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


class GTError(Exception):
    """Base class of every error gt raises itself."""


class ConfigError(GTError, ValueError):
    """A configuration value (option or environment variable) is not accepted."""

    def __init__(self, name: str, value: object, accepted: str):
        self.name, self.value, self.accepted = name, value, accepted
        super().__init__(f"{name}={value!r} is not accepted; expected {accepted}")

    def __reduce__(self):  # the worker sends it to the client: rebuilt from its three parts
        return (type(self), (self.name, self.value, self.accepted))


class WorkerDied(GTError, RuntimeError):
    """The worker process ended while work was pending; restart with gt_core.worker().restart()."""


class RemoteRefused(WorkerDied):
    """A remote worker could not be reached, or did not accept this client's authkey."""


class WorkerLost(GTError, RuntimeError):
    """A worker tensor whose worker has died or been restarted was used."""


class UnsupportedOperation(GTError, RuntimeError):
    """Something a worker tensor cannot do, with the way around it."""


class CompiledRunFailed(GTError, RuntimeError):
    """A compiled hot path failed mid-run after it may have updated tensors in place."""


class OutputMismatch(GTError, RuntimeError):
    """An op on the worker returned other outputs than the client inferred for it."""


class CaptureError(GTError, RuntimeError):
    """capture() used in a way one worker cannot serve (e.g. nested with other options)."""

"""What the worker keeps as the kernel has it: the global generator and the default dtype.

Inside a capture the worker draws from its own generator, the one eager's stream goes on in,
and makes the capture's tensors under its own default dtype: the session's ``Mirror`` sends
the kernel's state there in stream order (a seed, a generator state, a dtype), reads the
worker's generator back, and remembers what the worker has, so nothing is sent twice.
"""

from __future__ import annotations

import torch

from gt_core.client.recording.meta import follow_default_dtype
from gt_core.stream.instructions import RNG, SEED, Rng, Seed
from gt_core.stream.requests import DefaultDtype, RngState

__all__ = ["Mirror"]


class Mirror:
    """The worker's copy of the kernel's generator state and default dtype, for ``session``
    (its emit, stage and request; ``lock``: recording's)."""

    def __init__(self, session, lock):
        self.session, self.lock = session, lock
        self.rng = None  # the CPU generator state the worker has too (None: unknown)
        self.default_dtype = torch.float32  # the worker's (a fresh process has torch's own)

    def seed(self, n: int) -> None:
        with self.lock:
            self.session.emit(Seed(SEED, n))
            self.rng = None

    def send_rng_state(self, state) -> None:
        """The worker's CPU generator takes ``state`` (unless it has it already)."""
        with self.lock:
            if self.rng is None or not _equal(self.rng, state):
                self.session.emit(Rng(RNG, self.session.stage(state)))
            self.rng = None  # the worker draws from here on

    def fetch_rng_state(self):
        """The worker's CPU generator state, once everything sent so far has run (a sync),
        remembered as the worker's until it draws (see forget_rng_state)."""
        state = self.session.request(RngState())
        self.rng = state
        return state

    def forget_rng_state(self) -> None:
        self.rng = None

    def send_default_dtype(self, dtype: torch.dtype) -> None:
        """The worker's default dtype becomes ``dtype`` where it is not (a sync), in stream
        order: factories without a dtype, and integer tensors with Python floats, take it."""
        follow_default_dtype(dtype)  # (the client's cached inferences take it too)
        if dtype != self.default_dtype:
            self.session.request(DefaultDtype(dtype))
            self.default_dtype = dtype


def _equal(a, b) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))

"""A worker group: N ranks of one torch.distributed process group running one stream (SPMD).

The client sends every message to every rank (each has its pipes, as one worker has), so
every rank runs the same instructions, requests included, in the same order; only rank 0
answers. (Not rank 0 broadcasting the stream: a collective waiting for the client's next
message would time out while a notebook sits idle.) Decisions that could differ between ranks are made alike or agreed:

- a block is detected from the stream alone (every rank sees the same stream);
- blocks compile inline, at the occurrence that is due (no background thread whose finish
  time would differ per rank), with the thread count fixed;
- a compile that failed, or a first compiled run that failed its check, on any rank fails it
  on every rank (``agree``: an all-reduce of the outcome, at the same point of the stream);
- reverts judged on measured times are off (times differ per rank; an event says so).

Without sharding every rank holds every tensor whole (replicated) and computes what one
worker would; with it, see gt_core.worker_process.shard. Every collective a rank runs is counted
(gt_core.worker_process.comms); the ranks' lines show a step's.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import NamedTuple

__all__ = ["GroupSpec", "Group", "adjust"]

_TIMEOUT = datetime.timedelta(seconds=600)  # a collective waits this long for the others


class GroupSpec(NamedTuple):
    """Where a rank stands: its rank, the group's size, and where the ranks meet."""

    rank: int
    world: int
    init_method: str  # file:///path (local ranks) or tcp://host:port


def adjust(options):
    """The options every rank runs with: compiles inline, fixed threads, no timed reverts."""
    return dataclasses.replace(
        options,
        background=False,
        compile_process=False,
        worker_threads=options.worker_threads or 1,
        regression_samples=2**31 - 1,
    )


class Group:
    """This rank's part: the process group, the stream shared from rank 0, agreement."""

    def __init__(self, spec: GroupSpec, device, publish):
        import torch
        import torch.distributed as dist

        from gt_core.worker_process.comms import install

        self.dist, self.torch = dist, torch
        self.rank, self.world = spec.rank, spec.world
        self.comms = install()  # every collective this rank runs, by kind (before the first)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=spec.init_method,
            rank=spec.rank,
            world_size=spec.world,
            timeout=_TIMEOUT,
        )
        # Agreements travel on a gloo group of their own (CPU tensors), apart from the
        # device's collectives.
        self.control = dist.new_group(backend="gloo") if backend != "gloo" else None
        self.agreements = 0  # agreements made (all-reduces of one int)
        self.publish = publish
        publish([self._event()])

    def agree(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank (every rank calls this at the same point)."""
        self.agreements += 1
        flag = self.torch.tensor([1 if ok else 0], dtype=self.torch.int32)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN, group=self.control)
        self.publish([self._event()])
        return bool(flag.item())

    def _event(self) -> dict:
        from gt_core.observe import events as ev

        return ev.event(ev.GROUP, **self.stats())

    def stats(self) -> dict:
        return {
            "rank": self.rank,
            "world": self.world,
            "agreements": self.agreements,
            "comm": self.comms.snapshot(),
            "pid": os.getpid(),
        }

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:
            pass

"""Where an op's new tensors live: on the worker's device, whatever the client recorded.

The client sees every worker tensor as a CPU tensor, so what it records names the CPU:
``torch.arange(n, device=x.device)``, a mask made with ``torch.zeros(..., device=...)``,
``x.to("cpu")`` of a worker tensor. The worker owns its device, and one rule places such
ops wherever they run: op by op (the executor), in a block's eager graph and in its compiled
graph (build_graph). A device other than the CPU is the user's own choice and kept.
"""

from __future__ import annotations

import torch

__all__ = ["NONE", "FROM_INPUT", "FACTORY", "kind_of", "placed"]

# What an op's ``device`` argument means where the client named none (kind_of).
NONE, FROM_INPUT, FACTORY = range(3)  # no such argument | its tensor input's device | the CPU


def kind_of(op) -> int:
    """How ``op`` (an OpOverload) names the device of what it makes: NONE where it takes no
    ``device``; FROM_INPUT where it has a tensor input whose device it keeps unless told
    (``ones_like``, ``_to_copy``); FACTORY where it makes tensors from nothing (``arange``)."""
    schema = getattr(op, "_schema", None)
    if schema is None or not any(a.name == "device" for a in schema.arguments):
        return NONE
    takes_tensor = any(isinstance(a.type, torch.TensorType) for a in schema.arguments)
    return FROM_INPUT if takes_tensor else FACTORY


def placed(kwargs: dict, device: torch.device, kind: int) -> dict:
    """``kwargs`` of an op of ``kind`` (not NONE) with the worker's ``device`` where they name
    the CPU, or none and the op is a FACTORY (whose default device is the CPU's); pinned
    memory is the CPU's only."""
    dev = kwargs.get("device")
    if (dev is None and kind == FACTORY) or (dev is not None and torch.device(dev).type == "cpu"):
        kwargs = dict(kwargs, device=device)
    if kwargs.get("pin_memory"):
        kwargs = dict(kwargs, pin_memory=False)
    return kwargs

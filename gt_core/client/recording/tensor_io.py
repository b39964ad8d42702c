"""Worker tensors in PyTorch's own workflows: pickling, deep copies, moves to the CPU.

- Pickling a proxy (``torch.save``, ``pickle``) fetches its value and pickles a plain tensor
  in its place, Parameter-ness and ``requires_grad`` kept: the file holds ordinary tensors and
  loads without gt.
- ``copy.copy`` shares the value on the worker (an alias), as eager's shares storage.
- A deep copy is a clone recorded on the worker (no round trip of the data), with eager's
  rules: a Parameter is copied as ``Parameter.__deepcopy__`` copies one (no ``.grad``), any
  other leaf as ``Tensor.__deepcopy__`` does (its ``.grad`` and attributes copied too).
- A value fetched from the worker (``.cpu()``, ``.to("cpu")``) is a tensor on the CPU;
  assigning it through ``.data`` (what ``Module.cpu()`` does) makes the proxy that plain
  tensor, as ``.data =`` with a tensor of another device does in eager. It is not uploaded
  back.
- A tensor built on host memory inside a capture (``torch.load`` sets a new tensor's storage
  to the file's) is uploaded: like any tensor made in a capture, it lives on the worker.
- Optimizer state loaded as plain tensors (``opt.load_state_dict(torch.load(f))`` with the
  file read outside a capture) joins its parameter on the worker before the first step in a
  capture, as ``load_state_dict`` casts state to its parameter's device in eager.
"""

from __future__ import annotations

import copy
import weakref

import torch

from gt_core.client.recording.mode import capture_mode
from gt_core.client.recording.proxy_fields import FIELDS
from gt_core.client.recording.uploads import upload

__all__ = [
    "reduce",
    "deepcopy",
    "shallow_copy",
    "mark_fetched",
    "is_fetched",
    "become_plain",
    "to",
    "place_optimizer_state",
]


_fetched: dict[int, weakref.ref] = {}  # id(plain tensor) -> weakref: values fetched from a proxy


def mark_fetched(t: torch.Tensor) -> torch.Tensor:
    """Remember that ``t`` is a value fetched from the worker (a move to the CPU)."""
    key = id(t)
    _fetched[key] = weakref.ref(t, lambda _r, k=key: _fetched.pop(k, None))
    return t


def is_fetched(t: torch.Tensor) -> bool:
    """Whether ``t`` is a value fetched from the worker (see mark_fetched)."""
    ref = _fetched.get(id(t))
    return ref is not None and ref() is t


def _is_param(p) -> bool:
    # nn.Parameter(subclass instance) keeps the subclass and marks the instance instead.
    return isinstance(p, torch.nn.Parameter)


def _attributes(p) -> dict:
    """The user's attributes on ``p`` (not gt's bookkeeping nor Parameter's marker)."""
    return {k: v for k, v in p.__dict__.items() if k not in FIELDS and k != "_is_param"}


def _plain_like(p, value: torch.Tensor) -> torch.Tensor:
    """``value`` (a plain tensor) dressed as ``p`` is: Parameter-ness, requires_grad, attributes."""
    if _is_param(p):
        out = torch.nn.Parameter(value, requires_grad=p.requires_grad)
    else:
        out = value.detach().requires_grad_(p.requires_grad)
    out.__dict__.update(_attributes(p))
    return out


def reduce(p, protocol: int):
    """What pickle stores for ``p``: the plain tensor eager would have had (a fetch)."""
    return _plain_like(p, p.cpu()).__reduce_ex__(protocol)


def deepcopy(p, memo: dict):
    """A copy of ``p`` made on the worker, independent of ``p``, as eager deepcopy makes one."""
    hit = memo.get(id(p))
    if hit is not None:
        return hit
    if not p.is_leaf:
        raise RuntimeError(
            "Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
            "protocol: this gt worker tensor is the result of an op that requires grad; "
            "deepcopy p.detach() instead"
        )
    with torch.no_grad():
        new = torch.ops.aten.clone.default(p, memory_format=torch.preserve_format)
    if _is_param(p):
        # Parameter.__deepcopy__: a new Parameter of the data; no .grad, no attributes.
        new = torch.nn.Parameter(new, requires_grad=p.requires_grad)
        memo[id(p)] = new
        return new
    new.requires_grad_(p.requires_grad)
    memo[id(p)] = new
    if p.grad is not None:
        new.grad = deepcopy(p.grad, memo)
    new.__dict__.update(copy.deepcopy(_attributes(p), memo))
    return new


def shallow_copy(p):
    """``copy.copy(p)``: a new tensor sharing ``p``'s value on the worker, as eager shares
    storage; Parameter-ness, ``requires_grad`` and attributes kept."""
    new = torch.ops.aten.alias.default(p)
    if _is_param(p):
        new = torch.nn.Parameter(new, requires_grad=p.requires_grad)
    else:
        new.requires_grad_(p.requires_grad)
    new.__dict__.update(_attributes(p))
    return new


def become_plain(p, value: torch.Tensor) -> None:
    """``p.data = value`` with a value fetched from the worker: ``p`` becomes a plain tensor.

    ``p`` keeps its identity (modules and optimizers still hold it), its Parameter-ness and
    its ``requires_grad``; its ``.grad`` moves with it; its worker value is freed.
    """
    grad = p.grad
    if isinstance(grad, type(p)):  # a worker tensor too
        # Moved here, not through its own `.data` (as Module._apply asks next): p's autograd
        # metadata holds the grad, so it cannot be swapped in place; the plain copy set now
        # is what `p.grad.data = ...` then updates.
        grad = _plain_like(grad, grad.cpu())
    new = _plain_like(p, value)
    if not p.is_leaf:
        new.requires_grad_(False)  # a non-leaf keeps no autograd history across the move
    if grad is not None:
        p.grad = None
    try:
        torch.utils.swap_tensors(p, new)
    except RuntimeError as exc:
        if grad is not None:
            p.grad = grad
        raise RuntimeError(
            f"gt: could not turn the worker tensor {list(p.shape)} into a CPU tensor in place "
            f"({exc}); use t.cpu() for a CPU copy instead"
        ) from exc
    # `new` now holds the proxy's old value and bookkeeping: its end frees the worker's value.
    del new
    if grad is not None:
        p.grad = grad


def to(p, args: tuple, kwargs: dict):
    """``p.to(...)``: to an explicit CPU device outside a capture, a fetch; else torch's ``to``.

    Proxies report device cpu, so torch's ``to("cpu")`` returns the proxy itself. Inside a
    capture that is what it must do: the cpu device there is the one proxies report, and
    ``x.to(p.device)`` or ``model.to(device)`` must keep the work on the worker. Outside a
    capture, ``to("cpu")`` asks for a CPU tensor, as it would of a tensor on another device.
    ``to(dtype)`` and ``to(other_tensor)`` stay on the worker.
    """
    device = kwargs["device"] if "device" in kwargs else args[0] if args else None
    if (
        isinstance(device, str | torch.device)
        and torch.device(device).type == "cpu"
        and capture_mode() is None
    ):
        # the rest (dtype, memory_format, copy) applies to the fetched copy by torch's rules
        return mark_fetched(p.cpu().to(*args, **kwargs))
    return torch._C.TensorBase.to(p, *args, **kwargs)


_placed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> its state dict


def place_optimizer_state(opt: torch.optim.Optimizer, args, kwargs) -> None:  # noqa: ARG001
    """A global step pre-hook while capturing: plain state of a worker parameter is uploaded.

    Plain state beside worker parameters would be updated in place by ops with worker
    arguments: each step a sync, and with foreach ops a wrong result. Checked once per state
    dict (``load_state_dict`` replaces it), so a steady step pays one lookup.
    """
    state = opt.state
    mode = capture_mode()
    if _placed.get(opt) is state or mode is None:
        return
    cls = mode.proxy_cls
    for p, entries in state.items():
        if isinstance(p, cls):
            for k, v in entries.items():
                if isinstance(v, torch.Tensor) and not isinstance(v, cls):
                    entries[k] = upload(cls, p.gt_session, v, cache=False)
    _placed[opt] = state

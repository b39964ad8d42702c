"""CPU-only ops the client records, run by a worker on another device in portable form.

The client's tensors look like CPU tensors, so a composite op decomposes as it would on the
CPU: ``F.scaled_dot_product_attention`` becomes ``_scaled_dot_product_flash_attention_for_cpu``
(and its backward), kernels CUDA does not have. A worker on another device runs them as the
same computation in device-generic aten ops, with outputs laid out as the CPU kernel's meta
function lays them out, so the views the client recorded on them hold. They stay ordinary
Python functions in a hot block's FX graph; the compiler traces through them.
"""

from __future__ import annotations

import torch

__all__ = ["for_device"]

_aten = torch.ops.aten


def _scores(q, k, is_causal, attn_mask, scale):
    """(q kᵀ · scale with the masks applied, in float32 or wider; the scale used)."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    dt = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q.to(dt), k.to(dt).transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:  # a float mask: the kernel takes no other (the composite converts)
        s = s + attn_mask.to(dt)
    return s, scale


def _heads(q, kv):
    """``kv`` with as many heads as ``q`` (grouped-query attention: each key/value head serves
    ``q.size(1) // kv.size(1)`` consecutive query heads, as the CPU kernel pairs them)."""
    group = q.size(1) // kv.size(1)
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def _grouped(g, kv):
    """A gradient over the expanded heads, summed back onto ``kv``'s heads."""
    if g.size(1) == kv.size(1):
        return g
    h = kv.size(1)
    return g.unflatten(1, (h, g.size(1) // h)).sum(2)


def _no_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise NotImplementedError(
            f"gt: scaled_dot_product_attention with dropout_p={dropout_p} on a GPU worker is not "
            "supported yet (the client recorded the CPU kernel); use dropout_p=0.0 in training "
            "steps run through gt on a GPU, or run this worker on the CPU"
        )


def _flash_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _no_dropout(dropout_p)
    s, _ = _scores(q, _heads(q, k), is_causal, attn_mask, scale)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    b, h, n = q.size(0), q.size(1), q.size(2)
    out = torch.empty_like(q).copy_(torch.matmul(p, _heads(q, v).to(p.dtype)))
    lse_out = torch.empty((b, n, h), dtype=lse.dtype, device=q.device).transpose(1, 2)
    return out, lse_out.copy_(lse)


def _flash_for_cpu_backward(
    grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    _no_dropout(dropout_p)
    ke, ve = _heads(q, k), _heads(q, v)
    s, scale = _scores(q, ke, is_causal, attn_mask, scale)
    dt = s.dtype
    p = torch.exp(s - logsumexp.to(dt).unsqueeze(-1))
    go = grad_out.to(dt)
    dv = _grouped(torch.matmul(p.transpose(-2, -1), go), v)
    dp = torch.matmul(go, ve.to(dt).transpose(-2, -1))
    ds = p * (dp - (go * out.to(dt)).sum(-1, keepdim=True))
    dq = torch.matmul(ds, ke.to(dt)) * scale
    dk = _grouped(torch.matmul(ds.transpose(-2, -1), q.to(dt)), k) * scale
    # The CPU kernel's grads are laid out (batch, seq, heads, dim).
    return tuple(
        torch.empty_permuted(ref.size(), (0, 2, 1, 3), dtype=ref.dtype, device=ref.device).copy_(g)
        for g, ref in ((dq, q), (dk, k), (dv, v))
    )


class Portable:
    """An op's stand-in: called like it, named like it (events, errors, plans), its schema."""

    def __init__(self, op, impl):
        self.op, self.impl = op, impl
        self.namespace, self._opname = op.namespace, op._opname
        self._overloadname, self._schema = op._overloadname, op._schema
        self.__name__ = f"gt_portable_{op._opname}"

    def __call__(self, *args, **kwargs):
        return self.impl(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Portable({self.op})"


_PORTABLE = {
    _aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_for_cpu,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _flash_for_cpu_backward,
}


def for_device(op, device: torch.device):
    """``op`` itself, or its portable stand-in where ``device`` is not the CPU it was made for."""
    impl = _PORTABLE.get(op) if device.type != "cpu" else None
    return op if impl is None else Portable(op, impl)

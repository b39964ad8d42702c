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


def _no_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise NotImplementedError(
            f"gt: scaled_dot_product_attention with dropout_p={dropout_p} on a GPU worker is not "
            "supported yet (the client recorded the CPU kernel); use dropout_p=0.0 in training "
            "steps run through gt on a GPU, or run this worker on the CPU"
        )


def _flash_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _no_dropout(dropout_p)
    s, _ = _scores(q, k, is_causal, attn_mask, scale)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    b, h, n = q.size(0), q.size(1), q.size(2)
    out = torch.empty_like(q).copy_(torch.matmul(p, v.to(p.dtype)))
    lse_out = torch.empty((b, n, h), dtype=lse.dtype, device=q.device).transpose(1, 2)
    return out, lse_out.copy_(lse)


def _flash_for_cpu_backward(
    grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    _no_dropout(dropout_p)
    s, scale = _scores(q, k, is_causal, attn_mask, scale)
    dt = s.dtype
    p = torch.exp(s - logsumexp.to(dt).unsqueeze(-1))
    go = grad_out.to(dt)
    dv = torch.matmul(p.transpose(-2, -1), go)
    dp = torch.matmul(go, v.to(dt).transpose(-2, -1))
    ds = p * (dp - (go * out.to(dt)).sum(-1, keepdim=True))
    dq = torch.matmul(ds, k.to(dt)) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.to(dt)) * scale
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

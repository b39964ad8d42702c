"""Lowering: a recorded aliasing op compiles whatever layout the compiler gives its input."""

import math

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from conftest import assert_close
from models import train
from torch import nn

import gt_core
from gt_core.compile.lower import relax_views

_aten = torch.ops.aten


class Attention(nn.Module):
    """Attention written as users write it: ``q @ k.transpose(-1, -2)`` on 4-D tensors (a
    batched matmul that aten records as expand, view, bmm), as GPT-2 and T5 do."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)).softmax(-1)
        return self.out((a @ v).transpose(1, 2).reshape(b, t, d))


def _data():
    torch.manual_seed(1)
    return torch.randn(4, 8, 32), torch.randn(4, 8, 32)


@pytest.mark.inductor
def test_attention_with_a_transposed_key_compiles_under_inductor_and_equals_eager(process):
    sgd = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)  # noqa: E731
    ref, ref_losses = train(Attention, sgd, _data, F.mse_loss, 30, False)
    got, losses = train(
        Attention,
        sgd,
        _data,
        F.mse_loss,
        30,
        True,
        auto_compile=True,
        backend="inductor",
        background=False,
        threshold=3,
    )
    (p,) = gt_core.report().to_data()["hot_paths"]
    assert p["status"] == "compiled" and p["compiled_runs"] >= 1, p["fallback_reason"]
    assert p["checked"]["ok"] is True
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)


def _graph(fn) -> fx.GraphModule:
    return fx.symbolic_trace(fn)


def test_views_of_memory_nothing_writes_become_reshapes():
    def f(x):
        e = _aten.expand.default(_aten.transpose.int(x, 1, 2), [2, 3, 4])
        return (_aten.mul.Tensor(_aten.view.default(e, [6, 4]), 2.0),)

    gm = _graph(f)
    assert relax_views(gm) == 1
    x = torch.randn(2, 4, 3)
    assert torch.equal(gm(x)[0], x.transpose(1, 2).reshape(6, 4) * 2)


def test_a_view_the_block_returns_keeps_its_strides():
    gm = _graph(lambda x: (_aten.view.default(x, [6]),))
    assert relax_views(gm) == 0


def test_views_whose_memory_is_written_stay_views():
    def through_view(x):
        v = _aten.view.default(x, [6])
        _aten.add_.Tensor(v, 1.0)  # the write must reach x
        return (x,)

    def to_base(x):
        v = _aten.view.default(x, [6])
        _aten.mul_.Tensor(x, 2.0)  # ... and a write to x must reach v
        return (v,)

    for f in (through_view, to_base):
        gm = _graph(f)
        assert relax_views(gm) == 0
        x = torch.ones(2, 3)
        assert torch.equal(gm(x.clone())[0], f(x.clone())[0])

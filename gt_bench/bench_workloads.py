"""The workloads of ``python -m gt_bench.bench``: five step functions, each made afresh."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gt_bench.workloads import fed, make, make_opt

__all__ = ["WORKLOADS", "MODELS", "model_workload"]


# -- workloads: make() -> (step, state). step() runs one iteration and returns a scalar tensor;
# state lists what the step updates in place (the parameters), compared with eager's at the end.
# A step fed by a DataLoader also has ``step.fed``: (the training step of one batch, the batch
# iterator); what gt_core.jit and torch.compile wrap is that step, given each next batch.
def matmul_chain():
    ws = [torch.randn(256, 256) / 16 for _ in range(6)]
    x = torch.randn(64, 256)

    def step():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return h.sum()

    return step, []


def mlp_training():
    model, x, y, loss_fn = make(128, "mlp")
    opt, _ = make_opt(model, "mlp")

    def step():
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step, list(model.parameters())


class _Attention(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(x)


def attention_training():
    model = _Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 32, 64)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step, list(model.parameters())


def mixed_ops():
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    idx = torch.arange(0, 128, 2)

    def step():
        h = torch.sigmoid(a * 1.5 + b) - torch.relu(a - b) * 0.5
        h = h.softmax(-1) + h.index_select(0, torch.remainder(idx + 1, 128)).mean(0)
        return (h.cumsum(-1)[:, -1] - h.amax(-1)).abs().sum()

    return step, []


def dataloader_training():
    f = fed(64)
    batches = f.batches()

    def step():
        return f.step(*next(batches))

    step.fed = (f.step, batches)
    return step, f.params


WORKLOADS: dict[str, Callable] = {
    "matmul chain": matmul_chain,
    "MLP training step": mlp_training,
    "attention block": attention_training,
    "mixed operations": mixed_ops,
    "DataLoader MLP": dataloader_training,
}


def model_workload(name: str) -> Callable:
    """A ``transformers`` model of gt_bench.zoo as a workload: its training step on its batch
    (SGD momentum), the parameters and buffers its state. The batch is the step's argument
    (``step.fed``), as a training step takes it."""

    def make():
        from gt_bench import zoo

        z = zoo.build(name)
        batches = itertools.repeat(z.batch)

        def step():
            return z.step(*z.batch)

        step.fed = (z.step, batches)  # jit and torch.compile wrap the step of one batch
        return step, z.state

    return make


def _model_names() -> list[str]:
    from gt_bench import zoo

    return zoo.names()


# ``python -m gt_bench.bench --models``: the zoo's models (transformers, the ``models`` extra).
MODELS: dict[str, Callable] = {name: model_workload(name) for name in _model_names()}

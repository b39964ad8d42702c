"""An autoregressive forecaster with a KV cache, twice: as often written, and fixed.

``KVForecaster`` keeps the cache position of each layer as a Python int in
``kv_cache._current_idx`` and branches on it. Under ``torch.compile`` every step changes
that int, Dynamo's guard ``..._current_idx[0] == 0`` fails, the step recompiles, and after
``torch._dynamo.config.recompile_limit`` compiles the model silently runs eagerly.

``FixedForecaster`` keeps the position in a 0-d tensor and replaces the branch by tensor
ops (an ``index_copy_`` write and a mask over all positions): one graph serves every step.
Both compute the same function of the same weights (see :func:`make_models`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["KVCache", "KVForecaster", "FixedForecaster", "make_models", "generate"]


class KVCache:
    """Past keys and values per layer; each layer's position is a Python int (the bug)."""

    def __init__(self, layers: int, batch: int, max_len: int, dim: int):
        self.k = torch.zeros(layers, batch, max_len, dim)
        self.v = torch.zeros(layers, batch, max_len, dim)
        self._current_idx = [0] * layers


class _Weights(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 2, max_len: int = 32, batch: int = 2):
        super().__init__()
        self.dim, self.layers, self.max_len, self.batch = dim, layers, max_len, batch
        self.inp = nn.Linear(1, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, 1)


class KVForecaster(_Weights):
    """One step: the last value (batch, 1) in, the next value (batch, 1) out."""

    def __init__(self, **cfg):
        super().__init__(**cfg)
        self.reset()

    def reset(self) -> None:
        self.kv_cache = KVCache(self.layers, self.batch, self.max_len, self.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        cache = self.kv_cache
        for layer in range(self.layers):
            q, k, v = self.qkv[layer](h).chunk(3, dim=-1)
            i = cache._current_idx[layer]
            cache.k[layer, :, i] = k
            cache.v[layer, :, i] = v
            if cache._current_idx[layer] == 0:
                ctx = v  # nothing to attend to yet
            else:
                keys, vals = cache.k[layer, :, : i + 1], cache.v[layer, :, : i + 1]
                att = torch.softmax((keys @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(self.dim), -1)
                ctx = (att.unsqueeze(-1) * vals).sum(1)
            cache._current_idx[layer] += 1
            h = h + self.out[layer](ctx)
        return self.head(torch.tanh(h))


class FixedForecaster(_Weights):
    """The same step with the position in a 0-d tensor and no Python branch on it."""

    def __init__(self, **cfg):
        super().__init__(**cfg)
        shape = (self.layers, self.batch, self.max_len, self.dim)
        self.register_buffer("k", torch.zeros(shape), persistent=False)
        self.register_buffer("v", torch.zeros(shape), persistent=False)
        self.register_buffer("idx", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("pos", torch.arange(self.max_len), persistent=False)

    def reset(self) -> None:
        self.k.zero_(), self.v.zero_(), self.idx.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        at = self.idx.view(1)
        visible = self.pos <= self.idx  # positions written so far, this one included
        for layer in range(self.layers):
            q, k, v = self.qkv[layer](h).chunk(3, dim=-1)
            self.k[layer].index_copy_(1, at, k.unsqueeze(1))
            self.v[layer].index_copy_(1, at, v.unsqueeze(1))
            scores = (self.k[layer] @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(self.dim)
            att = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
            ctx = (att.unsqueeze(-1) * self.v[layer]).sum(1)
            h = h + self.out[layer](ctx)
        self.idx.add_(1)
        return self.head(torch.tanh(h))


def make_models(seed: int = 0, **cfg) -> tuple[KVForecaster, FixedForecaster]:
    """The two forecasters with the same weights (``cfg``: dim, layers, max_len, batch)."""
    torch.manual_seed(seed)
    buggy = KVForecaster(**cfg)
    fixed = FixedForecaster(**cfg)
    fixed.load_state_dict(buggy.state_dict())
    return buggy, fixed


@torch.no_grad()
def generate(step, x0: torch.Tensor, steps: int) -> torch.Tensor:
    """Run ``step`` autoregressively from ``x0`` (batch, 1): the outputs as (batch, steps)."""
    out, x = [], x0
    for _ in range(steps):
        x = step(x)
        out.append(x)
    return torch.cat(out, dim=1)

"""Workloads shared by tests and benchmarks: each built from a seed, so eager is the oracle."""

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch import nn

import gt_core


def mlp(d_in=32, d_hidden=64, d_out=4):
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(x.flatten(1)))


class Block(nn.Module):
    """A pre-norm transformer block with a token embedding and an LM head."""

    def __init__(self, vocab=50, d=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, tokens):
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.ff(self.ln2(x))
        return self.head(x)


# The transformer block's training step (SGD momentum, a batch of 4 sequences of 12 tokens),
# as ``train`` takes it: make_model, make_opt, make_data, loss_fn.
TRANSFORMER = dict(
    make_model=Block,
    make_opt=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
    make_data=lambda: (torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12))),
    loss_fn=lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()),
)


def train(make_model, make_opt, make_data, loss_fn, steps, on_worker, seed=0, sync_every=0, **options):
    """Train from ``seed``; on the worker when ``on_worker``. Returns (model, losses)."""
    ctx = gt_core.capture(**options) if on_worker else contextlib.nullcontext()
    losses = []
    with ctx:
        torch.manual_seed(seed)
        model = make_model()
        opt = make_opt(model.parameters())
        x, y = make_data()
        for i in range(steps):
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sync_every and i % sync_every == 0:
                losses.append(loss.item())
        losses.append(loss.item())
    return model, losses

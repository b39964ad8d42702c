"""The workloads tests, benchmarks and ``gt_bench.bench`` share, each built from a seed.

Models: ``mlp`` (784→256→10 with ``mlp(784, 256, 10)``; 32→64→4 by default, the tests'
size) and ``Block``, a pre-norm transformer block with a token embedding and an LM head.
Steps: ``step_fn(batch, workload)`` builds one training step of ``"mlp"`` (SGD momentum),
``"transformer"`` (SGD momentum) or ``"mlp-adam"`` (Adam with a cosine LR schedule); ``train``
runs a step many times, eagerly or on the worker, so eager is the oracle of every comparison.
``fed(batch)`` is the MLP classifier trained from a DataLoader: a fresh batch every step.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import gt_core

__all__ = [
    "mlp",
    "Block",
    "TRANSFORMER",
    "WORKLOADS",
    "make",
    "make_opt",
    "step_fn",
    "train",
    "fed",
    "Fed",
]

WORKLOADS = ("mlp", "transformer", "mlp-adam")


def mlp(d_in: int = 32, d_hidden: int = 64, d_out: int = 4) -> nn.Module:
    """Linear, ReLU, Linear."""
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


class Block(nn.Module):
    """A pre-norm transformer block with a token embedding and an LM head."""

    def __init__(self, vocab: int = 50, d: int = 32, heads: int = 4):
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


def _token_loss(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


# The transformer block's training step (SGD momentum, a batch of 4 sequences of 12 tokens),
# as ``train`` takes it: make_model, make_opt, make_data, loss_fn.
TRANSFORMER = dict(
    make_model=Block,
    make_opt=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
    make_data=lambda: (torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12))),
    loss_fn=_token_loss,
)


def make(batch: int, workload: str = "mlp", device=None, seed: int = 0):
    """(model, x, y, loss function) of a workload, built from ``seed`` (on ``device`` if
    given). The MLP is 784→256→10 on random data; the transformer reads 12 tokens."""
    torch.manual_seed(seed)
    workload = workload.removesuffix("-adam")
    if workload == "transformer":
        model = Block()
        x, y = torch.randint(0, 50, (batch, 12)), torch.randint(0, 50, (batch, 12))
        loss = _token_loss
    else:
        model = mlp(784, 256, 10)
        x, y, loss = torch.randn(batch, 784), torch.randn(batch, 10), F.mse_loss
    if device is not None:
        model, x, y = model.to(device), x.to(device), y.to(device)
    return model, x, y, loss


def make_opt(model: nn.Module, workload: str = "mlp"):
    """(optimizer, LR scheduler or None): SGD with momentum; for 'mlp-adam', Adam with a
    cosine LR schedule (lifted scalars)."""
    if workload == "mlp-adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), None


def training_step(model: nn.Module, opt, loss_fn):
    """``step(x, y)``: forward, ``loss_fn``, backward, the optimizer's step, zero_grad; the
    loss."""

    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def step_fn(batch: int, workload: str = "mlp", device=None, seed: int = 0, args: bool = False):
    """One training step of a workload, returning the loss, built from ``seed``.

    ``step()`` trains on the workload's own batch; with ``args=True`` the step is
    ``step(x, y)`` and ``(step, x, y)`` is returned (what ``gt_core.jit`` replays by its
    arguments).
    """
    model, x, y, loss_fn = make(batch, workload, device, seed)
    opt, sched = make_opt(model, workload)
    train_on = training_step(model, opt, loss_fn)

    def step_on(x, y):
        loss = train_on(x, y)
        if sched is not None:
            sched.step()
        return loss

    if args:
        return step_on, x, y

    def step():
        return step_on(x, y)

    return step


def train(
    make_model, make_opt, make_data, loss_fn, steps, on_worker, seed=0, sync_every=0, **options
):
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


class Fed(NamedTuple):
    """A training loop fed by a DataLoader: ``step(x, y)`` trains on one batch; ``batches()``
    yields the loader's batches forever (epoch after epoch); ``params`` are what it trains."""

    step: object
    batches: object
    params: list
    loader: object


_host_data: dict = {}


def host_dataset(n: int, features: int = 784, classes: int = 10, seed: int = 0):
    """(X, Y): ``n`` random samples as host tensors, as a DataLoader reads them from files.

    Made outside any capture (and cached), so that inside one they stay plain tensors of this
    process, and every batch the loader makes from them is uploaded to the worker.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    key = (n, features, classes, seed)
    if key not in _host_data:
        with _disable_current_modes():
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(n, features, generator=g)
            y = torch.randint(0, classes, (n,), generator=g)
        _host_data[key] = (x, y)
    return _host_data[key]


class NumpyRows:
    """A map-style dataset of one's own, as most loops have: rows of numpy arrays made tensors
    in ``__getitem__`` (by ``make``: ``torch.from_numpy``, ``torch.tensor``), an int label
    (collated into an int64 tensor)."""

    def __init__(self, x, y, make=torch.from_numpy):
        self.x, self.y, self.make = x, y, make

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.make(self.x[i]), int(self.y[i])


def fed(
    batch: int = 64,
    n_batches: int = 50,
    seed: int = 0,
    device=None,
    resident: bool = False,
    rows: bool = False,
    **loader_options,
) -> Fed:
    """The MLP 784→256→10 with cross-entropy and SGD momentum, trained from a DataLoader over
    ``n_batches * batch`` host samples, shuffled by a generator seeded with ``seed``.

    ``resident``: the samples are copied first, inside a capture onto the worker (as data a
    notebook makes or loads in a ``%%gt`` cell lives there), so each batch is made there.
    ``rows``: the same samples as numpy rows of a dataset of one's own (NumpyRows), not a
    TensorDataset: the same batches, each made row by row.

    With ``device`` (eager on a GPU), the model is made there and the step moves each batch
    there as users write it: pinned by the loader, ``.to(device, non_blocking=True)``.
    """
    from torch.utils.data import DataLoader, TensorDataset

    if rows and resident:
        raise ValueError("fed: rows (host numpy rows) or resident (data on the worker), not both")
    x, y = host_dataset(n_batches * batch, seed=seed)
    if resident:  # (zeros is a factory: on the worker inside a capture; copy_ uploads once)
        x, y = (torch.zeros(t.shape, dtype=t.dtype).copy_(t) for t in (x, y))
    torch.manual_seed(seed)
    # (on a device, initialised there from its generator, as a worker on it initialises)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = mlp(784, 256, 10)
    if device is not None:
        loader_options.setdefault("pin_memory", torch.device(device).type == "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader_options.setdefault("shuffle", True)
    if loader_options["shuffle"]:
        loader_options.setdefault("generator", torch.Generator().manual_seed(seed))
    data = NumpyRows(x.numpy(), y.numpy()) if rows else TensorDataset(x, y)
    loader = DataLoader(data, batch_size=batch, **loader_options)

    def step(x, y):
        if device is not None:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def batches():
        while True:
            yield from loader

    return Fed(step, batches, list(model.parameters()), loader)

"""What every loop of the corpus is made of: the Loop, tiny sizes, host data as files give it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from gt_bench.zoo import LLAMA, TEXT

__all__ = [
    "Loop",
    "epochs",
    "rng",
    "shuffled",
    "tokens",
    "state_of",
    "no_decay_groups",
    "hf_model",
    "VOCAB",
    "SEQ",
    "BATCH",
    "IMAGE",
    "TEXT",
    "LLAMA",
]

SEQ, BATCH, IMAGE = 16, 8, 16
VOCAB = TEXT["vocab_size"]  # (the zoo's tiny text configs: TEXT, LLAMA)


@dataclass
class Loop:
    """One training loop: ``step(batch)`` is the user's Python for one iteration (it returns
    the loss); ``batches`` yields batches epoch after epoch; ``after(i, loss)`` is the
    loop's own work after iteration ``i`` (a schedule stepped per epoch); ``state`` lists the
    tensors training updates, compared with eager's."""

    name: str
    library: str
    idioms: str
    step: Callable
    batches: Iterator
    state: Callable[[], list]
    after: Callable | None = None
    i: int = 0

    def one(self, fn):
        loss = fn(next(self.batches))
        if self.after is not None:
            self.after(self.i, loss)
        self.i += 1
        return loss


def epochs(loader) -> Iterator:
    """The loader's batches, epoch after epoch (each epoch shuffled anew), without end."""
    while True:
        yield from loader


def rng(seed: int) -> np.random.Generator:
    """The host's random numbers for a loop's synthetic data (never torch's: the loops
    draw theirs from torch's generator as eager does)."""
    return np.random.default_rng(seed)


def shuffled(*arrays, seed: int, batch: int = BATCH) -> DataLoader:
    """A shuffling DataLoader over host arrays, as data read from disk arrives."""
    data = TensorDataset(*(torch.from_numpy(a) for a in arrays))
    g = torch.Generator().manual_seed(seed)
    return DataLoader(data, batch_size=batch, shuffle=True, generator=g, drop_last=True)


def tokens(seed: int, n: int = 64, seq: int = SEQ) -> np.ndarray:
    """``n`` rows of ``seq`` token ids (0 left out: the padding id)."""
    return rng(seed).integers(1, VOCAB, size=(n, seq), dtype=np.int64)


def state_of(*modules):
    """() -> the parameters and buffers of ``modules``: what training updates."""
    return lambda: [t for m in modules for t in (*m.parameters(), *m.buffers())]


def no_decay_groups(model, weight_decay: float) -> list[dict]:
    """transformers' Trainer's param groups: no weight decay on biases and norms."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (rest if name.endswith("bias") or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def hf_model(cls: str, config_cls: str, **config):
    """A ``transformers`` model ``cls`` from a tiny config (random weights from torch's
    seed), in training mode."""
    import transformers

    return getattr(transformers, cls)(getattr(transformers, config_cls)(**config)).train()

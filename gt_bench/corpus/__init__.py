"""Real training loops gt does not write itself: library models with the idioms people use.

Each loop is built from a library installed from the registry (``transformers``,
``diffusers``, ``peft``, ``torch_geometric``, ``lightning``) or from ``torch.nn``'s own
recurrent and transformer modules, made tiny (a CPU step of milliseconds) and fed synthetic
data through the same machinery a user's data goes through (a ``DataLoader``, a collator).
The idioms are the ones their tutorials and trainers use: dict batches, a schedule stepped
inside the step or outside it, gradient clipping, accumulation over micro-batches, autocast,
two models with two optimizers, a hidden state carried across batches, an EMA of the
weights, a plateau schedule fed the epoch's loss.

``build(name, seed)`` makes a :class:`Loop`; ``loop.one(fn)`` runs one iteration as the user's
loop does (the next batch, ``fn(batch)``, the loop's own work after it), where ``fn`` is
``loop.step`` itself, ``gt_core.jit(loop.step)`` or ``torch.compile(loop.step)``. Everything
is built inside whatever ``capture()`` is current, as a ``%%gt`` cell builds it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gt_bench.corpus import hf, libraries, torch_nn
from gt_bench.corpus.base import Loop

__all__ = ["Loop", "build", "names", "LIBRARIES"]

LOOPS: dict[str, Callable[[int], Loop]] = {
    "bert-classify": hf.bert_classify,
    "gpt2-accumulate": hf.gpt2_accumulate,
    "t5-adafactor": hf.t5_adafactor,
    "llama-autocast": hf.llama_autocast,
    "convnext-onecycle": hf.convnext_onecycle,
    "distilbert-qa": hf.distilbert_qa,
    "lstm-bptt": torch_nn.lstm_bptt,
    "gru-plateau": torch_nn.gru_plateau,
    "transformer-seq2seq": torch_nn.transformer_seq2seq,
    "encoder-clip-value": torch_nn.encoder_clip_value,
    "dcgan": torch_nn.dcgan,
    "diffusers-ddpm": libraries.diffusers_ddpm,
    "peft-lora": libraries.peft_lora,
    "pyg-gcn": libraries.pyg_gcn,
    "lightning-fabric": libraries.lightning_fabric,
}
LIBRARIES = ("transformers", "diffusers", "peft", "torch_geometric", "lightning")


def names() -> list[str]:
    return list(LOOPS)


def build(name: str, seed: int = 0) -> Loop:
    """The loop ``name``, its model, data and optimizer made from ``seed``."""
    if name not in LOOPS:
        raise ValueError(f"unknown loop {name!r}: expected one of {', '.join(LOOPS)}")
    torch.manual_seed(seed)
    return LOOPS[name](seed)

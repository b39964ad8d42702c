"""Library models as users bring them: ``transformers`` models from tiny random configs.

Nothing is downloaded: every model is built from a config small enough to train on a CPU in
milliseconds a step, with random weights from the seed. Each entry of ``ZOO`` makes a
:class:`Zoo`: the model, its optimizer (as people create them: default arguments), the batch
and the step, so that eager, ``%%gt``, ``gt_core.jit`` and ``torch.compile`` all run the same
function and eager is the oracle of every comparison. ``transformers`` is an optional
dependency (the ``models`` extra): importing this module does not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["Zoo", "ZOO", "build", "names"]

_VOCAB, _SEQ, _BATCH = 64, 16, 4


class Zoo(NamedTuple):
    """One model of the zoo, ready to step.

    ``step(*batch)`` runs one call (a training step returns its loss; an inference step its
    output) and ``state`` lists what the step updates in place (compared with eager's).
    ``train`` says whether ``step`` trains (a backward and an optimizer step).
    """

    name: str
    model: torch.nn.Module
    step: Callable
    batch: tuple
    state: list
    train: bool


def _lm_batch(g):
    ids = torch.randint(0, _VOCAB, (_BATCH, _SEQ), generator=g)
    return ids, ids.clone()


def _text(cls_name: str, config_name: str, **config):
    def model():
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return getattr(transformers, cls_name)(cfg)

    return model


_TEXT = dict(vocab_size=_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
_BUILDERS: dict[str, tuple] = {
    # name: (make the model, make the batch from a generator, optimizer, {options})
    "bert": (
        _text("BertForMaskedLM", "BertConfig", intermediate_size=64, **_TEXT),
        _lm_batch,
        "sgd",
        {},
    ),
    "llama": (
        _text(
            "LlamaForCausalLM",
            "LlamaConfig",
            intermediate_size=64,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **_TEXT,
        ),
        _lm_batch,
        "sgd",
        {},
    ),
}


def names() -> list[str]:
    return list(_BUILDERS)


def build(name: str, seed: int = 0, optimizer: str | None = None) -> Zoo:
    """The model ``name`` built from ``seed``, with its optimizer and a fixed batch."""
    make_model, make_batch, opt_name, _ = _BUILDERS[name]
    torch.manual_seed(seed)
    model = make_model()
    model.train()
    g = torch.Generator().manual_seed(seed)
    batch = make_batch(g)
    opt = _optimizer(optimizer or opt_name, model)

    def step(x, labels):
        loss = model(input_ids=x, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return Zoo(name, model, step, batch, list(model.parameters()), True)


def _optimizer(name: str, model):
    params = model.parameters()
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}")


ZOO = _BUILDERS

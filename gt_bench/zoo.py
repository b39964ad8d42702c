"""Library models as users bring them: ``transformers`` models from tiny random configs.

Nothing is downloaded: every model is built from a config small enough to train on a CPU in
milliseconds a step, with random weights from the seed. ``build(name)`` makes a :class:`Zoo`:
the model, its optimizer (as people create them: default arguments), a fixed batch, the
training step and an inference forward, so that eager, ``%%gt``, ``gt_core.jit`` and
``torch.compile`` all run the same function and eager is the oracle of every comparison.
``transformers`` is an optional dependency (the ``models`` extra): importing this module does
not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["Zoo", "Decoder", "build", "decoder", "names", "OPTIMIZERS", "TEXT", "LLAMA"]

_VOCAB, _SEQ, _BATCH, _IMAGE, _LABELS = 64, 16, 4, 32, 10


class Zoo(NamedTuple):
    """One model of the zoo, ready to step.

    ``step(x, labels)`` trains one step and returns the loss; ``infer(x)`` is the model's
    forward under ``torch.no_grad()``, returning its logits (put the model in eval mode
    first). ``state`` lists what training updates in place (compared with eager's).
    """

    name: str
    model: torch.nn.Module
    step: Callable
    infer: Callable
    batch: tuple
    state: list
    optimizer: torch.optim.Optimizer
    scheduler: object


def _text(g):
    ids = torch.randint(0, _VOCAB, (_BATCH, _SEQ), generator=g)
    return ids, ids.clone()


def _image(g):
    pixels = torch.randn(_BATCH, 3, _IMAGE, _IMAGE, generator=g)
    return pixels, torch.randint(0, _LABELS, (_BATCH,), generator=g)


# The tiny text configs, the zoo's and the corpus's (gt_bench.corpus): a Llama adds
# grouped-query attention and rotary embeddings to the shared sizes.
TEXT = dict(vocab_size=_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
LLAMA = dict(intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64, **TEXT)
_VISION = dict(num_labels=_LABELS)
# name: (model class, config class, config, batch maker, input name, train-mode modules)
_MODELS: dict[str, tuple] = {
    # an encoder with dropout on (p=0.1 in training), tied input and output embeddings
    "bert": ("BertForMaskedLM", "BertConfig", dict(intermediate_size=64, **TEXT), _text),
    # a decoder: RMSNorm, rotary embeddings, grouped-query attention, a cache made per call
    "llama": (
        "LlamaForCausalLM",
        "LlamaConfig",
        LLAMA,
        _text,
    ),
    # GPT-2: tied embeddings, Conv1D layers, dropout on
    "gpt2": (
        "GPT2LMHeadModel",
        "GPT2Config",
        dict(
            vocab_size=_VOCAB,
            n_positions=_SEQ * 2,
            n_embd=32,
            n_layer=2,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
        ),
        _text,
    ),
    # an encoder-decoder (relative position buckets, the decoder's input shifted right)
    "t5": (
        "T5ForConditionalGeneration",
        "T5Config",
        dict(
            vocab_size=_VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),  # fmt: skip
        _text,
    ),
    "vit": (
        "ViTForImageClassification",
        "ViTConfig",
        dict(
            image_size=_IMAGE,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            **_VISION,
        ),  # fmt: skip
        _image,
    ),
    # BatchNorm in train mode (running statistics updated in place every step)
    "resnet": (
        "ResNetForImageClassification",
        "ResNetConfig",
        dict(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", **_VISION
        ),
        _image,
    ),
}
# The same ResNet fine-tuned with BatchNorm in eval mode (running statistics frozen).
_FROZEN_BN = {"resnet-frozen-bn": "resnet"}

OPTIMIZERS = ("sgd", "adamw", "adam", "rmsprop")


def names() -> list[str]:
    return [*_MODELS, *_FROZEN_BN]


def build(name: str, seed: int = 0, optimizer: str = "sgd", scheduler: bool | str = False) -> Zoo:
    """The model ``name`` built from ``seed``, its optimizer (``OPTIMIZERS``, default
    arguments but the learning rate; with ``scheduler``, an LR scheduler the caller steps
    outside the training step: ``"step"`` (or True) a StepLR, ``"lambda"`` a LambdaLR and
    ``"onecycle"`` a OneCycleLR, both changing the lr every step) and a fixed batch from
    the same seed."""
    import transformers

    base = _FROZEN_BN.get(name, name)
    if base not in _MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {', '.join(names())}")
    model_cls, config_cls, config, make_batch = _MODELS[base]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))
    model.train()
    if name in _FROZEN_BN:
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.eval()
    batch = _batch(make_batch, seed)
    key = "pixel_values" if make_batch is _image else "input_ids"
    opt = _optimizer(optimizer, model)
    sched = _scheduler(scheduler, opt)

    def step(x, labels):
        loss = model(**{key: x}, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def infer(x):
        with torch.no_grad():
            if base == "t5":
                return model(input_ids=x, decoder_input_ids=x).logits
            return model(**{key: x}).logits

    state = [*model.parameters(), *model.buffers()]
    return Zoo(name, model, step, infer, batch, state, opt, sched)


def _batch(make_batch, seed: int) -> tuple:
    """The fixed batch, drawn on the CPU from ``seed`` whatever the default device (eager on a
    GPU builds the model under ``torch.device("cuda")``: the same batch goes there)."""
    device = torch.get_default_device()
    if device.type == "cpu":
        return make_batch(torch.Generator().manual_seed(seed))
    with torch.device("cpu"):
        batch = make_batch(torch.Generator().manual_seed(seed))
    return tuple(t.to(device) for t in batch)


class Decoder(NamedTuple):
    """A Llama generating greedily with a static KV cache, under ``torch.no_grad()``.

    ``prefill()`` runs the prompt through the model (filling the cache) and returns the first
    token; each ``step(token)`` then feeds one token at the cache's next position and returns
    the next token and the step's logits. The position lives in the cache as a tensor
    (``cumulative_length``, advanced in place), so every step is the same work.
    """

    model: torch.nn.Module
    cache: object
    prompt: torch.Tensor
    prefill: Callable
    step: Callable


_PROMPT, _CACHE_LEN = 4, 32


def decoder(seed: int = 0) -> Decoder:
    """The Llama of ``build("llama")`` (from ``seed``, eval mode) with a static cache of
    ``_CACHE_LEN`` positions and a prompt of ``_PROMPT`` tokens."""
    import transformers

    _, config_cls, config, _ = _MODELS["llama"]
    config = getattr(transformers, config_cls)(**config)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=_CACHE_LEN)
    (prompt,) = _batch(lambda g: (torch.randint(0, _VOCAB, (1, _PROMPT), generator=g),), seed)

    def prefill():
        with torch.no_grad():
            logits = model(input_ids=prompt, cache=cache, use_cache=True).logits
        return logits[:, -1:].argmax(-1)

    def step(token):
        with torch.no_grad():
            logits = model(input_ids=token, cache=cache, use_cache=True).logits
        return logits[:, -1:].argmax(-1), logits

    return Decoder(model, cache, prompt, prefill, step)


def _scheduler(kind: bool | str, opt):
    lrs = torch.optim.lr_scheduler
    if not kind:
        return None
    if kind is True or kind == "step":
        return lrs.StepLR(opt, step_size=5, gamma=0.9)
    if kind == "lambda":
        return lrs.LambdaLR(opt, lambda i: 1.0 / (1.0 + 0.1 * i))
    if kind == "onecycle":  # (the lr rises then falls; SGD's momentum and Adam's beta1 cycle)
        return lrs.OneCycleLR(opt, max_lr=10 * opt.param_groups[0]["lr"], total_steps=100)
    raise ValueError(f"unknown scheduler {kind!r}: expected step, lambda or onecycle")


def _optimizer(name: str, model):
    params = model.parameters()
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")

"""The corpus's transformers loops: models from tiny random configs, their own losses."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from gt_bench.corpus.base import (
    BATCH,
    IMAGE,
    LLAMA,
    SEQ,
    TEXT,
    VOCAB,
    Loop,
    epochs,
    hf_model,
    no_decay_groups,
    rng,
    shuffled,
    state_of,
    tokens,
)


def bert_classify(seed: int) -> Loop:
    """The Trainer's step: dict batches from its collator, the model's own loss, AdamW with
    no decay on biases and norms, clipping, a warmup schedule stepped inside the step."""
    import transformers

    model = hf_model(
        "BertForSequenceClassification", "BertConfig", num_labels=3, intermediate_size=64, **TEXT
    )
    ids, r = tokens(seed), rng(seed + 1)
    rows = [
        {
            "input_ids": list(x),
            "attention_mask": [1] * (SEQ - k) + [0] * k,
            "label": int(r.integers(3)),
        }
        for x, k in zip(ids, r.integers(0, 6, len(ids)), strict=True)
    ]
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        rows,
        batch_size=BATCH,
        shuffle=True,
        generator=g,
        collate_fn=transformers.default_data_collator,
    )
    opt = torch.optim.AdamW(no_decay_groups(model, 0.01), lr=5e-4)
    sched = transformers.get_linear_schedule_with_warmup(opt, 10, 1000)

    def step(batch):
        loss = model(**batch).loss
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.zero_grad()
        return loss.detach()

    return Loop(
        "bert-classify",
        "transformers",
        "dict batches, Trainer's step, warmup inside",
        step,
        epochs(loader),
        state_of(model),
    )


def gpt2_accumulate(seed: int) -> Loop:
    """A causal LM's own shifted loss, two micro-batches accumulated per step, a cosine
    schedule stepped by the loop."""
    import transformers

    model = hf_model(
        "GPT2LMHeadModel",
        "GPT2Config",
        vocab_size=VOCAB,
        n_positions=SEQ * 2,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    loader = shuffled(tokens(seed), seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = transformers.get_cosine_schedule_with_warmup(opt, 5, 500)

    def step(batch):
        (ids,) = batch
        total = 0.0
        for micro in ids.chunk(2):
            loss = model(input_ids=micro, labels=micro).loss / 2
            loss.backward()
            total = total + loss.detach()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return Loop(
        "gpt2-accumulate",
        "transformers",
        "accumulation 2, clipping, cosine outside",
        step,
        epochs(loader),
        state_of(model),
        after=lambda i, _: sched.step(),
    )


def t5_adafactor(seed: int) -> Loop:
    """A seq2seq model's own loss and transformers' Adafactor (its step count a Python int
    in the optimizer's state, its second moments factored)."""
    import transformers

    model = hf_model(
        "T5ForConditionalGeneration",
        "T5Config",
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    loader = shuffled(tokens(seed), tokens(seed + 1, seq=8), seed=seed)
    opt = transformers.Adafactor(
        model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False
    )

    def step(batch):
        src, tgt = batch
        loss = model(input_ids=src, labels=tgt).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return Loop(
        "t5-adafactor",
        "transformers",
        "seq2seq labels, Adafactor",
        step,
        epochs(loader),
        state_of(model),
    )


def llama_autocast(seed: int) -> Loop:
    """A Llama under bfloat16 autocast on the CPU, AdamW with fused=False defaults."""
    model = hf_model("LlamaForCausalLM", "LlamaConfig", **LLAMA)
    loader = shuffled(tokens(seed), seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch):
        (ids,) = batch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return Loop(
        "llama-autocast", "transformers", "bfloat16 autocast", step, epochs(loader), state_of(model)
    )


def convnext_onecycle(seed: int) -> Loop:
    """An image classifier's logits with a label-smoothed loss of the user's, SGD with
    Nesterov momentum, a OneCycleLR stepped by the loop."""
    model = hf_model(
        "ConvNextForImageClassification",
        "ConvNextConfig",
        num_labels=10,
        num_channels=3,
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        image_size=IMAGE,
    )
    r = rng(seed)
    images = r.standard_normal((64, 3, IMAGE, IMAGE), dtype=np.float32)
    loader = shuffled(images, r.integers(0, 10, 64), seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=2000)

    def step(batch):
        x, y = batch
        loss = F.cross_entropy(model(pixel_values=x).logits, y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return Loop(
        "convnext-onecycle",
        "transformers",
        "label smoothing, nesterov, OneCycleLR",
        step,
        epochs(loader),
        state_of(model),
        after=lambda i, _: sched.step(),
    )


def distilbert_qa(seed: int) -> Loop:
    """Extractive question answering: the model's start/end loss, RMSprop."""
    model = hf_model(
        "DistilBertForQuestionAnswering",
        "DistilBertConfig",
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=64,
    )
    r = rng(seed)
    loader = shuffled(tokens(seed), r.integers(0, SEQ, 64), r.integers(0, SEQ, 64), seed=seed)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)

    def step(batch):
        ids, start, end = batch
        loss = model(input_ids=ids, start_positions=start, end_positions=end).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return Loop(
        "distilbert-qa",
        "transformers",
        "start/end positions, RMSprop",
        step,
        epochs(loader),
        state_of(model),
    )

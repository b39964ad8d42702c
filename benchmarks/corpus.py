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

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["Loop", "build", "names", "LIBRARIES"]

VOCAB, SEQ, BATCH, IMAGE = 64, 16, 8, 16


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


def _epochs(loader) -> Iterator:
    while True:
        yield from loader


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _loader(*arrays, seed: int, batch: int = BATCH, collate=None) -> DataLoader:
    """A shuffling DataLoader over host arrays, as data read from disk arrives."""
    data = TensorDataset(*(torch.from_numpy(a) for a in arrays))
    g = torch.Generator().manual_seed(seed)
    return DataLoader(data, batch_size=batch, shuffle=True, generator=g, drop_last=True)


def _tokens(seed: int, n: int = 64, seq: int = SEQ) -> np.ndarray:
    return _rng(seed).integers(1, VOCAB, size=(n, seq), dtype=np.int64)


def _state(*modules):
    return lambda: [t for m in modules for t in (*m.parameters(), *m.buffers())]


def _no_decay_groups(model, weight_decay: float) -> list[dict]:
    """transformers' Trainer's param groups: no weight decay on biases and norms."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (rest if name.endswith("bias") or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


# -- transformers ---------------------------------------------------------------------------
def _hf(cls: str, config_cls: str, **config):
    import transformers

    return getattr(transformers, cls)(getattr(transformers, config_cls)(**config)).train()


_TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)


def bert_classify(seed: int) -> Loop:
    """The Trainer's step: dict batches from its collator, the model's own loss, AdamW with
    no decay on biases and norms, clipping, a warmup schedule stepped inside the step."""
    import transformers

    model = _hf(
        "BertForSequenceClassification", "BertConfig", num_labels=3, intermediate_size=64, **_TEXT
    )
    ids, r = _tokens(seed), _rng(seed + 1)
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
    opt = torch.optim.AdamW(_no_decay_groups(model, 0.01), lr=5e-4)
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
        _epochs(loader),
        _state(model),
    )


def gpt2_accumulate(seed: int) -> Loop:
    """A causal LM's own shifted loss, two micro-batches accumulated per step, a cosine
    schedule stepped by the loop."""
    import transformers

    model = _hf(
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
    (loader,) = (_loader(_tokens(seed), seed=seed, batch=2 * BATCH // 2),)
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
        _epochs(loader),
        _state(model),
        after=lambda i, _: sched.step(),
    )


def t5_adafactor(seed: int) -> Loop:
    """A seq2seq model's own loss and transformers' Adafactor (its step count a Python int
    in the optimizer's state, its second moments factored)."""
    import transformers

    model = _hf(
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
    loader = _loader(_tokens(seed), _tokens(seed + 1, seq=8), seed=seed)
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
        _epochs(loader),
        _state(model),
    )


def llama_autocast(seed: int) -> Loop:
    """A Llama under bfloat16 autocast on the CPU, AdamW with fused=False defaults."""
    model = _hf(
        "LlamaForCausalLM",
        "LlamaConfig",
        intermediate_size=64,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **_TEXT,
    )
    loader = _loader(_tokens(seed), seed=seed)
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
        "llama-autocast", "transformers", "bfloat16 autocast", step, _epochs(loader), _state(model)
    )


def convnext_onecycle(seed: int) -> Loop:
    """An image classifier's logits with a label-smoothed loss of the user's, SGD with
    Nesterov momentum, a OneCycleLR stepped by the loop."""
    model = _hf(
        "ConvNextForImageClassification",
        "ConvNextConfig",
        num_labels=10,
        num_channels=3,
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        image_size=IMAGE,
    )
    r = _rng(seed)
    images = r.standard_normal((64, 3, IMAGE, IMAGE), dtype=np.float32)
    loader = _loader(images, r.integers(0, 10, 64), seed=seed)
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
        _epochs(loader),
        _state(model),
        after=lambda i, _: sched.step(),
    )


def distilbert_qa(seed: int) -> Loop:
    """Extractive question answering: the model's start/end loss, RMSprop."""
    model = _hf(
        "DistilBertForQuestionAnswering",
        "DistilBertConfig",
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=64,
    )
    r = _rng(seed)
    loader = _loader(_tokens(seed), r.integers(0, SEQ, 64), r.integers(0, SEQ, 64), seed=seed)
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
        _epochs(loader),
        _state(model),
    )


# -- torch.nn's recurrent and transformer modules -------------------------------------------
class _WordLM(nn.Module):
    """pytorch/examples' word language model: embedding, a 2-layer LSTM, a decoder."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.rnn = nn.LSTM(hidden, hidden, num_layers=2, dropout=0.2)
        self.drop = nn.Dropout(0.2)
        self.decoder = nn.Linear(hidden, VOCAB)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.embed(x)), hidden)
        return self.decoder(self.drop(out)), hidden


def lstm_bptt(seed: int) -> Loop:
    """Truncated backprop through time: the hidden state detached and carried from batch to
    batch, clipping, the update written by hand with an lr the loop anneals per epoch."""
    model = _WordLM().train()
    stream = torch.from_numpy(_rng(seed).integers(0, VOCAB, size=(8 * SEQ * 16 + 1,)))
    cols = stream[:-1].view(-1, 8)  # (time, batch)
    hidden = [(torch.zeros(2, 8, 32), torch.zeros(2, 8, 32))]
    lr = [2.0]
    bptt = SEQ

    def batches():
        while True:
            for i in range(0, cols.size(0) - 1 - bptt, bptt):
                yield cols[i : i + bptt], cols[i + 1 : i + 1 + bptt]

    def step(batch):
        x, y = batch
        h = tuple(t.detach() for t in hidden[0])
        out, h = model(x, h)
        loss = F.cross_entropy(out.view(-1, VOCAB), y.reshape(-1))
        model.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr[0])
        hidden[0] = h
        return loss.detach()

    per_epoch = (cols.size(0) - 1 - bptt) // bptt

    def after(i, _):
        if (i + 1) % per_epoch == 0:
            lr[0] /= 4.0

    return Loop(
        "lstm-bptt",
        "torch.nn",
        "hidden carried, clipping, manual SGD, lr annealed",
        step,
        batches(),
        _state(model),
        after=after,
    )


def gru_plateau(seed: int) -> Loop:
    """A bidirectional GRU classifier, Adam, ReduceLROnPlateau fed each epoch's mean loss."""
    emb, rnn, head = (
        nn.Embedding(VOCAB, 32),
        nn.GRU(32, 32, batch_first=True, bidirectional=True),
        nn.Linear(64, 4),
    )
    model = nn.ModuleDict(dict(emb=emb, rnn=rnn, head=head)).train()
    loader = _loader(_tokens(seed), _rng(seed).integers(0, 4, 64), seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    seen = []

    def step(batch):
        x, y = batch
        out, _ = rnn(emb(x))
        loss = F.cross_entropy(head(out.mean(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def after(i, loss):
        seen.append(loss)
        if (i + 1) % len(loader) == 0:
            plateau.step(torch.stack(seen).mean().item())
            seen.clear()

    return Loop(
        "gru-plateau",
        "torch.nn",
        "bidirectional GRU, ReduceLROnPlateau per epoch",
        step,
        _epochs(loader),
        _state(model),
        after=after,
    )


def transformer_seq2seq(seed: int) -> Loop:
    """nn.Transformer with a causal mask and padding masks, a label-smoothed loss that
    ignores padding, Adam with the paper's betas and a Noam warmup stepped by the loop."""
    d = 32
    model = nn.ModuleDict(
        dict(
            src=nn.Embedding(VOCAB, d),
            tgt=nn.Embedding(VOCAB, d),
            out=nn.Linear(d, VOCAB),
            t=nn.Transformer(d, 4, 2, 2, 64, dropout=0.1, batch_first=True),
        )
    ).train()
    src, tgt = _tokens(seed), _tokens(seed + 1, seq=SEQ + 1)
    tgt[:, -3:] = 0  # padding
    loader = _loader(src, tgt, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    noam = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: d**-0.5 * min((s + 1) ** -0.5, (s + 1) * 20**-1.5)
    )
    causal = nn.Transformer.generate_square_subsequent_mask(SEQ)

    def step(batch):
        s, t = batch
        t_in, t_out = t[:, :-1], t[:, 1:]
        h = model["t"](
            model["src"](s),
            model["tgt"](t_in),
            tgt_mask=causal,
            tgt_key_padding_mask=t_in == 0,
            tgt_is_causal=True,
        )
        logits = model["out"](h)
        loss = F.cross_entropy(
            logits.reshape(-1, VOCAB), t_out.reshape(-1), ignore_index=0, label_smoothing=0.1
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return Loop(
        "transformer-seq2seq",
        "torch.nn",
        "masks, ignore_index, Noam LambdaLR outside",
        step,
        _epochs(loader),
        _state(model),
        after=lambda i, _: noam.step(),
    )


def encoder_clip_value(seed: int) -> Loop:
    """A pre-norm TransformerEncoder classifier (mean-pooled), SGD, clip_grad_value_."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
    model = nn.ModuleDict(
        dict(
            emb=nn.Embedding(VOCAB, 32),
            head=nn.Linear(32, 5),
            enc=nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
        )
    ).train()
    loader = _loader(_tokens(seed), _rng(seed).integers(0, 5, 64), seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    def step(batch):
        x, y = batch
        loss = F.cross_entropy(model["head"](model["enc"](model["emb"](x)).mean(1)), y)
        loss.backward()
        nn.utils.clip_grad_value_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return Loop(
        "encoder-clip-value",
        "torch.nn",
        "pre-norm encoder, clip_grad_value_, SGD wd",
        step,
        _epochs(loader),
        _state(model),
    )


def dcgan(seed: int) -> Loop:
    """pytorch/examples' DCGAN step: a discriminator and a generator with BatchNorm, two
    Adam optimizers, the fake batch detached for the discriminator's step."""
    z = 16
    gen = nn.Sequential(
        nn.ConvTranspose2d(z, 32, 4, 1, 0, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(True),
        nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(True),
        nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False),
        nn.Tanh(),
    ).train()
    disc = nn.Sequential(
        nn.Conv2d(3, 16, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, True),
        nn.Conv2d(16, 32, 4, 2, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.LeakyReLU(0.2, True),
        nn.Conv2d(32, 1, 4, 1, 0, bias=False),
        nn.Sigmoid(),
    ).train()
    images = _rng(seed).uniform(-1, 1, (64, 3, IMAGE, IMAGE)).astype(np.float32)
    loader = _loader(images, seed=seed)
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCELoss()

    def step(batch):
        (real,) = batch
        n = real.size(0)
        ones, zeros = torch.full((n,), 1.0), torch.full((n,), 0.0)
        disc.zero_grad()
        err_real = bce(disc(real).view(-1), ones)
        err_real.backward()
        fake = gen(torch.randn(n, z, 1, 1))
        err_fake = bce(disc(fake.detach()).view(-1), zeros)
        err_fake.backward()
        opt_d.step()
        gen.zero_grad()
        err_g = bce(disc(fake).view(-1), ones)
        err_g.backward()
        opt_g.step()
        return (err_real + err_fake + err_g).detach()

    return Loop(
        "dcgan",
        "torch.nn",
        "two models, two Adams, BatchNorm, noise per step",
        step,
        _epochs(loader),
        _state(gen, disc),
    )


# -- other libraries of the field -----------------------------------------------------------
def diffusers_ddpm(seed: int) -> Loop:
    """diffusers' unconditional training step: noise and timesteps drawn per step, the
    scheduler's add_noise, the UNet's noise prediction, AdamW and an EMA of the weights."""
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.training_utils import EMAModel

    unet = UNet2DModel(
        sample_size=IMAGE,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    ).train()
    noise_sched = DDPMScheduler(num_train_timesteps=100)
    images = _rng(seed).uniform(-1, 1, (64, 3, IMAGE, IMAGE)).astype(np.float32)
    loader = _loader(images, seed=seed)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    ema = EMAModel(unet.parameters(), decay=0.999)

    def step(batch):
        (clean,) = batch
        noise = torch.randn_like(clean)
        t = torch.randint(0, 100, (clean.size(0),))
        pred = unet(noise_sched.add_noise(clean, noise, t), t).sample
        loss = F.mse_loss(pred, noise)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ema.step(unet.parameters())
        return loss.detach()

    return Loop(
        "diffusers-ddpm",
        "diffusers",
        "noise and timesteps per step, EMA",
        step,
        _epochs(loader),
        _state(unet),
    )


def peft_lora(seed: int) -> Loop:
    """peft's LoRA on a Llama's attention projections: only the adapters train."""
    import peft
    import transformers

    base = _hf(
        "LlamaForCausalLM",
        "LlamaConfig",
        intermediate_size=64,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **_TEXT,
    )
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.05)
    model = peft.get_peft_model(base, cfg).train()
    loader = _loader(_tokens(seed), seed=seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sched = transformers.get_linear_schedule_with_warmup(opt, 5, 500)

    def step(batch):
        (ids,) = batch
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss.detach()

    return Loop(
        "peft-lora",
        "peft",
        "LoRA adapters only, schedule inside",
        step,
        _epochs(loader),
        lambda: params,
    )


def pyg_gcn(seed: int) -> Loop:
    """torch_geometric's node classification tutorial: a two-layer GCN over one graph (its
    normalisation scattered over the edges every step), dropout, Adam with weight decay."""
    from torch_geometric.nn import GCNConv

    r, nodes = _rng(seed), 200
    edges = torch.from_numpy(r.integers(0, nodes, (2, 800)))
    x = torch.from_numpy(r.standard_normal((nodes, 16), dtype=np.float32))
    y = torch.from_numpy(r.integers(0, 4, nodes))
    mask = torch.from_numpy(r.random(nodes) < 0.5)

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = GCNConv(16, 32), GCNConv(32, 4)

        def forward(self, x, edges):
            h = F.dropout(F.relu(self.conv1(x, edges)), p=0.5, training=self.training)
            return self.conv2(h, edges)

    model = GCN().train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def step(batch):
        x, edges, y, mask = batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x, edges)[mask], y[mask])
        loss.backward()
        opt.step()
        return loss.detach()

    return Loop(
        "pyg-gcn",
        "torch_geometric",
        "full-graph GCN, boolean mask, Adam wd",
        step,
        itertools.repeat((x, edges, y, mask)),
        _state(model),
    )


def lightning_fabric(seed: int) -> Loop:
    """lightning's Fabric loop over lightning's demo Transformer: fabric.setup wraps the
    model and optimizer, fabric.backward runs backward."""
    import lightning
    from lightning.pytorch.demos import Transformer

    fabric = lightning.Fabric(accelerator="cpu", devices=1)
    model = Transformer(vocab_size=VOCAB, ninp=32, nhead=4, nhid=64, nlayers=2, dropout=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(
        _loader(_tokens(seed, seq=SEQ + 1), seed=seed), move_to_device=False
    )

    def step(batch):
        (ids,) = batch
        x, y = ids[:, :-1], ids[:, 1:]
        out = model(x, y)
        loss = F.nll_loss(out, y.reshape(-1))
        opt.zero_grad()
        fabric.backward(loss)
        fabric.clip_gradients(model, opt, max_norm=0.5)
        opt.step()
        return loss.detach()

    return Loop(
        "lightning-fabric",
        "lightning",
        "Fabric's setup, backward, clip_gradients",
        step,
        _epochs(loader),
        _state(model),
    )


LOOPS: dict[str, Callable[[int], Loop]] = {
    "bert-classify": bert_classify,
    "gpt2-accumulate": gpt2_accumulate,
    "t5-adafactor": t5_adafactor,
    "llama-autocast": llama_autocast,
    "convnext-onecycle": convnext_onecycle,
    "distilbert-qa": distilbert_qa,
    "lstm-bptt": lstm_bptt,
    "gru-plateau": gru_plateau,
    "transformer-seq2seq": transformer_seq2seq,
    "encoder-clip-value": encoder_clip_value,
    "dcgan": dcgan,
    "diffusers-ddpm": diffusers_ddpm,
    "peft-lora": peft_lora,
    "pyg-gcn": pyg_gcn,
    "lightning-fabric": lightning_fabric,
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

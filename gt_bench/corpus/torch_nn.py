"""The corpus's loops over torch.nn's recurrent and transformer modules (and a DCGAN)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gt_bench.corpus.base import (
    IMAGE,
    SEQ,
    VOCAB,
    Loop,
    epochs,
    rng,
    shuffled,
    state_of,
    tokens,
)


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
    stream = torch.from_numpy(rng(seed).integers(0, VOCAB, size=(8 * SEQ * 16 + 1,)))
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
        state_of(model),
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
    loader = shuffled(tokens(seed), rng(seed).integers(0, 4, 64), seed=seed)
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
        epochs(loader),
        state_of(model),
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
    src, tgt = tokens(seed), tokens(seed + 1, seq=SEQ + 1)
    tgt[:, -3:] = 0  # padding
    loader = shuffled(src, tgt, seed=seed)
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
        epochs(loader),
        state_of(model),
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
    loader = shuffled(tokens(seed), rng(seed).integers(0, 5, 64), seed=seed)
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
        epochs(loader),
        state_of(model),
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
    images = rng(seed).uniform(-1, 1, (64, 3, IMAGE, IMAGE)).astype(np.float32)
    loader = shuffled(images, seed=seed)
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
        epochs(loader),
        state_of(gen, disc),
    )

"""The corpus's loops from other libraries of the field: diffusers, peft, torch_geometric, lightning."""

from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gt_bench.corpus.base import (
    IMAGE,
    LLAMA,
    SEQ,
    VOCAB,
    Loop,
    epochs,
    hf_model,
    rng,
    shuffled,
    state_of,
    tokens,
)


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
    images = rng(seed).uniform(-1, 1, (64, 3, IMAGE, IMAGE)).astype(np.float32)
    loader = shuffled(images, seed=seed)
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
        epochs(loader),
        state_of(unet),
    )


def peft_lora(seed: int) -> Loop:
    """peft's LoRA on a Llama's attention projections: only the adapters train."""
    import peft
    import transformers

    base = hf_model("LlamaForCausalLM", "LlamaConfig", **LLAMA)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.05)
    model = peft.get_peft_model(base, cfg).train()
    loader = shuffled(tokens(seed), seed=seed)
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
        epochs(loader),
        lambda: params,
    )


def pyg_gcn(seed: int) -> Loop:
    """torch_geometric's node classification tutorial: a two-layer GCN over one graph (its
    normalisation scattered over the edges every step), dropout, Adam with weight decay."""
    from torch_geometric.nn import GCNConv

    r, nodes = rng(seed), 200
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
        state_of(model),
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
        shuffled(tokens(seed, seq=SEQ + 1), seed=seed), move_to_device=False
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
        epochs(loader),
        state_of(model),
    )

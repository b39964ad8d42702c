"""A LoopSpec written as the Python a user would write (see tests/idioms.py).

``write(spec, way)`` is the whole program: imports, the helpers the loop uses, the host data
a DataLoader reads, the model, optimizer(s), scheduler(s), the step and the loop. The way
decides two lines only: ``with gt_core.capture():`` (not in eager) and ``@gt_core.jit``
(only in jit), so the three ways run the same loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["write", "BATCH", "BATCHES_PER_EPOCH", "HF_SCHEDULES", "MANUAL"]

BATCH, FEATURES, CLASSES, VOCAB, SEQ, HIDDEN = 8, 16, 4, 32, 12, 32
BATCHES_PER_EPOCH = 4
HF_SCHEDULES = ("get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup")
MANUAL = ("manual-lr", "manual-lr-wd")  # the lr (and weight decay) written into each group


def write(spec, way: str) -> str:
    """``spec``'s program for ``way`` (eager: no capture and no jit; gt: no jit)."""
    return _Writer(spec, way).write()


class _Code:
    """Lines of Python with an indentation level."""

    def __init__(self):
        self.lines: list[str] = []
        self.level = 0

    def __call__(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(("    " * self.level + line) if line else "")

    def block(self, header: str | None):
        """Indent what follows under ``header`` (None: no header, no indent)."""
        code = self

        class _Block:
            def __enter__(self):
                if header is not None:
                    code(header)
                    code.level += 1

            def __exit__(self, *exc):
                if header is not None:
                    code.level -= 1

        return _Block()


def _kwargs(args) -> str:
    """Keyword arguments as written (a tuple, kept hashable in the spec, as a list)."""
    return ", ".join(f"{k}={list(v) if type(v) is tuple else v!r}" for k, v in args)


@dataclass
class _Writer:
    """Writes a LoopSpec's program for one way."""

    spec: object  # a LoopSpec
    way: str
    code: _Code = field(default_factory=_Code)

    # names as the step sees them (inside) and as the loop does (outside)
    def _names(self, inside: bool) -> dict:
        loc = self.spec.location
        if loc == "trainer":
            own = "self" if inside else "trainer"
            return dict(model=f"{own}.model", opt=f"{own}.opt", sched=f"{own}.sched", own=own)
        if loc == "module":
            own = "self" if inside else "net"
            return dict(model=own, opt=f"{own}.opt", sched=f"{own}.sched", own=own)
        many = {"opt-dict": "opts.values()", "opt-list": "opts"}.get(loc)
        return dict(model="model", opt="opt", sched="sched", own=None, many=many)

    # -- pieces --------------------------------------------------------------------------
    def model_expr(self) -> str:
        s = self.spec
        if s.model == "bert":
            config = (
                f"transformers.BertConfig(vocab_size={VOCAB}, hidden_size=32, "
                "num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, "
                f"num_labels={CLASSES})"
            )
            return f"transformers.BertForSequenceClassification({config})"
        if s.model == "gpt2":
            config = (
                f"transformers.GPT2Config(vocab_size={VOCAB}, n_positions={2 * SEQ}, n_embd=32, "
                "n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)"
            )
            return f"transformers.GPT2LMHeadModel({config})"
        if s.model == "lstm":
            return f"LSTMLM({VOCAB}, {FEATURES}, {HIDDEN})"
        # A bias before BatchNorm is removed by it: its gradient is rounding noise, which Adam
        # scales up to lr-sized steps, so any other rounding (a compiled step's) moves it by
        # lr. People leave it out (bias=False), as ResNets do; so do these loops.
        bias = ", bias=False" if s.norm == "BatchNorm1d" else ""
        if s.model == "conv1d":
            layers = [f"nn.Conv1d(4, 8, 3, padding=1{bias})"]
            layers += ["nn.BatchNorm1d(8)"] if s.norm else []
            layers += [f"nn.{s.act}()", "nn.Flatten()"]
            layers += ["nn.Dropout(0.1)"] if s.dropout else []
            layers += [f"nn.Linear({8 * SEQ}, {CLASSES})"]
            return "nn.Sequential(" + ", ".join(layers) + ")"
        layers = [f"MeanEmbedding({VOCAB}, {FEATURES})"] if s.model == "embedding" else []
        for k in range(s.depth):
            block = [f"nn.Linear({FEATURES if k == 0 else 32}, 32{bias})"]
            block += [f"nn.{s.norm}(32)"] if s.norm else []
            block += [f"nn.{s.act}()"]
            block += ["nn.Dropout(0.1)"] if s.dropout else []
            layers += block
        layers.append(f"nn.Linear(32, {CLASSES})")
        return "nn.Sequential(" + ", ".join(layers) + ")"

    def opt_expr(self, params: str) -> str:
        s = self.spec
        args = dict(s.opt_args)
        if s.lr_tensor:
            args["lr"] = f"torch.tensor({s.lr!r})"
        written = ", ".join(
            f"{k}={v}" if k == "lr" and s.lr_tensor else f"{k}={v!r}" for k, v in args.items()
        )
        params = f"param_groups({params})" if s.groups else params
        return f"torch.optim.{s.optimizer}({params}{', ' + written if written else ''})"

    def sched_expr(self, opt: str) -> str | None:
        s = self.spec
        if s.schedule in ("none", *MANUAL):
            return None
        args = dict(s.sched_args)
        if s.schedule == "LambdaLR":
            return f"torch.optim.lr_scheduler.LambdaLR({opt}, lambda i: min(1.0, i / {args['warmup']}))"
        if s.schedule in HF_SCHEDULES:
            return f"transformers.{s.schedule}({opt}, {_kwargs(s.sched_args)})"
        return f"torch.optim.lr_scheduler.{s.schedule}({opt}, {_kwargs(s.sched_args)})"

    def each(self, names: dict, what: str, body: str) -> list[str]:
        """``body`` (with ``{}`` for the optimizer or scheduler) for each of ``what``."""
        many = names.get("many")
        if many is None:
            return [body.format(names[what])]
        source = {"opt": many, "sched": "scheds"}[what]
        return [f"for {what} in {source}:", "    " + body.format(what)]

    def groups_of(self, names: dict) -> str:
        many = names.get("many")
        if many is None:
            return f"{names['opt']}.param_groups"
        return f"(g for opt in {many} for g in opt.param_groups)"

    def write_settings(self, names: dict, it: str) -> None:
        """The hand-written schedule: the lr (and weight decay) into every param group."""
        c, s = self.code, self.spec
        c(f"lr = get_lr({it})")
        if s.schedule == "manual-lr-wd":
            c(f"wd = get_wd({it})")
        with c.block(f"for g in {self.groups_of(names)}:"):
            c('g["lr"] = lr')
            if s.schedule == "manual-lr-wd":
                with c.block('if g["weight_decay"] > 0:'):
                    c('g["weight_decay"] = wd')

    def loss_lines(self, names: dict, x: str, y: str, batch: str | None) -> list[str]:
        lines = self._loss_lines(names, x, y, batch)
        if self.spec.autocast:
            lines = [
                'with torch.autocast("cpu", dtype=torch.bfloat16):',
                *("    " + a for a in lines),
            ]
        knob = self.knob(inside=True)
        if self.spec.knob == "scale":
            lines.append(f"loss = loss * {knob}")
        elif self.spec.knob == "branch":
            lines += [f"if {knob} > 0.5:", "    loss = loss * 2.0"]
        return lines

    def knob(self, inside: bool) -> str:
        """The Python number the step reads (LoopSpec.knob), as the step or the loop names it."""
        loc = self.spec.location
        if loc in ("trainer", "module"):
            return "self.knob" if inside else {"trainer": "trainer.knob", "module": "net.knob"}[loc]
        return {"closure": 'cfg["knob"]', "opt-dict": "knob[0]", "opt-list": "knob"}.get(
            loc, "KNOB"
        )

    def knob_init(self) -> None:
        """The number's first value where it lives (a Trainer's or Net's own in __init__)."""
        if self.spec.knob == "none":
            return
        self.code(
            {
                "closure": 'cfg = {"knob": 1.0}',
                "opt-dict": "knob = [1.0]",
                "opt-list": "knob = 1.0",
                "globals": "KNOB = 1.0",
            }.get(self.spec.location, "self.knob = 1.0")
        )

    def _loss_lines(self, names: dict, x: str, y: str, batch: str | None) -> list[str]:
        s, m = self.spec, names["model"]
        if s.model in ("bert", "gpt2"):
            if batch is not None:
                return [f"loss = {m}(**{batch}).loss"]
            return [f"loss = {m}(input_ids={x}, labels={y}).loss"]
        if s.model == "lstm":
            h = f"{names['own']}.hidden" if names["own"] else "hidden"
            return [
                f"{h} = tuple(t.detach() for t in {h})",
                f"logits, {h} = {m}({x}, {h})",
                f"loss = F.cross_entropy(logits.flatten(0, 1), {y}.flatten())",
            ]
        return [f"loss = F.cross_entropy({m}({x}), {y})"]

    def opt_step_lines(self, names: dict) -> None:
        c, s = self.code, self.spec
        if s.clip:
            params = f"{names['model']}.parameters()"
            c(f"torch.nn.utils.clip_grad_norm_({params}, 1.0)")
        c(*self.each(names, "opt", "{}.step()"))

    def zero_lines(self, names: dict) -> None:
        arg = "" if self.spec.set_to_none else "set_to_none=False"
        self.code(*self.each(names, "opt", "{}.zero_grad(" + arg + ")"))

    # -- the step ----------------------------------------------------------------------------
    def step_def(self, params: str) -> None:
        c, s = self.code, self.spec
        names = self._names(inside=True)
        if self.way == "jit":
            c("@gt_core.jit")
        name = "training_step" if s.location == "module" else "step"
        self_ = "self, " if s.location in ("trainer", "module") else ""
        with c.block(f"def {name}({self_}{params}):"):
            shared = []
            if s.model == "lstm" and not names["own"]:
                shared.append("hidden")
            if s.schedule in MANUAL and s.sched_inside and not names["own"]:
                shared.append("it")
            if shared:
                c(("global " if s.location == "globals" else "nonlocal ") + ", ".join(shared))
            opt_inside = s.accum_inside
            if opt_inside and s.zero_grad == "start":
                self.zero_lines(names)
            if s.schedule in MANUAL and s.sched_inside:
                it = f"{names['own']}.it" if names["own"] else "it"
                self.write_settings(names, it)
                c(f"{it} += 1")
            batch = "batch" if s.data == "loader-dict" else None
            x, y = ('batch["x"]', 'batch["y"]') if batch else ("x", "y")
            if s.accum > 1 and s.accum_inside:
                with c.block(f"for xb, yb in zip(x.chunk({s.accum}), y.chunk({s.accum})):"):
                    c(*self.loss_lines(names, "xb", "yb", None))
                    c(f"loss = loss / {s.accum}", "loss.backward()")
            else:
                c(*self.loss_lines(names, x, y, batch))
                if s.accum > 1:
                    c(f"loss = loss / {s.accum}")
                c("loss.backward()")
            if opt_inside:
                self.opt_step_lines(names)
                stepped = s.sched_inside and s.schedule not in MANUAL
                if stepped and s.sched_first:
                    c(*self.each(names, "sched", "{}.step()"))
                if s.zero_grad == "end":
                    self.zero_lines(names)
                if stepped and not s.sched_first:
                    c(*self.each(names, "sched", "{}.step()"))
            if s.knob == "decay":
                with c.block("with torch.no_grad():"):
                    c(f"for p in {names['model']}.parameters():")
                    c(f"    p.mul_(1.0 - 0.01 * {self.knob(inside=True)})")
            if s.returns != "none":
                c("return loss")

    # -- the loop ----------------------------------------------------------------------------
    def loop(self) -> None:
        c, s = self.code, self.spec
        names = self._names(inside=False)
        call_args = "batch" if s.data == "loader-dict" else "x, y"
        fn = {"trainer": "trainer.step", "module": "net.training_step"}.get(s.location, "step")
        call = f"{fn}({call_args})"
        counted = (s.schedule in MANUAL and not s.sched_inside) or not s.accum_inside
        c("losses = []")
        if s.knob != "none":
            c("tick = 0")
        if s.data == "fixed":
            header = [f"for i in range({s.calls}):"]
        else:
            if counted:
                c("i = 0")
            epochs = s.calls // BATCHES_PER_EPOCH
            each = f"for {call_args} in loader:"
            if s.data == "slices":
                each = f"for j in range(0, len(X_all), {BATCH}):"
            header = [f"for epoch in range({epochs}):", each]
        with c.block(header[0]), c.block(header[1] if len(header) > 1 else None):
            if s.data == "slices":  # (views of one tensor at successive offsets)
                c(f"x, y = X_all[j : j + {BATCH}], Y_all[j : j + {BATCH}]")
            if s.schedule in MANUAL and not s.sched_inside:
                self.write_settings(names, "i" if s.accum_inside else f"i // {s.accum}")
            c(
                {
                    "none": call,
                    "tensor": f"losses.append({call})",
                    "item": f"losses.append({call}.item())",
                }[s.returns]
            )
            if s.knob != "none":
                knob = self.knob(inside=False)
                change = f"{knob} - 0.6" if s.knob == "branch" else f"{knob} * 0.5"
                c("tick += 1")
                with c.block(f"if tick == {s.calls // 2}:"):
                    c(f"{knob} = {change}")
            if not s.accum_inside:
                with c.block(f"if (i + 1) % {s.accum} == 0:"):
                    self.opt_step_lines(names)
                    self.zero_lines(names)
                    if s.schedule not in ("none", *MANUAL):
                        c(*self.each(names, "sched", "{}.step()"))
            elif s.schedule not in ("none", *MANUAL) and not s.sched_inside:
                c(*self.each(names, "sched", "{}.step()"))
            if s.data != "fixed" and counted:
                c("i += 1")
        if s.returns == "tensor":
            c("losses = [loss.item() for loss in losses]")

    # -- the whole program -------------------------------------------------------------------
    def write(self) -> str:
        c, s = self.code, self.spec
        self.imports()
        self.helpers()
        self.host_data()
        if s.location in ("trainer", "module"):
            self.classes()
        capture = "with gt_core.capture():" if self.way != "eager" else None
        if s.location in ("closure", "opt-dict", "opt-list"):
            self.gap()
            with c.block("def train():"):
                self.body()
                c("return model, losses")
            self.gap()
            with c.block(capture):
                c("model, losses = train()")
                self.results("model")
        else:
            self.gap()
            with c.block(capture):
                self.body()
                self.results({"trainer": "trainer.model", "module": "net"}.get(s.location, "model"))
        return "\n".join(c.lines) + "\n"

    def gap(self) -> None:
        """Two blank lines between top-level statements (PEP 8), wherever the last one ended."""
        lines = self.code.lines
        while lines and not lines[-1]:
            lines.pop()
        lines += ["", ""]

    def imports(self) -> None:
        c, s = self.code, self.spec
        c(*(["import math", ""] if s.schedule in MANUAL else []))
        c(*(["import numpy as np"] if s.data != "fixed" else []))
        c("import torch", "import torch.nn.functional as F")
        if s.model in ("bert", "gpt2") or s.schedule in HF_SCHEDULES:
            c("import transformers")
        c("from torch import nn")
        names = {"loader": "DataLoader, TensorDataset", "fixed": None}.get(
            s.data, "DataLoader, Dataset"
        )
        c(*([f"from torch.utils.data import {names}"] if names else []))
        c("", "import gt_core")

    def results(self, model: str) -> None:
        self.code(f"state = {{k: v.detach().cpu() for k, v in {model}.state_dict().items()}}")

    def helpers(self) -> None:
        c, s = self.code, self.spec
        if s.model == "embedding":
            self.gap()
            c(
                "class MeanEmbedding(nn.Module):",
                "    def __init__(self, vocab, dim):",
                "        super().__init__()",
                "        self.emb = nn.Embedding(vocab, dim)",
                "",
                "    def forward(self, tokens):",
                "        return self.emb(tokens).mean(1)",
            )
        if s.model == "lstm":
            self.gap()
            c(
                "class LSTMLM(nn.Module):",
                "    def __init__(self, vocab, dim, hidden):",
                "        super().__init__()",
                "        self.emb = nn.Embedding(vocab, dim)",
                "        self.lstm = nn.LSTM(dim, hidden, batch_first=True)",
                "        self.head = nn.Linear(hidden, vocab)",
                "",
                "    def forward(self, tokens, hidden):",
                "        out, hidden = self.lstm(self.emb(tokens), hidden)",
                "        return self.head(out), hidden",
            )
        if s.groups:
            self.gap()
            c(
                "def param_groups(params):",
                "    params = list(params)",
                "    decay = [p for p in params if p.dim() >= 2]",
                "    no_decay = [p for p in params if p.dim() < 2]",
                "    groups = [",
                '        {"params": decay, "weight_decay": 0.1},',
                '        {"params": no_decay, "weight_decay": 0.0},',
                "    ]",
                '    return [g for g in groups if g["params"]]',
            )
        if s.schedule in MANUAL:
            args = dict(s.sched_args)
            warm, total, lr, low = args["warmup"], args["total"], s.lr, s.lr / 10
            self.gap()
            c(
                "def get_lr(it):",
                f"    if it < {warm}:",
                f"        return {lr!r} * (it + 1) / ({warm} + 1)",
                f"    ratio = (it - {warm}) / ({total} - {warm})",
                f"    return {low!r} + 0.5 * (1.0 + math.cos(math.pi * ratio)) * ({lr!r} - {low!r})",
            )
            if s.schedule == "manual-lr-wd":
                self.gap()
                c("def get_wd(it):", f"    return 0.1 * (1.0 - it / ({total} + 1))")

    def host_data(self) -> None:
        """The loader's samples: host arrays made before the loop, as if read from files."""
        c, s = self.code, self.spec
        if s.data == "fixed":
            return
        n = BATCH * BATCHES_PER_EPOCH
        self.gap()
        c(f"rng = np.random.default_rng({s.seed})")
        if s.model in ("mlp", "conv1d"):
            shape = (n, FEATURES) if s.model == "mlp" else (n, 4, SEQ)
            c(f"X = rng.standard_normal({shape}, dtype=np.float32)")
            c(f"Y = rng.integers(0, {CLASSES}, {n})")
        elif s.model in ("lstm", "gpt2"):
            c(f"tokens = rng.integers(0, {VOCAB}, ({n}, {SEQ + 1}))")
            if s.model == "lstm":
                c("X, Y = tokens[:, :-1].copy(), tokens[:, 1:].copy()")
            else:
                c("X, Y = tokens[:, :-1].copy(), tokens[:, :-1].copy()")
        else:  # embedding, bert
            c(f"X = rng.integers(0, {VOCAB}, ({n}, {SEQ}))")
            c(f"Y = rng.integers(0, {CLASSES}, {n})")
        if s.data == "slices":
            return  # (sliced in the loop: see loop)
        if s.data == "loader":
            c("dataset = TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))")
        elif s.data == "numpy-rows":
            y = "torch.from_numpy(self.y[i])" if s.model in ("lstm", "gpt2") else "int(self.y[i])"
            self.gap()
            c(
                "class Rows(Dataset):",
                "    def __init__(self, x, y):",
                "        self.x, self.y = x, y",
                "",
                "    def __len__(self):",
                "        return len(self.x)",
                "",
                "    def __getitem__(self, i):",
                f"        return torch.from_numpy(self.x[i]), {y}",
            )
            self.gap()
            c("dataset = Rows(X, Y)")
        else:
            if s.model == "bert":
                item = (
                    '{"input_ids": self.x[i], "attention_mask": torch.ones_like(self.x[i]), '
                    '"labels": self.y[i]}'
                )
            elif s.model == "gpt2":
                item = '{"input_ids": self.x[i], "labels": self.y[i]}'
            else:
                item = '{"x": self.x[i], "y": self.y[i]}'
            self.gap()
            c(
                "class Records(Dataset):",
                "    def __init__(self, x, y):",
                "        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)",
                "",
                "    def __len__(self):",
                "        return len(self.x)",
                "",
                "    def __getitem__(self, i):",
                f"        return {item}",
            )
            self.gap()
            c("dataset = Records(X, Y)")
        shuffle = {
            "no": "",
            "generator": f", shuffle=True, generator=torch.Generator().manual_seed({s.seed})",
            "global": ", shuffle=True",
        }[s.shuffle]
        c(f"loader = DataLoader(dataset, batch_size={BATCH}{shuffle})")

    def classes(self) -> None:
        """The Trainer (plain object) or the nn.Module holding its optimizer."""
        c, s = self.code, self.spec
        lstm, counter = s.model == "lstm", s.schedule in MANUAL and s.sched_inside
        sched = self.sched_expr("self.opt")
        params = "x, y" if s.data != "loader-dict" else "batch"
        self.gap()
        if s.location == "trainer":
            args = ["model", "opt"] + (["sched"] if sched else []) + (["hidden"] if lstm else [])
            with c.block("class Trainer:"):
                with c.block(f"def __init__(self, {', '.join(args)}):"):
                    c(f"self.{', self.'.join(args)} = {', '.join(args)}")
                    self.knob_init()
                    if counter:
                        c("self.it = 0")
                c("")
                self.step_def(params)
        else:
            with c.block("class Net(nn.Module):"):
                with c.block("def __init__(self):"):
                    c("super().__init__()")
                    c(f"self.net = {self.model_expr()}")
                    c(f"self.opt = {self.opt_expr('self.parameters()')}")
                    if sched:
                        c(f"self.sched = {sched}")
                    if lstm:
                        c(f"self.hidden = {self.zeros_hidden()}")
                    self.knob_init()
                    if counter:
                        c("self.it = 0")
                c("")
                with c.block("def forward(self, *args, **kwargs):"):
                    c("return self.net(*args, **kwargs)")
                c("")
                self.step_def(params)

    def zeros_hidden(self) -> str:
        return f"(torch.zeros(1, {BATCH}, {HIDDEN}), torch.zeros(1, {BATCH}, {HIDDEN}))"

    def body(self) -> None:
        """Seed, model, optimizer(s), scheduler(s), fixed data, the step and the loop."""
        c, s = self.code, self.spec
        c(f"torch.manual_seed({s.seed})")
        loc = s.location
        if loc == "module":
            c("net = Net()")
        else:
            c(f"model = {self.model_expr()}")
            if loc in ("opt-dict", "opt-list"):
                c("params = list(model.parameters())")
                a, b = self.opt_expr("params[:2]"), self.opt_expr("params[2:]")
                if loc == "opt-dict":
                    c(f'opts = {{"first": {a}, "rest": {b}}}')
                    many = "opts.values()"
                else:
                    c(f"opts = [{a}, {b}]")
                    many = "opts"
                sched = self.sched_expr("opt")
                if sched:
                    c(f"scheds = [{sched} for opt in {many}]")
            else:
                c(f"opt = {self.opt_expr('model.parameters()')}")
                sched = self.sched_expr("opt")
                if sched:
                    c(f"sched = {sched}")
        if s.data == "fixed":
            if s.model in ("mlp", "conv1d"):
                shape = f"{BATCH}, {FEATURES}" if s.model == "mlp" else f"{BATCH}, 4, {SEQ}"
                c(f"x, y = torch.randn({shape}), torch.randint(0, {CLASSES}, ({BATCH},))")
            elif s.model in ("lstm", "gpt2"):
                c(f"tokens = torch.randint(0, {VOCAB}, ({BATCH}, {SEQ + 1}))")
                c(
                    "x, y = tokens[:, :-1], tokens[:, 1:]"
                    if s.model == "lstm"
                    else "x = y = tokens[:, :-1]"
                )
            else:
                c(f"x = torch.randint(0, {VOCAB}, ({BATCH}, {SEQ}))")
                c(f"y = torch.randint(0, {CLASSES}, ({BATCH},))")
        if s.data == "slices":
            c("X_all, Y_all = torch.from_numpy(X), torch.from_numpy(Y)")
        if s.model == "lstm" and loc not in ("module",):
            c(f"hidden = {self.zeros_hidden()}")
        if s.schedule in MANUAL and s.sched_inside and loc not in ("trainer", "module"):
            c("it = 0")
        if loc not in ("trainer", "module"):
            self.knob_init()
        if loc == "trainer":
            args = ["model", "opt"]
            args += ["sched"] if self.sched_expr("opt") else []
            args += ["hidden"] if s.model == "lstm" else []
            c(f"trainer = Trainer({', '.join(args)})")
        elif loc != "module":
            c("")
            self.step_def("batch" if s.data == "loader-dict" else "x, y")
            c("")
        self.loop()

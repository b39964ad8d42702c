"""Training loops as people write them: a hypothesis strategy of loops, and a runner.

A :class:`LoopSpec` is one loop: a model, an optimizer, an LR schedule, where the training
state lives, where the data comes from, and the small habits of a step (accumulation,
clipping, zero_grad). ``str(spec)`` is that loop as the Python a user would write, with
``@gt_core.jit`` on its step (tests/_idioms_program.py writes it); ``run(spec, way)``
executes exactly that Python in one of three ways:

  * ``"eager"``: no capture, no jit: the oracle, the loop as the user runs it without gt;
  * ``"gt"``: inside ``gt_core.capture()``, without ``@gt_core.jit``;
  * ``"jit"``: inside ``gt_core.capture()``, the step decorated with ``@gt_core.jit``.

``classify(eager, got)`` then says what a way did against eager: ``equal``, ``refused`` (jit
refused or stopped replay and ran the Python, its reason an event: still equal), ``silent``
(a different number without such a word: the worst bug) or ``error`` (it raised).

Equal means: the same keys, shapes and dtypes in the model's state_dict and the same number
of losses, and for every tensor and loss ``max|got - eager| <= TOL * max(1, max|eager|)``:
an absolute 1e-5 where eager's values stay within 1, relative to the largest beyond. A NaN or
inf on one side only is a difference. jit runs the optimizers as written, so their numbers are
eager's (the summary prints the largest difference among equal loops).

``loops()`` draws the specs, ``spread`` picks a sample that covers the most pairs of
dimension values, ``simplify`` sets a failing spec's dimensions to their simplest values
while it still fails alike (what a report shows).
"""

from __future__ import annotations

import dataclasses
import heapq
import linecache
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from _idioms_program import BATCHES_PER_EPOCH, HF_SCHEDULES, MANUAL, write
from hypothesis import strategies as st

import gt_core
from gt_core.client import capture as _capture

__all__ = [
    "LoopSpec",
    "Outcome",
    "Verdict",
    "loops",
    "spread",
    "simplify",
    "run",
    "classify",
    "TOL",
    "WAYS",
]

TOL = 1e-5
WAYS = ("eager", "gt", "jit")

# optimizer -> the lr it uses when none is written (torch's defaults)
DEFAULT_LR = {
    "SGD": 1e-3,
    "Adam": 1e-3,
    "AdamW": 1e-3,
    "RMSprop": 1e-2,
    "Adagrad": 1e-2,
    "Adadelta": 1.0,
}
# optimizers without momentum or beta1: OneCycleLR must not cycle it
_NO_MOMENTUM = ("Adagrad", "Adadelta")


@dataclass(frozen=True)
class LoopSpec:
    """One training loop; ``str()`` prints it as the Python a user would write."""

    seed: int = 0
    model: str = "mlp"  # mlp | embedding | conv1d | lstm | bert | gpt2
    norm: str | None = None  # the hidden block of mlp/embedding/conv1d: a norm layer,
    act: str = "ReLU"  # an activation,
    dropout: bool = False  # a dropout,
    depth: int = 1  # this many hidden blocks
    optimizer: str = "AdamW"
    opt_args: tuple = ()  # keyword arguments as written: (("lr", 0.05), ("momentum", 0.9))
    lr_tensor: bool = False  # lr=torch.tensor(...)
    groups: bool = False  # decay / no-decay param groups, as nanoGPT's configure_optimizers
    schedule: str = "none"
    sched_args: tuple = ()
    sched_inside: bool = False  # the scheduler (or the hand-written lr) inside the step
    location: str = "closure"  # closure | globals | trainer | module | opt-dict | opt-list
    data: str = "fixed"  # fixed | loader | loader-dict | numpy-rows | slices (X[j : j + B])
    shuffle: str = "no"  # no | generator | global (the loader draws its seed from torch's)
    accum: int = 1  # micro-batches per optimizer step
    accum_inside: bool = True  # the micro-batch loop inside the step (else: one a call)
    clip: bool = False
    autocast: bool = False  # the forward under torch.autocast("cpu", dtype=torch.bfloat16)
    zero_grad: str = "end"  # start | end (of the step)
    sched_first: bool = False  # a scheduler inside steps before zero_grad (the Trainer's order)
    set_to_none: bool = True
    returns: str = "tensor"  # none | tensor (collected, read at the end) | item (each call)
    # A Python number the step reads, which the loop halves (or lowers, across the branch's
    # threshold) halfway, where the training state lives: none | scale (the loss times it) |
    # branch (an ``if`` on it) | decay (a hand-written weight decay of the parameters by it)
    knob: str = "none"
    calls: int = 12  # calls of the step

    def __str__(self) -> str:
        return self.program("jit")

    def program(self, way: str) -> str:
        """The loop's Python for ``way`` (eager: no capture and no jit; gt: no jit)."""
        return write(self, way)

    @property
    def lr(self) -> float:
        return dict(self.opt_args).get("lr", DEFAULT_LR[self.optimizer])

    @property
    def steps(self) -> int:
        """Optimizer steps (and scheduler steps): one a call, or one per ``accum`` calls."""
        return self.calls if self.accum_inside else self.calls // self.accum

    def short(self) -> str:
        """One line: the dimensions that differ from the defaults."""
        parts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default or f.name in ("model", "optimizer")
        ]
        return "LoopSpec(" + ", ".join(parts) + ")"


# -- the strategy ----------------------------------------------------------------------------
_OPTIMIZERS = [
    ("AdamW", ()),
    ("AdamW", (("lr", 3e-3), ("weight_decay", 0.1))),
    ("Adam", ()),
    ("Adam", (("lr", 1e-2),)),
    ("SGD", (("lr", 0.05),)),
    ("SGD", (("lr", 0.05), ("momentum", 0.9))),
    ("SGD", (("lr", 0.05), ("momentum", 0.9), ("nesterov", True))),
    ("SGD", (("lr", 0.05), ("momentum", 0.9), ("weight_decay", 1e-4))),
    ("RMSprop", ()),
    ("RMSprop", (("momentum", 0.9),)),
    ("Adagrad", ()),
    ("Adadelta", ()),
]
# the transformers models at a low share: each is a tenth of the time of an MLP's loop
_MODELS = ["mlp"] * 6 + ["embedding"] * 3 + ["conv1d"] * 3 + ["lstm"] * 3 + ["bert", "gpt2"]
_SCHEDULES = [
    "none",
    "StepLR",
    "MultiStepLR",
    "CosineAnnealingLR",
    "OneCycleLR",
    "LambdaLR",
    "ExponentialLR",
    *HF_SCHEDULES,
    *MANUAL,
]


def _sched_args(schedule: str, steps: int, lr: float, optimizer: str) -> tuple:
    warm = max(1, steps // 4)
    if schedule == "StepLR":
        return (("step_size", max(2, steps // 3)), ("gamma", 0.5))
    if schedule == "MultiStepLR":
        return (("milestones", (steps // 3, 2 * steps // 3)), ("gamma", 0.3))
    if schedule == "CosineAnnealingLR":
        return (("T_max", steps),)
    if schedule == "OneCycleLR":
        args = (("max_lr", 10 * lr), ("total_steps", steps))
        return args + ((("cycle_momentum", False),) if optimizer in _NO_MOMENTUM else ())
    if schedule == "LambdaLR":
        return (("warmup", warm),)
    if schedule == "ExponentialLR":
        return (("gamma", 0.9),)
    if schedule in HF_SCHEDULES:
        return (("num_warmup_steps", warm), ("num_training_steps", steps))
    if schedule in MANUAL:
        return (("warmup", warm), ("total", steps))
    return ()


@st.composite
def loops(draw) -> LoopSpec:
    """A LoopSpec: every combination drawn is valid PyTorch."""
    model = draw(st.sampled_from(_MODELS))
    layered = model in ("mlp", "embedding", "conv1d")
    norms = [None, "BatchNorm1d"] if model == "conv1d" else [None, "LayerNorm", "BatchNorm1d"]
    optimizer, opt_args = draw(st.sampled_from(_OPTIMIZERS))
    data = draw(st.sampled_from(["fixed", "loader", "loader-dict", "numpy-rows", "slices"]))
    accum = draw(st.sampled_from([1, 1, 1, 2, 3]))
    # a micro-batch loop inside the step splits tensors; an LSTM's hidden state keeps its batch
    accum_inside = accum > 1 and model != "lstm" and data != "loader-dict" and draw(st.booleans())
    calls = 12 if accum == 3 else draw(st.sampled_from([8, 12]))
    schedule = draw(st.sampled_from(_SCHEDULES))
    # the optimizer's step outside the step (accumulating over calls) takes the scheduler along
    sched_inside = schedule != "none" and (accum == 1 or accum_inside) and draw(st.booleans())
    spec = LoopSpec(
        seed=draw(st.integers(0, 3)),
        model=model,
        norm=draw(st.sampled_from(norms)) if layered else None,
        act=draw(st.sampled_from(["ReLU", "GELU"])) if layered else "ReLU",
        dropout=layered and draw(st.booleans()),
        depth=draw(st.sampled_from([1, 2])) if model in ("mlp", "embedding") else 1,
        optimizer=optimizer,
        opt_args=opt_args,
        lr_tensor=schedule not in MANUAL and draw(st.booleans()),
        groups=draw(st.booleans()),
        schedule=schedule,
        sched_inside=sched_inside,
        location=draw(
            st.sampled_from(["closure", "globals", "trainer", "module", "opt-dict", "opt-list"])
        ),
        data=data,
        shuffle="no"
        if data in ("fixed", "slices")
        else draw(st.sampled_from(["no", "generator", "global"])),
        accum=accum,
        accum_inside=accum_inside or accum == 1,
        clip=draw(st.booleans()),
        # (CPU autocast has no bfloat16 LSTM: torch.nn.LSTM refuses the mixed dtypes)
        autocast=model != "lstm" and draw(st.sampled_from([False, False, True])),
        zero_grad=draw(st.sampled_from(["end", "start"])),
        sched_first=sched_inside and draw(st.booleans()),
        set_to_none=draw(st.booleans()),
        returns=draw(st.sampled_from(["tensor", "item", "none"])),
        knob=draw(st.sampled_from(["none", "none", "scale", "branch", "decay"])),
        calls=calls,
    )
    steps = spec.steps
    return dataclasses.replace(spec, sched_args=_sched_args(schedule, steps, spec.lr, optimizer))


# Dimensions whose pairs of values a sample covers first (see ``spread``).
_SPREAD = (
    "model",
    "optimizer",
    "schedule",
    "sched_inside",
    "location",
    "data",
    "accum",
    "accum_inside",
    "lr_tensor",
    "groups",
    "norm",
    "returns",
    "knob",
)
_SLOW = ("bert", "gpt2")  # a transformers loop takes about ten MLP loops' time


def spread(candidates: list[LoopSpec], n: int) -> list[LoopSpec]:
    """``n`` of ``candidates`` that cover the most pairs of dimension values, greedily.

    Hypothesis draws close variants of one loop (a mutated example and the next), so its
    first ``n`` cover few combinations; picked from many draws, ``n`` cover most pairs (a
    covering design). The transformers models take at most a fifteenth of the picks. The
    same candidates in the same order give the same picks."""
    left = list(dict.fromkeys(candidates))
    pairs = [
        frozenset(
            ((a, getattr(c, a)), (b, getattr(c, b)))
            for i, a in enumerate(_SPREAD)
            for b in _SPREAD[i + 1 :]
        )
        for c in left
    ]
    # A candidate's gain only shrinks as picks cover more: its last gain bounds it (lazy
    # greedy), so most candidates are not counted again at each pick.
    heap = [(-len(p), k) for k, p in enumerate(pairs)]
    heapq.heapify(heap)
    covered: set = set()
    picked: list[LoopSpec] = []
    slow_left = max(1, n // 15)
    while heap and len(picked) < n:
        _, k = heapq.heappop(heap)
        if left[k].model in _SLOW and not slow_left:
            continue
        gain = len(pairs[k] - covered)
        if heap and gain < -heap[0][0]:
            heapq.heappush(heap, (-gain, k))
            continue
        covered |= pairs[k]
        slow_left -= left[k].model in _SLOW
        picked.append(left[k])
    return picked


# Each dimension's simplest value, tried in this order by ``simplify``.
_SIMPLEST = (
    ("model", "mlp"),
    ("location", "closure"),
    ("data", "fixed"),
    ("shuffle", "no"),
    ("accum", 1),
    ("accum_inside", True),
    ("schedule", "none"),
    ("sched_inside", False),
    ("groups", False),
    ("lr_tensor", False),
    ("optimizer", "SGD"),
    ("opt_args", (("lr", 0.05),)),
    ("norm", None),
    ("act", "ReLU"),
    ("dropout", False),
    ("depth", 1),
    ("clip", False),
    ("autocast", False),
    ("zero_grad", "end"),
    ("sched_first", False),
    ("set_to_none", True),
    ("returns", "tensor"),
    ("knob", "none"),
    ("calls", 8),
    ("seed", 0),
)


def simplify(spec: LoopSpec, still: Callable[[LoopSpec], bool]) -> LoopSpec:
    """``spec`` with each dimension set to its simplest value where ``still`` holds after
    (``still``: the loop still fails alike), until no dimension can be simplified. A
    schedule's arguments follow its steps; an optimizer becomes SGD with its own lr."""
    while True:
        for name, value in _SIMPLEST:
            if name == "opt_args" and spec.optimizer != "SGD":
                value = ()  # (the optimizer's defaults)
            if getattr(spec, name) == value:
                continue
            changed = {name: value}
            if name == "optimizer":
                changed["opt_args"] = (("lr", 0.05),) if value == "SGD" else ()
            if name == "accum":
                changed["accum_inside"] = True
            if name == "data":
                changed["shuffle"] = "no"
            if name == "calls" and spec.accum == 3:
                continue
            try:
                simpler = dataclasses.replace(spec, **changed)
                simpler = dataclasses.replace(
                    simpler,
                    sched_args=_sched_args(
                        simpler.schedule, simpler.steps, simpler.lr, simpler.optimizer
                    ),
                )
            except Exception:
                continue
            if _valid(simpler) and still(simpler):
                spec = simpler
                break
        else:
            return spec


def _valid(spec: LoopSpec) -> bool:
    """The combinations ``loops`` draws (others are no valid loop, or not one people write)."""
    if spec.sched_inside and (spec.schedule == "none" or not spec.accum_inside):
        return False
    if spec.accum == 1 and not spec.accum_inside:
        return False
    if (
        spec.accum > 1
        and spec.accum_inside
        and (spec.model == "lstm" or spec.data == "loader-dict")
    ):
        return False
    if spec.lr_tensor and spec.schedule in MANUAL:
        return False
    if spec.data in ("fixed", "slices") and spec.shuffle != "no":
        return False
    if spec.sched_first and not spec.sched_inside:
        return False
    if spec.autocast and spec.model == "lstm":
        return False
    if spec.calls % spec.accum or (spec.data != "fixed" and spec.calls % BATCHES_PER_EPOCH):
        return False
    conv = spec.model == "conv1d"
    return not (conv and spec.norm == "LayerNorm") and not (conv and spec.depth > 1)


# -- running ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one way left: the model's state, the losses, and for jit its calls and events."""

    state: dict | None = None
    losses: list = field(default_factory=list)
    error: BaseException | None = None
    trace: str = ""
    calls: int = 0  # calls of the jitted step
    replayed: int = 0
    recorded: int = 0
    events: list = field(default_factory=list)  # jit events: state, reason

    @property
    def reasons(self) -> list[str]:
        """The jit's words: each event that stopped or refused replay, with its reason."""
        return [f"{e['state']}: {e['reason']}" for e in self.events if _a_word(e)]


def run(spec: LoopSpec, way: str, fresh: bool = True) -> Outcome:
    """Run ``spec``'s program ``way`` (eager, gt or jit); an error is returned, not raised.
    ``fresh``: on a worker of its own (False: on the worker the last run left)."""
    src = spec.program(way)
    filename = f"<loop {way} {abs(hash(spec)):x}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = {"__name__": "__loop__"}
    if way != "eager" and fresh:
        # Each loop on a fresh worker: one loop's blocks and errors do not reach the next (a
        # loop run with jit, then without, in one session is a test of its own).
        gt_core.worker().stop()
        gt_core.reset()
    out = Outcome()
    try:
        exec(compile(src, filename, "exec"), ns)
        out.state, out.losses = ns["state"], list(ns["losses"])
    except Exception as exc:
        out.error, out.trace = exc, traceback.format_exc()
    if way == "jit":
        s = _capture._state["session"]
        entries = list(s.jits) if s is not None else []
        out.calls = spec.calls
        out.replayed = sum(e.replayed for e in entries)
        out.recorded = sum(e.calls for e in entries)
        out.events = [
            {"state": e["state"], "trigger": e.get("trigger"), "reason": e.get("reason")}
            for e in gt_core.events_log().snapshot()
            if e["type"] == "jit"
        ]
    linecache.cache.pop(filename, None)
    return out


def _a_word(event: dict) -> bool:
    """A jit event that says the Python ran: replay refused, or stopped to record again
    (``ran`` in older releases); not a key starting to record or replay, nor an audit that
    found the replay right."""
    return event["state"] not in ("recording", "replaying")


def distance(a, b) -> float:
    """max|a - b| / max(1, max|b|) (``b`` the eager value); inf where one side alone is not
    finite, 0 where both hold the same non-finite value."""
    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    same_odd = (a == b) | (a.isnan() & b.isnan())
    if bool((~torch.isfinite(a) | ~torch.isfinite(b))[~same_odd].any()):
        return math.inf
    diff = torch.where(same_odd, torch.zeros_like(a), (a - b).abs())
    finite = b[torch.isfinite(b)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    return float(diff.max()) / scale


def _key_bias(name: str, t: torch.Tensor) -> slice | None:
    """Where an attention's key bias lies in the state entry ``name`` (BERT's key.bias, the
    middle third of GPT-2's fused c_attn.bias), or None.

    A key bias adds one number to every score of a query's row, which the softmax takes out:
    its gradient is zero but for rounding, and Adam or RMSprop divide that noise by its own
    size into steps of lr. Any other rounding (a recorded step's) moves it by lr: its value
    is noise, and it is held to being finite where eager's is."""
    if name.endswith("attention.self.key.bias"):
        return slice(None)
    if name.endswith("attn.c_attn.bias"):
        third = t.shape[-1] // 3
        return slice(third, 2 * third)
    return None


def compare(got: Outcome, want: Outcome) -> tuple[float, str]:
    """(the largest ``distance`` of ``got`` from ``want``, where it is): inf where the
    state's keys, a tensor's dtype or shape, or the number of losses differ."""
    if set(got.state) != set(want.state):
        return math.inf, f"state keys differ: {sorted(set(got.state) ^ set(want.state))}"
    worst, where = 0.0, ""
    for k, w in want.state.items():
        g = got.state[k]
        if g.dtype != w.dtype or g.shape != w.shape:
            return math.inf, f"{k}: {g.dtype}{list(g.shape)} != eager's {w.dtype}{list(w.shape)}"
        noise = _key_bias(k, w)
        if noise is not None:
            if not torch.equal(torch.isfinite(g[noise]), torch.isfinite(w[noise])):
                return math.inf, f"{k} (NaN)"
            g, w = g.clone(), w.clone()
            g[noise] = w[noise] = 0
        d = distance(g, w)
        if d > worst:
            worst, where = d, f"{k}" + (" (NaN)" if bool(g.isnan().any()) else "")
    if len(got.losses) != len(want.losses):
        return math.inf, f"{len(got.losses)} losses != eager's {len(want.losses)}"
    for i, (g, w) in enumerate(zip(got.losses, want.losses, strict=True)):
        d = distance(g, w)
        if d > worst:
            worst, where = d, f"loss {i} ({g!r}, eager {w!r})"
    return worst, where


@dataclass
class Verdict:
    """A way's class against eager, and why."""

    kind: str  # equal | refused | silent | error | invalid (eager itself raised)
    detail: str = ""
    clear: bool = False  # an error: a gt error that names the op
    off: float = 0.0  # the largest scaled difference from eager (see ``distance``)

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def classify(eager: Outcome, got: Outcome) -> Verdict:
    """``got`` (a gt or jit Outcome) against the eager oracle."""
    if eager.error is not None:
        return Verdict("invalid", f"eager raised {type(eager.error).__name__}: {eager.error}")
    if got.error is not None:
        e = got.error
        clear = isinstance(e, gt_core.GTError) and "aten." in str(e)
        first = str(e).splitlines()[0] if str(e) else ""
        return Verdict("error", f"{type(e).__name__}: {first[:300]}", clear)
    off, where = compare(got, eager)
    words = got.reasons
    if not off <= TOL:
        said = f" (events: {'; '.join(w[:200] for w in words)})" if words else ""
        return Verdict("silent", f"{where} off by {off:.3g}{said}", off=off)
    if words:
        return Verdict("refused", "; ".join(w[:200] for w in words), off=off)
    return Verdict("equal", off=off)

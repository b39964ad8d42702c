"""gt_core.jit's lifecycle as one table, and its reasons as records (no torch import).

A jitted function keeps one state per call key (:class:`JitState`). It moves only along
:data:`TRANSITIONS`, each move caused by a :class:`Trigger`, and every move is an event (kind
``jit``: its ``state``, ``trigger`` and, where there is one, its ``cause``). The client's
state machine (``gt_core.client.jit.entry``) and the report's fold (``jit_summary``) both
read this table, so the two cannot tell a key's story differently.

Why a key left a state is a :class:`JitReason`: a kind and its facts (the op, the argument,
the user's line, the values). Its sentence and its fix are rendered from the record; nothing
parses them back.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

__all__ = ["JitState", "Trigger", "TRANSITIONS", "next_state", "JitReason", "REASONS"]


class JitState(str, enum.Enum):
    """A jitted call key's state, as its events name it."""

    RECORDING = "recording"  # calls run their Python and are recorded until two make one block
    REPLAYING = "replaying"  # a call sends one RUN instead of running the Python
    RERECORDING = "re-recording"  # replay stopped for a reason that may pass: recording again
    REFUSED = "refused"  # calls run their Python from now on (the reason says why)

    __str__ = str.__str__
    __format__ = str.__format__


class Trigger(str, enum.Enum):
    """What moves a key from one state to the next."""

    PREPARED = "prepared"  # two recorded calls made one block and the worker sent its plan
    REFUSED = "refused"  # the recorded calls show the step cannot be replayed
    UNFIT = "unfit"  # an input of the block no longer fits it (replaced, other metadata)
    SETTING_CHANGED = "setting-changed"  # a setting the block holds as a number changed
    AUDITED = "audited"  # an audited call made the block the replay would have sent
    AUDIT_DIFFERED = "audit-differed"  # an audited call made another block: replay stops

    __str__ = str.__str__
    __format__ = str.__format__


_S, _T = JitState, Trigger
TRANSITIONS: dict[tuple[JitState, Trigger], JitState] = {
    (_S.RECORDING, _T.PREPARED): _S.REPLAYING,
    (_S.RECORDING, _T.REFUSED): _S.REFUSED,
    (_S.RERECORDING, _T.PREPARED): _S.REPLAYING,
    (_S.RERECORDING, _T.REFUSED): _S.REFUSED,
    (_S.REPLAYING, _T.UNFIT): _S.RERECORDING,
    (_S.REPLAYING, _T.SETTING_CHANGED): _S.RERECORDING,
    (_S.REPLAYING, _T.AUDITED): _S.REPLAYING,
    (_S.REPLAYING, _T.AUDIT_DIFFERED): _S.REFUSED,
}


def next_state(state: JitState, trigger: Trigger) -> JitState:
    """The state ``trigger`` moves ``state`` to (ValueError: no such transition)."""
    try:
        return TRANSITIONS[(JitState(state), Trigger(trigger))]
    except KeyError:
        raise ValueError(f"gt_core.jit: no transition from {state} on {trigger}") from None


_KEEPS_RUNNING = " The function keeps running its Python meanwhile (its block still compiles)."
_AGAIN = (
    "nothing, if the change was meant: recording starts over and replay resumes once two calls "
    "record the same block"
)

# kind: (sentence, fix), format strings over a reason's fields (op, arg, line, old, new, n,
# place, what). The sentence is what the event's ``reason`` says; the fix ends the advice.
REASONS: dict[str, tuple[str, str]] = {
    "value_read": (
        "the step reads the value of a small tensor as a Python number ({n} per call: a "
        "tensor learning rate an optimizer turns into a number, an .item() of a counter) in a "
        "way a replay cannot repeat ({what}): it would keep the number recorded",
        "give the optimizer its learning rate as a Python float (a scheduler's changes then "
        "flow into the block), or use it as a tensor inside the step (Adam and AdamW with "
        "capturable=True do)." + _KEEPS_RUNNING,
    ),
    "mutates": (
        "the step changes Python state it reaches ({what}): a replay runs no Python and would not",
        "do that outside the jitted function: step the LR scheduler and count steps in the "
        "loop around it (for ...: loss = step(x, y); sched.step())." + _KEEPS_RUNNING,
    ),
    "sync": (
        "a sync inside the step ({n} per call{at}): replay cannot answer it (.item(), printing "
        "a tensor, a data-dependent shape, torch.get_rng_state as torch.utils.checkpoint calls "
        "it), the function keeps running",
        "move the sync out of the jitted function: return the loss and read it outside "
        "(loss.item() every k steps), or keep running values on the worker and read them once."
        + _KEEPS_RUNNING,
    ),
    "seeds": (
        "the step seeds or sets the random generator each call (torch.manual_seed inside it): "
        "move that out of the jitted function",
        "seed once before the loop, outside the jitted function." + _KEEPS_RUNNING,
    ),
    "uploads": (
        "the step makes a tensor of more than {n} elements from host data each call{at}: data "
        "belongs in the arguments",
        "make it before the loop and pass it to the step as an argument (or create it on the "
        "worker inside the capture)." + _KEEPS_RUNNING,
    ),
    "written_constant": (
        "the step makes a tensor from host data{at} and writes it in place ({op}): replay would "
        "reuse it written",
        "write to a copy (torch.tensor(...).clone()) or use the out-of-place op (x = x + 1 "
        "rather than x.add_(1))." + _KEEPS_RUNNING,
    ),
    "python_number": (
        "a Python number the step passes to {op} ({arg}) changed between calls ({old} -> {new}) "
        "and is not computed from an optimizer's settings: replay would freeze it",
        "make it a tensor the step reads (lr=torch.tensor(0.01), an optimizer with "
        "capturable=True) and update that tensor outside the step (a scheduler does)."
        + _KEEPS_RUNNING,
    ),
    "host_data_changes": (
        "a tensor the step makes from host data{at} changes between calls ({old} -> {new}): "
        "that is data; pass it as an argument",
        "pass it to the step as an argument, or compute it from tensors the step reads."
        + _KEEPS_RUNNING,
    ),
    "python_result": (
        "the step returns a Python value that changes ({old} -> {new})",
        "return tensors only; compute the Python value outside the jitted function."
        + _KEEPS_RUNNING,
    ),
    "no_block": (
        "{n} calls recorded without a block the worker saw twice alike: the step records "
        "different work each call",
        "keep each call's work the same: move branches (every N steps) and changing shapes out "
        "of the jitted function, or jit each variant as its own function." + _KEEPS_RUNNING,
    ),
    "unreachable": (
        "the step reads a worker tensor jit cannot find again: not an argument, nor reachable "
        "from its closure or globals, or those of the functions it calls (through modules, "
        "optimizers, dicts, lists, objects' attributes)",
        "pass that tensor as an argument, or keep it on a module, an optimizer or a dict the "
        "step's closure or globals reach." + _KEEPS_RUNNING,
    ),
    "after_scheduler": (
        "the step works after stepping its LR scheduler ({what}): a replay steps the scheduler "
        "after the block, so that work would not be done",
        "step the LR scheduler after the optimizer's step (as transformers' Trainer does), "
        "or in the loop around it; with a tensor learning rate, last in the step." + _KEEPS_RUNNING,
    ),
    "kept_alive": (
        "{n} tensor(s) the step makes stay alive where jit cannot put them again (e.g. appended "
        "to a list, or kept by an autograd graph)",
        "return them from the step, or keep Python numbers instead (losses.append(loss) outside "
        "the step, .detach() what is kept)." + _KEEPS_RUNNING,
    ),
    "returns_input": (
        "the step returns a tensor it did not make (an input)",
        "return only what the step computes (the caller has its inputs already), or a copy "
        "(x.clone())." + _KEEPS_RUNNING,
    ),
    "moves_tensor": (
        "the step moves a tensor it did not make into {place}: replay cannot",
        "assign a tensor the step computes there, or make that assignment outside the step."
        + _KEEPS_RUNNING,
    ),
    "follows_offset": (
        "the step returns or keeps a view of an argument, and the argument begins elsewhere "
        "in its storage each call (a result at offset {old} -> {new}): a replay would put the "
        "view where the recorded call found it",
        "return or keep a copy of it (x[i].clone()), or pass the step whole tensors."
        + _KEEPS_RUNNING,
    ),
    "plan_mismatch": (
        "the worker's block does not match the recorded call ({what})",
        "nothing to change in the step: this is gt's own limit; the function keeps running.",
    ),
    "unfit": (
        "{place} no longer fits the block ({what}): the function ran instead",
        _AGAIN + ". To keep replaying, update tensors in place (p.copy_(new)) rather than "
        "binding a new one",
    ),
    "setting_changed": (
        "an optimizer setting the step reads changed ({arg}: {old} -> {new}): recorded again",
        _AGAIN + "; the setting that changed flows into the block from then on",
    ),
    "value_changed": (
        "a Python value the step reaches changed ({place}: {old} -> {new}); the block holds "
        "it as recorded, so the call is recorded again",
        _AGAIN + " (a module switched between train() and eval() is recorded once per mode "
        "change; a float the step computes with flows into the block once two recorded calls "
        "saw it differ; an int or a bool that changes every call keeps it from replaying: "
        "make it a tensor)",
    ),
    "test_flips": (
        "a number the step tests in Python would take another path now ({what}), so the call "
        "is recorded again",
        _AGAIN + " (a number that crosses a threshold the step compares it with is recorded "
        "once per outcome)",
    ),
    "settings_parted": (
        "settings that were equal when the step was recorded now differ ({arg}): a number the "
        "block reads may come from either, so the call is recorded again",
        _AGAIN + "; recorded with different values, each number flows from its own setting",
    ),
    "audit_differed": (
        "an audited call made another block than the replay would have sent ({what}): replay "
        "stopped for this call key",
        "tell us the step (this is a gap in jit's rules); meanwhile the function runs its "
        "Python, which is always right.",
    ),
}


@dataclass(frozen=True)
class JitReason:
    """Why a jitted call key moved: a kind of :data:`REASONS` and its facts."""

    kind: str
    op: str | None = None  # the op the reason is about ('aten.mul.Tensor')
    arg: str | None = None  # its argument, or the setting ('argument 1', 'lr')
    line: str | None = None  # the user's line ('train.py:12')
    old: object = None  # the value before
    new: object = None  # the value now
    n: int | None = None  # a count (syncs per call, tensors kept alive, calls recorded)
    place: str | None = None  # where in the step's state, in words
    what: str | None = None  # what differed or no longer fits, in words

    def __post_init__(self):
        if self.kind not in REASONS:
            raise ValueError(f"gt_core.jit: unknown reason kind {self.kind!r}")

    def _fill(self) -> dict:
        d = {k: ("?" if v is None else v) for k, v in asdict(self).items()}
        d["old"], d["new"] = _shown(self.old), _shown(self.new)
        d["at"] = (
            f", the last at {self.line}"
            if self.kind == "sync" and self.line
            else (f" (at {self.line})" if self.line else "")
        )
        return d

    def text(self) -> str:
        """The reason in one sentence."""
        return REASONS[self.kind][0].format_map(self._fill())

    def fix(self) -> str:
        """What to do about it."""
        return REASONS[self.kind][1].format_map(self._fill())

    def explain(self) -> dict:
        """``{"id", "cause", "fix"}``, as the causes catalogue gives for other reasons."""
        cause = self.text().replace(" -> ", " → ")  # (the dashboard's arrow)
        return {"id": f"jit_{self.kind}", "cause": cause, "fix": self.fix()}

    def to_data(self) -> dict:
        return {k: _plain(v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_data(cls, d: dict) -> JitReason:
        return cls(**d)

    def __str__(self) -> str:
        return self.text()


def _shown(v) -> str:
    """A value as a reason shows it: a string (already words) as it is, else its repr."""
    return v if isinstance(v, str) else repr(v)


def _plain(v):
    """A value as JSON keeps it (numbers and strings as they are, the rest as its repr)."""
    return v if isinstance(v, (int, float, str, bool)) else repr(v)

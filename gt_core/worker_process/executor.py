"""The worker's executor: real tensors by id, and any aten op run by calling its OpOverload.

There are no per-op tables: an instruction names an OpOverload, its arguments (with Refs to
values) and the ids of its new tensor outputs. The same code runs in the worker process and,
for debugging and fast tests, in the client's own process.
"""

from __future__ import annotations

import importlib
import sys

import torch

from gt_core.errors import OutputMismatch, UnsupportedOperation
from gt_core.stream.instructions import (
    DEFOP,
    FREE,
    MARK,
    OP,
    PUT,
    RNG,
    SEED,
    Ref,
    op_name,
    resolve_op,
)
from gt_core.stream.meta import ValueMeta, value_meta
from gt_core.stream.placement import NONE, kind_of, placed
from gt_core.worker_process.outputs import described, fit, grad_on
from gt_core.worker_process.portable import for_device
from gt_core.worker_process.shard import local

__all__ = ["Executor", "describe_args", "Unresolved"]


def describe_args(args, kwargs) -> str:
    """'float32[3, 4], float32[5, 6], alpha=2' for an error message."""

    def one(a) -> str:
        if isinstance(a, torch.Tensor):
            return f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(one(x) for x in a) + "]"
        return repr(a)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class Unresolved:
    """An op the worker process cannot find (a DEFOP it could not resolve): each call raises.

    A ``torch.library`` op defined only in the client's process is the usual case. The
    instruction that calls it fails like any failing op (its outputs poisoned, the error
    raised at the next sync) and the worker keeps serving.
    """

    def __init__(self, qualified: str, exc: BaseException, module: str | None = None):
        self.qualified = qualified
        self.module = module
        ns, rest = qualified.split("::", 1) if "::" in qualified else ("?", qualified)
        self.namespace = ns
        self._opname, _, self._overloadname = rest.partition(".")
        self._overloadname = self._overloadname or "default"
        self.reason = f"{type(exc).__name__}: {exc}"

    def __call__(self, *args, **kwargs):
        m = self.module
        if m is None or m == "__main__":
            where = "put its definition in a module and name that module"
            m = "my_ops"
        else:
            where = f"it is defined in module '{m}' here: name that module"
        raise UnsupportedOperation(
            f"gt: the op '{self.qualified}' is not known to the worker process ({self.reason}). "
            "An op registered with torch.library in this process alone does not exist in the "
            f"worker: {where} in the worker_imports option (gt_core.configure(worker_imports="
            f"('{m}',)) or GT_WORKER_IMPORTS={m}), then call gt_core.worker().restart()."
        )

    def __repr__(self) -> str:
        return f"<unresolved op {self.qualified}>"


class Executor:
    """Executes instructions on real tensors held by id; remembers the first failure."""

    def __init__(self, device: torch.device, publish=None):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # Ops called as OpOverloads start CUDA below Python's lazy init, which then never
            # runs: torch.manual_seed stayed queued (seeds ignored) and synchronize skipped.
            torch.cuda.init()
        self.values: dict[int, torch.Tensor] = {}
        self.ops: dict[int, object] = {}
        self.unresolved: set[int] = set()  # op indices whose DEFOP named an op not found here
        self._device_arg: dict[int, int] = {}  # op -> how it names a device (placement.kind_of)
        self.error: BaseException | None = None  # first failure since the last sync
        self.poisoned: set[int] = set()  # ids whose producing instruction failed
        self.missing: dict[int, str] = {}  # ids an op did not make though inferred: why
        self.regraded: set[int] = set()  # op indices run again with grad mode on (outputs.py)
        self.publish = publish or (lambda events: None)
        self.executed = 0
        self._names: dict[int, str] = {}
        self.sharding = None  # a sharding worker group's ShardPolicy (None: ops called directly)

    def shard_with(self, policy) -> None:
        """A sharding group's rank: ops are called through ``policy`` (a ShardPolicy)."""
        self.sharding = policy

    # -- the stream ----------------------------------------------------------------------
    def execute(self, ins) -> None:
        """Run one instruction eagerly. What it raises is its error at the next sync (its
        outputs never computed): no instruction ends the worker's session."""
        code = ins.code
        try:
            if code == OP:
                self.run_op(ins)
            elif code == FREE:
                self.values.pop(ins.vid, None)
                self.poisoned.discard(ins.vid)
                self.missing.pop(ins.vid, None)
            elif code == PUT:
                value = ins.value
                if value.device != self.device:  # (a staged upload is read onto it already)
                    value = value.to(self.device)
                if self.sharding is not None:
                    value = self.sharding.place(value)
                self.values[ins.vid] = value
            elif code == DEFOP:
                self.define(ins.op, ins.name, ins.module)
            elif code == SEED:
                torch.manual_seed(ins.seed)
            elif code == RNG:
                torch.set_rng_state(ins.state)
            elif code == MARK and self.sharding is not None:
                self.sharding.mark(ins.name, ins.phase)
            # SYNC carries no work, nor MARK but for sharding; the engine reads them.
        except Exception as exc:
            made = [ins.vid] if code == PUT else []
            if self.fail_outputs(made, exc):
                _note(exc, f"(gt worker: raised by a {type(ins).__name__} instruction)")
        self.executed += 1

    def define(self, idx: int, qualified: str, module: str | None = None) -> None:
        """Op ``idx`` is ``qualified``; one not found here fails each instruction that uses it.

        ``module``: where the client's Python registered it. torch's own modules are imported
        here when needed (torch registers some ops only once such a module is imported, as
        torch.nn.functional.linear_cross_entropy does); a project's need worker_imports.
        """
        try:
            op = for_device(resolve_op(qualified), self.device)
        except Exception as exc:  # AttributeError from torch.ops, or a malformed name
            if module and module.startswith("torch.") and module not in sys.modules:
                try:
                    importlib.import_module(module)
                except Exception:
                    pass
                else:
                    return self.define(idx, qualified)
            self.ops[idx] = Unresolved(qualified, exc, module)
            self.unresolved.add(idx)
            self._device_arg[idx] = NONE
            return
        self.ops[idx] = op
        self._names.pop(idx, None)
        self.unresolved.discard(idx)
        self.regraded.discard(idx)
        self._device_arg[idx] = kind_of(op)

    def op_name(self, idx: int) -> str:
        """The name of op ``idx`` ('aten.add.Tensor')."""
        name = self._names.get(idx)
        if name is None:
            name = self._names[idx] = op_name(self.ops[idx])
        return name

    def run_op(self, ins):
        """Run one OP instruction: its result, or None where it failed. Each step (its
        arguments, the call, binding its outputs) that raises fails the op: its outputs
        never computed, the error raised at the next sync with the line that recorded it."""
        idx, outs = ins.op, ins.outs
        op, a, k = self.ops.get(idx), ins.args, ins.kwargs
        try:
            a, k = self.resolve(a), self.resolve(k)
            if (kind := self._device_arg[idx]) != NONE:
                k = placed(k, self.device, kind)
            result = self._call(op, a, k)
            pairs, lack = fit(op, result, outs)
            if lack and idx not in self.regraded:
                # Once per op: a backward's grads not asked for (its output_mask) are None with
                # grad mode on too, and each of its runs would run it twice.
                self.regraded.add(idx)
                whole = grad_on(op, lambda o: self._call(o, a, k), outs, lack)
                if whole is not None:
                    op, result, pairs, lack = whole
        except Exception as exc:
            self.fail(exc, op, a, k, outs)
            return None
        if op is not self.ops[idx]:  # (GradOn: it runs so from now on, in blocks too)
            self.ops[idx] = op
        self.values.update(pairs)
        for pos, oid in lack:
            said = f"returned None for its output {pos}, where the client inferred a tensor"
            self.missing[oid] = f"{op_name(op)} {said}"
        return result

    def _call(self, op, a, k):
        return op(*a, **k) if self.sharding is None else self.sharding.call(op, a, k)

    def fail(self, exc: BaseException, op, args, kwargs, outs) -> None:
        made = [o for o in outs if o is not None]
        self.poisoned.update(made)
        if self.error is not None:
            return
        if type(exc) is _Unavailable:  # an input failed earlier, or was freed: its error
            exc = _unavailable(op, self.missing.get(exc.args[0]))
        else:
            _note(exc, f"(gt worker: raised by {_name(op)}({describe_args(args, kwargs)}))")
        try:
            exc.gt_outs = made  # the client knows the line that recorded these
        except Exception:  # (an exception type that takes no attributes)
            pass
        self.error = exc

    def resolve(self, a):
        """Arguments with Refs replaced by the values they name (a KeyError where one is
        missing: never computed, or freed); no generators: it runs for every argument."""
        t = type(a)
        if t is Ref:
            if a.id in self.poisoned:
                raise _Unavailable(a.id)
            try:
                return self.values[a.id]
            except KeyError:
                raise _Unavailable(a.id) from None
        if t is list or t is tuple:
            return [self.resolve(x) for x in a] if t is list else tuple(map(self.resolve, a))
        if t is dict:
            return {k: self.resolve(v) for k, v in a.items()}
        return a

    # -- what the hot-path engine does besides instructions ------------------------------
    def meta(self, vid: int) -> ValueMeta | None:
        """The metadata of value ``vid``, or None if there is none."""
        t = self.values.get(vid)
        return None if t is None else value_meta(t)

    def lookup(self, ids) -> list[torch.Tensor]:
        """The values of ``ids``, in order (KeyError if one is missing)."""
        values = self.values
        return [values[i] for i in ids]

    def bind_outputs(self, ids, outs, sig: str = "?") -> None:
        """Values computed together (hot path ``sig``'s outputs) become ``ids``. Where they do
        not fit (another count, or no tensor for one), those ids are never computed."""
        if len(outs) != len(ids):
            why = f"the hot path {sig} returned {len(outs)} values, where {len(ids)} were expected"
            self.fail_outputs(ids, OutputMismatch(f"gt worker: {why}"))
            return
        values = self.values
        for vid, value in zip(ids, outs, strict=True):
            if isinstance(value, torch.Tensor):
                values[vid] = value
            else:
                self.missing[vid] = f"the hot path {sig} returned {value!r} for it, not a tensor"

    def drop(self, ids) -> None:
        """Forget ``ids`` (freed by instructions that ran as one call, or not at all)."""
        values = self.values
        for vid in ids:
            values.pop(vid, None)
            self.missing.pop(vid, None)

    def fail_outputs(self, ids, exc: BaseException) -> bool:
        """``ids`` were never computed; ``exc`` is the error the next sync raises unless an
        earlier one is pending. Whether ``exc`` is that error."""
        self.poisoned.update(ids)
        if self.error is not None:
            return False
        self.error = exc
        return True

    def count(self, n: int) -> None:
        """``n`` instructions ran without passing through ``execute`` (as one call)."""
        self.executed += n

    # -- requests (each follows a barrier) ----------------------------------------------
    def take_error(self) -> BaseException | None:
        err, self.error = self.error, None
        return err

    def fetch(self, vid: int) -> torch.Tensor:
        if vid in self.missing:
            raise OutputMismatch(f"gt: this value was never made: {self.missing[vid]}")
        if vid in self.poisoned:
            raise RuntimeError(
                "gt: this value was never computed: the op that makes it failed earlier"
            )
        # The worker's own tensor: the transport copies it out (staged, or cloned in process),
        # lazy conjugate and negative bits applied, a view's storage beyond it left behind.
        # A sharded value is made whole (a collective: every rank of the group fetches it).
        value = self.values[vid].detach()
        return value if self.sharding is None else self.sharding.whole(value)

    def call(self, idx: int, args, kwargs, base_id: int):
        """Run one op now (a sync op) and describe its outputs for the client."""
        op = self.ops[idx]
        try:
            a, k = self.resolve(args), self.resolve(kwargs)
        except _Unavailable as exc:
            raise _unavailable(op, self.missing.get(exc.args[0])) from None
        if (kind := self._device_arg[idx]) != NONE:
            k = placed(k, self.device, kind)
        try:
            result = op(*a, **k) if self.sharding is None else self.sharding.read(op, a, k)
        except Exception as exc:
            _note(exc, f"(gt worker: raised by {op_name(op)}({describe_args(a, k)}))")
            raise
        if type(result) in (int, float, bool, complex):  # .item(): nothing to describe
            return result, base_id
        return described(op, result, (a, k), (args, kwargs), self.values, base_id)

    def stats(self) -> dict:
        return {
            "values": len(self.values),
            "executed": self.executed,
            "bytes": sum(
                t.untyped_storage().nbytes()
                for t in map(local, self.values.values())
                if t.layout == torch.strided  # (the only kind there is: see upload and call)
            ),
        }


def _unavailable(op, why: str | None) -> BaseException:
    """The error of ``op`` using a value that is not there; ``why``: why it was never made."""
    if why is None:
        return RuntimeError(f"gt worker: {_name(op)} used a value that does not exist")
    return OutputMismatch(
        f"gt worker: {_name(op)} used a value that was never made: {why}. Run this op "
        "outside gt_core.capture() (bring its inputs home with .cpu()), and report it to gt."
    )


class _Unavailable(KeyError):
    """An argument names a value that is not there: never computed, or freed."""


def _name(op) -> str:
    """The op's name for an error ('aten.mm.default'), whatever ``op`` is."""
    try:
        return op_name(op)
    except Exception:
        return repr(op)


def _note(exc: BaseException, note: str) -> None:
    try:
        exc.add_note(note)
    except Exception:  # (a frozen exception object)
        pass

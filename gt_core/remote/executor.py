"""The worker's executor: real tensors by id, and any aten op run by calling its OpOverload.

There are no per-op tables: an instruction names an OpOverload, its arguments (with Refs to
values) and the ids of its new tensor outputs. The same code runs in the worker process and,
for debugging and fast tests, in the client's own process.
"""

from __future__ import annotations

import importlib
import sys

import torch
from torch.utils._pytree import tree_flatten

from gt_core.errors import UnsupportedOperation
from gt_core.remote.portable import for_device
from gt_core.remote.shard import local
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
from gt_core.stream.meta import Made, ValueMeta, tensor_meta, value_meta

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
        self._device_arg: dict[int, bool] = {}
        self.error: BaseException | None = None  # first failure since the last sync
        self.poisoned: set[int] = set()  # ids whose producing instruction failed
        self.publish = publish or (lambda events: None)
        self.executed = 0
        self._names: dict[int, str] = {}
        self.sharding = None  # a sharding worker group's ShardPolicy (None: ops called directly)

    # -- the stream ----------------------------------------------------------------------
    def execute(self, ins) -> None:
        """Run one instruction eagerly."""
        code = ins.code
        if code == OP:
            self.run_op(ins)
        elif code == FREE:
            self.values.pop(ins.vid, None)
            self.poisoned.discard(ins.vid)
        elif code == PUT:
            value = ins.value
            if value.device != self.device:  # (a staged upload is read onto it already)
                value = value.to(self.device)
            self.values[ins.vid] = value if self.sharding is None else self.sharding.place(value)
        elif code == DEFOP:
            self.define(ins.op, ins.name, ins.module)
        elif code == SEED:
            torch.manual_seed(ins.seed)
        elif code == RNG:
            torch.set_rng_state(ins.state)
        elif code == MARK and self.sharding is not None:
            self.sharding.mark(ins.name, ins.phase)
        # SYNC carries no work, nor MARK but for sharding; the engine reads them.
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
            self._device_arg[idx] = False
            return
        self.ops[idx] = op
        self._names.pop(idx, None)
        self.unresolved.discard(idx)
        self._device_arg[idx] = any(a.name == "device" for a in op._schema.arguments)

    def op_name(self, idx: int) -> str:
        """The name of op ``idx`` ('aten.add.Tensor')."""
        name = self._names.get(idx)
        if name is None:
            name = self._names[idx] = op_name(self.ops[idx])
        return name

    def run_op(self, ins):
        idx, outs = ins.op, ins.outs
        try:
            a = self.resolve(ins.args)
            k = self.resolve(ins.kwargs)
        except KeyError:  # an input failed earlier (or was freed): propagate, one error only
            self.poisoned.update(o for o in outs if o is not None)
            if self.error is None:
                self.error = RuntimeError(
                    f"gt worker: {op_name(self.ops[idx])} used a value that does not exist"
                )
            return None
        if self._device_arg[idx]:
            k = self._place(k)
        try:
            op = self.ops[idx]
            result = op(*a, **k) if self.sharding is None else self.sharding.call(op, a, k)
        except Exception as exc:
            self.fail(exc, self.ops[idx], a, k, outs)
            return None
        self.bind(result, outs)
        return result

    def bind(self, result, outs) -> None:
        if not outs:
            return
        if isinstance(result, torch.Tensor):
            self.values[outs[0]] = result
            return
        values = self.values
        flat = [x for x in tree_flatten(result)[0] if isinstance(x, torch.Tensor)]
        for oid, t in zip(outs, flat, strict=True):
            if oid is not None:
                values[oid] = t

    def fail(self, exc: BaseException, op, args, kwargs, outs) -> None:
        made = [o for o in outs if o is not None]
        self.poisoned.update(made)
        if self.error is None:
            try:
                exc.add_note(f"(gt worker: raised by {op_name(op)}({describe_args(args, kwargs)}))")
                exc.gt_outs = made  # the client knows the line that recorded these
            except Exception:
                pass
            self.error = exc

    def resolve(self, a):
        """Arguments with Refs replaced by the values they name (KeyError if missing)."""
        t = type(a)
        if t is Ref:
            if a.id in self.poisoned:
                raise KeyError(a.id)
            return self.values[a.id]
        if t is list or t is tuple:
            return t(self.resolve(x) for x in a)
        if t is dict:
            return {k: self.resolve(v) for k, v in a.items()}
        return a

    def _place(self, kwargs: dict) -> dict:
        # The client sees every worker tensor as a CPU tensor; the worker owns its device.
        dev = kwargs.get("device")
        if dev is None or torch.device(dev).type == "cpu":
            kwargs = dict(kwargs, device=self.device)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return kwargs

    # -- what the hot-path engine does besides instructions ------------------------------
    def meta(self, vid: int) -> ValueMeta | None:
        """The metadata of value ``vid``, or None if there is none."""
        t = self.values.get(vid)
        return None if t is None else value_meta(t)

    def lookup(self, ids) -> list[torch.Tensor]:
        """The values of ``ids``, in order (KeyError if one is missing)."""
        values = self.values
        return [values[i] for i in ids]

    def bind_outputs(self, ids, outs) -> None:
        """Values computed together (a block's outputs) become ``ids``."""
        values = self.values
        for vid, value in zip(ids, outs, strict=True):
            values[vid] = value

    def drop(self, ids) -> None:
        """Forget ``ids`` (freed by instructions that ran as one call, or not at all)."""
        values = self.values
        for vid in ids:
            values.pop(vid, None)

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
        a, k = self.resolve(args), self.resolve(kwargs)
        if self._device_arg[idx]:
            k = self._place(k)
        op = self.ops[idx]
        try:
            result = op(*a, **k) if self.sharding is None else self.sharding.read(op, a, k)
        except Exception as exc:
            try:
                exc.add_note(f"(gt worker: raised by {op_name(op)}({describe_args(a, k)}))")
            except Exception:
                pass
            raise
        if type(result) in (int, float, bool, complex):  # .item(): nothing to describe
            return result, base_id
        _dense_only(op, result)
        inputs = {
            id(v): r.id
            for v, r in zip(
                tree_flatten(a)[0] + tree_flatten(k)[0],
                tree_flatten(args)[0] + tree_flatten(kwargs)[0],
                strict=False,
            )
            if isinstance(r, Ref)
        }
        next_id = [base_id]

        def describe(x):
            if isinstance(x, torch.Tensor):
                if id(x) in inputs:  # in-place: the output is an input
                    return Ref(inputs[id(x)])
                vid = next_id[0]
                next_id[0] += 1
                self.values[vid] = x
                return Made(vid, tensor_meta(x))
            if isinstance(x, (list, tuple)):
                return type(x)(describe(y) for y in x)
            return x

        return describe(result), next_id[0]

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


def _dense_only(op, result) -> None:
    """A sync op's tensor outputs must be dense (strided): worker tensors are no other kind."""
    for x in tree_flatten(result)[0]:
        if isinstance(x, torch.Tensor) and x.layout != torch.strided:
            raise UnsupportedOperation(
                f"gt: {op_name(op)} made a {x.layout} tensor; worker tensors are dense "
                "(strided) only. Bring the input home first (t.cpu()): ops on plain "
                "tensors run in this process, inside capture too."
            )

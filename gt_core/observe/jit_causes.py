"""The catalogue's causes for gt_core.jit: why a step is not replayed, and what to change.

Each pattern matches a reason gt_core.jit gives (gt_core.client.jit, jit_recipe) in its
refusal (kind ``jit_refused``) or when a replayed call's input no longer fits (``jit_ran``);
the last of each kind matches any reason: the general advice.
"""

from __future__ import annotations

from gt_core.observe.cause import Cause

__all__ = ["JIT_CAUSES"]

_KEEPS_RUNNING = "The function keeps running its Python meanwhile (its block still compiles)."

JIT_CAUSES: tuple[Cause, ...] = (
    Cause(
        "jit_sync",
        ("jit_refused",),
        r"a sync inside the step \((?P<n>\d+) per call",
        "the step syncs {n} time(s) per call (.item(), printing a tensor, a data-dependent "
        "shape): a replay has no Python to answer it",
        "move the sync out of the jitted function: return the loss and read it outside "
        "(loss.item() every k steps), or keep running values on the worker and read them "
        "once. " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_python_number",
        ("jit_refused",),
        r"a Python number the step passes to (?P<op>\S+) \((?P<arg>[^)]*)\) changed between "
        r"calls \((?P<old>.*?) -> (?P<new>.*?)\)",
        "a Python number passed to {op} ({arg}) changed between calls ({old} → {new}): a "
        "replay would freeze it",
        "make it a tensor the step reads (lr=torch.tensor(0.01), an optimizer with "
        "capturable=True) and update that tensor outside the step (a scheduler does). "
        + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_python_result",
        ("jit_refused",),
        r"returns a Python value that changes \((?P<old>.*?) -> (?P<new>.*?)\)",
        "the step returns a Python value that changes ({old} → {new})",
        "return tensors only; compute the Python value outside the jitted function. "
        + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_seeds",
        ("jit_refused",),
        r"seeds (?:or sets )?the (?:random )?generator",
        "the step seeds or sets the random generator each call (torch.manual_seed inside it)",
        "seed once before the loop, outside the jitted function. " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_uploads",
        ("jit_refused",),
        r"uploads data|makes a tensor of more than \d+ elements from host data each "
        r"call(?P<at> \(at [^)]*\))?",
        "the step uploads data each call{at}: a batch or a tensor made from host data inside it",
        "make it before the loop and pass it to the step as an argument (or create it on the "
        "worker inside the capture). " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_host_data_changes",
        ("jit_refused",),
        r"a tensor the step makes from host data(?P<at> \(at [^)]*\))? changes between calls "
        r"\((?P<old>.*?) -> (?P<new>.*?)\)",
        "a tensor the step makes from host data{at} changes between calls ({old} → {new}): a "
        "replay would freeze it",
        "pass it to the step as an argument, or compute it from tensors the step reads. "
        + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_written_constant",
        ("jit_refused",),
        r"makes a tensor from host data(?P<at> \(at [^)]*\))? and writes it in place "
        r"\((?P<op>[^)]*)\)",
        "the step writes in place ({op}) to a tensor it makes from host data{at}: a replay "
        "would start from the written one",
        "write to a copy (torch.tensor(...).clone()) or use the out-of-place op (x = x + 1 "
        "rather than x.add_(1)). " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_unreachable",
        ("jit_refused",),
        r"reads a worker tensor jit cannot find again",
        "the step reads a tensor jit cannot find again (not an argument, nor reachable from "
        "its closure or globals through modules, optimizers, dicts, lists, objects' attributes)",
        "pass that tensor as an argument, or keep it on a module, an optimizer or a dict "
        "the step's closure or globals reach. " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_kept_alive",
        ("jit_refused",),
        r"(?P<n>\d+) tensor\(s\) the step makes stay alive",
        "{n} tensor(s) the step makes stay alive where jit cannot put them again (appended "
        "to a list, kept by an autograd graph)",
        "return them from the step, or keep Python numbers instead (losses.append(loss) "
        "outside the step, .detach() what is kept). " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_returns_input",
        ("jit_refused",),
        r"returns a tensor it did not make",
        "the step returns a tensor it did not make (one of its inputs)",
        "return only what the step computes (the caller has its inputs already), or a copy "
        "(x.clone()). " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_moves_tensor",
        ("jit_refused",),
        r"moves a tensor into (?P<place>.*?): replay cannot",
        "the step moves a tensor it did not make into {place}",
        "assign a tensor the step computes there, or make that assignment outside the "
        "step. " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_no_block",
        ("jit_refused",),
        r"(?P<n>\d+) calls recorded without a block",
        "{n} calls recorded without a repeating block: the step does different work each "
        "call (a Python branch, a shape that changes, a sync that cuts it)",
        "keep each call's work the same: move branches (every N steps) and changing shapes "
        "out of the jitted function, or jit each variant as its own function. " + _KEEPS_RUNNING,
    ),
    Cause(
        "jit_refused",
        ("jit_refused",),
        r"",
        "gt_core.jit does not replay this function",
        "the function keeps running its Python (its block still compiles); to replay it, keep "
        "syncs out of the step and pass changing numbers as tensors (lr=torch.tensor(...), "
        "capturable=True)",
    ),
    Cause(
        "jit_unfit",
        ("jit_ran",),
        r"^(?P<where>.*?) no longer fits the block \((?P<got>.*)\)",
        "{where} no longer fits the replayed block ({got}): that call ran its Python",
        "nothing, if the change was meant: recording starts over and replay resumes once "
        "two calls record the same block. To keep replaying, update tensors in place "
        "(p.copy_(new)) rather than binding a new one",
    ),
    Cause(
        "jit_ran",
        ("jit_ran",),
        r"",
        "an input of the replayed block no longer fits it (a parameter or state replaced, "
        "or its shape, dtype or device changed): that call ran its Python",
        "nothing, if the change was meant: recording starts over and replay resumes once "
        "two calls record the same block. To keep replaying, update tensors in place "
        "(p.copy_(new)) rather than binding a new one",
    ),
    Cause(
        "jit_frozen",
        ("jit_frozen",),
        r"",
        "a replay keeps Python numbers as recorded",
        "nothing, if these stay as they are; a number you change later (a learning rate) must "
        "be a tensor the step reads, or replays keep the old value",
    ),
    Cause(
        "jit_would_save",
        ("jit_would_save",),
        r"",
        "the step's Python costs more on the client than its block on the worker",
        "wrap the step in @gt_core.jit: once two calls recorded the same block, a call sends "
        "one message instead of running its Python (see the 05_jit notebook and its contract)",
    ),
)

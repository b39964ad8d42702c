"""``gt_core.jit``: once a step is known, a call sends one message instead of running its Python.

Inside ``capture()`` (or a ``%%gt`` cell), a call of a jitted function is first recorded as
any code is, with marks around it, so the worker sees exactly the call as one block. Once two
recorded calls with the same key (its tensor arguments' metadata, its other arguments'
values) made the same block, and the worker has sent that block's plan, a call no longer
runs the function: it reads the block's inputs where the recorded call found them (its
arguments, parameters, their ``.grad``, optimizer state), sends one RUN, and puts proxies for
the block's outputs where the recorded call left them (its result, ``.grad``, optimizer
state). The worker runs the block compiled (eagerly until its compile is done).

Recorded calls run library code as torch.compile traces it: ``torch.compiler.is_compiling()``
is true (``transformers`` skips its data-dependent checks), but not inside an optimizer's
step: optimizers run as written, so their numbers are eager's to the bit (``traced``).

Contract (what a replayed call does not repeat)
  * Tensors flow. So do the numbers an optimizer's step computes from its float settings
    (``lr``, betas, weight decay) and from values it reads from small tensors (Adam's step
    count, a tensor lr): they become inputs of the block, and a replayed call sends them
    computed from the settings as they are now (``settings``; a schedule replays from the
    first recipe, per step or per epoch). A number is tied to every expression that gave it
    on both recorded calls (two param groups with one lr), and sent only while they agree.
    A setting is compared before every replay instead, and a change records again, where
    the step's Python branches on it or takes it out of arithmetic (``if weight_decay !=
    0``, ``math.sqrt``), or a number of it is held in the block (an op outside the
    optimizer's step passed its value, a tensor made from it).
  * The Python numbers of the step's own state (a list's item, a global, an attribute of
    a trainer or a module) follow the same rules: a float is a setting of its own (``alpha=
    -lr[0]`` of a hand-written update flows once two recorded calls saw it differ), and what
    the Python tests of any float (``if cfg["thr"] > 0.5``, ``int()``, ``float()``) is
    checked before each replay: another outcome records the call again. Every int and bool
    the step reaches is compared (C reads them: ``range(n)``, a shape). Other Python numbers
    the step passes to ops are frozen as the recorded calls had them; where they differ
    between recorded calls, replay is refused with the op and the values, and the function
    keeps running (compiled as any hot path).
  * An LR scheduler the step steps is stepped by each replay after its RUN. With float
    settings its step is Python alone and the block goes on past it (``model.zero_grad()``
    and ``return loss.detach()`` after it, as transformers' Trainer orders its step, are in
    the block); an optimizer's step or a setting's number after it refuses replay. With a
    tensor lr its step (and its ops on the tensor) ends the block, and any work after it
    refuses replay (``schedulers``).
  * A call key holds each tensor argument's metadata wherever its storage begins: batches
    sliced from one tensor (``data[i : i + n]``) are one key. Where both recorded calls had
    an argument at one offset the block is replayed there alone; where they differed and a
    result followed the offset (a view of the argument returned or kept), replay is refused.
  * Every tensor slot the step reaches is as the recorded call found it (empty, or a
    tensor of its metadata; one tensor in two places in both), and so is every container
    on the way (an optimizer's state, a submodule), else the call runs its Python (a
    checkpoint loaded, a parameter rebound); but a ``.grad`` the block adds
    to, found empty (``zero_grad(set_to_none=True)`` before the first micro-batch), is
    filled with zeros first, so accumulating over calls replays one block.
  * Tensors the step makes from host data (``torch.tensor([...])``, a cache's empty
    tensors) are frozen into the block when equal on the recorded calls, and listed with
    the line that made them; one that differs is data: replay is refused naming that line.
  * Python side effects are not repeated: prints, appends to lists, attributes other than
    the tensor state above, Python's own random numbers.
  * A sync inside the step (``.item()``, printing a tensor, data-dependent shapes) refuses
    replay: the step needs its Python.
  * Tensors the step reads must be reachable from its arguments, closure or globals (its
    own, or those of the Python functions it calls, three levels deep) through tensors,
    modules, optimizers, LR schedulers, dicts, lists, tuples and the attributes of
    plain objects (a KV cache and its layers); outputs the same.
  * Outputs of a replayed call are detached (no autograd graph leads to them).
Never a wrong replay: an input that no longer fits (a parameter replaced, its metadata
changed) runs the function instead, with the reason as an event; the worker checks each
RUN's inputs against the block as well. The first replay after each recipe, and then one in
``Options.jit_audit`` (``GT_JIT_AUDIT``), is recorded instead and compared with what the
replay would have sent (``audit``): a difference no rule foresaw stops replay, with what
differed.

The package, one concept a module: ``function`` (the decorator and its call keys), ``entry``
(a key's state machine: the table is ``gt_core.observe.jit_states``), ``reach`` (the one walk
over the state a step reaches), ``knob`` (floats that remember how they were computed, and
what Python tested of them), ``settings`` (optimizer settings and the state's numbers that
flow or are compared),
``program`` (values read from small tensors, read again by a replay), ``traced`` (how a
call records), ``schedulers`` (an LR scheduler's step, outside the block), ``recording``
(one recorded call, and what two say together), ``recipe`` (what a replay reads and
writes), ``replay`` (one replayed call), ``audit`` (a recorded call compared with the
replay it stands for).
"""

from gt_core.client.jit.function import Jit, jit

__all__ = ["jit", "Jit"]

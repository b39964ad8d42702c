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
is true (optimizers compute Adam's bias corrections as tensor ops; ``transformers`` skips
its data-dependent checks), and the step's optimizers are ``capturable`` while it records
(restored after; never a param group whose lr is zero, where torch's capturable Adam makes
NaN): the block then reads the step count, not a new Python number per call.

Contract (what a replayed call does not repeat)
  * Tensors flow, and so do the float settings of the optimizers the step reaches (``lr``,
    betas, weight decay) that changed between the two recorded calls: the numbers the step
    computed from them by arithmetic become inputs of the block, and a replayed call sends
    them computed from the settings as they are now (``settings``; a per-step LR schedule
    replays). A number is tied to every setting expression that gave it on both recorded
    calls (two param groups with one lr), and sent only while they all agree. Other Python values the step reads are frozen as the recorded calls had them;
    where they differ between recorded calls, replay is refused with the op and the values,
    and the function keeps running (compiled as any hot path). The settings that do not
    flow are compared before every replay: after a change (a StepLR's step) the function
    records one call again, compared with the last one recorded, so a frozen setting is
    never replayed stale and the changed one flows from then on.
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
over the state a step reaches), ``settings`` (optimizer settings that flow or are compared),
``traced`` (how a call records), ``recipe`` (recorded calls and what a replay reads and
writes), ``audit`` (a recorded call compared with the replay it stands for).
"""

from gt_core.client.jit.function import Jit, jit

__all__ = ["jit", "Jit"]

"""The catalogue's causes for gt's own hot paths: what the dashboard's reasons table says to do."""

from __future__ import annotations

from gt_core.observe.cause import Cause

__all__ = ["HOTPATH_CAUSES"]

# Dynamic shapes, suggested unless the hot path was compiled with them.
_DYNAMIC = (("dynamic", True, ", or --dynamic", ()),)

HOTPATH_CAUSES: tuple[Cause, ...] = (
    # -- gt's own hot paths: what the dashboard's reasons table says to do ----------------
    # A recompile: the first difference between two signatures, typed (observe.graph.Change);
    # each cause's id is a change's kind, and nothing matches the words.
    Cause(
        "batch_size",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "the batch size changed ({old} → {new})",
        "use a fixed batch size (DataLoader(..., drop_last=True)){tries}",
        _DYNAMIC,
    ),
    Cause(
        "input_shape",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "an input shape changed",
        "pad or bucket to a few fixed shapes{tries}",
        _DYNAMIC,
    ),
    Cause(
        "input_dtype",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "an input dtype changed",
        "cast once before the loop and use autocast the same way every step",
    ),
    Cause(
        "input_stride",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "an input's memory layout changed (a transposed or sliced tensor)",
        "call .contiguous() on it",
    ),
    Cause(
        "input_device",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "an input moved to another device",
        "move the model and data once, before the loop",
    ),
    Cause(
        "python_number",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "a Python number changed between iterations (a step counter, a learning-rate schedule)",
        "pass it as a tensor (torch.tensor(lr)), or use the optimizer's capturable=True",
    ),
    Cause(
        "kept_value",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "a value is kept in one iteration and not the next (e.g. losses.append(loss))",
        "keep what the loop holds on to the same every step (losses.append(loss.item()))",
    ),
    Cause(
        "different_work",
        ("signature_change",),
        None,  # (chosen by the change's kind, never by words: observe.graph.Change)
        "the loop did different work (a Python branch, e.g. every N steps)",
        "move the branch out of the loop, or accept one compiled variant per branch",
    ),
    # One advice per kind, whatever the reason's text.
    Cause(
        "revert",
        ("revert",),
        r"",
        "the compiled block was slower than eager",
        "the compiled block was slower than eager, so gt runs it eagerly again. Small blocks "
        "are launch-bound: try a larger batch{tries}",
        (
            ("backend", "aot_eager", ", or --backend aot_eager", ("eager",)),
            ("mode", "reduce-overhead", ", or --mode reduce-overhead on a GPU (CUDA graphs)", ()),
        ),
    ),
    Cause(
        "compile_failed",
        ("compile_failed",),
        r"",
        "the compile, or a compiled run, failed",
        "the block runs eagerly (correct, not faster).{tries} To report it, attach an "
        "instruction log (--log PATH) and this reason",
        (
            (
                "backend",
                "aot_eager",
                " Try --backend aot_eager to see whether the inductor backend is at fault.",
                ("eager",),
            ),
            ("backend", "eager", " Try --backend eager to check the capture itself.", ()),
        ),
    ),
    Cause(
        "retired",
        ("retired",),
        r"",
        "the block repeated inside a longer period (e.g. the backward or the optimizer's "
        "update of alike layers inside a training step), so it is matched no more",
        "nothing to do: the longer hot path its reason names runs these instructions, "
        "with the rest of its period",
    ),
    Cause(
        "sync_cut",
        ("sync",),
        r"",
        "a sync point (.item(), print, .cpu()) cut occurrences short",
        "those occurrences ran eagerly (correct, not faster). Once at the end of a loop or "
        "now and then for logging costs little; a sync in every iteration keeps the block "
        "from running compiled: log every k steps, or keep running values on the worker and "
        "read them once",
    ),
    Cause(
        "diverged",
        ("mismatch",),
        r"",
        "occurrences diverged from the block",
        "the loop body changed part-way through a block (a data-dependent branch or a sync "
        "such as .item()); those occurrences ran eagerly. Keep every iteration's work the "
        "same",
    ),
    # The data a loop moves (gt_core.observe.feeding: ``what`` says how much of the loop).
    Cause(
        "feeding",
        ("uploads",),
        r"",
        "feeding data {what}: {bytes} uploaded per iteration take {ms} of each iteration's "
        "{pace} (the step: {step})",
        "keep the dataset on the worker: create it inside the capture, or move it once with "
        "gt_core.to_worker(X); then give it to the DataLoader as a TensorDataset (a batch is "
        "one indexing op per tensor there), or take each epoch's batches as views of it "
        "in one go "
        "(perm = torch.randperm(len(X)) inside the capture, then "
        "zip(X[perm].split(b), Y[perm].split(b))), so that batches are worker tensors, not "
        "uploads. Slicing X[i:i + b] anew each step changes a number every iteration, which "
        "keeps the loop from compiling",
    ),
    Cause(
        "rows-draw",
        ("rows",),
        None,  # (chosen by its id where the rows' draws are counted: observe.feeding)
        "{dataset}'s rows draw from the global generator: {draws} draws for a batch of {rows} "
        "rows, each made on the worker (eager's stream of random numbers is there), and the "
        "batch is built there op by op ({ops} ops)",
        "draw from a torch.Generator the dataset holds (torch.rand(..., generator=self.g): "
        "drawn in the kernel as in eager, and the batch stays a host batch that goes up in "
        "one copy per tensor), or load with num_workers >= 1 (the loader's processes draw "
        "their own numbers, as in eager)",
    ),
    Cause(
        "rows",
        ("rows",),
        r"",
        "{dataset}'s batches are built on the worker op by op: {ops} ops for a batch of {rows} "
        "rows (its tensors live on the worker, and each row is indexed with its own number, "
        "another every step, which no hot path holds)",
        "make the dataset's tensors outside the capture (the DataLoader then builds each "
        "batch in the kernel, and it goes up in one copy per tensor), or hold them in a "
        "TensorDataset (a batch is then one indexing op per tensor on the worker)",
    ),
    Cause(
        "fetching",
        ("fetches",),
        r"",
        "fetching data {what}: syncs fetch {bytes} per iteration, copied out in {ms} of each "
        "iteration's {pace} (the step: {step}) while the worker waits",
        "fetch less often (every k steps), or less: a sum, a mean or an argmax instead of the "
        "whole tensor",
    ),
    Cause(
        "worker_error",
        ("worker_error",),
        r"",
        "an op raised on the worker",
        "raised in the cell at the first sync after it (or at the cell's end); the values "
        "this op was to make, and those computed from them, do not exist: fix that line and "
        "re-run",
    ),
)

"""What each option does, in words: the docs' configuration page is made from this table,
with each option's variable and default (``gt_core.options``)."""

from __future__ import annotations

__all__ = ["HELP"]


HELP = {  # option -> what it does
    "auto_compile": "compile hot paths once detected; off, hot paths are not looked for and blocks compiled before run as their eager graphs (said once per block)",
    "compile_all": "compile every block between sync points at first sight",
    "threshold": "repeats in a row that make a block hot",
    "min_seq": "shortest block (instructions)",
    "window": "instructions of history searched",
    "backend": "how blocks compile",
    "mode": "how blocks compile",
    "dynamic": "compile with dynamic shapes",
    "regression_samples": "compiled runs timed before a revert is considered",
    "debug": "`1`: a line per detection, compile, fallback, revert; `2`: also mismatches",
    "log": "every event as a JSON line",
    "config": "YAML of named signals, e.g. `training_step: {compile: true}`, `batch: {shard: {axis: 0, workers: [0, 1]}}`",
    "worker": '`inprocess` runs the same executor in this process; `tcp://HOST:PORT` uses a remote worker (see "A remote worker")',
    "workers": 'ranks of a local worker group (torch.distributed, gloo on the CPU; see "A worker group")',
    "shard": 'with `workers` >= 2: signals whose tensors are sharded, `batch=0` (a dict in `configure`, `%%gt --shard batch=0`; see "Sharding")',
    "authkey_file": "the file holding a remote worker's key (the one its `--authkey-file` names); `gt_core.connect(..., authkey=...)` gives it directly",
    "device": "the worker's device when it starts: `auto` (CUDA if present, else the CPU), `cpu`, `cuda`, `cuda:N`",
    "background": "compile off the critical path",
    "client_match": "once a block is hot, the client sends each occurrence as one message",
    "compile_process": "background inductor compiles (CPU worker) run in a low-priority process of their own; `0`: in a thread of the worker",
    "worker_threads": "a fixed count of the worker process's CPU threads (a capture's own applies from its start); none: eager's count for ops run eagerly, shared for compiled runs, see below",
    "flush_at": "instructions the client batches before it sends them to the worker",
    "jit_audit": "`gt_core.jit` records (audits) one replayed call in this many and compares it with the replay; `0`: only the first after each recording",
    "user_eager_every": "diagnostics of your own `torch.compile`: one call in this many of a compiled function runs eagerly (at most 5 per function, only where the inputs equal the last compiled call's), so its compiled calls are timed against eager on the same inputs; `0`: none, and the report says the comparison is off",
    "worker_imports": "modules the worker imports when it starts, before serving (comma-separated; a tuple in `configure`): where a project's own `torch.library` ops are defined, so the worker knows them. An op the worker does not know fails at the next sync, naming it; a module that fails to import fails the worker's start",
}

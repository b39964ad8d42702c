"""Options: one dataclass, read from GT_* environment variables and overridden per capture."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from gt_core.errors import ConfigError

__all__ = [
    "Options",
    "from_env",
    "ENV",
    "load_signals",
    "shard_axes",
    "check",
    "parse",
    "accepted",
    "remote_address",
]

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
WORKERS = ("process", "inprocess")
REMOTE = re.compile(r"tcp://(\[[0-9a-fA-F:]+\]|[\w.-]+):(\d{1,5})")  # a remote worker's address


def remote_address(worker: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://HOST:PORT`` worker option (None: a local worker)."""
    m = REMOTE.fullmatch(worker) if isinstance(worker, str) else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    return m.group(1).strip("[]"), int(m.group(2))


DEVICE_HINT = "auto (CUDA if present, else the CPU), cpu, or cuda / cuda:N where a CUDA device is"


def _device_ok(device) -> bool:
    if device in ("auto", "cpu"):
        return True
    if not isinstance(device, str) or not re.fullmatch(r"cuda(:\d+)?", device):
        return False
    import torch

    index = int(device.partition(":")[2] or 0)
    return torch.cuda.is_available() and index < torch.cuda.device_count()


@dataclass(frozen=True)
class Options:
    """How gt records, detects and compiles; every field has a GT_* environment variable."""

    auto_compile: bool = True  # compile hot paths once detected
    compile_all: bool = False  # compile every flushed block on first sight
    threshold: int = 5  # repeats in a row that make a block hot
    min_seq: int = 8  # shortest block worth compiling (instructions)
    window: int = 8192  # instructions of history searched for a repeat
    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool = False
    debug: int = 0  # 1: a line per detection/compile/fallback/revert; 2: also mismatches
    log: str | None = None  # instruction log: every event as a JSON line
    config: str | None = None  # YAML file of named signals
    worker: str = "process"  # or "inprocess" (no second process), or "tcp://HOST:PORT" (remote)
    authkey_file: str | None = None  # a remote worker's key (see gt_core.connect)
    workers: int = 1  # ranks of a local worker group (torch.distributed; see client.group)
    device: str = "auto"  # the worker's device: auto (CUDA if present), cpu, cuda, cuda:N
    regression_samples: int = 5  # compiled runs timed before a revert is considered
    background: bool = True  # compile off the critical path (eager runs meanwhile)
    client_match: bool = True  # the client sends a hot block's occurrence as one message
    compile_process: bool = True  # inductor compiles in a process of their own (CPU worker)
    worker_threads: int | None = None  # the worker process's CPU threads, fixed (None: shared)
    flush_at: int = 512  # instructions the client batches before it sends them
    jit_audit: int = 256  # gt_core.jit records (audits) 1 replay in this many; 0: the first only
    user_eager_every: int = 10  # 1 call in this many of a user's compiled function runs eagerly
    worker_imports: tuple = ()  # modules the worker imports at its start (their torch.library ops)
    # signal name -> axis: a worker group shards the tensors made inside it (gt_core.worker_process.shard)
    shard: dict = field(default_factory=dict)
    signals: dict = field(default_factory=dict, compare=False)  # read from `config`

    def replace(self, **changes) -> Options:
        """These options with ``changes`` (validated; a bad value raises ConfigError)."""
        for k in changes:
            _known(k)
        changes = {
            k: os.fspath(v) if k in PATHS and isinstance(v, os.PathLike) else v
            for k, v in changes.items()
        }
        if isinstance(changes.get("worker_imports"), list):
            changes["worker_imports"] = tuple(changes["worker_imports"])
        out = dataclasses.replace(self, **changes)
        out.validate({k: k for k in changes})
        if "config" in changes:  # signals come from the file alone: none without one
            out = dataclasses.replace(out, signals=load_signals(out.config) if out.config else {})
            out.validate({"config": "config"})
        return out

    def validate(self, source: dict | None = None) -> None:
        """Raise ConfigError naming the variable, the value and what is accepted.

        ``source`` maps the options the user gave to the names they gave them by (an
        environment variable, a keyword): errors name those, and a window too small for
        threshold*min_seq blames the one the user gave.
        """
        source = source or {}
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name), source.get(f.name))
        t, m, w = self.threshold, self.min_seq, self.window
        if w < t * m:
            given = [k for k in ("threshold", "min_seq", "window") if k in source] or ["window"]
            key = given[0]
            fix = (
                "raise window or lower threshold or min_seq"
                if key == "window"
                else f"lower {key} or raise window"
            )
            raise ConfigError(
                source.get(key, key),
                getattr(self, key),
                f"threshold*min_seq <= window ({t}*{m} = {t * m}, window is {w}): {fix}",
            )
        if shard_axes(self) and self.workers < 2:
            key = "shard" if self.shard else "config"
            raise ConfigError(
                source.get(key, key),
                getattr(self, key),
                "no shard with one worker: sharding splits tensors over the ranks of a worker "
                "group; add workers=2 (or more), or drop shard",
            )
        if self.workers > 1 and self.worker == "inprocess":
            raise ConfigError(
                source.get("workers", "workers"),
                self.workers,
                f"1 with worker={self.worker!r}: a worker group is local processes (worker="
                "'process'), or a torchrun group behind a remote worker (worker='tcp://...')",
            )


_COMMON = ("inductor", "aot_eager", "eager", "cudagraphs")


def _known_backends() -> set[str]:
    """Backend names torch.compile accepts in this process (registered ones included)."""
    import torch._dynamo

    return set(torch._dynamo.list_backends(exclude_tags=())) | {"inductor"}


def _backend_accepted() -> str:
    known = _known_backends()
    return (
        f"a registered torch.compile backend: {', '.join(b for b in _COMMON if b in known)}, "
        "or a name given to torch._dynamo.register_backend"
    )


# What each option accepts: one rule per field, the only place values are checked.
# Integers are never bools (True is an int to Python, not a count to gt); paths are str or
# os.PathLike, never an int: open(1) would take over, and later close, the kernel's stdout.
def _int(least: int, most: int | None = None):
    return lambda v: (
        isinstance(v, int)
        and not isinstance(v, bool)
        and v >= least
        and (most is None or v <= most)
    )


def _path(v) -> bool:
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    return v is None or isinstance(v, str)


BOOL = "True or False (as text: 1/0, true/false, yes/no, on/off)"
PATH = "a file path (str or os.PathLike), or None"
PATHS = ("log", "config", "authkey_file")
RULES: dict = {
    "auto_compile": (lambda v: isinstance(v, bool), BOOL),
    "compile_all": (lambda v: isinstance(v, bool), BOOL),
    "threshold": (_int(2), "an integer >= 2 (a block must repeat to be hot)"),
    "min_seq": (_int(1), "an integer >= 1"),
    "window": (_int(1), "an integer >= threshold*min_seq"),
    "backend": (lambda v: isinstance(v, str) and v in _known_backends(), _backend_accepted),
    "mode": (
        lambda v: v is None or (isinstance(v, str) and v in MODES),
        f"one of {', '.join(str(m) for m in MODES[1:])}, or None",
    ),
    "dynamic": (lambda v: isinstance(v, bool), BOOL),
    "debug": (_int(0, 2), "0, 1 or 2"),
    "log": (_path, PATH),
    "config": (_path, PATH.replace("a file", "a YAML file")),
    "worker": (
        lambda v: isinstance(v, str) and (v in WORKERS or remote_address(v) is not None),
        f"one of {', '.join(WORKERS)}, or tcp://HOST:PORT (a remote worker)",
    ),
    "authkey_file": (_path, PATH.replace("a file", "a file holding a remote worker's key")),
    "device": (_device_ok, DEVICE_HINT),
    "regression_samples": (_int(1), "an integer >= 1"),
    "background": (lambda v: isinstance(v, bool), BOOL),
    "client_match": (lambda v: isinstance(v, bool), BOOL),
    "compile_process": (lambda v: isinstance(v, bool), BOOL),
    "worker_threads": (lambda v: v is None or _int(1)(v), "an integer >= 1, or None (shared)"),
    "flush_at": (_int(1), "an integer >= 1"),
    "jit_audit": (_int(0), "an integer >= 0 (0: only the first replay after each recording)"),
    "user_eager_every": (_int(0), "an integer >= 0 (0: no call runs eagerly to compare)"),
    "workers": (_int(1, 64), "an integer from 1 to 64 (ranks of a local worker group)"),
    "worker_imports": (
        lambda v: isinstance(v, tuple) and all(isinstance(m, str) and m for m in v),
        "a tuple of module names (comma-separated in GT_WORKER_IMPORTS)",
    ),
    "signals": (lambda v: isinstance(v, dict), "a dict of named signals (set the config option)"),
    "shard": (
        lambda v: (
            isinstance(v, dict)
            and all(isinstance(k, str) and k and _int(0)(a) for k, a in v.items())
        ),
        "a dict of signal name -> axis (an integer >= 0), e.g. {'batch': 0}",
    ),
}


def accepted(key: str) -> str:
    """What option ``key`` accepts, in words."""
    text = RULES[key][1]
    return text() if callable(text) else text


def check(key: str, value, name: str | None = None) -> None:
    """Raise ConfigError unless ``value`` is accepted for option ``key`` (on its own)."""
    _known(key)
    _check(key, value, name)


def _check(key: str, value, name: str | None) -> None:
    if not RULES[key][0](value):
        raise ConfigError(name or key, value, accepted(key))


def _known(key: str) -> None:
    if not any(f.name == key for f in dataclasses.fields(Options)) or key == "signals":
        names = ", ".join(f.name for f in dataclasses.fields(Options) if f.name != "signals")
        raise ConfigError("option", key, f"one of: {names}")


# Text (an environment variable, a `%gt config key=value`) -> value, by the field's type.
def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError


def _none(s: str) -> bool:
    return s.strip().lower() in ("", "none", "null")


PARSERS = {
    "bool": _bool,
    "int": int,
    "int | None": lambda s: None if _none(s) else int(s),
    "str": str,
    "str | None": lambda s: None if _none(s) else s,
    "tuple": lambda s: tuple(m.strip() for m in s.split(",") if m.strip()),
    "dict": lambda s: _axes(s),
}


def _axes(s: str) -> dict:
    """'batch=0,other=1' -> {'batch': 0, 'other': 1} (ValueError if it is not so)."""
    out = {}
    for part in (p.strip() for p in s.split(",")):
        if part:
            name, eq, axis = part.partition("=")
            if not eq or not name.strip():
                raise ValueError(part)
            out[name.strip()] = int(axis)
    return out


def parse(key: str, text: str, name: str | None = None):
    """The value of option ``key`` written as ``text``; ConfigError if it does not parse."""
    _known(key)
    kind = next(f.type for f in dataclasses.fields(Options) if f.name == key)
    try:
        return PARSERS[kind](text)
    except ValueError:
        raise ConfigError(name or key, text, accepted(key)) from None


ENV = {  # environment variable -> option
    "GT_AUTO_COMPILE": "auto_compile",
    "GT_COMPILE": "compile_all",
    "GT_HOTPATH_THRESHOLD": "threshold",
    "GT_HOTPATH_MIN_SEQ": "min_seq",
    "GT_HOTPATH_WINDOW": "window",
    "GT_BACKEND": "backend",
    "GT_COMPILE_MODE": "mode",
    "GT_DYNAMIC": "dynamic",
    "GT_DEBUG_COMPILE": "debug",
    "GT_INSTRUCTION_LOG": "log",
    "GT_CONFIG": "config",
    "GT_WORKER": "worker",
    "GT_AUTHKEY_FILE": "authkey_file",
    "GT_WORKERS": "workers",
    "GT_SHARD": "shard",
    "GT_DEVICE": "device",
    "GT_REGRESSION_SAMPLES": "regression_samples",
    "GT_BACKGROUND_COMPILE": "background",
    "GT_CLIENT_MATCH": "client_match",
    "GT_COMPILE_PROCESS": "compile_process",
    "GT_WORKER_THREADS": "worker_threads",
    "GT_FLUSH_AT": "flush_at",
    "GT_JIT_AUDIT": "jit_audit",
    "GT_USER_EAGER_EVERY": "user_eager_every",
    "GT_WORKER_IMPORTS": "worker_imports",
}


def from_env(environ: dict | None = None) -> Options:
    """Options from GT_* variables; a bad value raises ConfigError naming the variable."""
    environ = os.environ if environ is None else environ
    values, source = {}, {}
    for var, key in ENV.items():
        if var in environ:
            values[key] = parse(key, environ[var], var)
            source[key] = var
    opts = dataclasses.replace(Options(), **values)
    opts.validate(source)
    if opts.config:
        opts = dataclasses.replace(
            opts, signals=load_signals(opts.config, source.get("config", "config"))
        )
        opts.validate(source)
    return opts


def load_signals(path: str | os.PathLike, name: str = "config") -> dict:
    """Named signals from a YAML file: ``{name: {"compile": bool}}``."""
    import yaml

    if not _path(path) or path is None:
        raise ConfigError(name, path, PATH)
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(name, path, f"a readable YAML file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(name, path, f"valid YAML ({str(exc).splitlines()[0]})") from None
    signals = doc.get("signals", doc) if isinstance(doc, dict) else None
    if not isinstance(signals, dict):
        raise ConfigError(
            name, path, "a YAML mapping of signal names, e.g. 'training_loop: {compile: true}'"
        )
    out = {}
    for sig, spec in signals.items():
        spec = spec or {}
        if (
            not isinstance(spec, dict)
            or not set(spec) <= {"compile", "shard"}
            or not isinstance(spec.get("compile", False), bool)
        ):
            raise ConfigError(
                f"{name} signal {sig!r}",
                spec,
                "a mapping like {compile: true} or {shard: {axis: 0, workers: [0, 1]}}",
            )
        out[str(sig)] = {"compile": spec.get("compile", False)}
        if "shard" in spec:
            out[str(sig)]["shard"] = _shard_spec(f"{name} signal {sig!r}", spec["shard"])
    return out


def _shard_spec(name: str, shard) -> dict:
    """A signal's ``shard: {axis: A, workers: [...]}``, checked: {"axis": A, "workers": [...]}."""
    workers = shard.get("workers") if isinstance(shard, dict) else None
    ok = isinstance(shard, dict) and set(shard) <= {"axis", "workers"}
    ok = ok and _int(0)(shard.get("axis")) and (workers is None or isinstance(workers, list))
    ok = ok and all(_int(0)(w) for w in workers or ()) and workers != []
    if not ok:
        raise ConfigError(
            name,
            shard,
            "shard: {axis: A, workers: [0, 1, ...]} (an axis >= 0; workers: the group's ranks, "
            "all of them, or left out)",
        )
    return {"axis": shard["axis"], "workers": shard.get("workers")}


def shard_axes(options: Options) -> dict:
    """Signal name -> axis, from the shard option and the signals' ``shard`` specs."""
    axes = {n: s["shard"]["axis"] for n, s in options.signals.items() if "shard" in s}
    return {**axes, **options.shard}

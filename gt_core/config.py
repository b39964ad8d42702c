"""Options: one dataclass, read from GT_* environment variables and overridden per capture."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from .errors import ConfigError

__all__ = ["Options", "from_env", "ENV", "load_signals"]

BACKENDS_HINT = "a torch.compile backend name such as 'inductor', 'aot_eager' or 'eager'"
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
WORKERS = ("process", "inprocess")
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
    worker: str = "process"  # or "inprocess" (same executor, no second process)
    device: str = "auto"  # the worker's device: auto (CUDA if present), cpu, cuda, cuda:N
    regression_samples: int = 5  # compiled runs timed before a revert is considered
    background: bool = True  # compile off the critical path (eager runs meanwhile)
    client_match: bool = True  # the client sends a hot block's occurrence as one message
    compile_process: bool = True  # inductor compiles in a process of their own (CPU worker)
    worker_imports: tuple = ()  # modules the worker imports at its start (their torch.library ops)
    signals: dict = field(default_factory=dict, compare=False)

    def replace(self, **changes) -> Options:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            names = ", ".join(f.name for f in dataclasses.fields(self) if f.name != "signals")
            raise ConfigError(f"option {sorted(unknown)[0]}", changes[sorted(unknown)[0]], f"one of: {names}")
        changes = {k: v for k, v in changes.items() if v is not None or k in ("mode", "log", "config")}
        if isinstance(changes.get("worker_imports"), list):
            changes["worker_imports"] = tuple(changes["worker_imports"])
        out = dataclasses.replace(self, **changes)
        out.validate()
        if "config" in changes and out.config:
            out = dataclasses.replace(out, signals=load_signals(out.config))
        return out

    def validate(self, source: dict | None = None) -> None:
        """Raise ConfigError naming the variable, the value and what is accepted."""
        name = (source or {}).get

        def check(ok: bool, key: str, accepted: str) -> None:
            if not ok:
                raise ConfigError(name(key, key), getattr(self, key), accepted)

        for key in ("threshold", "min_seq", "window", "regression_samples"):
            v = getattr(self, key)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, key, "an integer >= 1")
        check(self.threshold >= 2, "threshold", "an integer >= 2 (a block must repeat to be hot)")
        check(isinstance(self.backend, str) and bool(self.backend), "backend", BACKENDS_HINT)
        known = _known_backends()
        check(
            self.backend in known,
            "backend",
            f"a registered torch.compile backend: {', '.join(b for b in _COMMON if b in known)}, "
            "or a name given to torch._dynamo.register_backend",
        )
        check(self.mode in MODES, "mode", f"one of {', '.join(str(m) for m in MODES[1:])}")
        check(self.worker in WORKERS, "worker", f"one of {', '.join(WORKERS)}")
        check(_device_ok(self.device), "device", DEVICE_HINT)
        check(isinstance(self.debug, int) and self.debug in (0, 1, 2), "debug", "0, 1 or 2")
        check(
            isinstance(self.worker_imports, tuple)
            and all(isinstance(m, str) and m.strip() for m in self.worker_imports),
            "worker_imports",
            "a tuple of module names, e.g. ('my_ops',); in GT_WORKER_IMPORTS, comma-separated",
        )
        if self.window < self.threshold * self.min_seq:
            raise ConfigError(
                name("window", "window"),
                self.window,
                f"at least threshold*min_seq = {self.threshold * self.min_seq}",
            )


_COMMON = ("inductor", "aot_eager", "eager", "cudagraphs")


def _known_backends() -> set[str]:
    """Backend names torch.compile accepts in this process (registered ones included)."""
    import torch._dynamo

    return set(torch._dynamo.list_backends(exclude_tags=())) | {"inductor"}


# Environment variable -> (field, parser)
def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError


def _names(s: str) -> tuple:
    return tuple(n.strip() for n in s.split(",") if n.strip())


ENV = {
    "GT_AUTO_COMPILE": ("auto_compile", _bool, "0/1, true/false, yes/no, on/off"),
    "GT_COMPILE": ("compile_all", _bool, "0/1, true/false, yes/no, on/off"),
    "GT_HOTPATH_THRESHOLD": ("threshold", int, "an integer >= 2"),
    "GT_HOTPATH_MIN_SEQ": ("min_seq", int, "an integer >= 1"),
    "GT_HOTPATH_WINDOW": ("window", int, "an integer >= threshold*min_seq"),
    "GT_BACKEND": ("backend", str, BACKENDS_HINT),
    "GT_COMPILE_MODE": ("mode", str, "default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"),
    "GT_DYNAMIC": ("dynamic", _bool, "0/1, true/false"),
    "GT_DEBUG_COMPILE": ("debug", int, "0, 1 or 2"),
    "GT_INSTRUCTION_LOG": ("log", str, "a file path"),
    "GT_CONFIG": ("config", str, "a YAML file path"),
    "GT_WORKER": ("worker", str, "process or inprocess"),
    "GT_DEVICE": ("device", str, "auto, cpu, cuda or cuda:N"),
    "GT_BACKGROUND_COMPILE": ("background", _bool, "0/1, true/false"),
    "GT_CLIENT_MATCH": ("client_match", _bool, "0/1, true/false"),
    "GT_COMPILE_PROCESS": ("compile_process", _bool, "0/1, true/false"),
    "GT_WORKER_IMPORTS": ("worker_imports", _names, "module names, comma-separated"),
}


def from_env(environ: dict | None = None) -> Options:
    """Options from GT_* variables; a bad value raises ConfigError naming the variable."""
    environ = os.environ if environ is None else environ
    values, source = {}, {}
    for var, (key, parse, accepted) in ENV.items():
        if var not in environ:
            continue
        raw = environ[var]
        try:
            values[key] = parse(raw)
        except ValueError:
            raise ConfigError(var, raw, accepted) from None
        source[key] = var
    opts = dataclasses.replace(Options(), **values)
    opts.validate(source)
    if opts.config:
        opts = dataclasses.replace(opts, signals=load_signals(opts.config, "GT_CONFIG" if "config" in source else "config"))
    return opts


def load_signals(path: str, name: str = "config") -> dict:
    """Named signals from a YAML file: ``{name: {"compile": bool}}``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(name, path, f"a readable YAML file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(name, path, f"valid YAML ({str(exc).splitlines()[0]})") from None
    signals = doc.get("signals", doc) if isinstance(doc, dict) else None
    if not isinstance(signals, dict):
        raise ConfigError(name, path, "a YAML mapping of signal names, e.g. 'training_loop: {compile: true}'")
    out = {}
    for sig, spec in signals.items():
        spec = spec or {}
        if not isinstance(spec, dict) or not set(spec) <= {"compile"} or not isinstance(spec.get("compile", False), bool):
            raise ConfigError(f"{name} signal {sig!r}", spec, "a mapping like {compile: true}")
        out[str(sig)] = {"compile": spec.get("compile", False)}
    return out

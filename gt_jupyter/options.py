"""gt's options in IPython: the ``GT`` Configurable (``%config GT``) and ``%%gt``'s flags.

In [1]: %config GT.threshold = 3
In [2]: %%gt --threshold 3 --backend aot_eager
"""

from __future__ import annotations

import importlib
import os
import sys

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring
from traitlets import TraitError, TraitType
from traitlets.config import Config, Configurable

__all__ = ["GT", "Option"]


# -- gt_core, imported lazily: it imports torch, which loading the extension does not -------
def core_module():
    """gt_core, imported on first use (it imports torch)."""
    return importlib.import_module("gt_core")


def diagnostics_module():
    """The diagnostics module (not the function of the same name exported by gt_core)."""
    return importlib.import_module("gt_core.diagnostics")


def config_module():
    """gt_core.options, the module of the options' rules (``gt_core.config`` is the function
    showing the options in use)."""
    return importlib.import_module("gt_core.options")


class Option(TraitType):
    """One of gt's options: accepts exactly what gt_core's Options accepts for it.

    The check is gt_core's own (gt_core.options.check), made when a value is set: importing
    gt_core imports torch, which loading the extension does not.
    """

    def __init__(self, default, help: str, option: str | None = None):
        super().__init__(default, help=help)
        self.tag(config=True, option=option)  # option: the Options field, where the name differs

    def validate(self, obj, value):
        config = config_module()
        try:
            config.check(self.metadata["option"] or self.name, value)
        except config.ConfigError as exc:
            raise TraitError(f"GT.{self.name}: {exc}") from None
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class GT(Configurable):
    """gt's options, also settable with ``%config GT.threshold = 3`` (same as ``%gt config``).

    One trait per field of gt_core.Options, with its default (tests/test_config.py checks
    that they match); ``config`` is ``GT.config_file``, since a Configurable's ``config`` is
    its traitlets Config.
    """

    # -- when blocks compile
    auto_compile = Option(True, "compile hot paths (GT_AUTO_COMPILE)")
    compile_all = Option(False, "compile every block on first sight (GT_COMPILE)")
    threshold = Option(5, "repeats before a block is hot (GT_HOTPATH_THRESHOLD)")
    min_seq = Option(8, "fewest instructions in a hot block (GT_HOTPATH_MIN_SEQ)")
    window = Option(8192, "instructions searched for a repeat (GT_HOTPATH_WINDOW)")
    config_file = Option(None, "YAML of named signals (GT_CONFIG)", option="config")
    # -- how they compile
    backend = Option("inductor", "torch.compile backend (GT_BACKEND)")
    mode = Option(None, "torch.compile mode (GT_COMPILE_MODE)")
    dynamic = Option(False, "compile with dynamic shapes (GT_DYNAMIC)")
    background = Option(True, "compile off the critical path (GT_BACKGROUND_COMPILE)")
    compile_process = Option(
        True, "inductor compiles in a process of their own (GT_COMPILE_PROCESS)"
    )
    regression_samples = Option(5, "compiled runs timed before a revert (GT_REGRESSION_SAMPLES)")
    # -- the worker
    worker = Option(
        "process", "process, inprocess or tcp://HOST:PORT: where tensors live (GT_WORKER)"
    )
    authkey_file = Option(None, "a remote worker's key file (GT_AUTHKEY_FILE)")
    workers = Option(1, "ranks of a local worker group (GT_WORKERS)")
    shard = Option({}, "signal name -> axis its tensors are sharded along, in a group (GT_SHARD)")
    device = Option("auto", "the worker's device: auto, cpu, cuda, cuda:N (GT_DEVICE)")
    worker_threads = Option(None, "the worker's CPU threads, fixed (GT_WORKER_THREADS)")
    client_match = Option(True, "a hot block goes out as one message (GT_CLIENT_MATCH)")
    flush_at = Option(512, "instructions batched before they are sent (GT_FLUSH_AT)")
    jit_audit = Option(256, "gt_core.jit audits one replayed call in this many (GT_JIT_AUDIT)")
    worker_imports = Option((), "modules the worker imports at start (GT_WORKER_IMPORTS)")
    # -- what gt tells
    debug = Option(0, "0, 1 or 2: a line per detection, compile, fallback (GT_DEBUG_COMPILE)")
    log = Option(None, "events as JSON lines (GT_INSTRUCTION_LOG)")
    user_eager_every = Option(
        10,
        "one call in this many of your torch.compile'd function runs eagerly, to compare "
        "(GT_USER_EAGER_EVERY)",
    )

    def __init__(self, parent=None, **kw):
        # IPython keeps every `%config GT.x = v` in the shell's config, refused ones too, and
        # hands it to each new GT (a reload): it is applied to gt here, through gt's own check,
        # all at once; a bad value is one warning and never a failed %load_ext.
        given = dict(parent.config["GT"]) if parent is not None and "GT" in parent.config else {}
        super().__init__(parent=parent, config=Config(), **kw)
        self._syncing = False
        self.observe(self._changed, names=self.option_names())
        if given:
            traits = self.option_traits()
            try:
                core_module().configure(**{traits.get(k, k): v for k, v in given.items()})
            except Exception as exc:
                print(f"gt: IPython's config for GT is not applied: {exc}", file=sys.stderr)
            self.sync(core_module().config())

    @classmethod
    def option_traits(cls) -> dict[str, str]:
        """Trait name -> the Options field it sets."""
        traits = cls.class_traits(config=True)
        return {
            n: t.metadata.get("option") or n for n, t in traits.items() if "option" in t.metadata
        }

    @classmethod
    def option_names(cls) -> list[str]:
        return list(cls.option_traits())

    def _changed(self, change) -> None:
        if self._syncing:
            return
        option = self.option_traits()[change["name"]]
        try:
            core_module().configure(**{option: change["new"]})
        except Exception as exc:
            self._syncing = True
            try:
                setattr(self, change["name"], change["old"])
            finally:
                self._syncing = False
            raise UsageError(f"GT.{change['name']}: {exc}") from None

    def sync(self, values: dict) -> None:
        """Show gt's current options (without re-applying them)."""
        self._syncing = True
        try:
            for trait, option in self.option_traits().items():
                if option in values:
                    setattr(self, trait, values[option])
        finally:
            self._syncing = False


# -- parsing -------------------------------------------------------------------------------
def usage_line(magic) -> str:
    """``usage: %%gt [--no-compile] ...`` on one line.

    IPython writes the usage for the docstring (``::`` and ``%gt``, the line magic's name).
    """
    words = magic.parser.format_usage().split()
    prog = f"%{magic.parser.prog}"
    options = words[words.index(prog) + 1 :] if prog in words else words
    return " ".join(["usage:", f"%%{magic.parser.prog}", *options])


def usage_error(magic, exc: BaseException | str) -> UsageError:
    """A one-line UsageError: what was wrong, then the usage."""
    text = " ".join(str(exc).split()).rstrip(".")
    return UsageError(f"%%gt: {text}. {usage_line(magic)}")


def parse_flags(magic, line: str):
    """Parse ``%%gt`` options; a mistake is a one-line UsageError carrying the usage."""
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        raise usage_error(magic, exc) from None
    except ValueError as exc:  # shlex: an unclosed quote
        raise usage_error(magic, f"{exc} in {line!r}: close the quote") from None


def _shard_flags(values: list[str]) -> dict:
    """``--shard batch=0`` flags as the shard option, {"batch": 0}."""
    out = {}
    for v in values:
        name, eq, axis = v.partition("=")
        if not (eq and name.strip() and axis.strip().isdigit()):
            raise UsageError(
                f"%%gt: --shard {v!r}: expected NAME=AXIS, a signal's name and an axis >= 0 "
                "(--shard batch=0 shards the tensors made inside gt_core.signal.context('batch'))"
            )
        out[name.strip()] = int(axis)
    return out


def capture_options(args) -> dict:
    """The capture() options the parsed flags ask for (only those given)."""
    o: dict = {}
    if args.no_compile:
        o["auto_compile"] = False
    if args.compile:
        o["compile_all"] = True
    for flag, key in (
        ("threshold", "threshold"),
        ("min_seq", "min_seq"),
        ("backend", "backend"),
        ("mode", "mode"),
        ("workers", "workers"),
    ):
        if getattr(args, flag) is not None:
            o[key] = getattr(args, flag)
    if args.dynamic:
        o["dynamic"] = True
    if args.shard:
        o["shard"] = _shard_flags(args.shard)
    if args.log:
        o["log"] = args.log
    return o


def check_options(magic, core, options: dict) -> None:
    """Validate the options before the cell runs (a bad value never runs the cell)."""
    try:
        core.Options(**core.config()).replace(**options)
    except (core.ConfigError, ValueError, TypeError) as exc:
        raise usage_error(magic, exc) from None
    # An unopenable --log path is refused by the capture itself (a ConfigError on entering
    # it, turned into this UsageError before the cell runs).

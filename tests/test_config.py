"""Configuration: every option checked in one place, one line per mistake, nothing else broken.

A bad value never reaches the worker, the kernel's file descriptors or the traits of
``%config GT``: it is a ConfigError (gt_core) or a one-line UsageError (magics), and the
options that were set before stay set.
"""

import dataclasses
import os
import pathlib
import re
import sys

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython
from traitlets import TraitError

import gt_core
from gt_core.client import capture as _capture
from gt_core.options import ENV, Options, from_env, load_signals, parse
from gt_core.options_help import HELP
from gt_jupyter.magics import GT

FIELDS = [f for f in dataclasses.fields(Options) if f.name != "signals"]
BOOLS = [f.name for f in FIELDS if f.type == "bool"]
INTS = [f.name for f in FIELDS if f.type.startswith("int")]
README = pathlib.Path(__file__).parent.parent / "README.md"


@pytest.fixture
def ip():
    shell = start_ipython() or InteractiveShell.instance()  # IPython's testing shell, made once
    shell.run_line_magic("load_ext", "gt_jupyter")
    yield shell
    shell.run_line_magic("unload_ext", "gt_jupyter")
    shell.config.pop("GT", None)  # IPython keeps each %config GT.x, refused ones too


@pytest.fixture
def fresh(monkeypatch):
    """The options as a new kernel reads them: from the GT_* variables, on first use."""
    gt_core.worker().stop()
    monkeypatch.setitem(_capture._state, "options", None)


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    return msg


# -- every option, one rule ----------------------------------------------------------------
@pytest.mark.parametrize("key", BOOLS)
@pytest.mark.parametrize("value", ["maybe", "true", 1, 0, None])
def test_bools_are_true_or_false_only(key, value):
    with pytest.raises(gt_core.ConfigError, match=rf"^{key}=.* True or False"):
        Options().replace(**{key: value})
    assert Options().replace(**{key: False}).__getattribute__(key) is False


@pytest.mark.parametrize("key", INTS)
@pytest.mark.parametrize("value", [True, "3", 3.0])
def test_integers_are_never_bools_strings_or_floats(key, value):
    with pytest.raises(gt_core.ConfigError, match=rf"^{key}=.* not accepted"):
        Options().replace(**{key: value})


@pytest.mark.parametrize(
    "key, value", [("backend", 1), ("mode", ""), ("worker", None), ("device", 0), ("debug", 3)]
)
def test_strings_and_choices_are_checked(key, value):
    with pytest.raises(gt_core.ConfigError, match=rf"^{key}={value!r} is not accepted; expected"):
        Options().replace(**{key: value})


def test_none_is_refused_where_an_option_has_no_none():
    with pytest.raises(gt_core.ConfigError, match=r"^threshold=None .* integer >= 2"):
        gt_core.configure(threshold=None)
    assert gt_core.configure(worker_threads=None).worker_threads is None


def test_an_unknown_option_names_the_known_ones():
    with pytest.raises(gt_core.ConfigError, match=r"option='treshold' .* threshold, min_seq"):
        gt_core.configure(treshold=3)


# -- paths: never a file descriptor ---------------------------------------------------------
@pytest.mark.parametrize("key", ["config", "log"])
def test_a_path_option_never_takes_a_file_descriptor(key):
    r, w = os.pipe()  # descriptors the test owns: closing one would show here
    try:
        for value in (r, w, True, 1, 2, b"signals.yaml"):
            with pytest.raises(gt_core.ConfigError, match=rf"^{key}=.* file path \(str or os"):
                gt_core.configure(**{key: value})
        for fd in (r, w, 1, 2):
            os.fstat(fd)  # still open
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(gt_core.ConfigError, match="GT_CONFIG=3"):
        load_signals(3, "GT_CONFIG")


def test_a_path_option_takes_os_pathlike(tmp_path):
    signals = tmp_path / "signals.yaml"
    signals.write_text("step: {compile: true}\n")
    opts = gt_core.configure(config=signals)
    assert opts.config == str(signals) and opts.signals == {"step": {"compile": True}}
    assert gt_core.configure(config=None).signals == {}  # the file's signals go with it


# -- threshold, min_seq and window ----------------------------------------------------------
def test_threshold_below_two_says_two():
    with pytest.raises(gt_core.ConfigError) as err:
        gt_core.configure(threshold=-1)
    assert one_line(err) == (
        "threshold=-1 is not accepted; expected an integer >= 2 (a block must repeat to be hot)"
    )


def test_a_threshold_too_big_for_the_window_blames_the_threshold():
    with pytest.raises(gt_core.ConfigError) as err:
        gt_core.configure(threshold=100000)
    msg = one_line(err)
    assert msg.startswith("threshold=100000 is not accepted")
    assert "100000*8 = 800000, window is 8192" in msg and "lower threshold or raise window" in msg
    with pytest.raises(gt_core.ConfigError, match=r"^window=10 .* raise window"):
        gt_core.configure(window=10)
    with pytest.raises(gt_core.ConfigError, match=r"^GT_HOTPATH_MIN_SEQ=5000 .* lower min_seq"):
        from_env({"GT_HOTPATH_MIN_SEQ": "5000"})


# -- GT_* variables --------------------------------------------------------------------------
def test_every_option_has_an_env_variable_and_a_trait_and_a_row_in_the_docs():
    assert sorted(ENV.values()) == sorted(f.name for f in FIELDS)
    traits = GT.option_traits()
    assert sorted(traits.values()) == sorted(f.name for f in FIELDS)
    for trait, option in traits.items():
        assert getattr(GT(), trait) == getattr(Options(), option), trait
    # (the docs' configuration page is made from Options and options_help.HELP)
    sys.path.insert(0, str(README.parent))
    from mkdocs_hooks import options_table

    table = [line for line in options_table().splitlines() if line.startswith("| `GT_")]
    listed = {v for line in table for v in re.findall(r"`(GT_\w+)`", line.split("|")[1])}
    assert listed == set(ENV)
    assert set(HELP) == set(ENV.values())


def test_no_gt_variable_is_read_outside_the_options():
    root = pathlib.Path(gt_core.__file__).parent.parent
    for path in [*root.glob("gt_core/*.py"), *root.glob("gt_jupyter/*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"(environ(\.get)?\s*[\[(]|getenv\()\s*['\"]GT_", line):
                pytest.fail(f"{path.name}:{n} reads a GT_* variable itself: {line.strip()}")


@pytest.mark.parametrize(
    "var, value, match",
    [
        ("GT_WORKER_THREADS", "abc", r"^GT_WORKER_THREADS='abc' .* integer >= 1"),
        ("GT_WORKER_THREADS", "0", r"^GT_WORKER_THREADS=0 .* integer >= 1"),
        ("GT_FLUSH_AT", "abc", r"^GT_FLUSH_AT='abc' .* integer >= 1"),
        ("GT_FLUSH_AT", "0", r"^GT_FLUSH_AT=0 .* integer >= 1"),
        ("GT_REGRESSION_SAMPLES", "many", r"^GT_REGRESSION_SAMPLES='many'"),
    ],
)
def test_a_bad_variable_is_refused_before_any_worker_starts(fresh, monkeypatch, var, value, match):
    monkeypatch.setenv(var, value)
    with pytest.raises(gt_core.ConfigError, match=match):
        gt_core.configure()
    with pytest.raises(gt_core.ConfigError, match=match):
        _ = gt_core.worker().pid  # starting a worker reads the options first
    assert not gt_core.worker().started


def test_worker_threads_and_flush_at_come_from_the_options(fresh, monkeypatch, inprocess):
    monkeypatch.setenv("GT_WORKER_THREADS", "1")
    monkeypatch.setenv("GT_FLUSH_AT", "64")
    monkeypatch.setenv("GT_WORKER", "inprocess")
    monkeypatch.setenv("GT_BACKEND", "eager")
    monkeypatch.setitem(_capture._state, "options", None)
    assert (gt_core.config()["worker_threads"], gt_core.config()["flush_at"]) == (1, 64)
    assert _capture.session().flush_at == 64
    gt_core.configure(flush_at=3)
    with gt_core.capture():
        assert _capture.session().flush_at == 3
    assert parse("worker_threads", "none") is None and parse("flush_at", " 7 ") == 7


def test_the_worker_share_of_cpu_threads_takes_the_option():
    from gt_core.worker_process.cpu_share import CpuShare as _CpuShare

    threads = torch.get_num_threads()
    try:
        share = _CpuShare(torch.device("cpu"), 1)
        assert torch.get_num_threads() == 1 and not share.active  # fixed: nothing to share
    finally:
        torch.set_num_threads(threads)


# -- magics ----------------------------------------------------------------------------------
def test_a_bad_gt_config_value_is_one_usage_error_and_config_still_works(ip):
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("gt", "config auto_compile=maybe")
    assert one_line(err).startswith("%gt config: auto_compile='maybe' is not accepted")
    assert gt_core.config()["auto_compile"] is True
    out = ip.run_line_magic("gt", "config threshold=4 auto_compile=off worker_threads=2")
    assert "threshold = 4" in repr(out)
    assert gt_core.config()["auto_compile"] is False and gt_core.config()["worker_threads"] == 2
    traits = ip.magics_manager.registry["GTMagics"].options
    assert (traits.threshold, traits.auto_compile, traits.worker_threads) == (4, False, 2)


@pytest.mark.parametrize("line", ['config log="x', "config log='x"])
def test_an_unclosed_quote_in_gt_is_one_usage_error(ip, line):
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("gt", line)
    assert "No closing quotation" in one_line(err) and "close the quote" in str(err.value)


def test_an_unclosed_quote_in_the_cell_magic_is_one_usage_error(ip):
    ip.user_ns.pop("ran", None)
    with pytest.raises(UsageError) as err:
        ip.run_cell_magic("gt", '--log "x', "ran = True")
    assert (
        one_line(err).startswith("%%gt: No closing quotation")
        and "usage: %%gt" in err.value.args[0]
    )
    assert "ran" not in ip.user_ns


@pytest.mark.parametrize(
    "flags, words",
    [
        ("--threshold -1", "threshold=-1 is not accepted; expected an integer >= 2"),
        ("--threshold 100000", "threshold=100000 is not accepted; expected threshold*min_seq"),
    ],
)
def test_cell_magic_threshold_errors_name_the_value_given(ip, flags, words):
    ip.user_ns.pop("ran", None)
    with pytest.raises(UsageError) as err:
        ip.run_cell_magic("gt", flags, "ran = True")
    assert words in one_line(err)
    assert "ran" not in ip.user_ns


def test_traits_take_what_options_take(ip, caplog):
    traits = ip.magics_manager.registry["GTMagics"].options
    ip.run_line_magic("config", "GT.debug = 2")
    assert gt_core.config()["debug"] == 2 and traits.debug == 2
    for bad in ("True", "'1'", "3"):
        ip.run_line_magic("config", f"GT.debug = {bad}")  # %config shows the error, one line
        assert gt_core.config()["debug"] == 2 and traits.debug == 2
    assert "GT.debug: debug=True is not accepted; expected 0, 1 or 2" in caplog.messages
    ip.run_line_magic("config", "GT.window = 10")  # each fine alone, not with threshold*min_seq
    assert gt_core.config()["window"] == 8192 and traits.window == 8192
    ip.run_line_magic("config", "GT.config_file = 1")
    assert gt_core.config()["config"] is None
    ip.run_line_magic("gt", "config debug=0")  # %gt config still works after them
    assert traits.debug == 0
    with pytest.raises(TraitError, match=r"GT.auto_compile: auto_compile='yes' .* True or False"):
        GT().auto_compile = "yes"
    with pytest.raises(TraitError, match=r"GT.threshold: threshold=1 .* >= 2"):
        GT().threshold = 1


def test_a_reload_applies_the_shells_gt_config_and_survives_a_bad_value(ip, capsys):
    ip.run_line_magic("config", "GT.debug = 3")  # refused, but IPython keeps it
    ip.run_line_magic("unload_ext", "gt_jupyter")
    ip.run_line_magic("load_ext", "gt_jupyter")  # loads: one warning, the options unchanged
    err = capsys.readouterr().err
    assert "gt: IPython's config for GT is not applied: debug=3 is not accepted" in err
    assert gt_core.config()["debug"] == 0
    ip.config.GT.pop("debug")
    ip.run_line_magic("config", "GT.flush_at = 64")
    ip.run_line_magic("unload_ext", "gt_jupyter")
    ip.run_line_magic("load_ext", "gt_jupyter")  # a reload keeps it, in gt and in the traits
    assert gt_core.config()["flush_at"] == 64
    assert ip.magics_manager.registry["GTMagics"].options.flush_at == 64

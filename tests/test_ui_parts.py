"""The app's pure parts: the log buffer, formatting, theme files, notices, the attach command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from ui_fixtures import four_gpus_one_lost, job, price, recorded_gpus, snapshot

from gputui.core.session import model as M
from gputui.ui import fmt, notices
from gputui.ui import themes as theme_files
from gputui.ui.attach import attach_argv
from gputui.ui.logbuffer import MARK, LogBuffer
from gputui.ui.screens.new_job import free_gpus, gpu_hint, parse_env


# --- LogBuffer ---------------------------------------------------------------------------------------------------
def feed_all(buf: LogBuffer, data: bytes, step: int) -> LogBuffer:
    for i in range(0, len(data), step):
        buf.feed(data[i : i + step])
    return buf


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_any_chunking_gives_the_same_lines(step: int) -> None:
    data = b"one\r\ntwo\r\n\x1b[1;32mgreen\x1b[0m\ttab\r\n 10%\r 50%\r100%\r\nlast"
    buf = feed_all(LogBuffer(), data, step)
    assert buf.lines == ["one", "two", "green   tab", "100%"] and buf.partial == "last"


def test_carriage_return_redraws_show_only_the_latest_state() -> None:
    buf = LogBuffer()
    for i in range(10_000):
        buf.feed(b"\r%d/10000" % i)
    assert buf.lines == [] and buf.partial == "9999/10000"
    buf.feed(b"\r\n")
    assert buf.lines == ["9999/10000"] and buf.partial == ""


def test_lines_and_memory_are_bounded() -> None:
    buf = LogBuffer(max_lines=100, max_line_chars=50)
    buf.feed(b"".join(b"line %d\n" % i for i in range(1000)))
    assert len(buf.lines) == 100 and buf.lines[0] == "line 900" and buf.dropped == 900
    buf.feed(b"x" * 10_000_000)  # one huge unfinished line: kept capped, not whole
    assert len(buf._tail) <= 4 * 50 and buf.partial.startswith("x" * 50 + " …[+")
    buf.feed(b"\n")
    assert buf.lines[-1] == "x" * 50 + " …[+9999950 chars]"


def test_markers_and_search() -> None:
    buf = LogBuffer()
    buf.feed(b"alpha\nBeta\ngamma\nbeta again\npartial beta")
    buf.mark("gap: 5 bytes missing")
    assert buf.lines[-1] == MARK + "gap: 5 bytes missing" and buf.lines[-2] == "partial beta"
    assert buf.find("beta", 0) == 1 and buf.find("beta", 2) == 3 and buf.find("beta", 4) == 4
    assert buf.find("beta", 0, forward=False) == 4  # backwards from the top wraps to the end
    assert buf.find("BETA", 5) == 1  # wraps around
    assert buf.find("nothing", 0) is None


def test_invalid_utf8_and_controls_are_made_safe() -> None:
    buf = LogBuffer()
    buf.feed(b"caf\xc3\xa9 \xff\x07bell\x08\n")
    assert buf.lines == ["café \ufffdbell"]


# --- formatting -----------------------------------------------------------------------------------------------
def test_formatting() -> None:
    assert [fmt.duration(s) for s in (None, 5, 65, 3725, 90000)] == ["-", "5s", "1m05s", "1h02m", "1d01h"]
    assert (
        fmt.money(None) == "-"
        and fmt.money(2.5, per_hour=True) == "$2.50/h"
        and fmt.money(3, "EUR") == "3.00 EUR"
    )
    assert fmt.bar(0.5, 4) == "██  " and fmt.bar(None, 3) == "   " and fmt.bar(1.0, 2) == "██"
    assert fmt.spark([0, 50, 100], 3, 0, 100) == "▁▅█"
    assert len(fmt.spark(list(range(600)), 15)) == 15  # long history squeezed into the width
    assert (
        fmt.mem_pair(19818, 81559) == "19.4/79.6 GiB"
        and fmt.short_gpu_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
    )


# --- themes ---------------------------------------------------------------------------------------------------
def test_builtin_themes_load_with_level_colours() -> None:
    themes, errors = theme_files.load_themes(theme_files.BUILTIN_DIR)
    assert not errors
    by_name = {t.name: t for t in themes}
    assert {"gputui-dark", "gputui-light", "gputui-contrast"} <= set(by_name)
    for theme in themes:
        assert {theme_files.LEVEL_OK, theme_files.LEVEL_WARM, theme_files.LEVEL_HOT} <= set(theme.variables)
    assert not by_name["gputui-light"].dark


def test_a_broken_theme_file_is_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('name = "bad"\nprimry = "#fff"\n')
    (tmp_path / "good.toml").write_text('primary = "#123456"\n[variables]\ngputui-level-hot = "#ff0000"\n')
    themes, errors = theme_files.load_themes(tmp_path)
    assert [t.name for t in themes] == ["good"] and "unknown theme keys: primry" in errors[0]


def test_theme_choice_rules(tmp_path: Path) -> None:
    available = {"gputui-dark", "gputui-light", "gputui-contrast"}
    assert theme_files.pick_theme(None, theme_files.UiState(), available) == "gputui-dark"
    assert theme_files.pick_theme("gputui-light", theme_files.UiState(), available) == "gputui-light"
    saved = theme_files.UiState(theme="gputui-contrast", config_theme=None)
    assert theme_files.pick_theme(None, saved, available) == "gputui-contrast"
    assert theme_files.pick_theme("gputui-light", saved, available) == "gputui-light"  # the config changed since
    assert theme_files.pick_theme(None, theme_files.UiState(theme="gone"), available) == "gputui-dark"
    path = tmp_path / "state" / "ui.json"
    saved.save(path)
    assert theme_files.UiState.load(path) == saved and theme_files.UiState.load(tmp_path / "missing.json") == theme_files.UiState()


# --- notices --------------------------------------------------------------------------------------------------
def test_notices() -> None:
    up = snapshot("box", jobs=[job("box", "1", "train")], cost=price(2.0))
    assert notices.diff(None, up) == []
    drop = replace(up, state=M.RECONNECTING, error="reset")
    assert notices.diff(up, drop) == [notices.Notice("box dropped: reset; reconnecting", "warning")]
    assert notices.diff(drop, up) == [notices.Notice("box is back")]
    assert notices.diff(up, replace(up, state=M.ERROR, error="auth failed"))[0].severity == "error"
    done = replace(up, jobs=(replace(up.jobs[0], state=M.JOB_SUCCEEDED, exit_code=0),))
    assert notices.diff(up, done) == [notices.Notice("job 1 (train) on box succeeded")]
    quick = replace(up, jobs=(*up.jobs, job("box", "2", "quick", M.JOB_FAILED, exit_code=2)))
    assert notices.diff(up, quick) == []  # an ended job we never saw running, not ours: quiet
    assert notices.diff(up, quick, frozenset({"2"}))[0].message == "job 2 (quick) on box failed (exit 2)"
    idle = replace(up, cost=price(2.0, idle_s=900))
    assert notices.diff(up, idle)[0].message == "box is idle ($2.00/h); release it if you are done"
    free = replace(idle, cost=replace(idle.cost, price_per_hour=None))
    assert (
        notices.diff(replace(up, cost=replace(up.cost, price_per_hour=None)), free) == []
    )  # no price, no nag


# --- new job / attach -----------------------------------------------------------------------------------------
def test_free_gpus_are_suggested() -> None:
    a100 = recorded_gpus("a100x8")
    idle = snapshot("box", a100)
    assert free_gpus(idle) == list(range(8)) and gpu_hint(idle) == ("", "all 8 free (empty = all)")
    busy = snapshot("box", a100, loaded_job="3")
    half = replace(busy, metrics=replace(busy.metrics, gpus=busy.gpus[:4] + idle.gpus[4:]))
    assert gpu_hint(half) == ("4,5,6,7", "free: 4, 5, 6, 7 · busy: 0, 1, 2, 3")
    assert gpu_hint(snapshot("cpu-only")) == ("", "no GPUs reported on this host")
    # GPU 2 fails its handle: it is never suggested, and "empty = all" (which would include it) is not offered.
    assert gpu_hint(snapshot("box", four_gpus_one_lost("Unknown Error"))) == ("0,1,3", "free: 0, 1, 3 · lost: 2")
    assert parse_env("A=1 B='two words'") == {"A": "1", "B": "two words"}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_env("oops")


def test_attach_command() -> None:
    snap = snapshot("box", jobs=[job("box", "4", "train")])
    assert attach_argv(["ssh", "-t", "box"], snap, snap.jobs[0]) == [
        "ssh", "-t", "box", "tmux", "-L", "gputui-test", "attach", "-t", "=gputui-4",
    ]
    with pytest.raises(ValueError, match="has ended"):
        attach_argv([], snap, replace(snap.jobs[0], state=M.JOB_SUCCEEDED))
    with pytest.raises(ValueError, match="is queued: it has not started yet"):
        attach_argv([], snap, replace(snap.jobs[0], state=M.JOB_QUEUED))

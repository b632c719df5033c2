"""CLI conventions: Rich progress on a terminal (off when piped), shell completion, NO_COLOR, --json."""

from __future__ import annotations

import io
import itertools
import os
import pty
import sys
from types import SimpleNamespace

import pytest

from gputui.cli import common


def _on_pty(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, int, int]]) -> str:
    """Run progress_printer's callback with stderr on a pseudo-terminal; what the terminal received."""
    master, slave = pty.openpty()
    err = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr(common, "time", SimpleNamespace(monotonic=itertools.count(step=1.0).__next__))  # no throttle
    show = common.progress_printer()
    assert show is not None
    for call in calls:
        show(*call)
    err.flush()
    os.set_blocking(master, False)
    out = b""
    try:
        while chunk := os.read(master, 65536):
            out += chunk
    except BlockingIOError:
        pass
    err.close()
    os.close(master)
    return out.decode("utf-8", "replace")


def test_progress_on_a_terminal_has_a_bar_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    mb = 1_000_000
    seen = _on_pty(monkeypatch, [("ckpt.pt", 0, 50 * mb), ("ckpt.pt", 10 * mb, 50 * mb),
                                 ("ckpt.pt", 50 * mb, 50 * mb)])  # fmt: skip
    assert "━" in seen  # Rich's bar
    assert "MB" in seen and "/s" in seen  # size and rate
    assert "-:--:--" in seen or ":" in seen  # the ETA column
    assert "ckpt.pt  50.0 MB" in seen  # the finished file's line stays


def test_progress_file_names_are_data(monkeypatch: pytest.MonkeyPatch) -> None:
    hostile = "\x1b]52;c;aGk=\x07[bold]x[/]\x1b[2J.pt"
    seen = _on_pty(monkeypatch, [(hostile, 0, 10), (hostile, 10, 10)])
    assert "\x1b]52" not in seen and "\x07" not in seen and "\x1b[2J" not in seen
    assert "\\x1b]52;c;aGk=\\x07[bold]x[/]\\x1b[2J.pt" in seen  # shown escaped, markup literal


def test_progress_is_off_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert common.progress_printer() is None


def test_no_color_turns_the_bar_colourless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    seen = _on_pty(monkeypatch, [("a.pt", 0, 100), ("a.pt", 40, 100), ("a.pt", 100, 100)])
    assert "━" * 10 in seen  # the done part of the bar, drawn without colour
    assert "\x1b[3" not in seen and "\x1b[9" not in seen  # no colour at all

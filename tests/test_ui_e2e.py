"""The real ``gputui`` in a real terminal (tmux), against the local host, driven only by keystrokes:
start a job from the dialog, watch its output, attach to it and come back, kill it with confirmation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import ROOT, Home, suite_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]


class Terminal:
    """A 160x48 tmux pane on a private server running one command."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.base = ["tmux", "-L", name, "-f", "/dev/null"]
        subprocess.run(
            [*self.base, "new-session", "-d", "-x", "160", "-y", "48", "-s", "ui", *argv], check=True
        )

    def screen(self) -> str:
        res = subprocess.run([*self.base, "capture-pane", "-p", "-t", "ui"], capture_output=True, text=True)
        return res.stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "ui", *(["-l"] if literal else []), *keys], check=True)

    def wait(self, text: str, timeout: float = 30) -> str:
        try:
            return wait_for(lambda: text in (s := self.screen()) and s, timeout, 0.1, f"{text!r} on screen")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{self.screen()}") from None

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)


@pytest.fixture
def terminal(home: Home) -> Iterator[Terminal]:
    env = {
        "HOME": str(home.root),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        **suite_env(),
    }
    term = Terminal(f"gputui-e2e-{os.getpid()}", ["env", "-i", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "gputui"])
    try:
        yield term
    finally:
        term.close()


def test_start_watch_attach_and_kill_by_keyboard(terminal: Terminal) -> None:
    terminal.wait("1 host: 1 up")
    terminal.wait("cpu ")

    terminal.keys("n")
    terminal.wait("Command (split like a shell")
    terminal.keys("python3 -c \"print('e2e-ok-' + str(6 * 7))\"", literal=True)
    terminal.keys("Enter")
    terminal.wait("e2e-ok-42")  # the job's output, in the log pane
    terminal.wait("succeeded")

    terminal.keys("n")
    terminal.wait("Command (split like a shell")
    terminal.keys(
        "python3 -c \"import time; print('still-' + 'here', flush=True); time.sleep(600)\"", literal=True
    )
    terminal.keys("Enter")
    terminal.wait("still-here")  # the job's output: the command line itself says 'still-' + 'here'

    terminal.keys("a")  # attach: the pane now shows the job's own tmux session
    try:
        wait_for(lambda: "Hosts" not in terminal.screen(), 30, 0.1, "the app to hand over the terminal")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{terminal.screen()}") from None
    terminal.wait("still-here")
    terminal.keys("C-b", "d")  # detach from the job's tmux: back in the app
    terminal.wait("Hosts")
    terminal.wait("still-here")

    terminal.keys("k")
    terminal.wait("SIGKILL")
    terminal.keys("y")
    terminal.wait("killed")

    terminal.keys("q")
    wait_for(lambda: "Hosts" not in terminal.screen(), 30, 0.1, "the app to quit")

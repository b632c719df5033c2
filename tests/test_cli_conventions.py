"""CLI conventions: Rich progress on a terminal (off when piped), shell completion, NO_COLOR, --json."""

from __future__ import annotations

import io
import itertools
import os
import pty
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncssh
import pytest
from conftest import Home

from gputui.cli import common


def _on_pty(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, int, int]]) -> str:
    """Run progress_printer's callback with stderr on a pseudo-terminal; what the terminal received."""
    master, slave = pty.openpty()
    err = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr(common, "time", SimpleNamespace(monotonic=itertools.count(step=1.0).__next__))  # no throttle
    with common.progress_printer() as show:
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
                                 ("ckpt.pt", 50 * mb, 50 * mb)])
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
    with common.progress_printer() as show:
        assert show is None


def test_no_color_turns_the_bar_colourless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    seen = _on_pty(monkeypatch, [("a.pt", 0, 100), ("a.pt", 40, 100), ("a.pt", 100, 100)])
    assert "━" * 10 in seen  # the done part of the bar, drawn without colour
    assert "\x1b[3" not in seen and "\x1b[9" not in seen  # no colour at all


# --- a server that runs no commands (RunPod's basic SSH proxy) ----------------------------------------------------
class _ShellOnly(asyncssh.SSHServerSession):  # type: ignore[misc]
    """Interactive shells only, as ssh.runpod.io: an exec request is refused."""

    def exec_requested(self, command: str) -> bool:
        return False

    def shell_requested(self) -> bool:
        return True


class _NoAuth(asyncssh.SSHServer):  # type: ignore[misc]
    def begin_auth(self, username: str) -> bool:
        return False

    def session_requested(self) -> _ShellOnly:
        return _ShellOnly()


async def _shell_only_server(tmp_path: Path) -> tuple[Any, int, Path]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.create_server(
        _NoAuth, "127.0.0.1", 0, server_host_keys=[key]
    )
    port = server.sockets[0].getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_bytes(f"[127.0.0.1]:{port} ".encode() + key.export_public_key())
    return server, port, known


async def test_a_server_that_runs_no_commands_gets_an_error_naming_the_fix(tmp_path: Path) -> None:
    from gputui.core.config.file import HostConfig
    from gputui.core.transport.base import HostError
    from gputui.core.transport.ssh import SSHTransport

    server, port, known = await _shell_only_server(tmp_path)
    try:
        host = HostConfig(name="pod", host="127.0.0.1", port=port, user="root", known_hosts=str(known),
                          remote_dir=str(tmp_path / "state"), connect_timeout=10)
        transport = SSHTransport(host)
        with pytest.raises(HostError) as caught:
            await transport.open_agent()
        await transport.close()
    finally:
        server.close()
    said = str(caught.value)
    assert caught.value.kind == "no_exec"
    assert "did not run a command over SSH" in said and "exposed TCP port" in said


@pytest.mark.parametrize("host", ["ssh.runpod.io", "SSH.RunPod.io."])
async def test_the_runpod_proxy_is_named_before_any_connect(host: str) -> None:
    from gputui.core.config.file import HostConfig
    from gputui.core.transport.base import HostError
    from gputui.core.transport.ssh import SSHTransport

    transport = SSHTransport(HostConfig(name="pod", host=host, user="abc123-64411", connect_timeout=10))
    with pytest.raises(HostError, match="RunPod's basic SSH proxy.*exposed TCP port") as caught:
        await transport.open_agent()
    assert caught.value.kind == "no_exec"


# --- shell completion -----------------------------------------------------------------------------------------------
def _completion_home(home: Home) -> None:
    home.write_config(
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n\n'
        '[hosts.gpu1]\nhost = "203.0.113.7"\n\n[hosts.gpu2]\nhost = "203.0.113.8"\n'
    )


def test_completion_of_commands_options_and_host_names(home: Home) -> None:
    _completion_home(home)
    said = lambda *w: home.cli("__complete", *w, check=True).stdout.split()  # noqa: E731
    assert {"status", "sync", "run", "logs", "add"} <= set(said(""))
    assert said("st") == ["start", "status"] and said("stat") == ["status"]
    assert "--json" in said("status", "--j") and "--version" in said("--v")
    assert said("logs", "g") == ["gpu1", "gpu2"]
    assert said("--config", str(home.root / ".config/gputui/config.toml"), "kill", "") == ["gpu1", "gpu2", "local"]
    assert said("sync", "gpu1", "") == []  # a path: the shell's own completion


def test_completion_of_job_ids_through_bash(home: Home, tmp_path: Path) -> None:
    _completion_home(home)
    job = home.cli("run", "local", "--", "true", check=True).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gputui").write_text(f'#!/bin/sh\nexec {sys.executable} -m gputui "$@"\n')
    (bindir / "gputui").chmod(0o755)
    script = home.cli("--completion", "bash", check=True).stdout
    assert "complete -o default -F _gputui gputui" in script
    env = {**home.env, "PATH": f"{bindir}:{os.environ['PATH']}"}
    run = f'eval "$(gputui --completion bash)"; COMP_WORDS=(gputui logs local "{job[:2]}"); COMP_CWORD=3; _gputui; ' \
          'printf "%s\\n" "${COMPREPLY[@]}"'
    res = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
    assert job in res.stdout.split(), res.stderr


# --- --json and NO_COLOR ---------------------------------------------------------------------------------------------
TABLES = {"status", "cost", "doctor", "hosts", "jobs", "history", "queue", "compare", "service"}  # each command that prints a table
NOT_TABLES = {"run", "logs", "kill", "trust", "sync", "pull", "forward", "release", "start", "autostop", "notify", "add",
              "remove"}


def test_every_command_that_prints_a_table_takes_json() -> None:
    from gputui.cli.main import _subparsers, build_parser

    commands = _subparsers(build_parser())
    assert set(commands) == TABLES | NOT_TABLES  # a new command must be sorted into one of the two
    missing = [c for c in sorted(TABLES) if "--json" not in commands[c]._option_string_actions]
    assert not missing, f"tables without --json: {missing}"


def test_json_output_parses_and_holds_no_colour(home: Home) -> None:
    import json

    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    for argv in (["hosts", "--json"], ["cost", "--json"]):
        res = home.cli(*argv, check=True)
        assert isinstance(json.loads(res.stdout), dict) and "\x1b" not in res.stdout


async def test_no_color_turns_the_app_colourless(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gputui.core.config import file as cfg
    from gputui.ui.app import GpuTuiApp

    monkeypatch.setenv("NO_COLOR", "1")
    app = GpuTuiApp(cfg.Config(path=None, hosts={}), state_path=tmp_path / "ui.json")
    async with app.run_test(size=(100, 30)):
        assert app.no_color and any(type(f).__name__ in ("NoColor", "Monochrome") for f in app._filters)

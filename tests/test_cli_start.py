"""CLI commands on a local host start light: no UI (textual, rich) and no SSH (asyncssh) imported, and
`status` loads no log parser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Home

HEAVY = {"textual", "rich", "asyncssh", "cryptography"}


@pytest.mark.parametrize("command", ["status", "jobs", "history"])
def test_cli_on_a_local_host_imports_no_ui_and_no_ssh(home: Home, command: str) -> None:
    home.env["PYTHONPROFILEIMPORTTIME"] = "1"
    res = home.cli(command, "--json", check=True)
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "gputui.cli" in imported
    assert sorted(m for m in imported if m.split(".")[0] in HEAVY) == []
    if command == "status":  # no log is parsed: the parser is not loaded
        assert "gputui.core.insights" not in imported


@pytest.mark.parametrize("argv", [["status", "--json"], ["--config", "c.toml", "jobs", "--json"]])
def test_a_command_imports_only_its_own_command_module(home: Home, argv: list[str]) -> None:
    """``gputui status`` loads the fleet commands' module, not the sync, release, hosts or compare code."""
    if argv[0] == "--config":
        argv[1] = str(home.write_config('[hosts.local]\ntransport = "local"\n'))
    show = "import atexit, sys; atexit.register(lambda: print(' '.join(sys.modules), file=sys.stderr))"
    res = subprocess.run(
        [sys.executable, "-c", f"{show}; from gputui.cli import main; main({argv!r})"],
        env=home.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    imported = set(res.stderr.split())
    own = ["fleet"] if "status" in argv else ["files", "jobs"]  # jobs' `run --sync` is the files module's
    families = {f"gputui.cli.{name}" for name in ("jobs", "fleet", "release", "files", "hosts", "compare")}
    assert sorted(imported & families) == [f"gputui.cli.{name}" for name in own]


def test_the_list_of_command_modules_names_every_command_of_each() -> None:
    """main.FAMILIES (which module a command line loads) says what each module registers, in --help's order."""
    import argparse
    import importlib

    from gputui.cli.main import FAMILIES, _subparsers, build_parser

    for family, commands in FAMILIES.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"gputui.cli.{family}").register(sub)
        assert tuple(sub.choices) == commands
    every = [c for cmds in FAMILIES.values() for c in cmds]
    assert list(_subparsers(build_parser())) == every
    assert list(_subparsers(build_parser("sync"))) == ["sync", "forward", "pull"]


@pytest.mark.parametrize(
    ("argv", "word"),
    [(["status"], "status"), (["--config", "status", "jobs"], "jobs"), (["--config=x", "-h"], None),
     (["--version"], None), (["nope", "x"], "nope")],
)
def test_command_word(argv: list[str], word: str | None) -> None:
    from gputui.cli.main import command_word

    assert command_word(argv) == word


def test_asyncssh_is_imported_without_running_a_compiler_or_linker(tmp_path: Path) -> None:
    """asyncssh looks for optional C libraries at import (ctypes.util.find_library), which runs gcc and ld for
    each one the loader's cache lacks (liboqs, usually): through gputui it reads only that cache, and
    find_library is itself again afterwards."""
    import os

    bin_dir, ran = tmp_path / "bin", tmp_path / "ran"
    bin_dir.mkdir()
    for tool in ("gcc", "cc", "ld"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} >> "{ran}"\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env.pop("LD_LIBRARY_PATH", None)
    check = "import ctypes.util, gputui.core.transport.ssh, asyncssh; print(ctypes.util.find_library.__qualname__)"
    res = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "find_library"
    assert not ran.exists(), ran.read_text()

"""The state dir on the host is ours alone: refused when shared or foreign, never chmod'ed, no symlinks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, AgentProc, Home, kill_tmux


def hello_of(state: Path) -> tuple[dict, int]:
    """The agent's first frame and its exit status, for a state dir it may refuse."""
    proc = subprocess.run(
        [sys.executable, "-m", "remote_agent", "serve", "--state-dir", str(state)],
        input=b"", capture_output=True, cwd=ROOT, timeout=30,
    )
    return json.loads(proc.stdout.splitlines()[0]), proc.returncode


def test_a_shared_sticky_dir_is_refused_and_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    hello, code = hello_of(shared)
    error = hello["data"]["error"]
    assert code != 0 and error["code"] == "state_dir"
    assert str(shared) in error["message"] and "writable by others (mode 1777)" in error["message"]
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777  # the sticky bit is still there
    assert list(shared.iterdir()) == []


def test_a_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a dir to another user")
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    hello, _ = hello_of(foreign)
    assert str(foreign) in hello["data"]["error"]["message"]
    assert "belongs to uid 65534, not to you" in hello["data"]["error"]["message"]


def test_an_existing_private_dir_keeps_its_mode(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chmod(mine, 0o750)
    agent = AgentProc(mine)
    try:
        assert agent.call("ping")["ok"]
        assert stat.S_IMODE(mine.stat().st_mode) == 0o750
        assert stat.S_IMODE((mine / "jobs").stat().st_mode) == 0o700  # ours: created private
    finally:
        agent.close()
        kill_tmux(mine)


def test_cli_names_the_refused_dir_and_why(home: Home, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    home.env["GPUTUI_STATE_DIR"] = str(shared)
    res = home.cli("jobs")
    assert res.returncode == 4, res.stderr  # a host error, not "unreachable"
    assert f"refusing state dir {shared}: it is writable by others" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_planted_metrics_symlink_is_refused(tmp_path: Path) -> None:
    state, outside = tmp_path / "state", tmp_path / "outside"
    state.mkdir(mode=0o700)
    outside.mkdir()
    (state / "metrics").symlink_to(outside)
    hello, _ = hello_of(state)
    assert (
        "metrics" in hello["data"]["error"]["message"]
        and "symbolic link" in hello["data"]["error"]["message"]
    )
    assert list(outside.iterdir()) == []


def test_watchdog_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    from remote_agent.watchdog.daemon import LOG, Watchdog

    state, outside = tmp_path / "state", tmp_path / "outside.log"
    state.mkdir(mode=0o700)
    outside.write_text("theirs\n")
    (state / LOG).symlink_to(outside)
    Watchdog(str(state)).log("armed")
    agent = AgentProc(state)
    try:
        config = {"autostop_minutes": 60, "release_remote": ["true"]}
        reply = agent.call("watchdog.configure", config=config)
        assert not reply["ok"] and "watchdog.log is a symbolic link" in reply["error"]["message"]
    finally:
        agent.close()
        kill_tmux(state)
    assert outside.read_text() == "theirs\n"

"""The CLI starts the local agent while it imports (gputui.core.deploy.agentproc); the local transport takes it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gputui.core import paths
from gputui.core.deploy import agentproc
from gputui.core.session.host import HostSession
from gputui.core.transport.base import LocalTransport


async def test_an_agent_started_early_is_taken_once_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    state = tmp_path / "state"
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.local]\ntransport = "local"\nremote_dir = "{state}"\n')
    agentproc.start_early(["--config", str(config), "status", "--json"])
    assert len(agentproc._started) == 1
    early = next(iter(agentproc._started.values()))
    session = HostSession("local", LocalTransport(str(state), paths.cache_dir(), python=sys.executable))
    await session.start()
    try:
        assert agentproc._started == {}  # taken, not started again
        assert session.snapshot.facts["agent_pid"] == early.pid
        assert (await session.list_jobs()) == []
    finally:
        await session.close()
    assert early.poll() is not None  # stopped with the session


def test_no_early_start_for_other_commands(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[hosts.local]\ntransport = "local"\nremote_dir = "{tmp_path / "state"}"\n')
    for args in (["run", "local", "--", "true"], ["--config", str(config), "logs", "local", "1"], []):
        agentproc.start_early(args)
    assert agentproc._started == {}

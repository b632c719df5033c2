"""A config edited by hand while the app runs: hosts added and removed join and leave the fleet; a broken
edit is an error shown in the app, and the hosts stay as they were."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import Home
from test_ui_app import until

from gputui.core.config import file as cfg
from gputui.core.session import model as M
from gputui.ui import app as app_module
from gputui.ui.app import GpuTuiApp
from gputui.ui.widgets.fleet import FleetTable

SIZE = (160, 48)


def table(name: str, state: Path) -> str:
    return f'[hosts.{name}]\ntransport = "local"\nremote_dir = "{state}"\n'


@pytest.fixture
def env(home: Home, monkeypatch: pytest.MonkeyPatch) -> Home:
    monkeypatch.setenv("HOME", str(home.root))
    for key in list(os.environ):
        if key.startswith(("XDG_", "GPUTUI_")):
            monkeypatch.delenv(key)
    monkeypatch.setattr(app_module, "CONFIG_POLL_S", 0.05)
    return home


def messages(app: GpuTuiApp, start: str) -> list[str]:
    return [n.message for n in app._notifications if n.message.startswith(start)]


async def test_hosts_added_and_removed_by_hand_follow_and_a_broken_edit_is_shown(
    env: Home, tmp_path: Path
) -> None:
    path = tmp_path / "config.toml"
    first = "# my fleet\n" + table("alpha", env.state_dir)
    path.write_text(first)
    app = GpuTuiApp(cfg.load(str(path)), state_path=tmp_path / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["alpha"].state == M.CONNECTED, what="alpha up")
        await until(pilot, lambda: app._watch is not None and app._watch._digest is not None, what="first look")
        path.write_text(first + table("beta", tmp_path / "beta-state"))
        await until(pilot, lambda: "beta" in app.hosts, what="beta added")
        # Said as the host joins (the note lasts NOTIFY_S: a slow connect must not outlive it).
        await until(pilot, lambda: messages(app, "config reloaded: added beta"), what="said")
        await until(pilot, lambda: app.hosts["beta"].state == M.CONNECTED, what="beta connected")
        assert "beta" in app.query_one(FleetTable).rows

        path.write_text(first + "[hosts.gamma\n")  # broken TOML
        await until(pilot, lambda: messages(app, "config not reloaded"), what="the error shown")
        assert set(app.hosts) == {"alpha", "beta"} and app.is_running  # no crash, nothing dropped

        path.write_text(first)
        await until(pilot, lambda: "beta" not in app.hosts, what="beta removed")
        assert "beta" not in app.query_one(FleetTable).rows and app.host_order == ["alpha"]
        assert app.hosts["alpha"].state == M.CONNECTED

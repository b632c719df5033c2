"""The app's doctor and history views, its real release and autostop keys, on the real local host."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import Home, wait_for
from test_ui_app import SIZE, connected, local_app, screen_text, until

from gputui.core.config import file as cfg
from gputui.core.session import model as M
from gputui.ui import notices
from gputui.ui.screens.reports import ReportScreen


@pytest.fixture
def local_cfg(home: Home, monkeypatch: pytest.MonkeyPatch):
    """Build a local-host config with extra settings, HOME isolated (the ledger lives there too)."""
    monkeypatch.setenv("HOME", str(home.root))
    for key in list(os.environ):
        if key.startswith(("XDG_", "GPUTUI_")):
            monkeypatch.delenv(key)

    def make(**kw) -> cfg.Config:
        host = cfg.HostConfig(name="local", transport="local", remote_dir=str(home.state_dir), **kw)
        return cfg.Config(path=None, hosts={"local": host})

    yield make
    state = home.state_dir / "watchdog_state.json"
    pid = json.loads(state.read_text()).get("pid") if state.exists() else None
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def test_doctor_view_shows_the_hosts_checks(local_cfg, tmp_path: Path) -> None:
    app = local_app(local_cfg(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), what="doctor screen")
        await until(pilot, lambda: "tmux" in screen_text(app) and "OK" in screen_text(app), 60, "checks")
        assert "Doctor: local" in screen_text(app)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ReportScreen), what="closed")


async def test_history_view_lists_finished_runs(home: Home, local_cfg, tmp_path: Path) -> None:
    job_id = home.cli("run", "local", "--name", "finished-run", "--", sys.executable, "-c", "print('loss=0.25')")
    home.cli("logs", "-f", "local", job_id.stdout.strip(), check=True)
    app = local_app(local_cfg(price_per_hour=2.0), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("h")
        await until(pilot, lambda: "finished-run" in screen_text(app), 60, "history row")
        text = screen_text(app)
        assert "succeeded" in text and "loss=0.25" in text


async def test_release_key_runs_the_configured_release(local_cfg, tmp_path: Path) -> None:
    done = tmp_path / "released"
    app = local_app(local_cfg(release=("touch", str(done))), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("r")
        await until(pilot, lambda: f"Runs here: touch {done}" in getattr(app.screen, "body", ""), what="confirm")
        await pilot.press("y")
        await until(pilot, done.exists, what="release command ran")
        await until(pilot, lambda: any("local released" in n.message for n in app._notifications), what="notice")
        assert app.source.ledger.released("local")


async def test_autostop_countdown_and_snooze_key(home: Home, local_cfg, tmp_path: Path) -> None:
    never = tmp_path / "never"
    config = local_cfg(autostop_minutes=60.0, release_remote=("touch", str(never)), count_ssh_sessions=False)
    app = local_app(config, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await until(pilot, lambda: "autostop in" in screen_text(app), 60, "countdown shown")
        await pilot.press("z")
        watchdog = home.state_dir / "watchdog.json"
        wait_for(lambda: json.loads(watchdog.read_text()).get("snoozed_until"), what="snooze written")
        await until(pilot, lambda: any("snoozed" in n.message for n in app._notifications), what="notice")
    assert not never.exists()


def test_deadline_is_announced_once_an_hour_before() -> None:
    def snap(left: float | None) -> M.HostSnapshot:
        return M.HostSnapshot(name="h", state=M.CONNECTED, cost=M.CostInfo(deadline_in_s=left))

    assert notices.diff(snap(4000.0), snap(3700.0)) == []
    [n] = notices.diff(snap(3700.0), snap(3500.0))
    assert "released in" in n.message and n.severity == "warning"
    assert notices.diff(snap(3500.0), snap(3400.0)) == []

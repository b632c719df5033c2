"""The app's ``+`` dialog against the real test sshd: destination, the host key's fingerprint to accept, the
doctor's checks, then save; the new host joins the fleet without a restart, the user's config kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SshHome
from test_ui_app import until
from textual.widgets import Button

from gputui.core.config import file as cfg
from gputui.core.jobs.usecases import JobSpec
from gputui.core.session import model as M
from gputui.ui import app as app_module
from gputui.ui.app import GpuTuiApp
from gputui.ui.screens.add_host import AddHostScreen
from gputui.ui.widgets.plain_input import PlainInput

SIZE = (160, 60)


@pytest.fixture
def setup(ssh_home: SshHome, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    monkeypatch.setenv("HOME", str(ssh_home.root))
    monkeypatch.setattr(app_module, "CONFIG_POLL_S", 0.05)
    text = f'# my fleet, my comments\ncurrency = "EUR"   # euros\n\n[defaults]\nremote_dir = "{ssh_home.remote_dir}"\n'
    return ssh_home.write_config(text), text


def steps(screen: AddHostScreen) -> str:
    return "\n".join(screen.lines)


def enabled(screen: AddHostScreen, button: str) -> bool:
    return not screen.query_one(f"#{button}", Button).disabled


async def open_and_connect(pilot: object, app: GpuTuiApp, ssh_home: SshHome) -> AddHostScreen:
    await pilot.press("plus")  # type: ignore[attr-defined]
    screen = await until(pilot, lambda: isinstance(app.screen, AddHostScreen) and app.screen, what="dialog")  # type: ignore[arg-type]
    s = ssh_home.sshd
    screen.query_one("#name", PlainInput).value = "gpu1"
    screen.query_one("#dest", PlainInput).value = f"ssh {s.user}@127.0.0.1 -p {s.port} -i {s.keys['ok']}"
    screen.query_one("#price", PlainInput).value = "2.5"
    await pilot.click("#connect")  # type: ignore[attr-defined]
    await until(pilot, lambda: enabled(screen, "trust"), what="the key to accept")  # type: ignore[arg-type]
    return screen


async def test_plus_adds_a_host_that_joins_the_fleet(ssh_home: SshHome, setup: tuple[Path, str]) -> None:
    path, before = setup
    known = ssh_home.root / ".ssh" / "known_hosts"
    app = GpuTuiApp(cfg.load(str(path)), state_path=ssh_home.root / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_and_connect(pilot, app, ssh_home)
        assert f"ED25519 key {ssh_home.sshd.fingerprint()}" in steps(screen)
        assert not known.exists() and path.read_text() == before  # nothing written before Save

        await pilot.click("#trust")
        await until(pilot, lambda: enabled(screen, "save"), what="the checks")
        assert "tmux" in steps(screen).lower() and "gpu1: " in steps(screen)  # the doctor's report
        assert path.read_text() == before and not known.exists()

        await pilot.click("#save")
        await until(pilot, lambda: "gpu1" in app.hosts and app.hosts["gpu1"].state == M.CONNECTED, what="gpu1 up")
        assert not isinstance(app.screen, AddHostScreen)
        text = path.read_text()
        assert text.startswith(before) and "[hosts.gpu1]" in text and "price_per_hour = 2.5" in text
        assert known.read_text() == ssh_home.sshd.host_key_line()
        assert app.config.hosts["gpu1"].price_per_hour == 2.5

        # a job runs on the new host, through the app's own path
        await app._start_job(JobSpec(host="gpu1", argv=["echo", "hi"]))
        await until(pilot, lambda: any(j.command and not j.running and j.exit_code == 0
                                       for j in app.hosts["gpu1"].jobs), what="the job ran")


async def test_cancel_at_the_key_writes_nothing(ssh_home: SshHome, setup: tuple[Path, str]) -> None:
    path, before = setup
    app = GpuTuiApp(cfg.load(str(path)), state_path=ssh_home.root / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await open_and_connect(pilot, app, ssh_home)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AddHostScreen), what="closed")
        assert path.read_text() == before and not (ssh_home.root / ".ssh" / "known_hosts").exists()
        assert "gpu1" not in app.hosts


async def test_a_bad_destination_is_said_in_the_dialog(ssh_home: SshHome, setup: tuple[Path, str]) -> None:
    path, before = setup
    app = GpuTuiApp(cfg.load(str(path)), state_path=ssh_home.root / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus")
        screen = await until(pilot, lambda: isinstance(app.screen, AddHostScreen) and app.screen, what="dialog")
        screen.query_one("#name", PlainInput).value = "gpu1"
        screen.query_one("#dest", PlainInput).value = "@host"
        await pilot.click("#connect")
        await until(pilot, lambda: "not added:" in steps(screen), what="the error")
        assert "not a user name" in steps(screen) and enabled(screen, "connect")
        assert path.read_text() == before

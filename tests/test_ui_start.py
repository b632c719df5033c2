"""The app's start with SSH hosts in the config: the first frame and the local host wait for neither the SSH
stack (asyncssh and its crypto load in a thread after the first frame) nor an SSH host's connect; the local
host's agent starts before the app's modules load. No timings here: bench/ui_start.py measures them."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Home, SshHome
from faultproxy import FaultProxy
from test_ui_app import until
from ui_fixtures import screen_text

import gputui.ui as ui
from gputui import appstart
from gputui.core import paths
from gputui.core.config import file as cfg
from gputui.core.deploy import agentproc
from gputui.core.hosts.fleet import Fleet
from gputui.core.session import model as M
from gputui.core.session.host import HostSession
from gputui.ui import app as app_module
from gputui.ui.app import GpuTuiApp

SIZE = (160, 48)
TESTS = Path(__file__).parent
ROOT = TESTS.parent


def local_table(state_dir: Path) -> str:
    return f'[hosts.local]\ntransport = "local"\nremote_dir = "{state_dir}"\n'


def ssh_table(name: str, **settings: object) -> str:
    return f"[hosts.{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


@pytest.fixture
def hung() -> Iterator[int]:
    """A port that takes TCP connections (the kernel's backlog) and never says a word: a connect held."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as sock:
        yield sock.getsockname()[1]


class FirstFrame(GpuTuiApp):
    """The app, keeping what its first frame showed."""

    CSS_PATH = str(Path(app_module.__file__).with_name("gputui.tcss"))  # relative paths follow the subclass
    first_frame = ""
    local_link_started = False  # the local host's link was under way by the first frame

    def on_ready(self) -> None:
        self.first_frame = screen_text(self)
        self.local_link_started = self.source.session("local")._runner is not None
        super().on_ready()


def row(screen: str, host: str) -> str:
    return next(line for line in screen.splitlines() if line.strip(" │┃").startswith(host + " "))


async def test_an_ssh_host_held_at_connect_reads_connecting_and_the_local_host_comes_up_meanwhile(
    ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    proxy.blackhole()  # box's connect waits in the proxy's backlog until restore()
    path = ssh_home.write_config(
        ssh_table("box", **ssh_home.host_settings(port=proxy.port)) + local_table(ssh_home.state_dir)
    )
    app = FirstFrame(cfg.load(str(path)), state_path=tmp_path / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.first_frame, what="the first frame")
        assert "◌ connecting" in row(app.first_frame, "box") and app.local_link_started
        await until(pilot, lambda: app.hosts["local"].state == M.CONNECTED, what="local up")
        assert app.hosts["box"].state == M.CONNECTING  # still held: local did not wait for it
        proxy.restore()
        await until(pilot, lambda: app.hosts["box"].state == M.CONNECTED, what="box up once let through")


FIRST_FRAME_PROBE = """
import asyncio, json, sys
from pathlib import Path
from gputui.core.config import file as cfg
from gputui.ui.app import GpuTuiApp
from ui_fixtures import screen_text

seen = {}

on_ready = GpuTuiApp.on_ready

def first_frame(app):
    seen["first_frame"] = screen_text(app)
    seen["asyncssh_at_first_frame"] = "asyncssh" in sys.modules
    on_ready(app)

GpuTuiApp.on_ready = first_frame

async def main():
    app = GpuTuiApp(cfg.load(sys.argv[1]), state_path=Path(sys.argv[2]))
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(1200):  # the SSH host's session is built once the SSH stack has loaded
            if "first_frame" in seen and "hung" in app.source.sessions:
                break
            await pilot.pause(0.05)
        seen["asyncssh_once_built"] = "asyncssh" in sys.modules
        seen["hung"] = app.hosts["hung"].state
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_the_first_frame_does_not_wait_for_the_ssh_stack(home: Home, hung: int, tmp_path: Path) -> None:
    """In a fresh interpreter (this one has asyncssh loaded): asyncssh is not loaded when the first frame is
    out, and is once the SSH host's session is built."""
    path = home.write_config(local_table(home.state_dir) + ssh_table("hung", host="127.0.0.1", port=hung))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIRST_FRAME_PROBE), str(path), str(tmp_path / "ui.json")],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert "◌ connecting" in row(seen["first_frame"], "hung")
    assert seen["asyncssh_at_first_frame"] is False
    assert seen["asyncssh_once_built"] is True and seen["hung"] == M.CONNECTING  # held by the silent port


async def test_an_ssh_stack_that_does_not_load_is_each_ssh_hosts_error(
    home: Home, hung: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gputui.core.transport.ssh", None)  # importing it raises ImportError
    path = home.write_config(local_table(home.state_dir) + ssh_table("hung", host="127.0.0.1", port=hung))
    app = GpuTuiApp(cfg.load(str(path)), state_path=tmp_path / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["hung"].state == M.ERROR, what="hung's error")
        assert "cannot load the SSH support" in (app.hosts["hung"].error or "")
        await until(pilot, lambda: app.hosts["local"].state == M.CONNECTED, what="local up all the same")


def test_a_deferred_ssh_host_is_built_when_asked_for_and_listed_in_config_order(home: Home, hung: int) -> None:
    from gputui.core.transport.ssh import SSHTransport

    text = ssh_table("hung", host="127.0.0.1", port=hung) + local_table(home.state_dir)
    fleet = Fleet(cfg.parse(text, home.root / "config.toml"), defer_ssh=True)
    assert list(fleet.sessions) == ["local"]  # hung waits for the SSH stack
    assert [(s.name, s.state) for s in fleet.snapshots()] == [("hung", M.CONNECTING), ("local", M.CONNECTING)]
    session = fleet.session("hung")  # an action before the loader got to it: built now
    assert isinstance(session, HostSession) and isinstance(session.transport, SSHTransport)
    assert fleet.session("hung") is session and list(fleet.sessions) == ["local", "hung"]
    assert fleet.forget("local") is not None and [s.name for s in fleet.snapshots()] == ["hung"]


def local_argv(state_dir: Path) -> tuple[str, ...]:
    return tuple(agentproc.serve_argv(sys.executable, paths.cache_dir(), str(state_dir)))


def test_the_app_launch_starts_the_local_agent_before_the_app_loads(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = home.write_config(local_table(home.state_dir))
    under_way: list[bool] = []

    def run(config: cfg.Config, seeds: object = None) -> int:  # where the app's modules would load
        under_way.append(bool(agentproc._starting) or bool(agentproc._started))
        return 0

    monkeypatch.setattr(ui, "run", run)
    try:
        assert appstart.run_app(str(path)) == 0
    finally:
        import gc

        gc.enable()
        early = agentproc.take(list(local_argv(home.state_dir)))  # waits for the start's thread
    assert under_way == [True] and early is not None and early.poll() is None
    early.communicate(timeout=30)  # stdin closed: the agent ends


async def test_the_app_adopts_the_local_agent_started_with_it(home: Home, tmp_path: Path) -> None:
    config = cfg.parse(local_table(home.state_dir), home.root / "config.toml")
    appstart.start_local_agents(list(config.hosts.values()))
    early = agentproc._started[local_argv(home.state_dir)]
    app = GpuTuiApp(config, state_path=tmp_path / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["local"].state == M.CONNECTED, what="local up")
        assert local_argv(home.state_dir) not in agentproc._started and early.poll() is None  # taken, serving


async def test_a_local_host_the_service_shows_starts_its_agent_after_the_first_frame(
    home: Home, hung: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the session service's seed showing the local host up, the launch starts no local agent early and
    the app starts its link after the first frame (the frame has the host already; the agent's start would only
    share the CPU with it); the app's own link to it then takes over."""
    path = home.write_config(local_table(home.state_dir) + ssh_table("hung", host="127.0.0.1", port=hung))
    direct = subprocess.run([sys.executable, "-m", "gputui", "status", "--json", "--config", str(path)],
                            env=home.env, capture_output=True, text=True, timeout=120)
    seeds = [h for h in json.loads(direct.stdout)["hosts"] if h["name"] == "local"]  # as the service has it
    assert [h["state"] for h in seeds] == [M.CONNECTED]
    from gputui.service import client

    monkeypatch.setattr(client, "seed", lambda config_path: seeds)
    launched: list[object] = []
    monkeypatch.setattr(ui, "run", lambda config, seeds=None: launched.append(seeds) or 0)
    try:
        assert appstart.run_app(str(path)) == 0
    finally:
        import gc

        gc.enable()
    assert launched == [seeds] and local_argv(home.state_dir) not in agentproc._started and not agentproc._starting

    started_at_first_frame: list[bool] = []

    class FirstFrame(GpuTuiApp):
        CSS_PATH = str(ROOT / "gputui" / "ui" / "gputui.tcss")

        def on_ready(self) -> None:
            started_at_first_frame.append(self.source.session("local")._runner is not None)
            super().on_ready()

    app = FirstFrame(cfg.load(str(path)), state_path=tmp_path / "ui.json", seeds=seeds)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: started_at_first_frame, what="the first frame")
        assert started_at_first_frame == [False] and app.hosts["local"].state == M.CONNECTED  # the seed
        await until(pilot, lambda: "local" not in app._seeded and app.hosts["local"].facts.get("agent_pid"),
                    what="the app's own link to take over")


def test_the_build_an_early_start_checked_is_not_checked_again_before_its_agent_is_taken(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gputui.core.deploy import bundle

    checks: list[Path] = []
    real = bundle.ensure_local_build
    monkeypatch.setattr(bundle, "ensure_local_build", lambda cache_dir: checks.append(cache_dir) or real(cache_dir))
    host = cfg.HostConfig(name="local", transport="local", remote_dir=str(home.state_dir))
    agentproc.start_local_soon([host])
    early = agentproc.take(list(local_argv(home.state_dir)))  # what LocalTransport.open_agent does
    assert early is not None and len(checks) == 1
    local_argv(home.state_dir)  # a later start checks again
    assert len(checks) == 2
    early.communicate(timeout=30)


async def test_a_fleet_closed_before_the_ssh_stack_loaded_starts_no_ssh_host(home: Home, hung: int) -> None:
    text = ssh_table("hung", host="127.0.0.1", port=hung)
    fleet = Fleet(cfg.parse(text, home.root / "config.toml"), defer_ssh=True)
    fleet.run_in_background()
    await fleet.close()  # the user quit at once
    assert fleet.session("hung")._runner is None  # built when asked for after the close, never connecting


async def test_the_ssh_stack_loads_once_the_local_host_is_connected(
    home: Home, hung: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load holds the GIL most of its time: the local host's hello goes first (bounded by LOCAL_FIRST_S,
    made long here so that the order is the rule's, whatever the machine's load)."""
    import importlib

    from gputui.core.hosts import fleet as fleet_module

    monkeypatch.setattr(fleet_module, "LOCAL_FIRST_S", 60.0)
    text = local_table(home.state_dir) + ssh_table("hung", host="127.0.0.1", port=hung)
    fleet = Fleet(cfg.parse(text, home.root / "config.toml"), defer_ssh=True)
    local_at_load: list[str] = []
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> object:
        if name == fleet_module.SSH_STACK:
            local_at_load.append(fleet.sessions["local"].snapshot.state)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    fleet.run_in_background()
    try:
        await fleet.sessions["local"].wait_connected(timeout=60)
        for _ in range(600):
            if "hung" in fleet.sessions:
                break
            await asyncio.sleep(0.05)
    finally:
        await fleet.close()
    assert local_at_load == [M.CONNECTED]

"""Version skew: an older agent build's watchdog on the host when a newer gputui connects, and an agent that
speaks another protocol. The "old build" is a real copy of remote_agent/ in a folder named like a build
(``gputui-agent-<id>``, which is where its build id comes from), run the way gputui runs a build."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Home, stop_host, wait_for
from test_notify import Hook, hook  # noqa: F401  (the fixture)

from gputui.core.deploy import bundle
from remote_agent.fsutil import read_json
from remote_agent.watchdog import daemon

OLD = "0ld0ld0ld0ld0ld0"


def old_build(tmp_path: Path, build: str = OLD, **constants: int) -> Path:
    """A copy of the agent as a build named ``build``; ``constants`` (e.g. ``PROTOCOL_VERSION=0``) changed."""
    root = tmp_path / f"gputui-agent-{build}"
    shutil.copytree(ROOT / "remote_agent", root / "remote_agent", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "__main__.py").write_bytes(bundle._MAIN)
    for name, value in constants.items():
        for path in (root / "remote_agent").rglob("*.py"):
            text = path.read_text()
            if f"\n{name} = " in text:
                head, rest = text.split(f"\n{name} = ", 1)
                path.write_text(f"{head}\n{name} = {value}\n{rest.split(chr(10), 1)[1]}")
    return root


def new_build_id(home: Home) -> str:
    return bundle.agent_build()[0][len("gputui-agent-") : -len(".pyz")]


class Agent:
    """A build's agent on pipes (``python3 BUILD serve``, as gputui runs it), one request at a time."""

    def __init__(self, build: Path, state_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(build), "serve", "--state-dir", str(state_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        self.hello = self.frame()
        self.send({"op": "flow.credit", "args": {"upto": 1 << 62}})

    def send(self, frame: dict[str, Any]) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        self.proc.stdin.flush()

    def frame(self) -> dict[str, Any]:
        assert self.proc.stdout
        line = self.proc.stdout.readline()  # the agent answers or exits: a heartbeat comes every 2 s
        assert line, "the agent exited"
        return json.loads(line)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.send({"id": 1, "op": op, "args": args})
        while True:
            reply = self.frame()
            if reply.get("id") == 1:
                return reply

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process its parent has not reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def configure(home: Home, extra: str) -> None:
    home.write_config(
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\ncount_ssh_sessions = false\n{extra}'
    )


def start_old_watchdog(home: Home, build: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The old build's agent arms its watchdog, then its client goes; the old watchdog's record."""
    agent = Agent(build, home.state_dir)
    try:
        reply = agent.call("watchdog.configure", config=config)
        assert reply["result"]["armed"] is True, reply
    finally:
        agent.close()
    return wait_for(lambda: (daemon.owner(str(home.state_dir)) or {}).get("build") == build.name[13:]
                    and daemon.owner(str(home.state_dir)), what="the old build's watchdog to start")


def test_a_newer_client_replaces_an_older_builds_watchdog(home: Home, tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    old = start_old_watchdog(home, old_build(tmp_path), {"notify": {"webhook": hook.url, "events": ["job_failed"]},
                                                         "interval": 0.5})
    configure(home, f'[hosts.local.notify]\nwebhook = "{hook.url}"\nevents = ["job_failed"]\n')
    home.cli("status", check=True)  # the new build's agent arms the watchdog: its own build takes over
    new = new_build_id(home)
    record = wait_for(lambda: (daemon.owner(str(home.state_dir)) or {}).get("build") == new
                      and daemon.owner(str(home.state_dir)), timeout=60, what="the new build's watchdog")
    wait_for(lambda: not alive(old["pid"]), what="the old watchdog to exit")
    assert record["pid"] != old["pid"] and alive(record["pid"]) and record["revision"] == daemon.REVISION
    log = (home.state_dir / daemon.LOG).read_text()
    assert f"exiting: build {new} takes over from this build ({OLD})" in log
    assert f"build {new} takes over from build {OLD}" in log
    assert not (home.state_dir / daemon.STOP).exists()
    # the new watchdog does the work now: a failed job is posted once
    home.cli("run", "local", "--name", "boom", "--", sys.executable, "-c", "raise SystemExit(3)", check=True)
    wait_for(lambda: hook.bodies, timeout=60, what="the job_failed POST from the new watchdog")
    assert [b["text"] for b in hook.bodies] == ["[local] job 1 boom failed (exit 3)"]
    stop_host(home.state_dir)


def test_an_older_client_never_replaces_a_newer_revisions_watchdog(home: Home, tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    newer = old_build(tmp_path, "7e7e7e7e7e7e7e7e", REVISION=daemon.REVISION + 1)
    running = start_old_watchdog(home, newer, {"notify": {"webhook": hook.url, "events": ["job_failed"]},
                                               "interval": 0.5})
    configure(home, f'[hosts.local.notify]\nwebhook = "{hook.url}"\nevents = ["job_failed"]\n')
    home.cli("status", check=True)
    assert daemon.owner(str(home.state_dir)) == running and alive(running["pid"])
    assert not (home.state_dir / daemon.STOP).exists()
    stop_host(home.state_dir)


def test_the_old_watchdog_finishes_what_it_does_before_it_is_replaced(home: Home, tmp_path: Path) -> None:
    """A takeover asked for while the old watchdog runs pre_stop waits for the hook to end (nobody kills it);
    the new settings then win (the old one does not release on settings it no longer has) and the host is
    released once, by the new watchdog."""
    gate, hook_done, stopped = tmp_path / "gate", tmp_path / "hook-done", tmp_path / "stopped"
    wait_gate = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\nopen({str(hook_done)!r}, 'w')"
    settings = {"autostop_minutes": 0.01, "interval": 0.5, "count_sessions": False,
                "pre_stop": [sys.executable, "-c", wait_gate], "release_remote": ["touch", str(stopped)]}
    old = start_old_watchdog(home, old_build(tmp_path), settings)
    log = home.state_dir / daemon.LOG
    wait_for(lambda: "pre_stop: running" in log.read_text(), timeout=60, what="the old watchdog's pre_stop")
    configure(home, f'autostop_minutes = 0.01\nrelease_remote = ["touch", "{stopped}"]\n')
    home.cli("status", check=True)
    wait_for(lambda: (home.state_dir / daemon.STOP).exists(), what="the new build to ask the old watchdog to exit")
    assert alive(old["pid"]) and not stopped.exists()  # still in its pre_stop: nobody interrupts it
    gate.touch()
    wait_for(lambda: "release_remote: exit" in log.read_text(), timeout=60, what="the new watchdog's release")
    text = log.read_text()
    assert hook_done.exists() and "not releasing: the config changed while pre_stop ran" in text
    assert text.count("release_remote: exit 0") == 1 and text.index("exiting: build") < text.rindex("releasing:")
    wait_for(lambda: not alive(old["pid"]), what="the old watchdog to exit")
    assert not (home.state_dir / daemon.STOP).exists()
    stop_host(home.state_dir)


def test_a_watchdog_that_released_the_host_is_not_taken_over(tmp_path: Path) -> None:
    """The old watchdog's last pass released the host: the new one, once it holds the lock, stands down."""
    from remote_agent.fsutil import write_json

    state = str(tmp_path)
    holder = f"""import fcntl, json, os, sys, time
lock = open({str(tmp_path / daemon.LOCK)!r}, "w"); fcntl.flock(lock, fcntl.LOCK_EX)
json.dump({{"pid": os.getpid(), "build": "{OLD}", "revision": 1}}, open({str(tmp_path / daemon.OWNER)!r}, "w"))
json.dump({{"pid": os.getpid(), "action": "released"}}, open({str(tmp_path / daemon.STATE)!r}, "w"))
while not os.path.exists({str(tmp_path / daemon.STOP)!r}): time.sleep(0.05)
"""  # stands for an old watchdog: it holds the lock, and exits when asked, having released the host
    proc = subprocess.Popen([sys.executable, "-c", holder])
    try:
        wait_for(lambda: (daemon.owner(state) or {}).get("pid") == proc.pid, what="the stand-in to hold the lock")
        write_json(str(tmp_path / daemon.CONFIG), {"notify": {"webhook": "http://127.0.0.1:9/", "events": ["idle"]}})
        assert daemon.run(state, []) == 0
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    log = (tmp_path / daemon.LOG).read_text()
    assert "the watchdog it replaces released the host; not taking over" in log
    assert daemon.owner(state) == {"pid": proc.pid, "build": OLD, "revision": 1}  # no new watchdog ran


# --- the client refuses an agent that speaks another protocol ---------------------------------------------------
async def test_an_agent_speaking_another_protocol_is_refused(tmp_path: Path) -> None:
    from gputui.core.session.host import HostError, HostSession
    from gputui.core.transport.base import LocalTransport, _stop_process

    build = old_build(tmp_path, PROTOCOL_VERSION=0)
    state = tmp_path / "state"

    class OldTransport(LocalTransport):
        async def open_agent(self) -> Any:
            argv = [sys.executable, str(build), "serve", "--state-dir", str(state)]
            return await self._spawn(argv, _stop_process)

    session = HostSession("old", OldTransport(str(state), tmp_path / "cache"))
    try:
        with pytest.raises(HostError) as err:
            await asyncio.wait_for(session.start(), 60)
        assert err.value.kind == "protocol"
        assert str(err.value) == (
            f"the agent on old speaks protocol 0, this gputui 1 (agent build {OLD}): it is not this gputui's "
            "build; nothing was done on the host"
        )
        assert session.snapshot.state == "error" and session.link is None
    finally:
        await session.close()
    assert read_json(str(state / daemon.OWNER)) is None  # it never got as far as arming anything


def test_a_stop_request_counts_only_while_its_writer_waits(tmp_path: Path) -> None:
    """A request left by a new watchdog that died waiting must not make the old one exit (the host would be
    left with no watchdog), nor wake its naps early (a busy loop)."""
    from remote_agent.fsutil import write_json

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = os.getpid()
    write_json(str(tmp_path / daemon.STOP), {"pid": me, "build": "n3w", "by": gone.pid})
    assert daemon.stop_requested(str(tmp_path)) is None
    write_json(str(tmp_path / daemon.STOP), {"pid": me + 1, "build": "n3w", "by": me})  # for another watchdog
    assert daemon.stop_requested(str(tmp_path)) is None
    write_json(str(tmp_path / daemon.STOP), {"pid": me, "build": "n3w", "by": me})
    assert daemon.stop_requested(str(tmp_path)) == "n3w"


# --- a watchdog from a build before build records (it cannot be asked to exit) ----------------------------------
LEGACY_COMMIT = "4089d82"  # the last agent before watchdog_owner.json


def legacy_build(tmp_path: Path) -> Path:
    """That build, from git: the real old code, named like a build."""
    root = tmp_path / "gputui-agent-1e9acy1e9acy1e9a"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", LEGACY_COMMIT, "remote_agent"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {LEGACY_COMMIT} is not in this checkout")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    (root / "__main__.py").write_bytes(bundle._MAIN)
    return root


def start_legacy_watchdog(home: Home, build: Path, config: dict[str, Any]) -> int:
    agent = Agent(build, home.state_dir)
    try:
        assert agent.call("watchdog.configure", config=config)["result"]["armed"] is True
    finally:
        agent.close()
    pid = wait_for(lambda: daemon.lock_holder(str(home.state_dir)), what="the legacy watchdog to hold the lock")
    assert daemon.owner(str(home.state_dir)) is None and daemon.legacy_holder(str(home.state_dir)) == pid
    return int(pid)


def test_a_legacy_watchdog_is_replaced_between_its_passes(home: Home, tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    pid = start_legacy_watchdog(home, legacy_build(tmp_path),
                                {"notify": {"webhook": hook.url, "events": ["job_failed"]}, "interval": 0.5})
    configure(home, f'[hosts.local.notify]\nwebhook = "{hook.url}"\nevents = ["job_failed"]\n')
    home.cli("status", check=True)
    new = new_build_id(home)
    record = wait_for(lambda: (daemon.owner(str(home.state_dir)) or {}).get("build") == new
                      and daemon.owner(str(home.state_dir)), timeout=60, what="the new build's watchdog")
    wait_for(lambda: not alive(pid), what="the legacy watchdog to end")
    assert daemon.lock_holder(str(home.state_dir)) == record["pid"]
    assert f"build {new} takes over from the watchdog pid {pid}" in (home.state_dir / daemon.LOG).read_text()
    stop_host(home.state_dir)


def test_a_legacy_watchdog_is_never_ended_during_its_release(home: Home, tmp_path: Path) -> None:
    gate, hook_done, stopped = tmp_path / "gate", tmp_path / "hook-done", tmp_path / "stopped"
    wait_gate = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\nopen({str(hook_done)!r}, 'w')"
    settings = {"autostop_minutes": 0.01, "interval": 0.5, "count_sessions": False,
                "pre_stop": [sys.executable, "-c", wait_gate], "release_remote": ["touch", str(stopped)]}
    pid = start_legacy_watchdog(home, legacy_build(tmp_path), settings)
    log = home.state_dir / daemon.LOG
    wait_for(lambda: "pre_stop: running" in log.read_text(), timeout=60, what="the legacy watchdog's pre_stop")
    configure(home, f'autostop_minutes = 0.01\nrelease_remote = ["touch", "{stopped}"]\n')
    home.cli("status", check=True)
    wait_for(lambda: "when it is between passes" in log.read_text(), what="the new build to wait for its moment")
    assert alive(pid) and not stopped.exists() and not hook_done.exists()  # never ended in its pre_stop
    gate.touch()
    wait_for(lambda: "release_remote: exit" in log.read_text(), timeout=60, what="the new watchdog's release")
    text = log.read_text()
    assert hook_done.exists() and "not releasing: the config changed while pre_stop ran" in text
    assert text.count("release_remote: exit 0") == 1 and f"takes over from the watchdog pid {pid}" in text
    wait_for(lambda: not alive(pid), what="the legacy watchdog to end")
    stop_host(home.state_dir)

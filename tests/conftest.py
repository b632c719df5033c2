"""Shared fixtures: an isolated HOME per test, the real CLI as a subprocess, the real agent on pipes."""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tmux_socket(state_dir: Path) -> str:
    """The private tmux socket name the agent derives from its state dir."""
    return "gputui-" + hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:10]


def kill_tmux(state_dir: Path) -> None:
    subprocess.run(["tmux", "-L", tmux_socket(state_dir), "kill-server"], capture_output=True)


class Home:
    """A throwaway HOME: config, state dir (~/.gputui) and cache live inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state_dir = root / ".gputui"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "GPUTUI_", "TMUX"))}
        self.env.update(HOME=str(root), PYTHONPATH=str(ROOT))

    def cli(
        self, *args: str, timeout: float = 60, check: bool = False, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [sys.executable, "-m", "gputui", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            **kw,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"gputui {' '.join(args)} -> {res.returncode}\n{res.stderr}")
        return res

    def cli_bytes(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "gputui", *args], env=self.env, capture_output=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def write_config(self, text: str) -> Path:
        path = self.root / ".config" / "gputui" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def job_dir(self, job_id: str) -> Path:
        return self.state_dir / "jobs" / job_id


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Home]:
    h = Home(tmp_path / "home")
    h.root.mkdir()
    yield h
    kill_tmux(h.state_dir)


class AgentProc:
    """The real agent (from source) on pipes, driven frame by frame."""

    def __init__(self, state_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "remote_agent", "serve", "--state-dir", str(state_dir), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.hello = self.next_frame(timeout=20)
        assert self.hello.get("event") == "hello", self.hello
        self.send_raw(b'{"op": "flow.credit", "args": {"upto": %d}}\n' % (1 << 62))  # no flow control here

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def next_frame(self, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no frame from agent")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError("agent closed stdout")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        """Send a request and return its reply frame; events seen meanwhile go to ``self.events``."""
        self._next_id += 1
        rid = self._next_id
        self.send_raw(json.dumps({"id": rid, "op": op, "args": args}).encode() + b"\n")
        return self.reply(rid, timeout)

    def reply(self, rid: Any, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next_frame(max(0.1, deadline - time.monotonic()))
            if "event" in frame:
                self.events.append(frame)
            elif frame.get("id") == rid:
                return frame

    def wait_event(self, names: str | tuple[str, ...], timeout: float = 30, **match: Any) -> dict[str, Any]:
        """Next event named ``names`` (one or several) whose data matches ``match``; others are kept."""
        names = (names,) if isinstance(names, str) else names

        def hit(ev: dict[str, Any]) -> bool:
            return ev.get("event") in names and all(
                (ev.get("data") or {}).get(k) == v for k, v in match.items()
            )

        for i, ev in enumerate(self.events):
            if hit(ev):
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next_frame(max(0.1, deadline - time.monotonic()))
            if hit(frame):
                return frame
            if "event" in frame:
                self.events.append(frame)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProc]:
    state = tmp_path / "state"
    a = AgentProc(state)
    yield a
    a.close()
    kill_tmux(state)


def wait_for(predicate: Any, timeout: float = 30, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value (a readiness check, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


# --- SSH hosts: a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py) ----------------------------------------------
from sshd import Sshd, restricted_bin, ssh_available  # noqa: E402


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """One sshd for the session; keys ``ok``, ``notmux``, ``nopython`` (restricted PATH), ``stranger``."""
    why = ssh_available()
    if why:
        pytest.skip(why)
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.client_key("ok")
    server.client_key("notmux", str(restricted_bin(server.root / "bin-notmux", ("tmux",))))
    server.client_key("nopython", str(restricted_bin(server.root / "bin-nopython", ("python",))))
    server.client_key("stranger", authorize=False)
    server.start()
    yield server
    server.stop()


class SshHome(Home):
    """A client HOME whose config names the test sshd as host ``box``; the host's state dir is its own."""

    def __init__(self, root: Path, server: Sshd) -> None:
        super().__init__(root)
        self.sshd = server
        self.remote_dir = root.parent / "remote-state"
        self.known_hosts = root / "known_hosts"
        self.root.mkdir(parents=True, exist_ok=True)
        self.known_hosts.write_text(server.host_key_line())
        self.configure()

    def host_settings(self, key: str = "ok", port: int | None = None, **extra: Any) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": port or self.sshd.port,
            "user": self.sshd.user,
            "identity_file": str(self.sshd.keys[key]),
            "known_hosts": str(self.known_hosts),
            "remote_dir": str(self.remote_dir),
        }
        settings.update(extra)
        return {k: v for k, v in settings.items() if v is not None}

    def configure(self, key: str = "ok", port: int | None = None, **extra: Any) -> Path:
        """Write a config with one host, ``box``; ``extra`` overrides settings (None drops one)."""
        settings = self.host_settings(key, port, **extra)
        lines = ["[hosts.box]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
        return self.write_config("\n".join(lines) + "\n")

    def remote_job_dir(self, job_id: str) -> Path:
        return self.remote_dir / "jobs" / job_id


@pytest.fixture
def ssh_home(tmp_path: Path, sshd: Sshd) -> Iterator[SshHome]:
    h = SshHome(tmp_path / "home", sshd)
    yield h
    kill_tmux(h.remote_dir)

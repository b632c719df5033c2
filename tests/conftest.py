"""Shared fixtures: an isolated HOME per test, the real CLI as a subprocess, the real agent on pipes.

Every test runs away from the user's files and servers (``isolated``): its own HOME, no XDG_*, GPUTUI_*,
SSH_AUTH_SOCK or TMUX variables of the user, and the suite's own TMUX_TMPDIR. Everything the suite starts
carries ``RUN_MARK`` in its environment; at the end of the session ``suite_sandbox`` checks that nothing
marked still runs (and kills what does, and nothing else).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Set to a token unique to this run in the environment of every process the suite starts.
RUN_MARK = "PYTEST_GPUTUI_RUN"
#: The user's variables no test may see (prefixes); HOME and TMUX_TMPDIR are set to the suite's own.
USER_VARS = ("XDG_", "GPUTUI_", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "TMUX")
#: How long the suite's processes may take to exit after the last test (agents notice a gone client).
EXIT_GRACE_S = 30.0


def suite_env() -> dict[str, str]:
    """The variables a test must pass on when it builds a child's environment from scratch (``env -i``)."""
    return {k: os.environ[k] for k in ("TMUX_TMPDIR", RUN_MARK)}


def suite_processes() -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process but this one whose environment carries this run's mark."""
    mark = f"{RUN_MARK}={os.environ[RUN_MARK]}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append((int(entry.name), [a.decode(errors="replace") for a in cmdline.split(b"\0")[:-1]]))
    return found


def stop_host(state_dir: Path) -> None:
    """End what the suite started for one state dir: its tmux server (with the jobs), and the agents and the
    watchdog serving it (an agent whose link dropped keeps sampling for a while, by design)."""
    kill_tmux(state_dir)
    inside = str(state_dir) + os.sep
    for pid, argv in suite_processes():
        if any(a == str(state_dir) or a.startswith(inside) for a in argv):  # a job's hub names its job dir
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _isolate(mp: pytest.MonkeyPatch, home: Path) -> None:
    for key in list(os.environ):
        if key.startswith(USER_VARS) and key != "TMUX_TMPDIR":
            mp.delenv(key)
    home.mkdir(parents=True, exist_ok=True)
    mp.setenv("HOME", str(home))
    mp.setenv("GPUTUI_DIRECT", "1")  # no session service outlives a test: tests/test_service.py asks for one


@pytest.fixture(scope="session", autouse=True)
def suite_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run's sandbox; at its end no process of the suite (tmux server, job, agent, sshd) may be left."""
    root = tmp_path_factory.mktemp("suite")
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # started in the background (`pytest &`): SIGINT is
        signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored, and children would inherit that
    tmux_dir = root / "tmux"
    tmux_dir.mkdir(mode=0o700)
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, root / "home")
        mp.setenv("TMUX_TMPDIR", str(tmux_dir))
        mp.setenv(RUN_MARK, uuid.uuid4().hex)
        yield root
        left: list[tuple[int, list[str]]] = []
        deadline = time.monotonic() + EXIT_GRACE_S
        while (left := suite_processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not left, "processes of the test suite outlived it (killed now):\n" + "\n".join(
        f"  {pid} {shlex.join(argv)}" for pid, argv in left
    )


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test: a HOME of its own, none of the user's variables (set up first, so restored last)."""
    _isolate(monkeypatch, tmp_path_factory.mktemp("userhome"))


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
        self.env = dict(os.environ)  # already isolated (see ``isolated``)
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
        )

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
    stop_host(h.state_dir)


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
    stop_host(state)


def lost_in_a_reboot_job(tmp_path: Path) -> list[str]:
    """argv of a job for the faked reboots (test_restart, test_resume_on_boot): it prints its GPUTUI_ATTEMPT;
    attempt 1 runs until the reboot kills it, a later attempt succeeds at once."""
    script = tmp_path / "job.py"
    script.write_text(
        'import os, time\nprint("attempt", os.environ["GPUTUI_ATTEMPT"], flush=True)\n'
        'while os.environ["GPUTUI_ATTEMPT"] == "1":\n    time.sleep(0.05)\n'
    )
    return [sys.executable, str(script)]


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
from faultproxy import FaultProxy  # noqa: E402
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
    stop_host(h.remote_dir)


@pytest.fixture
def proxy(ssh_home: SshHome) -> Iterator[FaultProxy]:
    """A fault proxy (tests/faultproxy.py) in front of the sshd, its host key trusted at the proxy's port."""
    p = FaultProxy(ssh_home.sshd.port).start()
    with ssh_home.known_hosts.open("a") as f:
        f.write(ssh_home.sshd.host_key_line(f"[127.0.0.1]:{p.port}"))
    yield p
    p.stop()

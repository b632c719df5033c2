"""Issue 41: the session service. ``gputui status`` is answered from one long-lived process per user, config
file and environment that keeps the hosts' connections warm: the real CLI, a real sshd behind a fault proxy
that counts connections, the service started by the commands themselves. Every other test runs with
GPUTUI_DIRECT=1 (tests/conftest.py); these take it away."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Home, SshHome, wait_for
from faultproxy import FaultProxy

from gputui.core.money.cost import Ledger
from gputui.core.session import model as M
from gputui.service import client


@pytest.fixture
def served(ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path) -> Iterator[SshHome]:
    """Host ``box`` behind the proxy; commands may use a session service (its socket in a private runtime dir
    of this test's); every service started is gone at the end."""
    runtime = Path(tempfile.mkdtemp(prefix="gputui-test-run-", dir="/tmp"))  # another user may pass through it
    runtime.chmod(0o711)
    ssh_home.env.pop("GPUTUI_DIRECT", None)
    ssh_home.env["XDG_RUNTIME_DIR"] = str(runtime)
    ssh_home.configure(port=proxy.port)
    yield ssh_home
    for pid in service_pids(ssh_home):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(runtime, ignore_errors=True)


def service_pids(home: Home) -> list[int]:
    """The services started for this test's config (found by their command line)."""
    config = str((home.root / ".config" / "gputui" / "config.toml").resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"gputui.service.server" in cmdline and config.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def info(home: SshHome) -> dict[str, object] | None:
    res = home.cli("service", "--json", timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout) if res.stdout.startswith("{") else None


def warm(home: SshHome) -> dict[str, object]:
    """The first status goes direct and starts a service; the service then answers."""
    first = home.cli("status", "--json", timeout=120)
    assert first.returncode == 0, first.stderr
    return wait_for(lambda: info(home), timeout=60, what="the service the first status started")


def hosts(res: subprocess.CompletedProcess[str]) -> list[tuple[str, str, list[str]]]:
    return [(h["name"], h["state"], sorted(h)) for h in json.loads(res.stdout)["hosts"]]


def readings(res: subprocess.CompletedProcess[str]) -> list[tuple[bool, bool]]:
    """Whether each host's status has its host readings (CPU, memory) and GPU readings or why there are none."""
    return [(bool(h["host"]), bool(h["gpus"]) or h["gpu_error"] is not None) for h in json.loads(res.stdout)["hosts"]]


def test_status_is_answered_over_the_kept_connection(served: SshHome, proxy: FaultProxy) -> None:
    """After the first status, every status is the service's: one SSH connection in all, the same answer a
    direct command gives (fields and states), the same exit status; the socket is 0600 in a 0700 dir."""
    started = warm(served)
    assert started["requests"] == 0 and started["hosts"] == {}  # nothing connected before a status asks
    accepted = proxy.accepted
    answers = [served.cli("status", "--json", timeout=120) for _ in range(5)]
    assert all(a.returncode == 0 for a in answers), [a.stderr for a in answers]
    assert proxy.accepted == accepted + 1  # the service's one connection, kept
    direct = served.cli("status", "--json", "--direct", timeout=120)
    assert proxy.accepted == accepted + 2 and hosts(direct) == hosts(answers[-1]) == hosts(answers[0])
    assert [h[1] for h in hosts(direct)] == ["connected"]
    assert readings(direct) == readings(answers[0]) == readings(answers[-1]) == [(True, True)]  # the first too
    short = served.cli("status", "--short", timeout=120)
    assert short.returncode == 0 and short.stdout.startswith("box up") and proxy.accepted == accepted + 2
    now = info(served)
    assert now is not None and now["requests"] == 6 and now["hosts"] == {"box": "connected"}
    [sock] = (Path(served.env["XDG_RUNTIME_DIR"]) / "gputui").glob("*.sock")
    assert oct(sock.stat().st_mode & 0o777) == "0o600" and oct(sock.parent.stat().st_mode & 0o777) == "0o700"
    assert served.cli("service", "stop", timeout=30).stdout.startswith("session service for")
    wait_for(lambda: not sock.exists() and not service_pids(served), what="the service to stop")


def test_jobs_and_history_are_answered_over_the_kept_connection_too(served: SshHome, proxy: FaultProxy) -> None:
    warm(served)
    job = served.cli("run", "box", "--", "python3", "-c", "print('hi')", timeout=120).stdout.strip()
    assert served.cli("status", timeout=120).returncode == 0  # the service connects
    accepted = proxy.accepted
    listed = wait_for(lambda: (r := served.cli("jobs", "--json", timeout=120)).returncode == 0
                      and [j["state"] for j in json.loads(r.stdout)] == ["succeeded"] and r, what="the job's end")
    one = served.cli("jobs", "box", timeout=120)
    assert one.returncode == 0 and f"{job} " in one.stdout and proxy.accepted == accepted  # no new connection
    direct = served.cli("jobs", "--json", "--direct", timeout=120)
    assert [j["id"] for j in json.loads(listed.stdout)] == [j["id"] for j in json.loads(direct.stdout)] == [job]
    accepted = proxy.accepted  # (the direct command's connection counted)
    history = served.cli("history", "--json", timeout=120)
    assert history.returncode == 0 and proxy.accepted == accepted, history.stderr
    ran = json.loads(history.stdout)
    assert [(r["id"], r["state"]) for r in ran] == [(job, "succeeded")] == [
        (r["id"], r["state"]) for r in json.loads(served.cli("history", "--json", "--direct", timeout=120).stdout)]
    assert served.cli("history", "box", timeout=120).stdout == served.cli("history", "box", "--direct", timeout=120).stdout
    unknown = served.cli("jobs", "nosuchhost", timeout=60)
    assert unknown.returncode == 2 and "unknown host 'nosuchhost'" in unknown.stderr  # said by the command itself


def test_errors_reach_the_command_unchanged_and_a_config_edit_is_followed(
    served: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    warm(served)
    proxy.stop()  # the host stops answering: the same error and exit status as a direct command
    down = served.cli("status", timeout=120)
    direct = served.cli("status", "--direct", timeout=120)
    assert down.returncode == direct.returncode != 0 and down.stderr.startswith("gputui: box: ")
    served.configure(port=served.sshd.port)  # the user points box at the sshd itself: the service follows
    up = served.cli("status", "--json", timeout=120)
    assert up.returncode == 0 and [h[1] for h in hosts(up)] == ["connected"], up.stderr
    assert info(served)["hosts"] == {"box": "connected"}  # type: ignore[index]
    config = served.root / ".config" / "gputui" / "config.toml"
    config.write_text(config.read_text().replace(f"port = {served.sshd.port}", "port = 0"))  # it no longer loads
    bad, bad_direct = served.cli("status", timeout=60), served.cli("status", "--direct", timeout=60)
    assert (bad.returncode, bad.stderr) == (bad_direct.returncode, bad_direct.stderr) and "port" in bad.stderr
    assert bad.returncode == 2  # the command said it itself, directly, as always


def test_a_config_edit_reconnects_only_the_hosts_it_changed(served: SshHome, proxy: FaultProxy) -> None:
    """A host added to the config connects; the host the edit left alone keeps its connection (counted at the
    proxy); a host whose settings changed connects anew; a host removed is no longer shown."""
    warm(served)
    assert served.cli("status", timeout=120).returncode == 0  # box connected
    before = proxy.accepted
    box = served.root / ".config" / "gputui" / "config.toml"
    text = box.read_text()
    served.write_config(text + text.replace("[hosts.box]", "[hosts.other]"))  # the same machine, as another host
    both = served.cli("status", "--json", timeout=120)
    assert [(h[0], h[1]) for h in hosts(both)] == [("box", "connected"), ("other", "connected")], both.stderr
    assert proxy.accepted == before + 1  # other's; box kept its link
    changed = text.replace("[hosts.box]", "[hosts.box]\nidle_util_percent = 7")
    served.write_config(changed + text.replace("[hosts.box]", "[hosts.other]"))  # box connects anew, other not
    again = served.cli("status", "--json", timeout=120)
    assert [h[1] for h in hosts(again)] == ["connected", "connected"] and proxy.accepted == before + 2
    served.write_config(changed)  # other removed
    alone = served.cli("status", "--json", timeout=120)
    assert [(h[0], h[1]) for h in hosts(alone)] == [("box", "connected")] and proxy.accepted == before + 2
    assert info(served)["hosts"] == {"box": "connected"}  # type: ignore[index]


def test_a_host_that_never_answers_costs_later_answers_no_connect_timeout(served: SshHome, proxy: FaultProxy) -> None:
    """A host whose port takes the connection and never speaks: the first status waits for its connect timeout
    and says so, as a direct one; the next ones say the same at once (no new connection to it: it is tried again
    in the background, at most every RETRY_CONNECT_S), while box answers over its kept link."""
    warm(served)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        config = served.root / ".config" / "gputui" / "config.toml"
        config.write_text(config.read_text() + f'[hosts.hung]\nhost = "127.0.0.1"\nport = {hung.getsockname()[1]}\n'
                          'connect_timeout = 2\n')
        first = served.cli("status", timeout=120)
        tried: list[socket.socket] = []
        hung.setblocking(False)

        def take() -> int:  # the connections made to it so far
            with contextlib.suppress(BlockingIOError):
                while True:
                    tried.append(hung.accept()[0])
            return len(tried)

        before = take()
        later = served.cli("status", timeout=120)
        direct = served.cli("status", "--direct", timeout=120)
        assert take() == before + 1  # the direct command's: the service's answer made none
        for conn in tried:
            conn.close()
    assert later.returncode == first.returncode == direct.returncode != 0
    assert "hung" in later.stderr and later.stderr == first.stderr
    assert "box" in later.stdout and "connected" in served.cli("status", "--json", timeout=120).stdout


def test_a_killed_service_costs_a_command_nothing_and_another_build_is_never_used(served: SshHome) -> None:
    """kill -9: the next status answers directly and starts a new service. A command of another build (here
    an edited checkout) never talks to the old service: it answers directly and the old one exits."""
    first = warm(served)
    os.kill(int(first["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    res = served.cli("status", "--json", timeout=120)
    assert res.returncode == 0 and [h[1] for h in hosts(res)] == ["connected"], res.stderr
    second = wait_for(lambda: (i := info(served)) and i["pid"] != first["pid"] and i, timeout=60, what="a new service")
    edited = ROOT / "gputui" / "service" / "__init__.py"
    before = edited.stat()
    try:
        os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
        other = served.cli("status", "--json", timeout=120)
        assert other.returncode == 0 and [h[1] for h in hosts(other)] == ["connected"], other.stderr
        wait_for(lambda: not Path(f"/proc/{second['pid']}").exists(), timeout=60, what="the old build's service to exit")
    finally:
        os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_an_idle_service_exits_and_a_dir_others_can_enter_is_never_used(served: SshHome, tmp_path: Path) -> None:
    path = served.root / ".config" / "gputui" / "config.toml"
    path.write_text("service_idle_minutes = 0.02\n" + path.read_text())
    started = warm(served)
    assert served.cli("status", timeout=120).returncode == 0
    wait_for(lambda: not Path(f"/proc/{started['pid']}").exists(), timeout=60, what="the idle service to exit")
    runtime = Path(served.env["XDG_RUNTIME_DIR"]) / "gputui"
    runtime.chmod(0o755)  # no longer private: status answers directly and starts no service
    for _ in range(2):
        res = served.cli("status", "--json", timeout=120)
        assert res.returncode == 0, res.stderr
    assert service_pids(served) == [] and list(runtime.glob("*.sock")) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's client needs root to become that user")
def test_another_user_gets_no_answer(served: SshHome) -> None:
    """The 0700 dir keeps other users out; with it opened (and the socket), the service still answers no one
    but its user (SO_PEERCRED)."""
    warm(served)
    [sock] = (Path(served.env["XDG_RUNTIME_DIR"]) / "gputui").glob("*.sock")
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])\n"
             "try:\n    s.sendall(b'{\"op\": \"info\"}\\n'); print(repr(s.recv(100)))\n"
             "except (ConnectionResetError, BrokenPipeError):\n    print('reset')")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", probe, str(sock)]
    shut = subprocess.run(as_nobody, capture_output=True, text=True, timeout=60)
    assert shut.returncode != 0 and "PermissionError" in shut.stderr  # the private dir
    sock.parent.chmod(0o711)
    sock.chmod(0o666)
    try:
        opened = subprocess.run(as_nobody, capture_output=True, text=True, timeout=60)
        assert opened.returncode == 0 and opened.stdout.strip() in ("b''", "reset"), opened.stderr  # closed unanswered
    finally:
        sock.parent.chmod(0o700)
        sock.chmod(0o600)
    assert info(served) is not None  # and it still serves its user


PLANTED = """import socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
listener.listen(4)  # the peer a client sees is whoever listens: this user, not the one who made the socket
print("listening", flush=True)
while True:
    conn, _ = listener.accept()
    conn.settimeout(20)
    got = b""
    try:  # (a client that checks who listens has hung up already)
        conn.sendall(b'{"rc": 0, "out": "FORGED", "err": ""}\\n')  # a whole answer, as a service's ends
        conn.shutdown(socket.SHUT_WR)
        while chunk := conn.recv(65536):
            got += chunk
    except OSError:
        pass
    print(len(got), flush=True)
    conn.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's dir or socket needs root")
def test_a_dir_or_socket_another_user_planted_is_never_used(served: SshHome) -> None:
    """A runtime dir of another user's: every command answers directly, says why, and writes nothing there;
    ``gputui service`` names the problem. A socket where another user listens (made by root in the user's own
    dir): the command sends it nothing, answers directly and says why; the next service takes the place."""
    runtime = Path(served.env["XDG_RUNTIME_DIR"]) / "gputui"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 65534, 65534)
    res = served.cli("status", "--json", timeout=120)
    assert res.returncode == 0 and [h[1] for h in hosts(res)] == ["connected"], res.stderr
    assert f"{runtime} is not a private dir of yours (owner uid 65534" in res.stderr
    refused = served.cli("service", timeout=30)
    assert refused.returncode == 1 and "not a private dir of yours" in refused.stderr
    assert list(runtime.iterdir()) == [] and service_pids(served) == []
    os.chown(runtime, os.getuid(), os.getgid())

    first = warm(served)  # where its socket is
    [path] = runtime.glob("*.sock")
    os.kill(int(first["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    wait_for(lambda: service_pids(served) == [], timeout=30, what="the service to die")
    path.unlink()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    path.chmod(0o666)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", PLANTED]
    planted = subprocess.Popen([*as_nobody, str(sock.fileno())], pass_fds=[sock.fileno()], stdout=subprocess.PIPE,
                               text=True)
    sock.close()
    try:
        assert planted.stdout is not None and planted.stdout.readline() == "listening\n"
        res = served.cli("status", "--json", timeout=120)
        assert res.returncode == 0 and "FORGED" not in res.stdout, res.stdout
        assert [h[1] for h in hosts(res)] == ["connected"]
        assert f"{path} is served by uid 65534, not you: nothing was sent to it" in res.stderr
        def real() -> dict[str, object] | None:  # (the planted one refused: exit 1, until the new service binds)
            res = served.cli("service", "--json", timeout=30)
            return json.loads(res.stdout) if res.returncode == 0 and res.stdout.startswith("{") else None

        started = wait_for(real, timeout=60, what="a service of this user's in the planted one's place")
        assert started["pid"] in service_pids(served)
        assert select.select([planted.stdout], [], [], 60)[0] and planted.stdout.readline() == "0\n"  # reached, sent nothing
    finally:
        planted.kill()
    assert set(planted.communicate(timeout=30)[0].split()) <= {"0"}  # (and the CLI's tries before the new service)


def test_the_commands_side_is_light() -> None:
    """Talking to the service imports no asyncio, no asyncssh, no Rich or Textual: the gputui modules the light
    path loads are the launcher and gputui/service's address and client alone."""
    code = ("import sys; import gputui.launch, gputui.service.client; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('asyncio', 'asyncssh', 'rich', 'textual', 'gputui', 'remote_agent')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert res.stdout.strip() == str(sorted(["gputui", "gputui.launch", "gputui.service", "gputui.service.address",
                                             "gputui.service.client"]))


# --- gputui logs through the service --------------------------------------------------------------------------
BIG_LINE = 3 * 1024 * 1024  # one line over 1 MiB, beside bytes that are not UTF-8


def run_job(home: SshHome, code: str) -> str:
    res = home.cli("run", "box", "--", "python3", "-c", code, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def log_file(home: SshHome, job: str) -> Path:
    return home.remote_job_dir(job) / "output.log"


def served_logs(home: SshHome, job: str) -> subprocess.CompletedProcess[bytes]:
    return home.cli_bytes("logs", "box", job, timeout=120)


def test_logs_come_through_the_kept_connection_byte_for_byte(served: SshHome, proxy: FaultProxy) -> None:
    """``logs``, ``logs --tail N`` and ``logs -f`` through a warm service: the log file's bytes exactly (not
    UTF-8, a 3 MiB line), the job's exit status, no new SSH connection; an unknown job and an unknown host are
    said as the direct command says them."""
    warm(served)
    code = ("import sys; w = sys.stdout.buffer.write; w(b'caf\\xe9 \\xff\\xfe\\x1b[31m red\\r\\n'); "
            f"w(b'x' * {BIG_LINE} + b'\\n'); w(b'last line, no end'); sys.exit(3)")
    job = run_job(served, code)
    assert served.cli("status", timeout=120).returncode == 0  # the service connects
    accepted = proxy.accepted
    followed = served.cli_bytes("logs", "-f", "box", job, timeout=120)
    assert followed.returncode == 3, followed.stderr  # the job's exit status
    data = log_file(served, job).read_bytes()
    assert len(data) > BIG_LINE and followed.stdout == data
    plain = served_logs(served, job)
    tail = served.cli_bytes("logs", "--tail", "2", "box", job, timeout=120)
    assert (plain.returncode, plain.stdout) == (0, data) and proxy.accepted == accepted  # the kept connection
    direct_tail = served.cli_bytes("logs", "--tail", "2", "box", job, "--direct", timeout=120)
    assert tail.stdout == direct_tail.stdout == data[data.index(b"x"):] and tail.returncode == 0
    assert info(served)["requests"] == 4  # type: ignore[index]  # the status and the three logs
    unknown = served.cli("logs", "box", "999999", timeout=60)
    direct = served.cli("logs", "box", "999999", "--direct", timeout=60)
    assert (unknown.returncode, unknown.stderr, unknown.stdout) == (direct.returncode, direct.stderr, direct.stdout)
    assert unknown.returncode == 5 and "no job" in unknown.stderr
    nohost = served.cli("logs", "nosuchhost", job, timeout=60)
    assert nohost.returncode == 2 and "unknown host 'nosuchhost'" in nohost.stderr  # said by the command itself


def test_a_service_killed_mid_follow_costs_the_follower_no_byte(served: SshHome, proxy: FaultProxy) -> None:
    """kill -9 of the service while ``logs -f`` reads through it: the command goes on directly from the
    first byte it had not written; its output is the log file's bytes, none missing, none twice."""
    warm(served)
    go = served.root / "go"
    code = ("import os, sys, time\nfor i in range(4000):\n"
            "    sys.stdout.write(f'line {i:05d} ' + 'y' * (i % 97) + '\\n'); sys.stdout.flush()\n"
            f"    if i == 1999:\n        while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
            "sys.exit(7)")
    job = run_job(served, code)
    pid = int(info(served)["pid"])  # type: ignore[arg-type, index]
    out = served.root / "followed.out"
    with out.open("wb") as sink:
        follower = subprocess.Popen([sys.executable, "-m", "gputui", "logs", "-f", "box", job], env=served.env,
                                    stdout=sink, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: b"line 01999" in out.read_bytes(), timeout=120, what="the first half through the service")
            assert info(served)["streams"] == 1  # type: ignore[index]
            os.kill(pid, signal.SIGKILL)
            go.touch()  # the second half is written once the service is gone
            _, err = follower.communicate(timeout=180)
        finally:
            follower.kill()
    assert follower.returncode == 7, err
    data = log_file(served, job).read_bytes()
    assert data.count(b"\n") == 4000 and out.read_bytes() == data


def test_a_stalled_client_stalls_no_one_and_holds_bounded_memory(served: SshHome, proxy: FaultProxy) -> None:
    """A client that asks for a 64 MB log and never reads: beside it a ``status`` and a ``logs -f`` complete,
    the service's memory stays bounded, and a client that goes away mid-follow leaves no work behind."""
    warm(served)
    job = run_job(served, "import sys\nfor i in range(64):\n    sys.stdout.write(('z' * 1023 + '\\n') * 1024)")
    small = run_job(served, "print('small one')")
    assert served.cli("logs", "-f", "box", job, timeout=120).returncode == 0
    started = info(served)
    assert started is not None
    pid, page = int(started["pid"]), os.sysconf("SC_PAGE_SIZE")  # type: ignore[call-overload]

    def rss() -> int:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page

    before = rss()
    [sock_path] = (Path(served.env["XDG_RUNTIME_DIR"]) / "gputui").glob("*.sock")
    stalled = socket.socket(socket.AF_UNIX)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(str(sock_path))
    request = {"op": "logs", "host": "box", "job": job, "tail": None, "follow": True, "build": started["build"]}
    stalled.sendall(json.dumps(request).encode() + b"\n")
    try:
        wait_for(lambda: info(served)["streams"] == 1, what="the stalled stream")  # type: ignore[index]
        status = served.cli("status", "--json", timeout=120)
        assert status.returncode == 0 and [h[1] for h in hosts(status)] == ["connected"]
        live = served.cli_bytes("logs", "-f", "box", small, timeout=120)
        assert (live.returncode, live.stdout) == (0, log_file(served, small).read_bytes()) and b"small one" in live.stdout
        assert info(served)["streams"] == 1  # type: ignore[index]  # the stalled one, held back
        assert rss() - before < 32 * 1024 * 1024  # the 64 MB log was not read ahead for it
    finally:
        stalled.close()
    wait_for(lambda: info(served)["streams"] == 0, what="the dropped client's follow to end")  # type: ignore[index]


def read_stream(sock: socket.socket) -> tuple[bytes, dict[str, object]]:
    """A ``logs`` answer read whole off a raw socket: the log's bytes and the last frame's reply."""
    sock.settimeout(120)
    buf, data = b"", bytearray()

    def take(n: int) -> bytes:
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(1 << 20)
            assert chunk, "the stream ended without its last frame"
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out

    while not buf.startswith(b"{") or b"\n" not in buf:
        buf += sock.recv(1 << 16)
    header, _, buf = buf.partition(b"\n")
    assert json.loads(header) == {"offset": 0}
    while True:
        kind, size = struct.unpack(">cI", take(5))
        payload = take(size)
        if kind == b"e":
            return bytes(data), json.loads(payload)
        if kind == b"d":
            data += payload


def test_a_follower_that_stops_reading_is_held_back_then_given_every_byte(served: SshHome, proxy: FaultProxy) -> None:
    """A ``logs -f`` client that reads nothing while its job writes 48 MB: the service stops the host's follow
    (its memory stays bounded, other commands are answered), and once the client reads again it gets every
    byte in order and the job's exit status."""
    warm(served)
    go = served.root / "go"
    code = (f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
            "for i in range(48):\n    sys.stdout.write((f'{i:04d}' + 'w' * 1019 + '\\n') * 1024); sys.stdout.flush()\nsys.exit(4)")
    job = run_job(served, code)
    assert served.cli("jobs", "box", timeout=120).returncode == 0  # the service connects (its memory grows then)
    started = info(served)
    assert started is not None
    pid, page = int(started["pid"]), os.sysconf("SC_PAGE_SIZE")  # type: ignore[call-overload]
    before = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    [sock_path] = (Path(served.env["XDG_RUNTIME_DIR"]) / "gputui").glob("*.sock")
    with socket.socket(socket.AF_UNIX) as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(str(sock_path))
        request = {"op": "logs", "host": "box", "job": job, "tail": None, "follow": True, "build": started["build"]}
        stalled.sendall(json.dumps(request).encode() + b"\n")
        wait_for(lambda: info(served)["streams"] == 1, what="the follow")  # type: ignore[index]
        go.touch()
        wait_for(lambda: (r := served.cli("jobs", "box", "--json", timeout=120)).returncode == 0
                 and [j["state"] for j in json.loads(r.stdout) if j["id"] == job] == ["failed"], timeout=120,
                 what="the job's end")  # answered by the service meanwhile
        grown = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page - before
        assert info(served)["streams"] == 1 and grown < 24 * 1024 * 1024, grown  # type: ignore[index]
        data, reply = read_stream(stalled)
    assert reply == {"out": "", "err": "", "rc": 4} and data == log_file(served, job).read_bytes()
    assert len(data) == 48 * 1024 * 1024 + data.count(b"\r")


SIGNALS = """import os, pathlib, signal, sys, time
seen = pathlib.Path({seen!r})
def note(name):
    with seen.open("a") as f:
        f.write(name + "\\n")
def on_int(*_):
    note("INT")  # and go on: only a later signal ends it
def on_term(*_):
    note("TERM")
    sys.exit(143)
signal.signal(signal.SIGINT, on_int)
signal.signal(signal.SIGTERM, on_term)
note("up")
while True:
    time.sleep(0.05)
"""


def test_kill_through_the_kept_connection_says_what_the_direct_command_says(served: SshHome, proxy: FaultProxy) -> None:
    """``kill --yes`` (or with no terminal to ask on) through a warm service: the same words and exit status
    as the direct command, and no new connection; a job not running and an unknown job: the same errors."""
    warm(served)
    job = run_job(served, "import time; time.sleep(300)")
    assert served.cli("status", timeout=120).returncode == 0
    before = proxy.accepted
    killed = served.cli("kill", "box", job, "--yes", "--grace", "5", timeout=120)
    assert (killed.returncode, killed.stdout, killed.stderr) == (0, f"job {job} on box: killed (exit 130)\n", "")
    assert proxy.accepted == before  # the service's link: no new connection
    again, again_direct = (served.cli("kill", "box", job, *more, timeout=120) for more in ((), ("--direct",)))
    assert (again.returncode, again.stderr) == (again_direct.returncode, again_direct.stderr) == (
        1, f"gputui: job {job} is not running (killed)\n")
    unknown, unknown_direct = (served.cli("kill", "box", "999", *more, timeout=120) for more in ((), ("--direct",)))
    assert (unknown.returncode, unknown.stderr) == (unknown_direct.returncode, unknown_direct.stderr)
    assert unknown.returncode == 5 and "no job '999' on box" in unknown.stderr


def test_a_service_killed_mid_kill_neither_repeats_it_nor_loses_it(served: SshHome, proxy: FaultProxy) -> None:
    """kill -9 of the service while it kills a job that shrugs off SIGINT: the command goes on directly, the
    kill goes on from where it was (SIGTERM: the job never gets a second SIGINT) and the command says truly
    how the job ended."""
    warm(served)
    seen = served.root / "signals.txt"
    job = run_job(served, SIGNALS.format(seen=str(seen)))
    wait_for(lambda: seen.exists() and "up" in seen.read_text(), timeout=120, what="the job's handlers")
    pid = int(info(served)["pid"])  # type: ignore[arg-type, index]
    command = subprocess.Popen([sys.executable, "-m", "gputui", "kill", "box", job, "--yes", "--grace", "60"],
                               env=served.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True)
    try:
        wait_for(lambda: "INT" in seen.read_text(), timeout=120, what="the service's SIGINT")
        os.kill(pid, signal.SIGKILL)
        out, err = command.communicate(timeout=120)  # well before the 60 s grace would have passed twice
    finally:
        command.kill()
    assert (command.returncode, out) == (0, f"job {job} on box: killed (exit 143)\n"), err
    assert seen.read_text().splitlines() == ["up", "INT", "TERM"]  # one SIGINT, then the kill went on


def test_status_watch_keeps_its_one_connection_round_after_round(ssh_home: SshHome, proxy: FaultProxy) -> None:
    """``status --watch S`` (no service): one process, one connection for every round; to a pipe ``--json`` is
    one line per round, each the whole status; a job started meanwhile shows in a later round."""
    ssh_home.configure(port=proxy.port)
    watcher = subprocess.Popen([sys.executable, "-m", "gputui", "status", "--watch", "0.2", "--json"], env=ssh_home.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watcher.stdout is not None
    try:
        first = json.loads(watcher.stdout.readline())
        assert [(h["name"], h["state"], len(h["jobs"])) for h in first["hosts"]] == [("box", "connected", 0)]
        connections = proxy.accepted
        job = run_job(ssh_home, "import time; time.sleep(300)")
        after_run = proxy.accepted  # ``run``'s own
        for _ in range(600):  # rounds 0.2 s apart: at most two minutes
            if [j["id"] for j in json.loads(watcher.stdout.readline())["hosts"][0]["jobs"]] == [job]:
                break
        else:
            raise AssertionError(f"job {job} never showed")
        assert proxy.accepted == after_run == connections + 1
    finally:
        watcher.terminate()
        watcher.wait(timeout=60)


def test_status_watch_is_served_without_a_connection_and_goes_on_directly(served: SshHome, proxy: FaultProxy) -> None:
    """``status --watch S`` where a service runs: every round is its answer (no connection of the watcher's
    own); the service killed, the watcher goes on directly (one connection, kept) without a gap in its rounds."""
    started = warm(served)
    served.cli("status", timeout=120)  # the service's one connection
    accepted = proxy.accepted
    watcher = subprocess.Popen([sys.executable, "-m", "gputui", "status", "--watch", "0.2", "--json"], env=served.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watcher.stdout is not None
    try:
        for _ in range(3):
            assert [(h["name"], h["state"]) for h in json.loads(watcher.stdout.readline())["hosts"]] == [("box", "connected")]
        assert proxy.accepted == accepted
        os.kill(int(started["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        for _ in range(3):
            assert [(h["name"], h["state"]) for h in json.loads(watcher.stdout.readline())["hosts"]] == [("box", "connected")]
        assert proxy.accepted == accepted + 1  # the watcher's own, from the service's death on
    finally:
        watcher.terminate()
        watcher.wait(timeout=60)


@pytest.mark.parametrize("through_service", [False, True], ids=["direct", "served"])
def test_status_watch_on_a_terminal_redraws_in_place_and_host_text_stays_data(home: Home, through_service: bool) -> None:
    """On a terminal each round is drawn over the last from the top (its own cursor-home, clear-line and
    clear-below sequences: they must reach the terminal raw), while a host's text in it stays escaped: the
    local host's nvidia-smi answers with an escape sequence, shown as ``\\x1b``. The same where the session
    service answers the rounds."""
    tools = home.root / "hostile-bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text('#!/bin/sh\nprintf "\\033[31mEVIL\\n" >&2\nexit 9\n')
    (tools / "nvidia-smi").chmod(0o755)
    home.env["PATH"] = f"{tools}:{home.env['PATH']}"
    if through_service:
        home.env.pop("GPUTUI_DIRECT")
        home.env["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="gputui-test-run-", dir="/tmp")  # (a socket's path is short)
        assert home.cli("status", timeout=120).returncode == 0  # it starts one
        wait_for(lambda: home.cli("service", "--json", timeout=30).stdout.startswith("{"), timeout=60,
                 what="the service")
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gputui", "status", "--watch", "0.2"], env=home.env,
                            stdin=sub, stdout=sub, stderr=sub)
    os.close(sub)
    out = b""
    try:
        while out.count(b"Every 0.2 s: gputui status") < 3:
            ready, _, _ = select.select([main], [], [], 60)
            assert ready, out.decode(errors="replace")
            out += os.read(main, 65536)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        os.close(main)
        said = home.cli("service", "--json", timeout=30).stdout
        answered = json.loads(said)["requests"] if said.startswith("{") else None
        for pid in service_pids(home):
            os.kill(pid, signal.SIGKILL)
        if through_service:
            shutil.rmtree(home.env["XDG_RUNTIME_DIR"], ignore_errors=True)
    rounds = out.split(b"\x1b[H")[1:]
    assert len(rounds) >= 2 and all(r.endswith(b"\x1b[J") for r in rounds[:-1]), out
    assert b"nvidia-smi failed (exit 9): \\x1b[31mEVIL" in out and b"\x1b[31m" not in out
    assert (answered is None) if not through_service else answered >= 3, answered  # (every round the service's)


def test_status_now_answers_at_once_with_what_the_service_has(served: SshHome, proxy: FaultProxy) -> None:
    """``status --now`` (a shell prompt's): with no service, nothing on stdout, exit 3, and a service starts;
    then box as the service has it this moment, never waiting on its connect (held at the proxy: box reads
    connecting, where a waiting answer would say its connect's error), up once its link is; ``--direct``
    with it is a usage error."""
    first = served.cli("status", "--short", "--now", timeout=120)
    assert (first.returncode, first.stdout) == (3, "") and "one is starting" in first.stderr
    wait_for(lambda: info(served), timeout=60, what="the service --now started")
    proxy.blackhole()  # the service's connect to box waits in the proxy's backlog until restore()
    try:
        held = served.cli("status", "--short", "--now", timeout=120)
        assert (held.returncode, held.stdout, held.stderr) == (0, "box connecting\n", "")
        again = served.cli("status", "--json", "--now", timeout=120)
        assert [h[:2] for h in hosts(again)] == [("box", "connecting")]
    finally:
        proxy.restore()
    wait_for(lambda: served.cli("status", "--short", "--now", timeout=120).stdout.startswith("box up · "),
             timeout=120, what="box up in a --now answer")
    direct = served.cli("status", "--now", "--direct", timeout=120)
    assert direct.returncode == 2 and "--now answers from the session service" in direct.stderr


def release_config(home: SshHome, proxy: FaultProxy, script: str) -> Path:
    """``box`` released by ``sh -c SCRIPT`` run here (``$RUNS``: a file it may note each run in)."""
    runs = home.root / "release-runs.txt"
    home.configure(port=proxy.port, release=["sh", "-c", script.replace("$RUNS", str(runs))])
    return runs


def test_release_through_the_kept_connection_says_what_the_direct_command_says(
    served: SshHome, proxy: FaultProxy
) -> None:
    """``release --yes`` through a warm service: refused while a job runs with the direct command's words and
    exit status, then (``--force``) released once, confirmed in the ledger, with no new connection."""
    runs = release_config(served, proxy, "echo run >> $RUNS; echo instance stopped")
    warm(served)
    job = run_job(served, "import time; time.sleep(300)")
    assert served.cli("status", timeout=120).returncode == 0
    before = proxy.accepted
    refused, refused_direct = (served.cli("release", "box", "--yes", *more, timeout=120) for more in ((), ("--direct",)))
    assert (refused.returncode, refused.stdout, refused.stderr) == (
        refused_direct.returncode, refused_direct.stdout, refused_direct.stderr)
    assert refused.returncode == 1 and f"has running jobs: {job} " in refused.stderr and not runs.exists()
    released = served.cli("release", "box", "-y", "--force", "--no-pull", timeout=120)
    assert released.returncode == 0, released.stderr
    assert released.stdout.splitlines()[1:] == ["  instance stopped", "box: released (confirmed: client command exited 0)"]
    assert proxy.accepted == before + 1  # the refused direct command's own; the service's link for the rest
    assert runs.read_text() == "run\n"
    ledger = json.loads((served.root / ".local/state/gputui/ledger.json").read_text())
    assert ledger["hosts"]["box"]["released_at"] is not None


def test_a_service_killed_mid_release_never_asks_again_and_says_so(served: SshHome, proxy: FaultProxy) -> None:
    """kill -9 of the service while its release command runs (the command kills it): the command does not
    release again, and says loudly that the release is not confirmed; where the service had marked it
    released before it went, the command says released."""
    runs = release_config(served, proxy, "echo run >> $RUNS; kill -9 $PPID")
    warm(served)
    res = served.cli("release", "box", "--yes", timeout=120)
    assert res.returncode == 1 and res.stdout == ""
    assert "the session service stopped while it released box, and the release is NOT confirmed" in res.stderr
    assert "was not asked again" in res.stderr and runs.read_text() == "run\n"
    asked = time.time()
    ledger = Ledger(served.root / ".local/state/gputui/ledger.json")
    ledger.close("box", asked + 0.5)
    ledger.save(force=True)
    said = subprocess.run([sys.executable, "-c", "from gputui.cli.release import after_service; import sys; "
                           f"sys.exit(after_service('box', {asked!r}))"], env=served.env, capture_output=True,
                          text=True, timeout=60)
    assert (said.returncode, said.stdout) == (0, "box: released (confirmed by the session service, which stopped "
                                              "before it could say how)\n"), said.stderr


def test_a_stuck_service_costs_a_command_a_bounded_wait_and_a_slow_answer_none(
    served: SshHome, proxy: FaultProxy
) -> None:
    """A service at work says so while it works: a release whose command takes longer than the command's
    patience for a silent service is answered by the service all the same. A stuck one (stopped) says nothing:
    the command answers directly after that bound, saying why it paused; ``gputui service`` names its pid and
    ``gputui service stop`` ends it."""
    runs = release_config(served, proxy, f"sleep {client.QUIET_S + 2:g}; echo run >> $RUNS")
    warm(served)
    assert served.cli("status", timeout=120).returncode == 0  # the service connects
    before = proxy.accepted
    slow = served.cli("release", "box", "--yes", timeout=120)
    assert (slow.returncode, slow.stdout.splitlines()[-1:]) == (0, ["box: released (confirmed: client command exited 0)"])
    assert runs.read_text() == "run\n" and proxy.accepted == before  # the service's answer, over its link
    pid = int(info(served)["pid"])  # type: ignore[arg-type, index]
    os.kill(pid, signal.SIGSTOP)
    try:
        status = served.cli("status", "--json", timeout=120)
        assert status.returncode == 0 and [h[:2] for h in hosts(status)] == [("box", "connected")]
        assert proxy.accepted == before + 1  # answered directly, saying why it paused
        assert f"the session service (pid {pid}) said nothing for {client.QUIET_S:g} s" in status.stderr
        shown = served.cli("service", timeout=120)
        assert shown.returncode == 1 and f"(pid {pid}) takes connections but said nothing" in shown.stderr
        stopped = served.cli("service", "stop", timeout=120)
        assert stopped.returncode == 0 and f"(pid {pid}) did not answer: ended it" in stopped.stdout
        assert pid not in service_pids(served)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


SEEDS = "import json; from gputui.service import client; print(json.dumps(client.seed(None)))"


async def test_the_apps_first_frame_shows_the_hosts_a_running_service_has(
    served: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    """With a session service running, the app's first frame shows box up with its job, as the service has it,
    while the app's own link to box is still held at connect (the proxy holds it); once that link is up, the
    app's own snapshot takes over. With no service running there is nothing to show but ``connecting``."""
    from test_ui_app import until
    from ui_fixtures import screen_text

    from gputui.core.config import file as cfg
    from gputui.ui.app import GpuTuiApp

    warm(served)
    job = run_job(served, "import time; time.sleep(300)")
    wait_for(lambda: f'"id": "{job}"' in served.cli("status", "--json", timeout=120).stdout, what="the job listed")
    seeds = json.loads(subprocess.run([sys.executable, "-c", SEEDS], env=served.env, capture_output=True, text=True,
                                      check=True).stdout)
    assert [(h["name"], h["state"]) for h in seeds] == [("box", "connected")]

    class FirstFrame(GpuTuiApp):
        CSS_PATH = str(ROOT / "gputui" / "ui" / "gputui.tcss")  # relative paths follow the subclass
        first_frame = ""

        def on_ready(self) -> None:
            self.first_frame = screen_text(self)
            super().on_ready()

    proxy.blackhole()  # the app's own connect to box waits in the proxy's backlog until restore()
    config = cfg.load(str(served.root / ".config" / "gputui" / "config.toml"))
    app = FirstFrame(config, state_path=tmp_path / "ui.json", seeds=seeds)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.first_frame, what="the first frame")
        box = next(line for line in app.first_frame.splitlines() if line.strip(" │┃").startswith("box "))
        assert "● " in box and "connecting" not in box, app.first_frame
        assert app.hosts["box"].state == M.CONNECTED and [j.id for j in app.hosts["box"].jobs] == [job]
        await until(pilot, lambda: app.source.session("box").snapshot.state == M.CONNECTING, what="its own connect")
        assert app.hosts["box"].state == M.CONNECTED  # the seed stays while the app's own link is held
        proxy.restore()
        shown = []  # every box the app showed from here: never without its job
        await until(pilot, lambda: shown.append(app.hosts["box"]) or ("box" not in app._seeded
                    and app.hosts["box"].facts.get("agent_pid")), what="the app's own link to take over")
        assert all([j.id for j in snap.jobs] == [job] for snap in shown)
    assert json.loads(subprocess.run([sys.executable, "-c", SEEDS], env={**served.env, "GPUTUI_DIRECT": "1"},
                                     capture_output=True, text=True, check=True).stdout) == []


def test_the_services_log_stays_bounded_and_holds_no_terminal_sequence(tmp_path: Path) -> None:
    """A service up for weeks: its log rotates at LOG_MAX_BYTES (one older file kept); a record quoting a host's
    escape sequence is written escaped."""
    from gputui.service import server

    handler = server.log_handler(tmp_path / "service.log")
    logger = logging.getLogger("test-service-log")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        logger.error("host said %s", "\x1b]52;c;cm0gLXJm\x07\x1b[31mEVIL\r")
        for _ in range(3 * server.LOG_MAX_BYTES // 100):
            logger.info("%s", "x" * 100)
        logger.error("host said %s", "\x1b[2J")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["service.log", "service.log.1"]
    assert all(p.stat().st_size <= server.LOG_MAX_BYTES for p in tmp_path.iterdir())
    text = (tmp_path / "service.log").read_bytes()
    assert b"\x1b" not in text and b"\r" not in text and b"host said \\x1b[2J" in text


# --- logs through the service: a client that takes nothing, a log that shrinks, a log that grows ---------------
#: The service of ``gputui.service.server`` (the same code, so the same build) with a short ``STALL_S``: the test's
#: own start of it, as ``client._start_now`` starts one (the commands find it by its config and environment).
SHORT_STALL = ("import sys; from gputui.service import server; server.STALL_S = float(sys.argv[1]); "
               "sys.exit(server.main(sys.argv[2:]))")


@contextlib.contextmanager
def service_letting_go_after(home: SshHome, stall_s: float) -> Iterator[int]:
    """A session service for ``home``'s config that lets a client go after ``stall_s`` of taking nothing; its pid."""
    config = str((home.root / ".config" / "gputui" / "config.toml").resolve())
    proc = subprocess.Popen([sys.executable, "-c", SHORT_STALL, str(stall_s), config, "--default"], env=home.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd="/")
    try:
        wait_for(lambda: (i := info(home)) and i["pid"] == proc.pid, timeout=60, what="the test's service")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_client_that_takes_nothing_is_let_go_and_goes_on_directly_without_a_byte_lost(
    served: SshHome, proxy: FaultProxy
) -> None:
    """A ``logs -f`` and a ``logs`` whose stdout nobody reads (a full pipe) while the log is 24 MiB: the service
    lets both go once they took nothing for STALL_S (here 2 s, the test's own service), answering others all the
    while; read again, each command goes on directly from its offset: the log file's bytes exactly, no byte
    lost or twice, and the job's exit status."""
    go = served.root / "go"
    code = (f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
            "for i in range(24):\n    sys.stdout.write((f'{i:04d}' + 'v' * 1019 + '\\n') * 1024); sys.stdout.flush()\n"
            "sys.exit(4)")
    with service_letting_go_after(served, 2.0) as pid:
        job = run_job(served, code)
        assert served.cli("jobs", "box", timeout=120).returncode == 0  # the service connects
        command = [sys.executable, "-m", "gputui", "logs"]
        follower = subprocess.Popen([*command, "-f", "box", job], env=served.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: info(served)["streams"] == 1, what="the follow")  # type: ignore[index]
            go.touch()
            wait_for(lambda: (r := served.cli("jobs", "box", "--json", timeout=120)).returncode == 0
                     and [j["state"] for j in json.loads(r.stdout) if j["id"] == job] == ["failed"], timeout=120,
                     what="the job's end")
            copier = subprocess.Popen([*command, "box", job], env=served.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            try:
                wait_for(lambda: info(served)["streams"] == 0, timeout=120, what="both clients let go")  # type: ignore[index]
                assert follower.poll() is None and copier.poll() is None  # both still held by their full pipe
                accepted, requests = proxy.accepted, info(served)["requests"]  # type: ignore[index]
                status = served.cli("status", "--json", timeout=120)  # the service answers on, over its link
                assert status.returncode == 0 and [h[1] for h in hosts(status)] == ["connected"], status.stderr
                assert proxy.accepted == accepted and info(served)["requests"] == requests + 1  # type: ignore[index]
                copied, copy_err = copier.communicate(timeout=180)
            finally:
                copier.kill()
            followed, follow_err = follower.communicate(timeout=180)
        finally:
            follower.kill()
        data = log_file(served, job).read_bytes()
        assert len(data) == 24 * 1024 * 1024 + data.count(b"\r")
        assert (follower.returncode, copier.returncode) == (4, 0), (follow_err, copy_err)
        assert followed == data and copied == data
        assert info(served)["pid"] == pid  # type: ignore[index]  # the same service throughout


def test_a_log_truncated_under_a_served_follow_reads_as_under_a_direct_one(served: SshHome, proxy: FaultProxy) -> None:
    """The job's log truncated on the host twice while ``logs -f`` follows it through the service and ``logs -f
    --direct`` beside it: both say each gap (the same words) and go on from the log's new start; the service
    killed just after the second, the served command goes on directly from the new log's start (not from the
    old offset: that would say the gap again and print the new bytes twice, or skip them once the log grew past
    it). Both print the same bytes, all the user can still get, none twice, and end with the job's exit status."""
    warm(served)
    go = [served.root / f"go{i}" for i in (1, 2)]
    code = ("import os, sys, time\n"
            "def part(name, n, then):\n"
            "    sys.stdout.write(''.join(f'{name} {i:04d}\\n' for i in range(n))); sys.stdout.flush()\n"
            "    while not os.path.exists(then): time.sleep(0.02)\n"
            f"part('first', 400, {str(go[0])!r}); part('second', 30, {str(go[1])!r})\n"
            "print('third and last'); sys.exit(6)")
    job = run_job(served, code)
    log = log_file(served, job)
    first = wait_for(lambda: (d := log.read_bytes()).endswith(b"first 0399\r\n") and d, timeout=120, what="part one")
    outs = {way: served.root / f"{way}.out" for way in ("served", "direct")}
    errs = {way: served.root / f"{way}.err" for way in ("served", "direct")}
    procs = {}
    for way, more in (("served", ()), ("direct", ("--direct",))):
        with outs[way].open("wb") as out, errs[way].open("wb") as err:
            procs[way] = subprocess.Popen([sys.executable, "-m", "gputui", "logs", "-f", "box", job, *more],
                                          env=served.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def truncated(times: int) -> None:
        os.truncate(log, 0)
        wait_for(lambda: all(e.read_bytes().count(b"log truncated") == times for e in errs.values()), timeout=120,
                 what=f"gap {times}")

    try:
        wait_for(lambda: all(o.read_bytes() == first for o in outs.values()), timeout=120, what="part one followed")
        assert info(served)["streams"] == 1  # type: ignore[index]  # the served one is the service's
        truncated(1)
        go[0].touch()
        second = wait_for(lambda: (d := log.read_bytes()).endswith(b"second 0029\r\n") and d, timeout=120,
                          what="part two")
        wait_for(lambda: all(o.read_bytes() == first + second for o in outs.values()), timeout=120,
                 what="part two followed")
        assert info(served)["streams"] == 1 and second.count(b"\n") == 30  # type: ignore[index]  # still served
        truncated(2)
        os.kill(int(info(served)["pid"]), signal.SIGKILL)  # type: ignore[arg-type, index]
        go[1].touch()
        for proc in procs.values():
            proc.wait(timeout=180)
    finally:
        for proc in procs.values():
            proc.kill()
    assert log.read_bytes() == b"third and last\r\n"
    assert [p.returncode for p in procs.values()] == [6, 6], [e.read_bytes() for e in errs.values()]
    assert outs["served"].read_bytes() == outs["direct"].read_bytes() == first + second + log.read_bytes()
    said = {way: e.read_bytes() for way, e in errs.items()}
    assert said["served"] == said["direct"] == b"".join(
        b"\ngputui: --- log truncated: bytes from %d on are gone; restarting at 0 ---\n" % n
        for n in (len(first), len(second)))


def test_a_served_logs_of_a_growing_log_ends_at_a_byte_the_log_had(served: SshHome, proxy: FaultProxy) -> None:
    """``logs`` (no -f) of a 6 MiB log the job goes on writing to, through the service and directly: each prints
    the log's first bytes up to a point it had reached, exactly (nothing twice, no part of a chunk again), and
    exits 0 while the job still runs."""
    warm(served)
    stop = served.root / "stop"
    code = ("import os, sys, time\nsys.stdout.write(''.join(f'{i:07d} ' + 'g' * 1015 + '\\n' for i in range(6144)))\n"
            f"i = 0\nwhile not os.path.exists({str(stop)!r}):\n"
            "    i += 1; sys.stdout.write(f'more {i:07d}\\n'); sys.stdout.flush(); time.sleep(0.002)")
    job = run_job(served, code)
    log = log_file(served, job)
    wait_for(lambda: b"more 0000001" in log.read_bytes(), timeout=120, what="the log to grow")
    assert served.cli("status", timeout=120).returncode == 0  # the service connects
    accepted, requests = proxy.accepted, info(served)["requests"]  # type: ignore[index]
    copied = served_logs(served, job)
    assert proxy.accepted == accepted and info(served)["requests"] == requests + 1  # type: ignore[index]
    direct = served.cli_bytes("logs", "box", job, "--direct", timeout=120)
    stop.touch()
    wait_for(lambda: (r := served.cli("jobs", "box", "--json", timeout=120)).returncode == 0
             and [j["state"] for j in json.loads(r.stdout) if j["id"] == job] == ["succeeded"], timeout=120,
             what="the job's end")
    data = log.read_bytes()
    for res in (copied, direct):
        assert res.returncode == 0, res.stderr
        assert len(res.stdout) > 6 * 1024 * 1024 and res.stdout == data[:len(res.stdout)]


def test_a_host_key_trusted_meanwhile_is_used_by_the_next_answer(served: SshHome, proxy: FaultProxy) -> None:
    """An unknown host key: the service's answer refuses it as a direct command does (its fingerprint, exit 4);
    ``gputui trust box --yes`` meanwhile: the very next answer connects, not one after a retry's wait."""
    served.configure(port=proxy.port, known_hosts=None)
    first = served.cli("status", "--json", timeout=120)  # direct: it starts the service
    wait_for(lambda: info(served), timeout=60, what="the service")
    res = served.cli("status", "--json", timeout=120)
    assert (res.returncode, res.stderr) == (first.returncode, first.stderr) and res.returncode == 4, res.stderr
    assert served.sshd.fingerprint() in res.stderr and info(served)["requests"] == 1  # type: ignore[index]
    served.cli("trust", "box", "--yes", check=True, timeout=120)
    res = served.cli("status", "--json", timeout=120)
    assert res.returncode == 0 and [h[1] for h in hosts(res)] == ["connected"], res.stderr
    assert info(served)["requests"] == 2  # type: ignore[index]

"""gputui forward over the real sshd: an HTTP server started as a gputui job answers through the forward,
before and after an injected link reset."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Home, SshHome, stop_host
from faultproxy import FaultProxy
from sshd import Sshd, free_port, ssh_available

from gputui.core.config.file import HostConfig
from gputui.core.files.forward import Forward
from gputui.core.session.host import HostSession
from gputui.core.transport.ssh import SSHTransport


@pytest.fixture
def fwd_home(tmp_path: Path) -> Iterator[SshHome]:
    """An sshd that allows local TCP forwarding (the suite's shared one does not), as host ``box``."""
    why = ssh_available()
    if why:
        pytest.skip(why)
    server = Sshd(tmp_path / "sshd", tcp_forwarding="local")
    server.client_key("ok")
    server.start()
    home = SshHome(tmp_path / "home", server)
    yield home
    stop_host(home.remote_dir)
    server.stop()


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as res:
            return res.read()
    except OSError:
        return None


async def _answer(url: str, timeout: float = 60) -> bytes:
    """The page, once the forward serves it (readiness: the job's server needs a moment to listen)."""
    deadline = time.monotonic() + timeout
    while (body := await asyncio.to_thread(_get, url)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no answer from {url}")
        await asyncio.sleep(0.1)
    return body


def test_forward_reaches_a_job_server_before_and_after_a_reset(fwd_home: SshHome, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("hello from the host\n")
    port = free_port()
    fwd_home.cli(
        "run", "box", "--cwd", str(site), "--", "python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
        check=True,
    )
    proxy = FaultProxy(fwd_home.sshd.port).start()
    with fwd_home.known_hosts.open("a") as f:
        f.write(fwd_home.sshd.host_key_line(f"[127.0.0.1]:{proxy.port}"))

    async def main() -> None:
        cfg = HostConfig(name="box", **fwd_home.host_settings(port=proxy.port))
        session = HostSession("box", SSHTransport(cfg))
        await session.start()
        fwd = Forward(session, port)
        try:
            url = await fwd.start()
            assert url == f"http://127.0.0.1:{fwd.local_port}/"
            listening = fwd._server.sockets[0].getsockname()  # type: ignore[union-attr]
            assert listening[0] == "127.0.0.1"
            assert await _answer(url) == b"hello from the host\n"
            before = proxy.accepted
            await asyncio.to_thread(proxy.reset)
            assert await _answer(url) == b"hello from the host\n"
            assert proxy.accepted > before  # it went over a new connection
        finally:
            await fwd.close()
            await session.close()

    try:
        asyncio.run(main())
    finally:
        proxy.stop()


def test_forward_cli_on_local_host_needs_no_forward(home: Home) -> None:
    home.write_config('[hosts.here]\ntransport = "local"\n')
    res = home.cli("forward", "here", "6006", check=True)
    assert "no forward needed" in res.stdout and "http://127.0.0.1:6006/" in res.stdout
    res = home.cli("forward", "here", "70000")
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_forward_refuses_a_busy_local_port(fwd_home: SshHome) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        res = fwd_home.cli("forward", "box", "8888", str(busy.getsockname()[1]), timeout=60)
    assert res.returncode == 2 and "cannot listen" in res.stderr and "Traceback" not in res.stderr


def test_forward_cli_prints_its_url_and_serves_until_interrupted(fwd_home: SshHome, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("via the cli\n")
    port = free_port()
    fwd_home.cli(
        "run", "box", "--cwd", str(site), "--", "python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
        check=True,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputui", "forward", "box", str(port)],
        env=fwd_home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the URL comes first, flushed, before any connection
        url = line.split()[0]
        assert url.startswith("http://127.0.0.1:") and f"port {port}" in line, line
        assert asyncio.run(_answer(url)) == b"via the cli\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_forward_to_a_port_nothing_listens_on_says_why(fwd_home: SshHome) -> None:
    """A TensorBoard not started yet gave "refused the forward to port N: open failed" and no more."""
    local_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputui", "forward", "box", str(free_port()), str(local_port)],
        env=fwd_home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(f"http://127.0.0.1:{local_port}/")
        with socket.create_connection(("127.0.0.1", local_port), timeout=30) as conn:
            conn.settimeout(30)
            assert conn.recv(1) == b""  # closed: nothing to reach
        line = proc.stderr.readline()
        assert "refused the forward" in line and "nothing listens there yet" in line, line
        assert "AllowTcpForwarding" in line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_job_urls_finds_local_servers_newest_first_with_their_tokens() -> None:
    from gputui.core.files.forward import job_urls

    lines = [  # newest first, as the app hands them over
        "Serving on http://0.0.0.0:8000.",
        "TensorBoard 2.15 at http://localhost:6006/ (Press CTRL+C to quit)",
        "see https://example.com:443/docs and http://10.0.0.5:9999/",  # not this host's own address
        "    http://127.0.0.1:8888/lab?token=abc123",
        "old: http://localhost:6006/ and http://localhost:99999/",
    ]
    urls = job_urls(lines)
    assert [(u.port, u.tail) for u in urls] == [(8000, ""), (6006, "/"), (8888, "/lab?token=abc123")]
    assert urls[2].here(41234) == "http://127.0.0.1:41234/lab?token=abc123"
    assert urls[0].here(5000) == "http://127.0.0.1:5000/"


ECHO_SERVER = """
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen()
def echo(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(srv.accept()[0],), daemon=True).start()
"""


async def _echo(port: int, what: bytes, timeout: float = 60) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection through the forward that echoed ``what`` (readiness: the job's server starts listening)."""
    deadline = time.monotonic() + timeout
    while True:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(what)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            if await asyncio.wait_for(reader.readexactly(len(what)), 30) == what:
                return reader, writer
        writer.close()
        if time.monotonic() > deadline:
            raise AssertionError("no echo through the forward")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("fault", ["reset", "blackhole"])
def test_a_forwarded_connection_ends_when_its_link_is_lost(fwd_home: SshHome, fault: str) -> None:
    """It hung ~30 s after the link went; the client's next connection already works over the new link."""
    port = free_port()
    fwd_home.cli("run", "box", "--", "python3", "-c", ECHO_SERVER, str(port), check=True)
    proxy = FaultProxy(fwd_home.sshd.port).start()
    with fwd_home.known_hosts.open("a") as f:
        f.write(fwd_home.sshd.host_key_line(f"[127.0.0.1]:{proxy.port}"))

    async def main() -> None:
        session = HostSession("box", SSHTransport(HostConfig(name="box", **fwd_home.host_settings(port=proxy.port))))
        await session.start()
        fwd = Forward(session, port)
        try:
            await fwd.start()
            old_r, old_w = await _echo(fwd.local_port, b"before\n")
            if fault == "reset":
                await asyncio.to_thread(proxy.reset)
            else:
                await asyncio.to_thread(proxy.blackhole)
                await _until(lambda: session.link is None or session.link.closed.is_set(), what="the lost link noticed")
                await asyncio.to_thread(proxy.restore)
            new_r, new_w = await _echo(fwd.local_port, b"after\n")  # over the new link
            assert await asyncio.wait_for(old_r.read(), 5) == b""  # the old one was closed, not left hanging
            new_w.close()
            old_w.close()
        finally:
            await fwd.close()
            await session.close()

    try:
        asyncio.run(main())
    finally:
        proxy.stop()


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_job_urls_end_at_control_and_bidi_characters() -> None:
    from gputui.core.files.forward import job_urls

    lines = [
        "http://localhost:8888/?token=abc\x1b]52;c;ZXZpbA==\x07",  # an OSC 52 clipboard write after the token
        "http://127.0.0.1:6006/\u202egnp.lanigiro",  # a right-to-left override
        "http://localhost:7000/a\x00b",
    ]
    assert [u.here(1) for u in job_urls(lines)] == [
        "http://127.0.0.1:1/?token=abc", "http://127.0.0.1:1/", "http://127.0.0.1:1/a",
    ]

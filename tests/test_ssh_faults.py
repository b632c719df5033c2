"""Broken links between client and sshd (tests/faultproxy.py): nothing lost, nothing duplicated, states right."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import SshHome, wait_for
from faultproxy import FaultProxy
from sshd import free_port

from gputui.core.config.file import HostConfig
from gputui.core.session import model as M
from gputui.core.session.host import HostSession
from gputui.core.transport.link import LinkClosed
from gputui.core.transport.ssh import SSHTransport
from remote_agent import protocol as P

# Prints numbered lines (now and then one of 200 KB, so faults cut frames in half) until the stop file exists.
CHATTY_JOB = """
import os, sys, time
stop, code, i = sys.argv[1], int(sys.argv[2]), 0
while not (os.path.exists(stop) and i > 50):
    i += 1
    body = "y" * 200000 if i % 1000 == 0 else "x" * (i % 97)
    print("line %06d %s" % (i, body), flush=True)
    time.sleep(0.002)
print("done after", i, "lines", flush=True)
sys.exit(code)
"""


@pytest.fixture
def proxy(proxy: FaultProxy, ssh_home: SshHome) -> FaultProxy:
    """conftest's fault proxy, with the config's host ``box`` going through it."""
    ssh_home.configure(port=proxy.port)
    return proxy


def run_job(home: SshHome, *cmd: str) -> str:
    job_id = home.cli("run", "box", "--", *cmd, check=True).stdout.strip()
    assert job_id.isdigit()
    return job_id


def session(home: SshHome, port: int | None = None, **kw: Any) -> HostSession:
    metrics = kw.pop("metrics_interval", None)
    on_change = kw.pop("on_change", None)
    cfg = HostConfig(name="box", **home.host_settings(port=port, **kw))
    return HostSession("box", SSHTransport(cfg), on_change=on_change, metrics_interval=metrics)


async def until(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_fault_campaign_logs_arrive_byte_identical(
    ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    job = run_job(ssh_home, "python3", "-c", CHATTY_JOB, str(stop), "3")
    out, err = tmp_path / "client.out", tmp_path / "client.err"
    with out.open("wb") as fout, err.open("wb") as ferr:
        client = subprocess.Popen(
            [sys.executable, "-m", "gputui", "logs", "-f", "box", job],
            env=ssh_home.env, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL,
        )
    try:
        faults = [("reset", 0.0)] * 11 + [
            ("blackhole", d) for d in (0.2, 0.4, 0.7, 1.0, 1.5, 2.0, 0.3, 3.5, 4.0, 0.5, 1.2)
        ]
        random.Random(3).shuffle(faults)
        for kind, seconds in faults:
            before = proxy.accepted
            if kind == "reset":
                proxy.reset()
            else:
                proxy.blackhole()
                time.sleep(seconds)  # the fault's duration, not a wait for readiness
                proxy.restore()
            wait_for(lambda b=before: proxy.accepted > b, timeout=30, what=f"reconnect after {kind}")
            size = out.stat().st_size
            wait_for(lambda s=size: out.stat().st_size > s, timeout=30, what=f"bytes flowing after {kind}")
        assert client.poll() is None, err.read_text()
        stop.touch()
        assert client.wait(timeout=60) == 3, err.read_text()
    finally:
        if client.poll() is None:
            client.kill()
    log = (ssh_home.remote_job_dir(job) / "output.log").read_bytes()
    received = out.read_bytes()
    assert len(received) == len(log) and received == log, err.read_text()
    assert b"done after" in log and "missing" not in err.read_text()
    assert proxy.accepted >= 1 + len(faults)


def test_client_killed_and_restarted_finds_every_job_with_full_logs(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    first = run_job(ssh_home, "python3", "-c", CHATTY_JOB, str(stop), "0")
    second = run_job(ssh_home, "python3", "-c", CHATTY_JOB, str(stop), "4")
    client = subprocess.Popen(
        [sys.executable, "-m", "gputui", "logs", "-f", "box", first],
        env=ssh_home.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    assert client.stdout is not None
    assert client.stdout.readline().startswith(b"line 000001")
    client.send_signal(signal.SIGKILL)
    client.wait()

    jobs = {j["id"]: j for j in json.loads(ssh_home.cli("jobs", "box", "--json", check=True).stdout)}
    assert jobs[first]["state"] == jobs[second]["state"] == "running"
    stop.touch()
    for job, code in ((first, 0), (second, 4)):
        res = ssh_home.cli_bytes("logs", "-f", "box", job)
        assert res.returncode == code, res.stderr
        assert res.stdout == (ssh_home.remote_job_dir(job) / "output.log").read_bytes()


async def test_agent_killed_on_host_leaves_jobs_alone(ssh_home: SshHome, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    s = session(ssh_home)
    await s.start()
    s.run_in_background()
    try:
        job = await s.start_job(["python3", "-c", CHATTY_JOB, str(stop), "5"])
        received = bytearray()
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await s.follow_log(job.id, 0, received.extend, lambda info: done.done() or done.set_result(info))
        await until(lambda: len(received) > 1000, what="first bytes")
        agent_pid = s.snapshot.facts["agent_pid"]
        os.kill(agent_pid, signal.SIGKILL)
        await until(
            lambda: s.snapshot.state == M.CONNECTED and s.snapshot.facts.get("agent_pid") != agent_pid,
            what="a new agent",
        )
        assert [j.state for j in await s.list_jobs()] == ["running"]
        stop.touch()
        info = await asyncio.wait_for(done, 60)
        assert info["exit_code"] == 5
        assert bytes(received) == (ssh_home.remote_job_dir(job.id) / "output.log").read_bytes()
    finally:
        await s.close()


async def test_metrics_history_has_no_hole_across_reconnects(ssh_home: SshHome, proxy: FaultProxy) -> None:
    """The old agent keeps sampling until the new one takes over: the history holds samples taken while the
    client was reconnecting (the agent stamps them with this machine's clock), and no sample is missing."""
    connected_at: list[float] = []  # each time the state became "connected"
    states = [M.CONNECTING]

    def on_change(snap: M.HostSnapshot) -> None:
        if snap.state == M.CONNECTED != states[-1]:
            connected_at.append(time.time())
        states.append(snap.state)

    s = session(ssh_home, port=proxy.port, metrics_interval=0.2, on_change=on_change)
    s.run_in_background()
    try:
        await until(lambda: len(s.history) >= 5, what="first samples")
        outages: list[tuple[str, float, int]] = []  # (fault, when it began, connected_at entries before it)
        for fault in ("reset", "blackhole", "reset", "blackhole", "reset"):
            before, count = proxy.accepted, len(s.history)
            outages.append((fault, time.time(), len(connected_at)))
            if fault == "reset":
                proxy.reset()
            else:
                proxy.blackhole()
                await asyncio.sleep(1.0)  # the fault's duration, not a wait for readiness
                proxy.restore()
            await until(
                lambda b=before, c=count: (
                    proxy.accepted > b and s.snapshot.state == M.CONNECTED and len(s.history) > c + 5
                ),
                what=f"samples after {fault}",
            )
        seqs = s.history.seqs()
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        times = s.history.times()
        assert all(a < b for a, b in zip(times, times[1:], strict=False))
        for fault, began, seen in outages:
            back = next(t for t in connected_at[seen:] if t > began)  # connected again after the fault
            # without the old agent lingering, nothing samples between the cut and the new connection
            assert any(began < t < back for t in times), (fault, began, back)
    finally:
        await s.close()


async def test_states_backoff_and_half_open_detection(ssh_home: SshHome, proxy: FaultProxy) -> None:
    seen: list[tuple[str, str | None]] = []
    s = session(ssh_home, port=proxy.port, on_change=lambda snap: seen.append((snap.state, snap.detail)))
    s.run_in_background()
    try:
        await until(lambda: s.snapshot.state == M.CONNECTED, what="connected")
        proxy.reset()
        await until(lambda: s.snapshot.state == M.RECONNECTING, what="reconnecting")
        await until(lambda: s.snapshot.state == M.CONNECTED, what="connected again")
        states = [st for i, (st, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != st]
        assert states[:4] == [M.CONNECTING, M.CONNECTED, M.RECONNECTING, M.CONNECTED], states
        details = [d for st, d in seen if st == M.RECONNECTING]
        assert any(d and re.fullmatch(r"attempt \d+, next in \d+\.\d s", d) for d in details), details

        # Half-open: packets vanish, no RST. SSH keepalive (1 s x 2) notices it, before the agent's silence
        # limit (15 s) would: the reason says which one did (no clock is read).
        proxy.blackhole()
        await until(lambda: s.snapshot.state == M.RECONNECTING, timeout=60, what="half-open link noticed")
        assert "link lost" in (s.snapshot.error or "") and "sent nothing" not in (s.snapshot.error or "")
        proxy.restore()
        await until(lambda: s.snapshot.state == M.CONNECTED, what="connected after blackhole")
    finally:
        await s.close()


async def test_refusal_is_an_error_state_without_retries(ssh_home: SshHome, proxy: FaultProxy) -> None:
    s = session(ssh_home, port=proxy.port, key="stranger")
    runner = s.run_in_background()
    await asyncio.wait_for(runner, 30)  # gives up at once: retrying cannot fix auth
    assert s.snapshot.state == M.ERROR and "authentication failed" in (s.snapshot.error or "")
    assert proxy.accepted == 1
    await s.close()


async def test_an_unknown_host_key_waits_for_trust_then_connects(ssh_home: SshHome, proxy: FaultProxy) -> None:
    """The app's host with a key not trusted yet: an error state, not retried while known_hosts is as it was;
    ``gputui trust box --yes`` in another terminal, and the host connects without the app's restart."""
    ssh_home.known_hosts.write_text("")
    s = session(ssh_home, port=proxy.port)
    runner = s.run_in_background()
    try:
        await until(lambda: s.snapshot.state == M.ERROR, what="the host key refused")
        assert "unknown host key" in (s.snapshot.error or "") and not runner.done() and proxy.accepted == 1
        trusted = await asyncio.create_subprocess_exec(sys.executable, "-m", "gputui", "trust", "box", "--yes",
                                                       env=ssh_home.env, stdout=subprocess.DEVNULL)
        assert await trusted.wait() == 0
        await until(lambda: s.snapshot.state == M.CONNECTED, what="connected once trusted")
        assert proxy.accepted == 3  # the first try, trust's own, the one after it
    finally:
        await s.close()


async def test_unreachable_host_retries_with_backoff(ssh_home: SshHome) -> None:
    s = session(ssh_home, port=free_port())
    s.run_in_background()
    try:
        await until(lambda: "attempt 3," in (s.snapshot.detail or ""), what="third attempt")
        assert s.snapshot.state == M.RECONNECTING and "connection refused" in (s.snapshot.error or "")
    finally:
        await s.close()


async def test_request_while_unreachable_says_why(ssh_home: SshHome) -> None:
    s = session(ssh_home, port=free_port())
    s.run_in_background()
    try:
        await until(lambda: "attempt 1," in (s.snapshot.detail or ""), what="first attempt")
        with pytest.raises(LinkClosed) as err:
            await s.request(P.OP_PING, timeout=0.5)
        assert "not connected within 0.5 s (connection refused" in str(err.value)
    finally:
        await s.close()

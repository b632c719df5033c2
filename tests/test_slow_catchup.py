"""A follow far behind on a slow link catches up over a raw stream; its bytes keep the host alive.

At 10 KB/s a raw catch-up fills the connection, so the agent channel's heartbeats wait behind it. Bytes on any
channel of the host's connection prove it alive: the session must not reconnect for want of heartbeats.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import SshHome, wait_for
from faultproxy import FaultProxy
from test_ssh_faults import session, until

from gputui.core.session import host as session_host
from gputui.core.session import model as M

RATE = 10_000  # bytes per second, each direction
# A backlog past CATCHUP_MIN_BYTES at once, then nothing until the stop file exists.
BACKLOG_JOB = """
import os, sys, time
for i in range(45000):
    print("backlog %05d %s" % (i, "b" * 86))
sys.stdout.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print("done", flush=True)
"""


async def test_raw_catch_up_on_a_slow_link_does_not_reconnect(
    ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_host, "SILENCE_S", 5.0)  # the heartbeats wait behind the catch-up far longer than this
    stop = tmp_path / "stop"
    job = ssh_home.cli("run", "box", "--", "python3", "-c", BACKLOG_JOB, str(stop), check=True).stdout.strip()
    log = ssh_home.remote_job_dir(job) / "output.log"
    wait_for(lambda: log.exists() and log.stat().st_size >= 4_500_000, what="the backlog written")
    assert log.stat().st_size > session_host.CATCHUP_MIN_BYTES

    states: list[str] = []
    proxy.rate_limit(RATE)
    s = session(ssh_home, port=proxy.port, on_change=lambda snap: states.append(snap.state))
    s.run_in_background()
    try:
        await s.wait_connected(60)
        received = bytearray()
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await s.follow_log(job, 0, received.extend, lambda info: done.done() or done.set_result(info))
        # ~20 s of catch-up at this rate: four times the silence limit, with heartbeats stuck behind it.
        await until(lambda: len(received) >= 200_000, timeout=120, what="200 kB of the catch-up")
        assert proxy.accepted == 1 and M.RECONNECTING not in states, (states, s.snapshot.error)

        proxy.rate_limit(None)
        stop.touch()
        info = await asyncio.wait_for(done, 120)
        assert info["exit_code"] == 0
        assert bytes(received) == log.read_bytes()  # byte-exact, nothing lost or repeated
    finally:
        await s.close()

"""A slow link (tests/faultproxy.py rate limit): logs make steady progress, the link is never declared dead."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from conftest import SshHome, wait_for
from faultproxy import FaultProxy
from test_ssh_faults import session, until

from gputui.core.session import model as M
from remote_agent import protocol as P

RATE = 10_000  # bytes per second, each direction
PROGRESS_BYTES = 150_000  # followed over the slow link: some 20 s of it, past the session's 15 s silence limit
# Writes a 2 MB backlog at once, then a numbered line a second until the stop file exists.
BACKLOG_JOB = """
import os, sys, time
stop = sys.argv[1]
for i in range(20000):
    print("backlog %05d %s" % (i, "b" * 84))
i = 0
while not os.path.exists(stop):
    i += 1
    print("live %d" % i, flush=True)
    time.sleep(1)
print("done", flush=True)
"""


async def test_backlog_streams_steadily_over_a_10_kb_per_s_link(
    ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Bytes keep coming, requests are answered while the backlog still streams (they do not queue behind
    it), nothing reconnects, and the log arrives byte-exact. No rate is asserted: a slow machine only takes
    longer (each wait's bound is a hang guard)."""
    stop = tmp_path / "stop"
    job = ssh_home.cli("run", "box", "--", "python3", "-c", BACKLOG_JOB, str(stop), check=True).stdout.strip()
    log = ssh_home.remote_job_dir(job) / "output.log"
    wait_for(lambda: log.exists() and b"live 1" in log.read_bytes(), what="the backlog written")
    backlog = log.read_bytes().index(b"live 1")

    states: list[str] = []
    proxy.rate_limit(RATE)  # the agent is on the host already (run uploaded it): connecting takes seconds
    s = session(ssh_home, port=proxy.port, on_change=lambda snap: states.append(snap.state))
    s.run_in_background()
    try:
        await s.wait_connected(60)  # every connect-time request done (it resumes follows registered by then)
        received = bytearray()
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await s.follow_log(job, 0, received.extend, lambda info: done.done() or done.set_result(info))

        # Steady progress over a stretch longer than the session's silence limit: more bytes again and
        # again, and a ping answered each time with the backlog still streaming (without flow control the
        # reply would wait behind megabytes of log frames).
        answered_at: list[int] = []
        while len(received) < PROGRESS_BYTES:
            before = len(received)
            await until(lambda b=before: len(received) > b, timeout=60, what="more log bytes")
            await s.request(P.OP_PING, timeout=120)
            answered_at.append(len(received))
        assert len(answered_at) >= 5, answered_at  # in many pieces, not one burst
        assert answered_at[-1] < backlog, (answered_at, backlog)  # answered mid-backlog, every time
        assert proxy.accepted == 1 and M.RECONNECTING not in states, (states, s.snapshot.error)
        assert bytes(received) == log.read_bytes()[: len(received)]

        proxy.rate_limit(None)
        stop.touch()
        info = await asyncio.wait_for(done, 120)
        assert info["exit_code"] == 0
        assert bytes(received) == log.read_bytes()  # byte-exact, nothing lost or repeated
    finally:
        await s.close()


async def test_hung_agent_is_noticed_by_its_silence(ssh_home: SshHome) -> None:
    s = session(ssh_home)
    s.run_in_background()
    try:
        await s.wait_connected(60)
        pid = s.snapshot.facts["agent_pid"]
        os.kill(pid, signal.SIGSTOP)  # alive, link fine, SSH keepalive answered: only its silence tells
        try:
            await until(lambda: s.snapshot.state == M.RECONNECTING, timeout=60, what="the hung agent noticed")
            assert "the agent sent nothing for" in (s.snapshot.error or "")
            await until(lambda: s.snapshot.state == M.CONNECTED, what="a new agent")
        finally:
            os.kill(pid, signal.SIGKILL)
    finally:
        await s.close()

"""A follow far behind the log's end catches up over a raw stream (the agent's ``cat``), byte-exact and resumable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from conftest import SshHome
from faultproxy import FaultProxy
from test_ssh_faults import session, until

from gputui.core.session import host
from gputui.core.transport.base import AgentChannel
from remote_agent import protocol as P

# Writes MB megabytes of every byte value (no line structure, NULs, \r, bad UTF-8), waits for the stop file,
# writes a last line without its newline and exits 3.
BIG_THEN_WAIT = """
import os, sys, time
stop, mb = sys.argv[1], int(sys.argv[2])
block = bytes(range(256)) * 256 + b"tail of a block\\r\\n"
out = sys.stdout.buffer
for i in range(mb * 1000000 // len(block)):
    out.write(b"%08d" % i + block)
out.flush()
while not os.path.exists(stop):
    time.sleep(0.05)
out.write(b"last words, no newline")
out.flush()
sys.exit(3)
"""


def recorded_streams(s: host.HostSession) -> list[list[str]]:
    """The argv of every raw agent stream ``s`` opens from now on (the list fills as they open)."""
    streams: list[list[str]] = []
    open_stream = s.transport.open_agent_stream

    async def counted(args: list[str]) -> AgentChannel:
        streams.append(args)
        return await open_stream(args)

    s.transport.open_agent_stream = counted  # type: ignore[method-assign]
    return streams


def recorded_requests(s: host.HostSession) -> list[tuple[str, dict[str, Any]]]:
    """(op, args) of every request ``s`` sends on its current link from now on."""
    sent: list[tuple[str, dict[str, Any]]] = []
    assert s.link is not None
    request = s.link.request

    async def counted(op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        sent.append((op, args))
        return await request(op, timeout=timeout, **args)

    s.link.request = counted  # type: ignore[method-assign]
    return sent


async def test_catch_up_cut_by_a_link_reset_resumes_byte_exact_over_raw_streams(
    ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    s = session(ssh_home, port=proxy.port)
    streams = recorded_streams(s)
    await s.start()
    s.run_in_background()
    try:
        job = await s.start_job(["python3", "-c", BIG_THEN_WAIT, str(stop), "24"])
        log = ssh_home.remote_job_dir(job.id) / "output.log"
        await until(lambda: log.exists() and log.stat().st_size >= 23_000_000, what="the big log")
        received = bytearray()
        cut = False

        def on_data(data: bytes) -> None:
            nonlocal cut
            received.extend(data)
            if not cut and len(received) >= 6_000_000:
                cut = True
                proxy.reset()  # mid-stream: the catch-up's channel and the agent's die together

        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        follow = await s.follow_log(job.id, 0, on_data, lambda info: done.done() or done.set_result(info))
        await until(lambda: len(received) >= 23_000_000 and follow.catchup is None, 120, "the catch-up")
        assert cut and proxy.accepted >= 2
        cats = [args for args in streams if args[0] == "cat"]
        assert len(cats) >= 2, cats  # the resume after the reset went on over a raw stream too
        assert int(cats[-1][2]) >= 6_000_000  # from the cursor, not from the start
        assert bytes(received) == log.read_bytes()[: len(received)]
        stop.touch()  # the rest comes over the agent's follow
        info = await asyncio.wait_for(done, 60)
        assert info["exit_code"] == 3
        assert bytes(received) == log.read_bytes()
        assert received.endswith(b"last words, no newline")
    finally:
        await s.close()


async def test_a_follow_near_the_end_uses_no_raw_stream(ssh_home: SshHome, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    s = session(ssh_home)
    streams = recorded_streams(s)
    await s.start()
    s.run_in_background()
    try:
        job = await s.start_job(["python3", "-c", BIG_THEN_WAIT, str(stop), "1"])
        log = ssh_home.remote_job_dir(job.id) / "output.log"
        await until(lambda: log.exists() and log.stat().st_size >= 900_000, what="the log")
        assert log.stat().st_size < host.CATCHUP_MIN_BYTES
        received = bytearray()
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await s.follow_log(job.id, 0, received.extend, lambda info: done.done() or done.set_result(info))
        stop.touch()
        await asyncio.wait_for(done, 60)
        assert bytes(received) == log.read_bytes()
        assert streams == []
    finally:
        await s.close()


async def test_logs_without_follow_copy_a_big_log_over_a_raw_stream(ssh_home: SshHome, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    stop.touch()  # the job ends right after its big write
    s = session(ssh_home)
    streams = recorded_streams(s)
    await s.start()
    try:
        job = await s.start_job(["python3", "-c", BIG_THEN_WAIT, str(stop), "8"])
        async def job_ended() -> None:
            while (await s.list_jobs())[0].running:
                await asyncio.sleep(0.1)

        await asyncio.wait_for(job_ended(), 120)  # readiness, with a bound on the wait
        received = bytearray()
        sent = recorded_requests(s)
        end = await s.copy_log(job.id, 100, received.extend)
        log = (ssh_home.remote_job_dir(job.id) / "output.log").read_bytes()
        assert end == len(log) and bytes(received) == log[100:]
        assert [args[0] for args in streams] == ["cat"]
        # The first read brings bytes and the size (no probe of its own); one more after the stream finds the end.
        reads = [args for op, args in sent if op == P.OP_LOGS_READ]
        assert len(reads) == 2 and all(args.get("max_bytes") is None for args in reads), sent
        sent.clear()
        assert await s.copy_log(job.id, len(log) - 1000, received.extend) == len(log)  # a short stretch
        assert bytes(received[-1000:]) == log[-1000:] and [op for op, _ in sent] == [P.OP_LOGS_READ]
    finally:
        await s.close()
    res = ssh_home.cli_bytes("logs", "box", job.id)  # the CLI prints the same bytes
    assert res.returncode == 0, res.stderr
    assert res.stdout == log

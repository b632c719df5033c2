"""A followed log resumed after a reconnect: the client asks from its cursor and drops the bytes it already has.

The real agent (local transport, real tmux) serves the log; between the client and the agent sits a writer
that records each ``logs.follow`` request and, after the first connection, asks the agent for a few bytes
*before* the client's offset: the agent's answer then overlaps what the client already has, as it does when
an old follow's frames or a rewinding agent resend bytes. Whatever the agent sends, the log the client hands
on must be the file's bytes exactly once, in order.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from conftest import stop_host

from gputui.core.session import model as M
from gputui.core.session.host import HostSession
from gputui.core.transport.base import AgentChannel, LocalTransport
from remote_agent import protocol as P

OVERLAP = 700  # bytes the agent resends before the client's cursor on every resume

# Writes numbered lines, waits for the gate file, writes more lines and a last one without a newline.
GATED_JOB = """
import os, sys, time
gate = sys.argv[1]
out = sys.stdout.buffer
for i in range(400):
    out.write(b"before %05d the quick brown fox\\n" % i)
out.flush()
while not os.path.exists(gate):
    time.sleep(0.02)
for i in range(400):
    out.write(b"after %05d jumps over the lazy dog\\n" % i)
out.write(b"the end, no newline")
out.flush()
"""


class RewindingWriter:
    """The agent channel's writer: records every ``logs.follow`` offset asked; ``rewind`` bytes earlier on
    the wire."""

    def __init__(self, writer: Any, asked: list[int], rewind: int) -> None:
        self.writer, self.asked, self.rewind = writer, asked, rewind

    def write(self, data: bytes) -> Any:
        frames = []
        for line in data.splitlines(keepends=True):
            frame = json.loads(line)
            if frame.get("op") == P.OP_LOGS_FOLLOW:
                self.asked.append(frame["args"]["offset"])
                frame["args"]["offset"] = max(0, frame["args"]["offset"] - self.rewind)
                line = P.encode(frame)
            frames.append(line)
        return self.writer.write(b"".join(frames))

    def __getattr__(self, name: str) -> Any:  # drain, close, is_closing... as the real writer
        return getattr(self.writer, name)


def rewinding_session(state: Path, cache: Path) -> tuple[HostSession, list[list[int]], list[Any]]:
    """A local session whose every connection records the follow offsets it asks (one list per connection);
    from the second connection on, the agent is asked for OVERLAP bytes more. Also the readers, to cut."""
    session = HostSession("local", LocalTransport(str(state), cache, python=sys.executable))
    asked: list[list[int]] = []
    readers: list[Any] = []
    open_agent = session.transport.open_agent

    async def rewinding() -> AgentChannel:
        channel = await open_agent()
        asked.append([])
        readers.append(channel.reader)
        rewind = OVERLAP if len(asked) > 1 else 0
        channel.writer = RewindingWriter(channel.writer, asked[-1], rewind)  # type: ignore[assignment]
        return channel

    session.transport.open_agent = rewinding  # type: ignore[method-assign]
    return session, asked, readers


async def until(predicate: Any, what: str, timeout: float = 60) -> None:
    """Readiness, not a fixed sleep: poll ``predicate`` until it holds (the bound is only a hang guard)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_resumed_follow_hands_on_every_byte_once(tmp_path: Path) -> None:
    state, gate = tmp_path / "state", tmp_path / "gate"
    session, asked, readers = rewinding_session(state, tmp_path / "cache")
    received = bytearray()
    gaps: list[str] = []
    states: list[str] = []
    session.on_change = lambda snap: states.append(snap.state)
    try:
        await session.start()
        session.run_in_background()
        job = await session.start_job([sys.executable, "-c", GATED_JOB, str(gate)])
        log = state / "jobs" / job.id / "output.log"
        await until(lambda: log.exists() and log.read_bytes().endswith(b"00399 the quick brown fox\r\n"),
                    "the first part written")  # (the job's terminal writes \r\n)
        first = log.read_bytes()
        assert len(first) > OVERLAP
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await session.follow_log(
            job.id, 0, received.extend, lambda info: done.done() or done.set_result(info), gaps.append
        )
        await until(lambda: len(received) >= len(first), "the first part received")

        readers[-1].feed_eof()  # the link drops; the session reconnects and resumes the follow
        await until(lambda: len(asked) == 2 and asked[1], "the follow resumed on a new connection")
        assert M.RECONNECTING in states
        gate.touch()
        info = await asyncio.wait_for(done, 60)
    finally:
        await session.close()
        stop_host(state)
    assert info["exit_code"] == 0
    assert asked == [[0], [len(first)]]  # the resume asked from the cursor: every byte it had, none more
    assert gaps == []
    assert bytes(received) == log.read_bytes()  # the OVERLAP bytes resent were dropped, nothing is missing
    assert received.endswith(b"the end, no newline")

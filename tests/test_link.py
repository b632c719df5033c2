"""Link against the real agent on pipes: request timeouts, errors that say what happened."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, kill_tmux

from gputui.core.transport.link import Link, LinkClosed, RequestTimeout
from remote_agent import protocol as P


class PipeAgent:
    """The agent from source as a child process, with a Link on its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process, link: Link, events: list[tuple[str, Any]]) -> None:
        self.proc, self.link, self.events = proc, link, events


@pytest.fixture
async def pipe_agent(tmp_path: Path) -> AsyncIterator[PipeAgent]:
    state = tmp_path / "state"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "remote_agent", "serve", "--state-dir", str(state),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )
    assert proc.stdin and proc.stdout
    events: list[tuple[str, Any]] = []
    link = Link(proc.stdout, proc.stdin, lambda name, data: events.append((name, data)))
    await link.start()
    yield PipeAgent(proc, link, events)
    await link.close()
    proc.stdin.close()
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    kill_tmux(state)


async def test_request_timeout_names_the_request_and_keeps_the_link(pipe_agent: PipeAgent) -> None:
    link = pipe_agent.link
    with pytest.raises(RequestTimeout) as err:
        await link.request(P.OP_EXEC, timeout=0.3, argv=["sleep", "3"], timeout_s=10)
    assert str(err.value) == "agent did not answer host.exec within 0.3 s"
    assert not link.closed.is_set()  # one slow answer is not a dead link
    assert "t" in await link.request(P.OP_PING, timeout=10)


async def test_write_to_a_gone_agent_says_so(pipe_agent: PipeAgent) -> None:
    pipe_agent.proc.kill()
    await pipe_agent.proc.wait()
    with pytest.raises(LinkClosed) as err:
        for _ in range(50):  # the first writes may still land in the pipe's buffer
            await pipe_agent.link.request(P.OP_PING, timeout=5)
    assert str(err.value).strip() and not str(err.value).endswith(": ")


async def test_close_does_not_swallow_its_callers_cancel(pipe_agent: PipeAgent) -> None:
    closer = asyncio.create_task(pipe_agent.link.close())
    await asyncio.sleep(0)  # closer now waits for the read loop to end
    closer.cancel()  # e.g. HostSession.close() cancelling a runner that is dropping its link
    await asyncio.wait({closer})
    assert closer.cancelled()
    assert pipe_agent.link.closed.is_set()

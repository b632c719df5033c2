"""A request over the frame limit: refused by the client before sending (a usage error, exit 2), and an agent
error reply to a frame it could not read goes to the request it answers (not to ``id: null``)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from conftest import AgentProc, Home

from gputui.core.transport.link import Link, RequestTooLarge
from remote_agent import protocol as P


def test_oversized_request_is_answered_under_its_id(agent: AgentProc) -> None:
    agent.send_raw(
        b'{"id": 41, "op": "jobs.start", "args": {"pad": "' + b"x" * (P.MAX_FRAME_BYTES + 10) + b'"}}\n'
    )
    reply = agent.reply(41, timeout=20)
    assert reply["ok"] is False and reply["error"]["code"] == P.E_MALFORMED
    assert f"{P.MAX_FRAME_BYTES} byte frame limit" in reply["error"]["message"]
    assert agent.call("ping")["ok"]


def test_unparsable_request_is_answered_under_its_id(agent: AgentProc) -> None:
    agent.send_raw(b'{"id": 42, "op": "ping", "args": {"x": NaN}}\n')
    reply = agent.reply(42, timeout=20)
    assert reply["ok"] is False and reply["error"]["code"] == P.E_MALFORMED


@pytest.mark.parametrize(("head", "expected"), [
    (b'{"id":7,"op":"x"', 7), (b' { "id" : 12 }', 12), (b'{"op":"x","id":7}', None), (b"[1]", None),
    (b'{"id":"7"}', None), (b'{"id":' + b"9" * 40, None),
])
def test_frame_id_reads_only_a_leading_numeric_id(head: bytes, expected: int | None) -> None:
    assert P.frame_id(head) == expected


class _Sink:
    def __init__(self) -> None:
        self.sent = bytearray()

    def write(self, data: bytes) -> None:
        self.sent += data


async def test_link_refuses_an_oversized_request_before_sending() -> None:
    sink = _Sink()
    link = Link(asyncio.StreamReader(), sink, lambda name, data: None)
    with pytest.raises(RequestTooLarge, match=r"over the agent's limit of 4,194,304 bytes"):
        await link.request(P.OP_JOBS_START, argv=["\x01" * 800_000])  # ~4.8 MB once JSON-escaped
    assert not sink.sent and not link._pending


def test_cli_run_with_an_argv_over_the_frame_limit_is_a_usage_error(home: Home) -> None:
    # \x01 is six bytes in JSON: 8 x 100,000 of them (within the OS's argv limits) make a 4.8 MB request.
    res = home.cli("run", "local", "--", sys.executable, "-c", "pass", *["\x01" * 100_000] * 8, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "bytes once encoded, over the agent's limit of 4,194,304 bytes" in res.stderr
    listed = home.cli("jobs", "local", "--json", check=True)
    assert listed.stdout.strip() == "[]"  # nothing started

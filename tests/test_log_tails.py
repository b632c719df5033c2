"""logs.tails: the ends of many jobs' logs in one request, each bounded, paged by the agent; what jobs --json
parses its insights from."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

from conftest import AgentProc, Home
from test_agent_listing import ended_job

from gputui.core.jobs import records
from gputui.core.session.host import HostSession
from gputui.core.transport.base import LocalTransport
from remote_agent import protocol as P

BIG = 700 * 1024  # above the largest tail


def log_of(job: int) -> bytes:
    return b"x" * BIG + f"\nepoch 1/1 loss=0.{job:04d}\n".encode()


def jobs_with_big_logs(state: Path, count: int) -> list[str]:
    for i in range(1, count + 1):
        (ended_job(state, i) / "output.log").write_bytes(log_of(i))
    return [str(i) for i in range(1, count + 1)]


def test_tails_are_bounded_per_job_and_per_reply_and_errors_stay_per_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ids = jobs_with_big_logs(state, 6)
    agent = AgentProc(state)
    try:
        reply = agent.call(P.OP_LOGS_TAILS, jobs=["nope", *ids], max_bytes=P.TAIL_MAX_BYTES)
        assert reply["ok"], reply
        tails = reply["result"]["tails"]
        assert tails[0]["job"] == "nope" and "error" in tails[0]
        served = tails[1:]
        assert 1 <= len(served) < len(ids)  # 6 x 512 KiB do not fit one reply: the rest is asked for again
        assert sum(len(base64.b64decode(t["b64"])) for t in served) <= P.TAILS_PAGE_BYTES
        for tail in served:
            data = base64.b64decode(tail["b64"])
            assert len(data) == P.TAIL_MAX_BYTES and tail["offset"] == tail["size"] - len(data)
            assert data == log_of(int(tail["job"]))[-P.TAIL_MAX_BYTES :]
        for bad in ({"jobs": "1"}, {"jobs": ["1"] * (P.TAILS_JOBS + 1)}, {"jobs": ids, "max_bytes": 1 << 30}):
            reply = agent.call(P.OP_LOGS_TAILS, **bad)
            assert not reply["ok"] and reply["error"]["code"] == P.E_BAD_ARGS, reply
    finally:
        agent.close()


def test_insights_of_many_jobs_come_in_one_request_per_page(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ids = jobs_with_big_logs(state, 60)
    session = HostSession("local", LocalTransport(str(state), tmp_path / "cache"))
    ops: list[str] = []

    async def collect() -> list[Any]:
        await session.start()
        try:
            jobs = await session.list_jobs()
            request = session.request

            async def counted(op: str, *args: Any, **kwargs: Any) -> Any:
                ops.append(op)
                return await request(op, *args, **kwargs)

            session.request = counted  # type: ignore[method-assign]
            return await records.with_insights(session, jobs)
        finally:
            await session.close()

    jobs = asyncio.run(collect())
    assert [j.id for j in jobs] == ids
    for job in jobs:
        assert job.insights is not None and job.insights.metrics["loss"]["last"] == int(job.id) / 10000
    pages = -(-len(ids) * records.TAIL_BYTES // P.TAILS_PAGE_BYTES)
    assert ops == [P.OP_LOGS_TAILS] * pages, ops  # not one read and one times request per job


def test_jobs_json_reads_every_tail(home: Home) -> None:
    ids = jobs_with_big_logs(home.state_dir, 40)
    listed = {j["id"]: j for j in json.loads(home.cli("jobs", "--json", check=True).stdout)}
    assert sorted(listed, key=int) == ids
    assert all(listed[i]["insights"]["metrics"]["loss"]["last"] == int(i) / 10000 for i in ids)

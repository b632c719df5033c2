"""Job lists of any length: paged replies, long commands cut for listing, the ended-jobs index."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

from conftest import AgentProc, Home, kill_tmux

from gputui.core.session.host import HostSession
from gputui.core.transport.base import LocalTransport
from remote_agent import protocol as P

BIG_ARGV = ["python3", "train.py"] + ["--opt=" + "x" * 100_000] * 15  # 1.5 MB, like the report's


def ended_job(state: Path, job_id: int, argv: list[str] | None = None, name: str | None = None) -> Path:
    """A job dir as the runner leaves it when the job has ended."""
    d = state / "jobs" / str(job_id)
    d.mkdir(parents=True, mode=0o700)
    now = time.time()
    record = {"id": str(job_id), "name": name or f"train {job_id}", "argv": argv or ["python3", "train.py"]}
    record.update(cwd="/tmp", created_at=now - 100, gpus=None, tmux_session=f"gputui-{job_id}")
    (d / "job.json").write_text(json.dumps(record))
    (d / "pid.json").write_text(
        json.dumps({"pid": 4_000_000, "runner_pid": 4_000_001, "started_at": now - 99})
    )
    (d / "output.log").write_bytes(b"epoch 1/1 loss=0.1\n")
    (d / "status.json").write_text(json.dumps({"exit_code": 0, "signal": None, "ended_at": now - 1}))
    return d


def all_pages(agent: AgentProc, **args: object) -> tuple[list[dict], int]:
    """Every job through jobs.list pages; (jobs, number of pages)."""
    jobs: list[dict] = []
    after, pages = 0, 0
    while True:
        reply = agent.call("jobs.list", after=after, **args)
        assert reply["ok"], reply
        assert len(json.dumps(reply)) < P.MAX_FRAME_BYTES
        pages += 1
        jobs += reply["result"]["jobs"]
        if not reply["result"]["more"]:
            return jobs, pages
        after = int(jobs[-1]["id"])


def test_huge_commands_list_cut_and_jobs_get_has_them_whole(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for i in (1, 2, 3):
        ended_job(state, i, BIG_ARGV)
    agent = AgentProc(state)
    try:
        jobs, _ = all_pages(agent)
        assert [j["id"] for j in jobs] == ["1", "2", "3"]
        for job in jobs:
            assert job["argv_truncated"] == {"args": 17, "chars": sum(map(len, BIG_ARGV))}
            assert len(json.dumps(job)) < 10_000 and "cut for listing" in job["argv"][-1]
        full = agent.call("jobs.get", job="2")["result"]
        assert full["argv"] == BIG_ARGV and "argv_truncated" not in full
        assert agent.call("jobs.get", job="9")["error"]["code"] == "not_found"
    finally:
        agent.close()


def test_a_real_job_with_a_long_command_is_listed_and_events_stay_small(agent: AgentProc) -> None:
    argv = ["true"] + ["y" * 50_000] * 10
    started = agent.call("jobs.start", argv=argv)["result"]
    assert len(json.dumps(started)) < 10_000 and started["argv_truncated"]["chars"] == 500_004
    event = agent.wait_event("job", id=started["id"], state="succeeded")
    assert len(json.dumps(event)) < 10_000
    assert agent.call("jobs.get", job=started["id"])["result"]["argv"] == argv


def test_thousands_of_jobs_come_in_pages_and_every_one_is_listed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for i in range(1, 2601):
        ended_job(state, i)
    agent = AgentProc(state)
    try:
        jobs, pages = all_pages(agent, limit=1000)
        assert [j["id"] for j in jobs] == [str(i) for i in range(1, 2601)] and pages == 3
        assert all(j["state"] == "succeeded" for j in jobs)
        again, pages = all_pages(agent)  # the default page: at most P.LIST_PAGE_JOBS jobs
        assert again == jobs and pages == 2
    finally:
        agent.close()
    # The client pages through by itself.
    session = HostSession("local", LocalTransport(str(state), tmp_path / "cache"))

    async def listed() -> list[str]:
        await session.start()
        try:
            return [j.id for j in await session.list_jobs()]
        finally:
            await session.close()

    assert asyncio.run(listed()) == [str(i) for i in range(1, 2601)]


def test_cli_lists_a_host_whose_jobs_once_filled_a_frame(home: Home) -> None:
    for i in (1, 2, 3):
        ended_job(home.state_dir, i, BIG_ARGV, name=f"big {i}")
    res = home.cli("jobs")
    assert res.returncode == 0, res.stderr
    assert all(f"big {i}" in res.stdout for i in (1, 2, 3))


def test_index_never_shows_a_deleted_jobs_record_for_a_new_job_with_its_id(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ended_job(state, 1, name="old")
    ended_job(state, 2, name="two")
    agent = AgentProc(state)
    try:
        assert [j["name"] for j in all_pages(agent)[0]] == ["old", "two"]
        assert (state / "jobs" / "ended.jsonl").read_text().count("\n") == 2
        old = time.time() - 60
        os.utime(state / "jobs", (old, old))  # an old jobs dir: the agent trusts its checked entries
        assert [j["name"] for j in all_pages(agent)[0]] == ["old", "two"]
        shutil.rmtree(state / "jobs" / "1")
        time.sleep(0.01)  # a new job.json: another mtime even where the inode number is reused
        ended_job(state, 1, name="new")
        assert [j["name"] for j in all_pages(agent)[0]] == ["new", "two"]
    finally:
        agent.close()
    with open(state / "jobs" / "ended.jsonl", "ab") as f:
        f.write(b'2 1 2 3 {"id":"2","name":"torn')  # a crash mid-append
    fresh = AgentProc(state)
    try:
        assert [j["name"] for j in all_pages(fresh)[0]] == ["new", "two"]
    finally:
        fresh.close()
        kill_tmux(state)


def test_damaged_job_files_are_that_jobs_error_not_the_lists(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ended_job(state, 1)
    (ended_job(state, 2) / "job.json").write_text("{not json")
    three = ended_job(state, 3)
    (three / "pid.json").write_text('{"runner_pid": "x", "started_at": []}')
    (three / "status.json").unlink()
    (state / "jobs" / "²").mkdir()  # a digit to str.isdigit(), not a job id
    agent = AgentProc(state)
    try:
        jobs, _ = all_pages(agent)
        assert [j["id"] for j in jobs] == ["1", "2", "3"]
        assert jobs[0]["state"] == "succeeded" and "error" not in jobs[0]
        assert "job.json" in jobs[1]["error"]
        assert jobs[2]["state"] == "lost" and "cannot read job 3" in jobs[2]["error"]
    finally:
        agent.close()


def test_a_huge_field_never_breaks_the_list(agent: AgentProc) -> None:
    rep = agent.call("jobs.start", argv=["true"], price_per_hour="9" * 3_000_000)
    assert rep["error"]["code"] == "bad_args" and "price_per_hour" in rep["error"]["message"]
    assert len(json.dumps(rep)) < 1000
    rep = agent.call("jobs.start", argv=["true"], gpus="0," * 1_000_000 + "1")
    assert rep["error"]["code"] == "bad_args" and len(json.dumps(rep)) < 1000
    job = agent.call("jobs.start", argv=["true"], cwd="/")["result"]
    job_json = agent.state_dir / "jobs" / job["id"] / "job.json"
    record = json.loads(job_json.read_text())
    stat = job_json.stat()
    record["git"] = {"branch": "b" * 200_000}  # e.g. a record written by another build
    job_json.write_text(json.dumps(record))
    os.utime(job_json, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    [listed] = agent.call("jobs.list")["result"]["jobs"]
    assert "record too large to list" in listed["error"] and len(json.dumps(listed)) < 1000
    full = agent.call("jobs.get", job=job["id"])["result"]
    assert full["git"]["branch"] == "b" * 200_000 and "error" not in full

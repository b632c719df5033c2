"""The insights of ended jobs kept on the client: a second ``jobs`` asks the host for no tail it has parsed,
gives what a fresh parse gives, re-parses a log that moved, and the cache file stays bounded and can never
make an error. Real agent (local transport)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import Home
from test_agent_listing import ended_job

from gputui.core.insights import JobInsights
from gputui.core.jobs import insights_cache, records
from gputui.core.session.host import HostSession
from gputui.core.session.model import JOB_RUNNING, Job
from gputui.core.transport.base import LocalTransport
from remote_agent import protocol as P
from remote_agent.jobs.index import INDEX


def log_of(job: int) -> bytes:
    """A log with what a cache could lose: NaN, a hint, a line with no newline, text that is not ASCII."""
    lines = [f"epoch {e}/5 loss={0.5 / e + job / 1000:.4f} acc={e / 10}\n" for e in range(1, 5)]
    lines += ["step 3 loss=nan lr=1e-05\n", "torch.OutOfMemoryError: CUDA out of memory. (é ✓)\n", "Killed"]
    return b"x" * 70_000 + "".join(lines).encode()


def make_jobs(state: Path, count: int) -> list[str]:
    for i in range(1, count + 1):
        (ended_job(state, i) / "output.log").write_bytes(log_of(i))
    return [str(i) for i in range(1, count + 1)]


class Host:
    """A session on the real agent that records which jobs each ``logs.tails`` request names."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.agent_cache = tmp / "agent-cache"
        self.asked: list[list[str]] = []

    def insights(self, cache: insights_cache.InsightsCache | None, change: Any = None) -> list[JobInsights]:
        async def go() -> list[JobInsights]:
            session = HostSession("local", LocalTransport(str(self.state), self.agent_cache))
            await session.start()
            try:
                jobs = await session.list_jobs()
                if change is not None:
                    jobs = [change(j) for j in jobs]
                request = session.request

                async def counted(op: str, *args: Any, **kwargs: Any) -> Any:
                    if op == P.OP_LOGS_TAILS:
                        self.asked.append(list(kwargs["jobs"]))
                    return await request(op, *args, **kwargs)

                session.request = counted  # type: ignore[method-assign]
                return await records.jobs_insights(session, jobs, cache)
            finally:
                await session.close()

        self.asked = []
        return asyncio.run(go())


def same(a: list[JobInsights], b: list[JobInsights]) -> bool:
    return repr(a) == repr(b)  # repr: NaN equals NaN


def test_a_cached_ended_job_gives_a_fresh_parse_and_its_tail_is_not_asked_again(tmp_path: Path) -> None:
    host = Host(tmp_path)
    ids = make_jobs(host.state, 5)
    fresh = host.insights(None)
    loss = fresh[0].metrics["loss"]["last"]
    assert loss != loss and {"loss_nan", "cuda_oom"} <= {h.code for h in fresh[0].hints}  # NaN, hints
    cold = host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))
    assert sorted(sum(host.asked, []), key=int) == ids
    warm = host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))  # a new process: read from the file
    assert host.asked == []  # no tail asked for
    assert same(cold, fresh) and same(warm, fresh)


def test_a_log_that_moved_is_parsed_again_and_a_running_job_always(tmp_path: Path) -> None:
    host = Host(tmp_path)
    make_jobs(host.state, 3)
    host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))
    with open(host.state / "jobs" / "2" / "output.log", "ab") as f:
        f.write(b"\nepoch 5/5 loss=0.0123\n")
    (host.state / "jobs" / INDEX).unlink()  # the agent's index of ended records is a cache too
    got = host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))
    assert host.asked == [["2"]]
    assert got[1].metrics["loss"]["last"] == 0.0123 and same(got, host.insights(None))
    running = host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"), lambda j: replace(j, state=JOB_RUNNING))
    assert host.asked == [["1", "2", "3"]]
    assert same(running, host.insights(None, lambda j: replace(j, state=JOB_RUNNING)))
    host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"), lambda j: replace(j, state=JOB_RUNNING))
    assert host.asked == [["1", "2", "3"]]  # a running job's insights were not stored


@pytest.mark.parametrize(
    "bad", ["garbage", "huge", "foreign entry", "directory", "old parser", "fifo", "symlink"]
)
def test_a_bad_cache_file_costs_a_parse_never_an_error(tmp_path: Path, bad: str) -> None:
    host = Host(tmp_path)
    make_jobs(host.state, 2)
    path = tmp_path / "c.txt"
    fresh = host.insights(None)
    if bad == "garbage":
        path.write_bytes(b"\xff\x00{not a cache\n\t\t\n")
    elif bad == "huge":
        with open(path, "wb") as f:
            f.truncate(insights_cache.MAX_FILE_BYTES + 1)
    elif bad == "directory":
        path.mkdir()
    elif bad == "fifo":  # reading it would wait for a writer forever
        os.mkfifo(path)
    elif bad == "symlink":
        path.symlink_to("/dev/zero")
    else:
        host.insights(insights_cache.InsightsCache(path))  # a good file, then spoil it
        head, *lines = path.read_bytes().splitlines()
        if bad == "old parser":
            head = b"gputui-insights-cache 1 0123456789abcdef"
        else:  # a line that parses as JSON but is not insights
            key, at, _ = lines[0].split(b"\t")
            lines[0] = b"\t".join([key, at, b'{"progress":{"x":1},"metrics":[]}'])
        path.write_bytes(b"\n".join([head, *lines]) + b"\n")
    got = host.insights(insights_cache.InsightsCache(path))
    assert same(got, fresh) and host.asked
    if bad != "directory":  # replaced by a good file: the next call asks for nothing
        assert same(host.insights(insights_cache.InsightsCache(path)), fresh) and host.asked == []


def test_the_cache_never_grows_past_its_bounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(insights_cache, "MAX_ENTRIES", 4)
    host = Host(tmp_path)
    make_jobs(host.state, 7)
    path = tmp_path / "c.txt"
    host.insights(insights_cache.InsightsCache(path))
    assert len(path.read_bytes().splitlines()) == 1 + 4
    entry = len(path.read_bytes().splitlines()[1])
    monkeypatch.setattr(insights_cache, "MAX_FILE_BYTES", 100 + 2 * (entry + 1))
    cache = insights_cache.InsightsCache(path)
    for i in range(50):  # more entries, each newer than the last
        cache.put(f"k{i}", JobInsights(last_line=f"line {i}", progress=float("nan")))
    cache.save()
    assert path.stat().st_size <= insights_cache.MAX_FILE_BYTES
    keys = [line.split(b"\t")[0] for line in path.read_bytes().splitlines()[1:]]
    assert keys and keys[0] == b"k49" and len(keys) <= 4  # the newest kept, the oldest dropped
    cache.put("big", JobInsights(last_line="y" * (insights_cache.MAX_ENTRY_BYTES + 1)))
    cache.save()
    assert b"big\t" not in path.read_bytes()  # an entry over its bound is not kept


def test_jobs_json_keeps_ended_jobs_insights_in_the_user_cache_dir(home: Home) -> None:
    make_jobs(home.state_dir, 3)
    first = json.loads(home.cli("jobs", "--json", check=True).stdout)
    cache = Path(home.env["HOME"]) / ".cache" / "gputui" / "insights.cache"
    assert len(cache.read_bytes().splitlines()) == 1 + 3
    assert json.loads(home.cli("jobs", "--json", check=True).stdout) == first
    assert all(j["insights"]["hints"] for j in first)


def test_a_job_record_from_the_cache_is_the_same_json(tmp_path: Path) -> None:
    host = Host(tmp_path)
    make_jobs(host.state, 1)
    cached = host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))[0]
    again = host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))[0]
    job = Job("local", "1", "n", "failed", ("x",))
    assert replace(job, insights=cached).to_json() == replace(job, insights=again).to_json()


def test_parsing_and_the_cache_file_stay_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's history view asks for the insights of every ended job: parsing the tails and the cache's file
    work run in a thread, so the app keeps drawing and answering keys meanwhile."""
    host = Host(tmp_path)
    make_jobs(host.state, 5)
    on_loop: list[tuple[str, bool]] = []

    def spy(name: str, real: Any) -> Any:
        def call(*args: Any) -> Any:
            on_loop.append((name, threading.current_thread() is threading.main_thread()))
            return real(*args)

        return call

    monkeypatch.setattr(records, "_insights", spy("parse", records._insights))
    monkeypatch.setattr(insights_cache.InsightsCache, "_read", spy("read", insights_cache.InsightsCache._read))
    host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))  # parses all 5, reads and writes the file
    host.insights(insights_cache.InsightsCache(tmp_path / "c.txt"))  # all 5 from the file
    assert {name for name, _ in on_loop} == {"parse", "read"}
    assert [name for name, main in on_loop if main] == []

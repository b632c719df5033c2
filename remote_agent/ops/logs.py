"""Log ops: logs.read, logs.follow, logs.unfollow, logs.times, logs.tails, logs.series."""

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .. import protocol as P
from ..jobs import series as job_series
from ..jobs.logclock import TIMES_NAME, read_times
from ..jobs.logs import Follow, read_chunk, tail_offset
from ..jobs.store import JobError

if TYPE_CHECKING:
    from ..server import Agent


def read(agent: "Agent", a: P.ReadArgs) -> P.ReadResult:
    path = agent.jobs.log_path(str(a.get("job")))
    offset = P.int_arg(a, "offset", 0)
    if a.get("tail_lines") is not None:
        offset = tail_offset(path, P.int_arg(a, "tail_lines", 0))
    data, size = read_chunk(path, offset, P.int_arg(a, "max_bytes", P.LOG_CHUNK_BYTES, 0, P.LOG_CHUNK_BYTES))
    # The path lets the client fetch a long stretch as a raw stream instead (the agent's ``cat``).
    return {"offset": offset, "b64": P.b64(data), "size": size, "path": path}


def times(agent: "Agent", a: P.TimesArgs) -> P.TimesResult:
    """When the bytes start..end of the job's log were written: [[offset, unix time], ...]."""
    path = os.path.join(agent.jobs.job_dir(str(a.get("job"))), TIMES_NAME)
    return {"times": read_times(path, int(a.get("start", 0)), int(a.get("end", 0)))}


def tails(agent: "Agent", a: P.TailsArgs) -> P.TailsResult:
    """The last ``max_bytes`` of each job's log with when they were written, for the first jobs named
    that fit in TAILS_PAGE_BYTES (always at least one)."""
    jobs = a.get("jobs")
    if not isinstance(jobs, list) or len(jobs) > P.TAILS_JOBS:
        raise ValueError("jobs must be a list of at most %d job ids" % P.TAILS_JOBS)
    max_bytes = P.int_arg(a, "max_bytes", P.TAIL_MAX_BYTES, 0, P.TAIL_MAX_BYTES)
    found: List[P.Tail] = []
    room = P.TAILS_PAGE_BYTES
    for job_id in map(str, jobs):
        try:
            path = agent.jobs.log_path(job_id)
            _, size = read_chunk(path, 0, 0)
            start = max(0, size - max_bytes)
            data, size = read_chunk(path, start, max_bytes)
            written = read_times(os.path.join(agent.jobs.job_dir(job_id), TIMES_NAME), start, start + len(data))
        except JobError as exc:
            found.append({"job": job_id, "error": str(exc)})
            continue
        cost = len(data) + 32 * len(written)
        if found and cost > room:
            break
        room -= cost
        found.append({"job": job_id, "offset": start, "size": size, "b64": P.b64(data), "times": written})
    return {"tails": found}


def series(agent: "Agent", a: P.JobArgs) -> P.SeriesResult:
    """The job's metric series: its log read on from where the last call stopped (a bounded stretch per call),
    kept in the job dir; an ended job's, once read to the end, come from that file alone."""
    job_id = str(a.get("job"))
    job_dir = agent.jobs.job_dir(job_id)
    ended = agent.jobs.describe(job_id)["state"] in P.JOB_ENDED_STATES
    ex, size = job_series.update(job_dir, ended)
    return job_series.result(job_id, ex, size)  # type: ignore[return-value]


def _ended(agent: "Agent", job_id: str) -> Optional[Dict[str, Any]]:
    job = agent.jobs.describe(job_id)
    if job["state"] not in P.JOB_ENDED_STATES:
        return None
    return {"job_state": job["state"], "exit_code": job["exit_code"]}


def follow(agent: "Agent", a: P.FollowArgs) -> P.FollowResult:
    """Push the log from ``offset`` as ``log`` events, then ``log_end`` when the job is over."""
    job_id = str(a.get("job"))
    path = agent.jobs.log_path(job_id)
    unfollow(agent, {"job": job_id})
    offset = P.int_arg(a, "offset", 0)
    stream = Follow(job_id, path, offset, agent.emit, lambda: _ended(agent, job_id), room=agent.credit.log_room)
    agent.follows[job_id] = stream
    stream.start()
    return {"job": job_id, "offset": stream.offset}


def unfollow(agent: "Agent", a: P.JobArgs) -> None:
    stream = agent.follows.pop(str(a.get("job")), None)
    if stream is not None:
        stream.stop()


HANDLERS = {
    P.OP_LOGS_READ: read, P.OP_LOGS_FOLLOW: follow, P.OP_LOGS_UNFOLLOW: unfollow, P.OP_LOGS_TIMES: times,
    P.OP_LOGS_TAILS: tails, P.OP_LOGS_SERIES: series,
}

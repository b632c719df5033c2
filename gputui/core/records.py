"""Run records: what a finished (or running) job was, did and cost, read back from its host."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from remote_agent import protocol as P

from .insights import Hint, JobInsights, timed_parser, with_exit_hint
from .link import AgentError
from .model import JOB_RUNNING, Job
from .session import HostSession

#: Only the end of a log is parsed for insights: progress and final metrics live there.
TAIL_BYTES = 512 * 1024


async def job_insights(session: HostSession, job: Job) -> JobInsights:
    """Progress, metrics and hints parsed from the last TAIL_BYTES of the job's log, plus an exit-code hint.

    The host's record of when the log's bytes were written gives the rates a live reader would have seen.
    """
    start = offset = max(0, job.log_size - TAIL_BYTES)
    data = bytearray()
    try:
        while True:
            offset, chunk, size = await session.read_log(job.id, offset)
            data += chunk
            offset += len(chunk)
            if not chunk or offset >= size:
                break
    except AgentError as exc:  # e.g. the log became a dir or a FIFO: this job's problem, not the host's
        fix = f"look at jobs/{job.id}/output.log in the host's state dir"
        return JobInsights(hints=(Hint("log_unreadable", "the job's log cannot be read", fix, str(exc)),))
    try:
        times = await session.log_times(job.id, start, offset)
    except AgentError:  # an agent from before the time index: no rates, as before
        times = []
    parser = timed_parser(bytes(data), start, times)
    if job.state != JOB_RUNNING:
        parser.flush()  # a final line without newline (e.g. "Killed") still counts once the job is over
    snap = parser.snapshot()
    if job.state != JOB_RUNNING:
        snap = replace(snap, hints=tuple(with_exit_hint(snap.hints, job.exit_code)))
    return snap


def visible_gpus(job: Job) -> list[P.GpuFact]:
    """The host's GPUs (as recorded at start) that the job's CUDA_VISIBLE_DEVICES selection allowed."""
    inventory = job.record.get("gpu_inventory") or []
    if not job.gpus or job.gpus == "all":
        return list(inventory)
    wanted = set(job.gpus.split(","))
    return [g for g in inventory if str(g.get("index")) in wanted or g.get("uuid") in wanted]


def run_record(job: Job, insights: JobInsights | None, currency: str) -> dict[str, Any]:
    """The history entry of one job."""
    usage = job.record.get("usage") or {}
    end = job.ended_at
    duration = end - job.started_at if end is not None and job.started_at is not None else None
    price = job.record.get("price_per_hour")
    gpus = visible_gpus(job)
    return {
        "host": job.host,
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "exit_code": job.exit_code,
        "command": list(job.command),
        "cwd": job.cwd,
        "git": job.record.get("git"),
        "code": job.record.get("code"),  # run --sync: the synced tree's hash, git commit and dirty flag
        "gpus": {
            "selection": job.gpus or "all",
            "indices": [g.get("index") for g in gpus],
            "models": sorted({g.get("name") for g in gpus if g.get("name")}),
        },  # fmt: skip
        "started_at": job.started_at,
        "ended_at": end,
        "duration_s": duration,
        "gpu_peak_mem_mib": usage.get("gpu_peak_mem_mib"),
        "gpu_mean_util": usage.get("gpu_mean_util"),
        "cost": price * duration / 3600.0 if price is not None and duration is not None else None,
        "currency": currency,
        "metrics": dict(insights.metrics) if insights else {},
        "hints": [h.to_json() for h in insights.hints] if insights else [],
    }

"""Run records: what a finished (or running) job was, did and cost, read back from its host."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gputui.core.insights import Hint, JobInsights, timed_parser, with_exit_hint
from gputui.core.jobs.insights_cache import InsightsCache, cacheable, entry_key
from gputui.core.jobs.labels import labelled, rank0_view  # a many-node job: the insights read rank 0's lines
from gputui.core.session.host import HostSession, LogTail
from gputui.core.session.model import JOB_RUNNING, GpuFault, Job
from remote_agent import protocol as P

#: Only the end of a log is parsed for insights: progress and final metrics live there.
TAIL_BYTES = 64 * 1024


async def jobs_insights(
    session: HostSession, jobs: Sequence[Job], cache: InsightsCache | None = None
) -> list[JobInsights]:
    """For each job: progress, metrics and hints parsed from the last TAIL_BYTES of its log, plus an
    exit-code hint; the tails come a page of jobs per request, not one request per job.

    The host's record of when the log's bytes were written gives the rates a live reader would have seen.
    With a ``cache``, an ended job whose insights it holds is not asked for its tail, and the insights of the
    ended jobs parsed here are stored in it; a running job's log moves, so it is always parsed. Parsing and
    the cache's file work run in a thread, so an app that asks keeps drawing meanwhile.
    """
    host = (session.name, session.snapshot.facts.get("hostname"), session.snapshot.facts.get("state_dir"))
    found = await asyncio.to_thread(_cached, cache, host, jobs) if cache is not None else {}
    by_id = {job.id: job for job in jobs if job.id not in found}
    async for tails in session.log_tails(list(by_id), TAIL_BYTES):  # parsed while the next page comes
        found.update(await asyncio.to_thread(_parse_page, tails, by_id, cache, host))
    if cache is not None:
        await asyncio.to_thread(cache.save)
    return [found[job.id] if job.id in found else _insights(job, None) for job in jobs]


def _cached(cache: InsightsCache, host: tuple[str | None, ...], jobs: Sequence[Job]) -> dict[str, JobInsights]:
    """The insights the cache holds for these jobs, by job id."""
    found = {}
    for job in jobs:
        hit = cache.get(entry_key(host, job, job.log_size)) if cacheable(job) else None
        if hit is not None:
            found[job.id] = hit
    return found


def _parse_page(
    tails: dict[str, LogTail], by_id: dict[str, Job], cache: InsightsCache | None, host: tuple[str | None, ...]
) -> dict[str, JobInsights]:
    """The insights of a page of tails, by job id; an ended job's are stored in the cache."""
    found = {}
    for job_id, tail in tails.items():
        asked = by_id.get(job_id)
        if asked is None:
            continue
        found[job_id] = _insights(asked, tail)
        if cache is not None and cacheable(asked) and tail.error is None:
            cache.put(entry_key(host, asked, tail.size), found[job_id])
    return found


async def with_insights(
    session: HostSession, jobs: Sequence[Job], cache: InsightsCache | None = None
) -> list[Job]:
    """The jobs, each with its ``insights`` (``jobs_insights``)."""
    insights = await jobs_insights(session, jobs, cache)
    return [replace(job, insights=ins) for job, ins in zip(jobs, insights, strict=True)]


async def job_insights(session: HostSession, job: Job) -> JobInsights:
    """``jobs_insights`` of one job."""
    return (await jobs_insights(session, [job]))[0]


def _insights(job: Job, tail: LogTail | None) -> JobInsights:
    if tail is None or tail.error is not None:  # e.g. the log became a dir or a FIFO: this job's problem
        fix = f"look at jobs/{job.id}/output.log in the host's state dir"
        detail = tail.error if tail is not None and tail.error is not None else "the host did not send it"
        return JobInsights(hints=(Hint("log_unreadable", "the job's log cannot be read", fix, detail),))
    data = rank0_view(tail.data, tail.offset) if labelled(job.record) else tail.data
    parser = timed_parser(data, tail.offset, tail.times)
    if job.state != JOB_RUNNING:
        parser.flush()  # a final line without newline (e.g. "Killed") still counts once the job is over
    snap = parser.snapshot()
    if job.state != JOB_RUNNING:  # over: no time left to estimate
        snap = replace(snap, eta_s=None, hints=tuple(with_exit_hint(snap.hints, job.exit_code)))
    return snap


def visible_gpus(job: Job) -> list[P.GpuFact]:
    """The host's GPUs (as recorded at start) that the job's CUDA_VISIBLE_DEVICES selection allowed."""
    inventory = job.record.get("gpu_inventory") or []
    if not job.gpus or job.gpus == "all":
        return list(inventory)
    wanted = set(job.gpus.split(","))
    return [g for g in inventory if str(g.get("index")) in wanted or g.get("uuid") in wanted]


def _kwh(joules: Any) -> float | None:
    if isinstance(joules, (int, float)) and not isinstance(joules, bool) and 0 <= joules < 1e15:
        return joules / 3.6e6
    return None


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e10 else None


def wasted(usage: dict[str, Any], cost: float | None) -> dict[str, Any]:
    """The share of a run's GPU samples that found its GPUs idle or throttled by heat or hardware, and what that
    share of its cost came to; and the same for its busy samples over a PCIe link with lanes missing (a slower
    machine than the one listed, not nothing: apart). From ``usage.json`` (remote_agent/jobs/usage.py); None
    where nothing says."""
    samples = usage.get("gpu_samples")
    if not isinstance(samples, int) or samples <= 0:
        return {"idle_fraction": None, "throttled_fraction": None, "cost_idle_or_throttled": None,
                "narrow_link_fraction": None, "cost_narrow_link": None}
    idle, throttled, narrow = (min(max(n, 0), samples) if isinstance(n := usage.get(k), int) else 0
                               for k in ("idle_samples", "throttled_samples", "narrow_link_samples"))
    share = min((idle + throttled) / samples, 1.0)
    return {"idle_fraction": idle / samples, "throttled_fraction": throttled / samples,
            "cost_idle_or_throttled": None if cost is None else cost * share,
            "narrow_link_fraction": narrow / samples, "cost_narrow_link": None if cost is None else cost * narrow / samples}


def run_faults(usage: dict[str, Any]) -> list[dict[str, Any]]:
    """The driver's XIDs on the run's GPUs while it ran (``usage.json``'s ``faults``), each checked."""
    out = []
    found = usage.get("faults")
    for raw in found if isinstance(found, list) else []:
        fault = GpuFault.from_wire(raw)
        gpu = raw.get("gpu") if isinstance(raw, dict) else None
        if fault is not None and isinstance(gpu, int) and not isinstance(gpu, bool):
            out.append({"gpu": gpu, "t": fault.t, "kind": fault.kind, "xid": fault.xid, "meaning": fault.meaning})
    return out[:20]


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
        "artifacts": job.record.get("artifacts") or [],  # run --artifacts: what release brings back first
        "attempts": job.record.get("attempts") or [],  # restart policies: each attempt that ended before the last
        "image": job.image,  # run --image: the image as asked and the ID the engine resolved it to
        "group": job.record.get("group"),  # a job over several hosts: its hosts and this part's rank
        "gpus": {
            "selection": job.gpus or "all",
            "indices": [g.get("index") for g in gpus],
            "models": sorted({g.get("name") for g in gpus if g.get("name")}),
        },
        "started_at": job.started_at,
        "ended_at": end,
        "duration_s": duration,
        "gpu_peak_mem_mib": usage.get("gpu_peak_mem_mib"),
        "gpu_mean_util": usage.get("gpu_mean_util"),
        "cost": price * duration / 3600.0 if price is not None and duration is not None else None,
        **wasted(usage, price * duration / 3600.0 if price is not None and duration is not None else None),
        "gpu_faults": run_faults(usage),  # the driver's XIDs on its GPUs while it ran
        "energy_kwh": _kwh(usage.get("energy_j")),  # what its GPUs drew, from their power readings
        "thermal_slowdown_s": _seconds(usage.get("thermal_slowdown_s")),  # the driver slowed its GPUs for heat
        "currency": currency,
        "metrics": dict(insights.metrics) if insights else {},
        "hints": [h.to_json() for h in insights.hints] if insights else [],
    }

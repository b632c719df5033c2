"""Job ops: jobs.start, jobs.list, jobs.get, jobs.kill, jobs.group_check, queue.list, queue.move."""

import json
from typing import TYPE_CHECKING, Any, Dict, List

from .. import protocol as P
from ..jobs import group as job_group
from ..jobs import image as job_image
from ..jobs.queue import never_fits, parse_request
from ..jobs.store import JobError, checked_restart
from ..watchdog import daemon

if TYPE_CHECKING:
    from ..server import Agent


def start(agent: "Agent", a: P.StartArgs) -> P.JobRecord:
    """Start a job now, or with ``queue`` put it in the host's queue (remote_agent/jobs/queue.py)."""
    price = None if a.get("price_per_hour") is None else P.number_arg(a, "price_per_hour", 0.0, 0.0, 1e9)
    extra = {"gpu_inventory": agent.facts().get("gpus") or [], "price_per_hour": price}
    code = a.get("code")  # what code ran (gputui run --sync): tree hash, git commit and dirty flag
    if isinstance(code, dict) and len(P.encode(code)) <= 4096:
        extra["code"] = code
    arts = a.get("artifacts")  # what to bring back before release (gputui run --artifacts)
    if isinstance(arts, list) and all(isinstance(x, str) for x in arts) and len(json.dumps(arts)) <= 4096:
        extra["artifacts"] = arts
    if a.get("queue") is not None and a.get("slurm") is not None:
        raise JobError("a Slurm job waits in Slurm's queue, not the host's: drop --queue", "bad_args")
    if a.get("container") is not None:  # run in an image (remote_agent/jobs/image.py)
        if a.get("slurm") is not None:
            raise JobError("jobs in images on Slurm hosts are not supported yet: drop --image", "bad_args")
        try:
            asked = job_image.check_request(a.get("container"))
            extra["container"] = job_image.prepare(asked, a.get("gpus"), agent.jobs.state_dir)
        except job_image.ImageError as exc:
            raise JobError(str(exc), "bad_args") from None
    if a.get("group") is not None:  # one part of a job over several hosts (remote_agent/jobs/group.py)
        if a.get("queue") is not None or a.get("slurm") is not None:
            raise JobError("a part of a job over several hosts runs now: no queue, no Slurm", "bad_args")
        try:
            extra["group"] = job_group.check_request(a.get("group"))
        except job_group.GroupError as exc:
            raise JobError(str(exc), "bad_args") from None
    if a.get("queue") is not None:
        policy = checked_restart(a.get("restart"), False)
        if policy is not None:
            extra["restart"] = policy
        request = parse_request(a.get("queue"))
        never = never_fits(request, agent.facts().get("gpus") or [])
        if never:
            raise JobError(never, "bad_args")
        job_id = agent.queue.submit(request, a.get("argv"), a.get("cwd"), a.get("env"), a.get("name"), extra,
                                    agent.facts()["boot_id"], a.get("secrets"))
        daemon.ensure_running(agent.jobs.state_dir, agent.launcher)
        job = agent.mark(agent.jobs.describe(job_id))
    else:
        job = agent.jobs.start(a.get("argv"), a.get("cwd"), a.get("env"), a.get("name"), a.get("gpus"), extra,
                               a.get("slurm"), a.get("restart"), a.get("secrets"))
        if job.get("restart"):  # the watchdog decides its restarts, with the client gone
            daemon.ensure_running(agent.jobs.state_dir, agent.launcher)
    agent.emit(P.EV_JOB, job)
    return job


def group_check(agent: "Agent", a: P.GroupCheckArgs) -> P.GroupCheckResult:
    """Whether this host's part of a job over several hosts can run (jobs/group.py ``check_host``)."""
    return job_group.check_host(dict(a), len(agent.facts().get("gpus") or []))  # type: ignore[return-value]


def page(agent: "Agent", a: P.ListArgs) -> P.Raw:
    """One page of the job list (``after`` an id, at most ``limit`` jobs and LIST_PAGE_BYTES of records)."""
    listing = agent.jobs.page(
        P.int_arg(a, "after", 0), P.int_arg(a, "limit", P.LIST_PAGE_JOBS, 1, P.LIST_PAGE_JOBS), P.LIST_PAGE_BYTES
    )
    return agent.mark_page(listing)


def get(agent: "Agent", a: P.JobArgs) -> P.JobRecord:
    """One job's full record (a listing cuts long commands)."""
    return agent.mark(agent.jobs.full_record(str(a.get("job"))))


def kill(agent: "Agent", a: P.KillArgs) -> P.JobRecord:
    """Kill a running job; a queued one is removed from the queue (it never starts)."""
    job_id, grace = str(a.get("job")), P.number_arg(a, "grace_s", 10.0, 0.0, P.MAX_KILL_GRACE_S)
    job = agent.queue.remove(job_id, "removed from the queue before it started")
    if job is None and a.get("queued_only"):  # what was confirmed was a removal: never a kill of a running job
        state = agent.jobs.describe(job_id)["state"]
        more = ": it started meanwhile; kill it again to stop it" if state == P.JOB_RUNNING else ""
        raise JobError("job %s is no longer queued (%s), not killed%s" % (job_id, state, more), "bad_args")
    if job is None:  # not queued (any more): it runs, or it ended
        job = agent.jobs.kill(job_id, grace)
    agent.emit(P.EV_JOB, job)
    return job


def queue_list(agent: "Agent", a: Dict[str, Any]) -> P.QueueListResult:
    """The queued jobs in order, each with its position and what it waits for: as many as LIST_PAGE_BYTES of
    records hold (the first always), ``more`` counting the rest."""
    state = agent.queue.state()
    queued = agent.queue.marks(agent.queue.queued())
    jobs: List[Dict[str, Any]] = []
    size = 0
    for job in queued:
        size += len(P.encode(job))
        if jobs and size > P.LIST_PAGE_BYTES:
            break
        jobs.append(job)
    return {"jobs": jobs, "more": len(queued) - len(jobs), "resumed_at": state.get("resumed_at"),
            "scheduler_t": state.get("t")}


def queue_move(agent: "Agent", a: P.QueueMoveArgs) -> P.QueueListResult:
    agent.queue.move(str(a.get("job")), P.int_arg(a, "to", 1, 1, 1 << 30))
    listing = queue_list(agent, {})
    for job in listing["jobs"]:
        agent.emit(P.EV_JOB, job)  # positions changed: the app learns them live
    return listing


HANDLERS = {
    P.OP_JOBS_START: start, P.OP_JOBS_LIST: page, P.OP_JOBS_GET: get, P.OP_JOBS_KILL: kill,
    P.OP_QUEUE_LIST: queue_list, P.OP_QUEUE_MOVE: queue_move, P.OP_JOBS_GROUP_CHECK: group_check,
}

"""What changed between two snapshots of a host that deserves a notification (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gputui.core.session import model as M

from . import fmt

DEADLINE_WARN_S = 3600.0  # a release deadline is announced this long before
NAME_CHARS = 160  # a host's or job's name in a notice; the app shows the notice as plain text
ERROR_CHARS = 300


def _name(text: str) -> str:
    return fmt.clip(text, NAME_CHARS)


@dataclass(frozen=True)
class Notice:
    message: str
    severity: str = "information"  # "information", "warning" or "error" (Textual's notify severities)


def job_end_notice(host: str, job: M.Job) -> Notice:
    label = f"job {_name(job.id)} ({_name(fmt.job_name(job.name, job.command))}) on {_name(host)}"
    if job.state == M.JOB_SUCCEEDED:
        return Notice(f"{label} succeeded")
    if job.state == M.JOB_FAILED:
        return Notice(f"{label} failed (exit {job.exit_code})", "error")
    if job.state == M.JOB_KILLED:
        return Notice(f"{label} was killed (exit {job.exit_code})", "warning")
    return Notice(f"{label} was lost (its tmux session vanished)", "warning")


def diff(
    old: M.HostSnapshot | None, new: M.HostSnapshot, started: frozenset[str] = frozenset()
) -> list[Notice]:
    """Host drops/returns, jobs that ended, a host turning idle. ``started``: job ids this client started
    (their end is reported even when the job never showed up as running)."""
    if old is None:
        return []
    out: list[Notice] = []
    was, now = old.state, new.state
    name, error = _name(new.name), fmt.clip(new.error or "", ERROR_CHARS)
    if was != now:
        if now == M.CONNECTED and was in (M.RECONNECTING, M.ERROR):
            out.append(Notice(f"{name} is back"))
        elif now == M.RECONNECTING and was == M.CONNECTED:
            out.append(Notice(f"{name} dropped: {error or 'link lost'}; reconnecting", "warning"))
        elif now == M.ERROR:
            out.append(Notice(f"{name}: {error or 'error'}", "error"))
    look, looked = new.instance, old.instance
    if look is not None and look.state in ("preempted", "stopped", "terminated") and (looked is None or looked.state != look.state):
        what = {"preempted": "was preempted by its provider", "stopped": "is stopped", "terminated": "was terminated"}
        severity = "error" if look.state == "preempted" else "warning"
        out.append(Notice(f"{name} {what[look.state]}: {fmt.clip(look.detail, ERROR_CHARS)}", severity))
    before = {j.id: j for j in old.jobs}
    for job in new.jobs:
        prev = before.get(job.id)
        if job.state in M.JOB_ENDED_STATES and (
            (prev is not None and prev.running) or (prev is None and job.id in started)
        ):
            out.append(job_end_notice(new.name, job))
    oc, nc = old.cost, new.cost
    near = nc is not None and nc.deadline_in_s is not None and nc.deadline_in_s <= DEADLINE_WARN_S
    if near and (oc is None or oc.deadline_in_s is None or oc.deadline_in_s > DEADLINE_WARN_S):
        left = fmt.duration(nc.deadline_in_s)
        out.append(Notice(f"{name} will be released in {left} (its deadline); save your work", "warning"))
    paid = nc is not None and nc.price_per_hour is not None
    if paid and nc.idle and not (oc is not None and oc.idle) and now == M.CONNECTED:
        burn = fmt.money(nc.price_per_hour, nc.currency, per_hour=True)
        out.append(Notice(f"{name} is idle ({burn}); release it if you are done", "warning"))
    return out

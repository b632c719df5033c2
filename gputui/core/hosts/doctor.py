"""Doctor on the client side: the report types, the request, and the plain-text rendering (no UI imports).

The checks themselves run on the host (``remote_agent/host/doctor.py``, op ``doctor``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from remote_agent import protocol as P

if TYPE_CHECKING:
    from gputui.core.config.file import HostConfig
    from gputui.core.session.host import HostSession

OK, WARN, FAIL, SKIP = P.DOCTOR_OK, P.DOCTOR_WARN, P.DOCTOR_FAIL, P.DOCTOR_SKIP
STATUSES = P.DOCTOR_STATUSES
DEFAULT_TIMEOUT_S = 60.0
HOSTS_AT_ONCE = 8  # doctor over many hosts: at most this many probes (torch imports, disk scans) at a time


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    status: P.DoctorStatus
    detail: str = ""
    fix: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Check:
        """A check from the host, whatever it holds: an unknown status reads as a failure."""
        return cls(
            id=str(d.get("id", "?")),
            title=str(d.get("title", "")),
            status=next((s for s in STATUSES if s == d.get("status")), FAIL),
            detail=str(d.get("detail") or ""),
            fix=str(d.get("fix") or ""),
        )

    def to_json(self) -> dict[str, str]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class DoctorReport:
    """One host's checks, or the error that kept us from running them."""

    host: str
    checks: tuple[Check, ...] = ()
    error: str | None = None
    python: str | None = None  # the interpreter the torch probe ran (the jobs' python)
    state_dir: str | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_result(cls, host: str, result: dict[str, Any]) -> DoctorReport:
        checks = tuple(Check.from_json(c) for c in result.get("checks") or [])
        return cls(
            host=host,
            checks=checks,
            python=result.get("python"),
            state_dir=result.get("state_dir"),
            counts={s: sum(c.status == s for c in checks) for s in STATUSES},
        )

    @property
    def failed(self) -> bool:
        return self.error is not None or any(c.status == FAIL for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.host,
            "error": self.error,
            "python": self.python,
            "state_dir": self.state_dir,
            "summary": self.counts,
            "checks": [c.to_json() for c in self.checks],
        }


async def run_doctor(
    session: HostSession, python: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    host: HostConfig | None = None, urls: dict[str, str] | None = None,
) -> DoctorReport:
    """Ask the host's agent for its checks; the torch probe may take ``timeout_s``, the reply a bit more.
    With ``host``, the release check is one of them (``release_item``; ``urls``: the providers' API bases)."""
    report = DoctorReport.from_result(session.name, await session.doctor(timeout_s, python))
    if host is None:
        return report
    boot = boot_item(session, host)
    checks = (await release_item(session, host, urls or {}), *([boot] if boot else []), *report.checks)
    counts: dict[str, int] = {s: sum(c.status == s for c in checks) for s in STATUSES}
    return DoctorReport(report.host, checks, report.error, report.python, report.state_dir, counts)


async def release_item(session: HostSession, host: HostConfig, urls: dict[str, str]) -> Check:
    """The release check as a doctor check: would ``gputui release`` (and autostop, a deadline) stop the bill?
    Proved with no side effects (gputui.core.money.release.check_release). A host with no release asked for and none
    found is skipped; one whose autostop or deadline could not release it fails."""
    import time

    from gputui.core.money.release import check_release

    title = "release"
    try:
        verdict = await check_release(session, host, urls)
    except Exception as exc:  # noqa: BLE001 - a check that could not run is a failed check, said why
        return Check("release", title, FAIL, f"the release could not be checked: {exc}", "see gputui release HOST --check")
    wants = bool(host.autostop_minutes or host.release_at or host.release_after_hours)
    when = time.strftime("%H:%M:%S", time.localtime(verdict.checked_at))
    detail = f"{verdict.via}: {verdict.detail} (checked {when})"
    if verdict.ok:
        return Check("release", title, OK, detail)
    if verdict.via == "none" and not wants and not host.release and not host.release_remote:
        return Check("release", title, SKIP, "no release set and no RunPod or vast.ai instance found on the host "
                     "(set release or release_remote, or a provider, to let gputui stop the bill)")
    fix = ("fix the provider key or instance, or set release_remote / release" if verdict.via in ("runpod", "vastai", "lambda")
           else "install the command, or fix release / release_remote in the host's table")
    return Check("release", title, FAIL, detail + "; the host would NOT be released", fix)


def boot_item(session: HostSession, host: HostConfig) -> Check | None:
    """``resume_on_boot``, where set: is its ``@reboot`` line in the host's crontab (as this connect's arming
    found it)?"""
    if not host.resume_on_boot:
        return None
    said = session.autostart or {}
    if said.get("ok"):
        return Check("resume_on_boot", "resume on boot", OK, "an @reboot line in the host's crontab brings its work "
                     "back after a reboot")
    why = str(said.get("detail") or "the host's agent did not say (a build from before resume_on_boot)")
    return Check("resume_on_boot", "resume on boot", FAIL, why + ": a reboot would leave the host's work stopped",
                 "install cron on the host or fix what it says, or set resume_on_boot = false")


def format_report(report: DoctorReport) -> str:
    """Plain text: one line per check, the fix indented under each one that is not ok."""
    if report.error is not None:
        return f"{report.host}: not checked ({report.error})"
    c = report.counts
    head = f"{report.host}: {c.get(FAIL, 0)} fail, {c.get(WARN, 0)} warn, {c.get(OK, 0)} ok, {c.get(SKIP, 0)} skipped"
    lines = [head]
    width = max((len(ch.title) for ch in report.checks), default=0)
    for ch in report.checks:
        lines.append(f"  {ch.status.upper():<4}  {ch.title:<{width}}  {ch.detail}")
        if ch.fix and ch.status != OK:
            lines.append(f"  {'':<4}  {'':<{width}}  fix: {ch.fix}")
    return "\n".join(lines)

"""Releasing a host: run the configured commands, close its ledger interval, mark it released."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from . import model as M
from .config import HostConfig
from .cost import Ledger, idleness
from .errors import GputuiError
from .link import AgentError, LinkClosed
from .session import HostSession


class ReleaseError(GputuiError, RuntimeError):
    """The host was not released; the message says why and what to do."""


@dataclass
class Step:
    where: str  # "client" or "host"
    argv: tuple[str, ...]
    exit_code: int | None
    output: str


@dataclass(frozen=True)
class ReleaseRequest:
    """What the user (or a budget rule) asked to release, and which running jobs they agreed to lose."""

    host: str
    confirmed_jobs: frozenset[str] | None = None  # running jobs a confirmation named (None: it named none)
    force: bool = False  # the CLI's --force: release whatever runs
    idle_only: bool = False  # an automatic release: only a host idle with no running job, checked now


@dataclass
class ReleaseResult:
    host: str
    steps: list[Step] = field(default_factory=list)


async def run_client_command(argv: tuple[str, ...], timeout: float) -> Step:
    """Run ``argv`` here (no shell); a hang is killed after ``timeout`` and reported."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise ReleaseError(f"cannot run release command {argv[0]!r}: {exc.strerror or exc}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise ReleaseError(
            f"release command {argv[0]!r} did not finish within {timeout:.0f} s; killed it"
        ) from None
    return Step("client", argv, proc.returncode, out.decode("utf-8", "replace")[-4000:].strip())


def check_configured(host: HostConfig) -> None:
    """A ReleaseError saying how to set one up when the host has no release command (ask nothing before it)."""
    if not host.release and not host.release_remote:
        raise ReleaseError(
            f"no release command for {host.name}: set release (run here, e.g. a provider CLI) "
            "or release_remote (run on the host, e.g. sudo shutdown -h now) in its [hosts.NAME] table"
        )


async def release_host(
    session: HostSession, host: HostConfig, ledger: Ledger, request: ReleaseRequest
) -> ReleaseResult:
    """Check again, now, that the release is still what was asked; then run ``release_remote`` on the host
    and ``release`` here, close the host's ledger interval and mark it released.

    Refused: while a job runs that the request did not name (unless ``force``); for an ``idle_only`` release,
    while any job runs or the host is not idle under its idle rule.
    """
    check_configured(host)
    # a queued job is lost with the host too: it counts as a running one here (named, confirmed or refused)
    running = [j for j in await session.list_jobs() if j.running or j.state == M.JOB_QUEUED]
    if request.idle_only:
        if running:
            raise ReleaseError(f"{host.name} was not released automatically: {_named(running)} running")
        idle, _, reasons = idleness((await session.sample()).activity, host)
        if not idle:
            why = "; ".join(reasons[:3]) or f"idle for less than {host.idle_minutes:g} min"
            raise ReleaseError(f"{host.name} was not released automatically: it is not idle ({why})")
    unconfirmed = [j for j in running if j.id not in (request.confirmed_jobs or ())]
    if unconfirmed and not request.force:
        if request.confirmed_jobs is None:
            raise ReleaseError(
                f"{host.name} has running jobs: {_named(unconfirmed)}; kill them first or use --force"
            )
        raise ReleaseError(
            f"{host.name} was not released: jobs started after you confirmed: {_named(unconfirmed)}; "
            "look at them, then release again"
        )
    result = ReleaseResult(host.name)
    boot_id = session.snapshot.facts.get("boot_id")
    if host.release_remote:
        try:
            res = await session.exec(list(host.release_remote), host.release_timeout)
            step = Step(
                "host", host.release_remote, res["exit_code"], (res["stdout"] + res["stderr"]).strip()
            )
        except LinkClosed:  # a shutdown may take the link with it before the reply
            step = Step("host", host.release_remote, None, "the host closed the connection (shutting down)")
        except AgentError as exc:
            raise ReleaseError(f"release_remote on {host.name} failed: {exc}") from None
        result.steps.append(step)
        if step.exit_code not in (0, None):
            raise ReleaseError(
                f"release_remote on {host.name} exited {step.exit_code}: {step.output or 'no output'}"
            )
    if host.release:
        step = await run_client_command(host.release, host.release_timeout)
        result.steps.append(step)
        if step.exit_code != 0:
            raise ReleaseError(
                f"release command for {host.name} exited {step.exit_code}: {step.output or 'no output'}"
            )
    ledger.close(host.name, time.time(), boot_id=boot_id)
    ledger.save(force=True)
    return result


def _named(jobs: list[M.Job]) -> str:
    return ", ".join(f"{j.id} ({j.name[:30]})" for j in jobs)

"""Releasing a host from the app. ``r`` asks first, naming the jobs and the commands that the release ends or
runs; when the host or a job names artifacts changed since the last pull, the release dialog offers to pull them
first; a budget with ``on_exceed = "release-idle"`` releases idle hosts itself. The core checks again, at release
time, that the host is still what was asked (the jobs the confirmation named, or an idle host)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from gputui.core import safetext
from gputui.core.config.file import HostConfig
from gputui.core.files.artifacts import DEFAULT_DEST, Check, check, pull_artifacts
from gputui.core.money.release import ReleaseError, ReleaseRequest, ReleaseResult, release_host
from gputui.core.money.spend import idle_release_candidates
from gputui.core.session import model as M

from .. import fmt
from ..screens.release import PULL, RELEASE, ReleaseScreen
from . import NAME_CHARS, NOTIFY_S

if TYPE_CHECKING:
    from gputui.core.money.cost import Ledger
    from gputui.core.money.spend import BudgetAlert
    from gputui.core.session.host import HostSession

    from ..app import GpuTuiApp

# the call that runs a host's release (core.release.release_host); tests give the app one that records instead
ReleaseCall = Callable[["HostSession", HostConfig, "Ledger", ReleaseRequest], Awaitable[ReleaseResult]]


def not_configured(app: GpuTuiApp, host: str) -> None:
    app.notify(
        f"release is not configured for {host}: set release or release_remote in its [hosts.{host}] table",
        severity="warning",
        timeout=NOTIFY_S,
    )


def configured(app: GpuTuiApp, host: str) -> bool:
    """The host has a release command (here or on the host) and the fleet keeps a ledger to record it."""
    conf = app.config.hosts.get(host)
    return conf is not None and app.ledger is not None and bool(conf.release or conf.release_remote)


def ask(app: GpuTuiApp, host: str) -> None:
    """The release key on ``host``: confirm (naming what would be lost and what runs), then release."""
    if not configured(app, host):
        not_configured(app, host)  # before asking: there would be nothing to confirm
        return
    snap = app.hosts.get(host)
    running = [j for j in snap.jobs if j.running or j.state == M.JOB_QUEUED] if snap else []
    body = f"Release {safetext.clean(host, limit=NAME_CHARS)}?\n\nThe machine goes back to its provider and billing stops."
    if running:
        n = len(running)
        kind = "running or queued" if any(j.state == M.JOB_QUEUED for j in running) else "running"
        body += f" {n} {kind} job{'s' if n != 1 else ''} and everything on its disk will be lost: "
        body += safetext.clean(
            ", ".join(f"{j.id} ({fmt.job_name(j.name, j.command)})" for j in running[:5]),
            limit=2 * NAME_CHARS,
        )
        body += f" and {n - 5} more." if n > 5 else "."
    request = ReleaseRequest(host, confirmed_jobs=frozenset(j.id for j in running))
    conf = app.config.hosts.get(host)
    if conf is not None:
        for where, argv in (("on the host", conf.release_remote), ("here", conf.release)):
            if argv:
                body += f"\nRuns {where}: {safetext.clean(shlex.join(argv), limit=NAME_CHARS)}"

    def answered(yes: bool | None) -> None:
        if yes:
            app.run_worker(release(app, request), group="command")

    def ask_plain() -> None:
        app.confirm("Release host", body, "Release", answered)

    if not wants_artifact_check(conf, snap):
        ask_plain()
    else:  # artifacts first: which changed since the last pull (a request to the host)
        app.run_worker(ask_release(app, request, body, ask_plain), group="command")


# --- artifacts first ------------------------------------------------------------------------------------------
def wants_artifact_check(conf: HostConfig | None, snap: M.HostSnapshot | None) -> bool:
    """Whether the host or one of its jobs names artifacts (otherwise release asks as it always did)."""
    if conf is None:
        return False
    return bool(conf.artifacts) or any(j.record.get("artifacts") for j in (snap.jobs if snap else ()))


async def ask_release(
    app: GpuTuiApp, request: ReleaseRequest, body: str, ask_plain: Callable[[], None]
) -> None:
    """Look for artifacts changed since the last pull; none: the plain confirmation; else the release dialog
    that offers to pull them first."""
    host = request.host
    try:
        found = await check(app.session(host), app.config.hosts[host])
    except Exception as exc:  # e.g. the link is down: nothing is known safe
        found = Check(host, problems=[str(exc) or type(exc).__name__])
    if not found.at_risk:
        ask_plain()
        return

    def answered(choice: str | None) -> None:
        if choice == PULL:
            app.run_worker(pull_then_release(app, request, found), group="command")
        elif choice == RELEASE:
            app.run_worker(release(app, request), group="command")

    app.push_screen(ReleaseScreen(body, found, DEFAULT_DEST), answered)


async def pull_then_release(app: GpuTuiApp, request: ReleaseRequest, found: Check) -> None:
    """Pull the artifacts to ./gputui-artifacts/HOST/; release only when every one arrived."""
    host, n = request.host, len(found.unpulled)
    app.notify(f"pulling {n} artifact files from {host} before the release…", timeout=NOTIFY_S)
    try:
        outcomes = await pull_artifacts(app.session(host), found.unpulled, DEFAULT_DEST)
    except Exception as exc:
        app.notify(f"pulling the artifacts failed: {exc}", title="not released", severity="error",
                   timeout=2 * NOTIFY_S)
        return
    kept = [o for o in outcomes if o.status == "newer here"]
    if kept:
        app.notify(f"{kept[0].target} here is newer than the host's: move it away, then release again",
                   title="not released", severity="error", timeout=2 * NOTIFY_S)
        return
    app.notify(f"pulled {n} artifact files to {os.path.abspath(DEFAULT_DEST)}/{host}/", timeout=NOTIFY_S)
    await release(app, request)


# --- the release itself ---------------------------------------------------------------------------------------
def release_idle(app: GpuTuiApp, alerts: Sequence[BudgetAlert], released: set[str]) -> None:
    """A budget exceeded with ``on_exceed = "release-idle"``: release its idle hosts, each once (``released``
    holds those this app released so)."""
    for host in idle_release_candidates(list(app.hosts.values()), app.config, alerts):
        if host not in released:
            released.add(host)
            app.notify(f"budget exceeded: releasing idle host {host}", severity="warning", timeout=NOTIFY_S)
            app.run_worker(release(app, ReleaseRequest(host, idle_only=True)), group="command")


async def release(app: GpuTuiApp, request: ReleaseRequest) -> None:
    """Run a confirmed release; whatever goes wrong is said (an error), never swallowed."""
    try:
        await release_with_fleet(app, request)
    except Exception as exc:
        app.notify(f"release of {request.host} failed: {exc}", severity="error", timeout=NOTIFY_S)


def release_call(app: GpuTuiApp) -> ReleaseCall:
    """What runs a confirmed release on the host: the core's, unless the app was given another."""
    return app.release_call or release_host


async def release_with_fleet(app: GpuTuiApp, request: ReleaseRequest) -> None:
    """Run the host's configured release; the core checks again that it is still what was asked (the jobs the
    confirmation named, or an idle host for a budget release)."""
    host = request.host
    conf = app.config.hosts.get(host)
    ledger = app.ledger
    if conf is None or ledger is None or not configured(app, host):
        not_configured(app, host)
        return
    app.notify(f"releasing {host}…", timeout=NOTIFY_S)
    try:
        result = await release_call(app)(app.session(host), conf, ledger, request)
    except ReleaseError as exc:
        app.notify(str(exc), title="not released", severity="error", timeout=2 * NOTIFY_S)
        return
    steps = "; ".join(f"{shlex.join(s.argv)} -> exit {s.exit_code}" for s in result.steps)
    app.notify(f"{host} released ({steps})", timeout=2 * NOTIFY_S)

"""The app's carry actions: a job's tree synced before it starts, artifacts pulled before a release, and a
web URL a job printed forwarded here. Each talks to the core and answers with notifications (plain text)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gputui.core import model as M
from gputui.core.artifacts import DEFAULT_DEST, Check, check, pull_artifacts
from gputui.core.config import HostConfig
from gputui.core.forward import Forward, ForwardError, WebUrl, job_urls
from gputui.core.jobs import JobSpec
from gputui.core.release import ReleaseRequest

from .screens.release import PULL, RELEASE, ReleaseScreen

if TYPE_CHECKING:
    from .app import GpuTuiApp

NOTIFY_S = 8.0


# --- sync before a job starts ---------------------------------------------------------------------------------
async def sync_first(app: GpuTuiApp, spec: JobSpec) -> JobSpec | None:
    """Sync ``spec.sync`` to the host (into ``spec.cwd``, else ``~/gputui-work/NAME``); the spec to start, now
    running in the synced dir and recording its code; None (after saying why) when the sync failed."""
    from gputui.core.sync import sync

    assert spec.sync is not None
    app.notify(f"syncing {spec.sync} to {spec.host}…", timeout=NOTIFY_S)
    try:
        res = await sync(app.source.session(spec.host), spec.sync, spec.cwd)
        res.require_complete(spec.host)  # a file refused there: never start the job on stale code
    except Exception as exc:  # SyncError, a lost link, an unreadable local file: the job does not start
        app.notify(f"sync to {spec.host} failed, job not started: {exc}", severity="error", timeout=NOTIFY_S)
        return None
    notes = f"; {len(res.notes)} notes (first: {res.notes[0]})" if res.notes else ""
    app.notify(f"synced {res.sent} of {res.files} files to {spec.host}:{res.target}{notes}", timeout=NOTIFY_S)
    return replace(spec, cwd=res.target, code=res.code(), sync=None)


# --- release: artifacts first ---------------------------------------------------------------------------------
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
        found = await check(app.source.session(host), app.config.hosts[host])
    except Exception as exc:  # e.g. the link is down: nothing is known safe
        found = Check(host, problems=[str(exc) or type(exc).__name__])
    if not found.at_risk:
        ask_plain()
        return

    def answered(choice: str | None) -> None:
        if choice == PULL:
            app.run_worker(pull_then_release(app, request, found), group="command")
        elif choice == RELEASE:
            app.run_worker(app._release(request), group="command")

    app.push_screen(ReleaseScreen(body, found, DEFAULT_DEST), answered)


async def pull_then_release(app: GpuTuiApp, request: ReleaseRequest, found: Check) -> None:
    """Pull the artifacts to ./gputui-artifacts/HOST/; release only when every one arrived."""
    host, n = request.host, len(found.unpulled)
    app.notify(f"pulling {n} artifact files from {host} before the release…", timeout=NOTIFY_S)
    try:
        outcomes = await pull_artifacts(app.source.session(host), found.unpulled, DEFAULT_DEST)
    except Exception as exc:
        app.notify(f"pulling the artifacts failed: {exc}", title="not released", severity="error",
                   timeout=2 * NOTIFY_S)  # fmt: skip
        return
    kept = [o for o in outcomes if o.status == "newer here"]
    if kept:
        app.notify(f"{kept[0].target} here is newer than the host's: move it away, then release again",
                   title="not released", severity="error", timeout=2 * NOTIFY_S)  # fmt: skip
        return
    app.notify(f"pulled {n} artifact files to {os.path.abspath(DEFAULT_DEST)}/{host}/", timeout=NOTIFY_S)
    await app._release(request)


# --- a job's web URL, forwarded -------------------------------------------------------------------------------
class Forwards:
    """The app's open forwards, one per (host, remote port), kept until the app ends."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], Forward] = {}

    async def close(self) -> None:
        for fwd in self.open.values():
            await fwd.close()
        self.open.clear()


def log_lines_newest_first(app: GpuTuiApp, job: M.Job) -> list[str]:
    stream = app.stream
    if stream is None or stream.key != (job.host, job.id):
        return []
    buf = stream.buffer
    return [buf.partial, *reversed(buf.lines)]


async def forward_url(app: GpuTuiApp, job: M.Job, forwards: Forwards) -> None:
    """Forward the newest local web URL the job printed; show (and copy) the URL here, token kept."""
    urls = job_urls(log_lines_newest_first(app, job))
    if not urls:
        app.notify(f"job {job.id} printed no local web URL (like http://localhost:6006/) in its log",
                   timeout=NOTIFY_S)  # fmt: skip
        return
    url: WebUrl = urls[0]
    conf = app.config.hosts.get(job.host)
    if conf is not None and conf.transport == "local":
        _show(app, url.here(url.port), f"job {job.id} runs on this machine: no forward needed")
        return
    fwd = forwards.open.get((job.host, url.port))
    if fwd is None:
        try:
            fwd = Forward(app.source.session(job.host), url.port, 0, on_error=_warn(app))
            await fwd.start()
        except ForwardError as exc:
            app.notify(f"cannot forward port {url.port}: {exc}", severity="error", timeout=NOTIFY_S)
            return
        forwards.open[(job.host, url.port)] = fwd
    _show(app, url.here(fwd.local_port), f"forwarded to {job.host} port {url.port} until gputui quits")


def _warn(app: GpuTuiApp) -> Callable[[str], Any]:
    return lambda message: app.notify(message, severity="warning", timeout=NOTIFY_S)


def _show(app: GpuTuiApp, link: str, how: str) -> None:
    app.copy_to_clipboard(link)
    app.notify(f"{link}\n{how} (copied)", title="open in a browser", timeout=4 * NOTIFY_S)

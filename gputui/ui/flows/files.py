"""Carrying files from the app: a job's tree synced before it starts, and a web URL a job printed forwarded
here. Each talks to the core and answers with notifications (plain text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gputui.core.files.forward import Forward, ForwardError, WebUrl, job_urls
from gputui.core.jobs.usecases import JobSpec
from gputui.core.session import model as M

from . import NOTIFY_S

if TYPE_CHECKING:
    from ..app import GpuTuiApp


# --- sync before a job starts ---------------------------------------------------------------------------------
async def sync_first(app: GpuTuiApp, spec: JobSpec) -> JobSpec | None:
    """Sync ``spec.sync`` to the host (into ``spec.cwd``, else ``~/gputui-work/NAME``); the spec to start, now
    running in the synced dir and recording its code; None (after saying why) when the sync failed."""
    from gputui.core.files.sync import sync

    assert spec.sync is not None
    app.notify(f"syncing {spec.sync} to {spec.host}…", timeout=NOTIFY_S)
    try:
        res = await sync(app.session(spec.host), spec.sync, spec.cwd)
        res.require_complete(spec.host)  # a file refused there: never start the job on stale code
    except Exception as exc:  # SyncError, a lost link, an unreadable local file: the job does not start
        app.notify(f"sync to {spec.host} failed, job not started: {exc}", severity="error", timeout=NOTIFY_S)
        return None
    notes = f"; {len(res.notes)} notes (first: {res.notes[0]})" if res.notes else ""
    app.notify(f"synced {res.sent} of {res.files} files to {spec.host}:{res.target}{notes}", timeout=NOTIFY_S)
    return replace(spec, cwd=res.target, code=res.code(), sync=None)


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
    """The lines of ``job``'s log the app holds (when it is the open log), the newest first."""
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
                   timeout=NOTIFY_S)
        return
    url: WebUrl = urls[0]
    conf = app.config.hosts.get(job.host)
    if conf is not None and conf.transport == "local":
        _show(app, url.here(url.port), f"job {job.id} runs on this machine: no forward needed")
        return
    fwd = forwards.open.get((job.host, url.port))
    if fwd is None:
        try:
            fwd = Forward(app.session(job.host), url.port, 0, on_error=_warn(app))
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

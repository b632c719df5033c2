"""The gputui app: the fleet, the selected host, its jobs and the selected job's log on one screen.

Data flows one way. The core publishes frozen HostSnapshots through ``on_change``; the app keeps only
the newest per host (coalescing) and applies them, with queued log output, in one batch at most
``FLUSH_S`` apart (never later: a pending repaint timer is moved earlier; a change of a host's state comes at
once). A change of state or jobs is drawn at once; metrics alone are drawn once per ``FLEET_EVERY_S``, the fleet
and the selected host in the same frame. Commands (start, kill, follow, release, attach) run as workers; widgets
never do I/O.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.theme import Theme
from textual.timer import Timer
from textual.widgets import DataTable, Footer

from gputui.core import safetext
from gputui.core.config import file as cfg
from gputui.core.money import autostop
from gputui.core.money.spend import fleet_spend
from gputui.core.session import model as M

from . import fmt
from . import themes as theme_files
from .attach import Runner, attach_argv, run_in_terminal
from .flows import NAME_CHARS, NOTIFY_S
from .keys import APP_BINDINGS, APP_KEYS, help_sections, key_label
from .logstream import LogStream
from .palette import Palette
from .source import (
    CONFIG_POLL_S,
    ConfigWatch,
    FleetSource,
    LocalFirst,
    Reconfigurable,
    SourceFactory,
    fleet_factory,
)
from .widgets.fleet import FleetTable, fleet_summary, host_row
from .widgets.host import GpuGrid, JobsTable, ProcsTable, host_info
from .widgets.log import LogPane, LogView
from .widgets.textbox import TextBox, set_class

if TYPE_CHECKING:  # what only actions, dialogs or the first log need loads then, not before the first frame
    from gputui.core.insights import Hint, JobInsights
    from gputui.core.jobs.usecases import JobSpec
    from gputui.core.money.cost import Ledger
    from gputui.core.session.host import HostSession

    from .flows.files import Forwards  # the flows (sync, artifacts, forwards: asyncssh) load when first used
    from .flows.instance import StartCall
    from .flows.release import ReleaseCall

FLUSH_S = 0.25  # snapshots and log output reach the screen at most this often
FLEET_EVERY_S = 1.0  # the fleet table repaints metrics at most this often (state changes at once)
JOB_SELECT_DELAY_S = 0.15  # a job's log opens once the cursor rests on it this long
KILL_GRACE_S = 10.0
NOTIFY_CHARS = 600  # a notification shows at most this much of a message (a host may send megabytes)


class GpuTuiApp(App[None]):
    """The fleet, the selected host and the selected job's log; see ``?`` for the keys."""

    CSS_PATH = "gputui.tcss"
    TITLE = "gputui"
    BINDINGS = [*APP_BINDINGS]  # gputui/ui/keys.py: every key, with the help's rows

    def __init__(
        self,
        config: cfg.Config | None = None,
        *,
        source_factory: SourceFactory | None = None,
        clock: Callable[[], float] = time.time,
        attach_runner: Runner = run_in_terminal,
        release_call: ReleaseCall | None = None,
        start_call: StartCall | None = None,
        state_path: Path | None = None,
        theme_dirs: Iterable[Path] | None = None,
        kill_grace_s: float = KILL_GRACE_S,
        log_max_lines: int = 5000,
        seeds: Iterable[Any] = (),
    ) -> None:
        super().__init__()
        self.config = config if config is not None else cfg.Config(path=None, hosts={})
        self.clock = clock
        self.attach_runner = attach_runner
        self.release_call = release_call  # None: the core's (flows.release.release_call)
        self.start_call = start_call  # None: the core's (gputui.core.money.lifecycle.start)
        self.kill_grace_s, self.log_max_lines = kill_grace_s, log_max_lines
        self.source: FleetSource = (source_factory or fleet_factory(self.config))(self._on_snapshot)
        self.hosts: dict[str, M.HostSnapshot] = {s.name: s for s in self.source.snapshots()}
        self._seeded = self._seed(seeds)
        self.host_order: list[str] = list(self.hosts)
        self.selected_host: str | None = self.host_order[0] if self.host_order else None
        self.selected_job: str | None = None
        self.stream: LogStream | None = None
        self.palette = Palette()
        self._pending: dict[str, M.HostSnapshot] = {}
        self._flush_timer: Timer | None = None
        self._flush_at = 0.0  # when the pending flush timer fires (monotonic)
        self._job_timer: Timer | None = None
        self._last_flush = 0.0
        self._started: set[tuple[str, str]] = set()
        self._draft: tuple[JobSpec, str] | None = None  # the new job that could not start, and why
        self._stream_lost = False
        self._shutting_down = False
        self._keys_sig: tuple[object, ...] = ()
        self._fleet_dirty, self._last_fleet = False, 0.0
        self._host_dirty = False  # the selected host's metrics moved: drawn with the next fleet repaint
        self._budget_seen: set[tuple[str, str]] = set()
        self._auto_released: set[str] = set()
        self._rows: dict[str, tuple[object, ...]] = {}
        self._state_path = state_path or theme_files.state_path()
        self._ui_state = theme_files.UiState.load(self._state_path)
        self._theme_errors = self._load_themes(theme_dirs)
        self._forwards: Forwards | None = None
        self._watch = ConfigWatch(self.config.path) if self.config.path is not None else None
        self._polling = False

    @property
    def forwards(self) -> Forwards:
        """The web URLs forwarded here, kept until the app ends."""
        if self._forwards is None:
            from .flows.files import Forwards

            self._forwards = Forwards()
        return self._forwards

    # --- what the flows use (gputui/ui/flows/) ----------------------------------------------------------------
    def session(self, host: str) -> HostSession:
        """The session of ``host`` (connecting it if need be)."""
        return self.source.session(host)

    @property
    def ledger(self) -> Ledger | None:
        """The fleet's ledger of rented time (None when the source keeps none: nothing can be released)."""
        return getattr(self.source, "ledger", None)

    def confirm(self, title: str, body: str, verb: str, answered: Callable[[bool | None], None]) -> None:
        """Ask before a kill, a removal or a release (``y``/``n``); ``answered`` gets the answer."""
        from .screens.confirm import ConfirmScreen

        self.push_screen(ConfirmScreen(title, body, verb), answered)

    def notify(  # type: ignore[override]
        self,
        message: str,
        *,
        title: str = "",
        severity: Any = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Every notification is plain text: host names, job names and errors are data, never markup, and
        their control characters are shown escaped (``markup`` is accepted and ignored)."""
        super().notify(
            safetext.clean(message, multiline=True, limit=NOTIFY_CHARS),
            title=safetext.clean(title, limit=NAME_CHARS),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    # --- themes -----------------------------------------------------------------------------------------------
    def _load_themes(self, dirs: Iterable[Path] | None) -> list[str]:
        found, errors = theme_files.load_themes(*(dirs or ()))
        for theme in found:
            self.register_theme(theme)
        self._start_theme(theme_files.pick_theme(self.config.theme, self._ui_state, set(self.available_themes)))
        self.palette = Palette.from_theme(self.current_theme)
        if self.config.theme is not None and self.config.theme not in self.available_themes:  # a typo: say so
            known = ", ".join(sorted(n for n in self.available_themes if n.startswith("gputui-")))
            errors.append(f"the config's theme = {self.config.theme!r} is no theme here (gputui's: {known}; "
                          "more in ~/.config/gputui/themes/)")
        return errors

    def _start_theme(self, name: str) -> None:
        """Set the theme the app starts in. ``self.theme = name`` runs Textual's theme watcher, which parses
        every stylesheet again and restyles every widget before the first frame (~6 ms); before the app runs
        nothing is parsed yet, so the theme's variables, classes and ANSI colours are all it takes
        (``test_start_theme_is_the_watchers`` holds this to what the watcher does)."""
        self.set_reactive(GpuTuiApp.theme, name)
        dark = self.current_theme.dark
        self.stylesheet.set_variables(self.get_css_variables())
        self.set_class(True, f"-theme-{name}", update=False)
        self.set_class(dark, "-dark-mode", update=False)
        self.set_class(not dark, "-light-mode", update=False)
        self._refresh_truecolor_filter(self.ansi_theme)

    def _on_theme_changed(self, theme: Theme) -> None:
        self.palette = Palette.from_theme(theme)
        self.query_one(LogView).palette = self.palette
        self._rows.clear()
        self._render_all()
        if theme.name != self._ui_state.theme:
            self._ui_state = theme_files.UiState(theme=theme.name, config_theme=self.config.theme)
            self._ui_state.save(self._state_path)

    # --- layout -----------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield TextBox(id="summary")
        yield FleetTable(id="hosts")
        with Vertical(id="host-pane", classes="-stale" if self._host_stale() else ""):  # no restyle at mount
            yield TextBox(id="host-info")
            yield GpuGrid(id="gpus")
            with Horizontal(id="lists"):
                yield JobsTable(id="jobs")
                yield ProcsTable(id="procs")
        yield LogPane(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#hosts").border_title = "Hosts"
        self.query_one("#jobs").border_title = "Jobs"
        self.query_one("#procs").border_title = "GPU processes"
        self.query_one("#log").border_title = "Log"
        self.query_one(LogView).palette = self.palette
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        for error in self._theme_errors:
            self.notify(error, title="theme not loaded", severity="warning", timeout=NOTIFY_S)
        self._render_all()
        self.query_one(FleetTable).focus()
        # The local hosts' links start now (their agents started with the app: gputui.appstart), so that the
        # agent's hello is read while the first frame is drawn; the rest once the first frame is out (the SSH
        # stack loads in a thread then, which would share the CPU with the first frame).
        if isinstance(self.source, LocalFirst) and not self._locals_seeded():
            self.source.start_local()
        self.call_after_refresh(self.source.run_in_background)
        if self._watch is not None and isinstance(self.source, Reconfigurable):
            self._poll_soon()
            self.set_interval(CONFIG_POLL_S, self._poll_soon, name="config")

    def on_ready(self) -> None:
        """The first frame is out. When the launch paused garbage collection for the start-up
        (:func:`gputui.appstart.run_app`), what the start-up built is frozen, so later collections skip it,
        and collection resumes."""
        if not gc.isenabled():
            gc.freeze()
            gc.enable()

    async def on_unmount(self) -> None:
        self._shutting_down = True
        if self._forwards is not None:
            await self._forwards.close()
        await self.source.close()

    # --- the config, edited while the app runs -----------------------------------------------------------------
    def _poll_soon(self) -> None:
        """A look at the config unless one is under way (never cancelled halfway: a change is never lost)."""
        if not self._polling:
            self._polling = True
            self.run_worker(self._poll_config(), group="config")

    async def _poll_config(self) -> None:
        """Look at the config file (in a thread); a change that parses is applied, a broken one is shown."""
        assert self._watch is not None
        try:
            await self._apply_config_change(await asyncio.to_thread(self._watch.poll))
        finally:
            self._polling = False

    async def _apply_config_change(self, found: cfg.Config | Exception | None) -> None:
        if found is None or self._shutting_down:
            return
        if isinstance(found, Exception):
            self.notify(f"config not reloaded: {found}", title="config", severity="error", timeout=2 * NOTIFY_S)
            return
        await self.use_config(found)

    async def use_config(self, config: cfg.Config) -> None:
        """Follow a new config: its hosts join the fleet, hosts no longer in it leave (nothing on them is
        touched: only the link closes)."""
        if not isinstance(self.source, Reconfigurable):
            return
        added, removed = await self.source.reconfigure(config)
        self.config = config
        for name in removed:
            self.hosts.pop(name, None)
            self._seeded.discard(name)  # a host restarted with new settings: its own link from now on
            self._pending.pop(name, None)
            self._rows.pop(name, None)
            if name not in config.hosts and name in self.host_order:
                self.host_order.remove(name)
            if self.stream is not None and self.stream.job.host == name:
                self._close_log()
        fresh = {s.name: s for s in self.source.snapshots() if s.name in added}
        for name in added:
            if name in fresh:
                self.hosts[name] = fresh[name]
                if name not in self.host_order:
                    self.host_order.append(name)
        if self.selected_host not in self.hosts:
            self.selected_host, self.selected_job = (self.host_order[0] if self.host_order else None), None
        self._render_all()
        self._refresh_keys()
        said = [f"added {', '.join(n for n in added if n not in removed)}" if set(added) - set(removed) else "",
                f"removed {', '.join(n for n in removed if n not in added)}" if set(removed) - set(added) else "",
                f"reconnecting {', '.join(n for n in added if n in removed)}" if set(added) & set(removed) else ""]
        if any(said):
            self.notify("config reloaded: " + "; ".join(x for x in said if x), title="config", timeout=NOTIFY_S)

    # --- the snapshot path ------------------------------------------------------------------------------------
    def _seed(self, seeds: Iterable[Any]) -> set[str]:
        """Show the connected hosts of a running session service (``seeds``: its ``status --json`` hosts) until
        the app's own link to each is up: the first frame has their GPUs and jobs instead of ``connecting``."""
        seeded = set()
        for raw in seeds:
            snap = M.HostSnapshot.from_status_json(raw, self.clock())
            if snap is not None and snap.name in self.hosts and self.hosts[snap.name].state != M.CONNECTED:
                self.hosts[snap.name] = snap
                seeded.add(snap.name)
        return seeded

    def _locals_seeded(self) -> bool:
        """Whether the first frame shows every local host as the session service has it (their links then
        start with the others, after it)."""
        local = [n for n, h in self.config.hosts.items() if h.transport == "local"]
        return bool(local) and all(n in self._seeded for n in local)

    def _on_snapshot(self, snap: M.HostSnapshot) -> None:
        """Called by the core for every change; a newer snapshot replaces an unapplied older one. A change of
        state (up, down, reconnecting) is applied at once, without waiting out ``FLUSH_S``. A host shown as the
        session service had it stays so until the app's own link to it has its jobs and readings (or fails)."""
        if self._shutting_down:
            return
        if snap.name in self._seeded:
            if snap.state == M.CONNECTING or (snap.state == M.CONNECTED and snap.metrics is None):
                return  # the app's own link is not all there yet (its jobs and readings come after its hello)
            self._seeded.discard(snap.name)
        last = self._pending.get(snap.name) or self.hosts.get(snap.name)
        self._pending[snap.name] = snap
        if last is None or last.state != snap.state:
            self._flush_by(time.monotonic())
        else:
            self._wake()

    def _wake(self) -> None:
        """A flush at most ``FLUSH_S`` after the last one."""
        self._flush_by(max(time.monotonic() + 0.01, self._last_flush + FLUSH_S))

    def _flush_by(self, due: float) -> None:
        """Make sure a flush runs by ``due`` (monotonic): a pending timer that fires later is moved earlier."""
        if self._shutting_down or self._exit or not self.is_running:
            return
        if self._flush_timer is not None:
            if self._flush_at <= due:
                return
            self._flush_timer.stop()
        self._flush_at = due
        self._flush_timer = self.set_timer(
            max(0.01, due - time.monotonic()), self._apply_snapshots, name="flush"
        )

    def _apply_snapshots(self) -> None:
        """Apply pending snapshots and log output in one batch."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self._flush_timer = None
        if self._shutting_down or self._exit or not self.is_running:  # tearing down: widgets may be gone
            return
        self._last_flush = time.monotonic()
        snaps, self._pending = self._pending, {}
        with self.batch_update():
            if snaps:
                self._apply(snaps)
            if self._fleet_dirty and time.monotonic() - self._last_fleet >= FLEET_EVERY_S:
                self._render_metrics()
            stream = self.stream
            drained = stream is not None and stream.drain()
            if drained:
                self.query_one(LogView).sync()
            if stream is not None and (drained or snaps):
                self._render_log_info()
                if stream.job.host == self.selected_host and not snaps:  # progress/ETA cells of its row
                    self._render_jobs()
                if stream.ended is not None and not stream.end_seen:
                    stream.end_seen = True
                    self._check_ended(stream)
        if self._fleet_dirty:
            self._flush_by(self._last_fleet + FLEET_EVERY_S)

    def _check_ended(self, stream: LogStream) -> None:
        """The log ended: if the job list still says running, ask the host for the jobs again."""
        snap = self.hosts.get(stream.job.host)
        job = next((j for j in snap.jobs if j.id == stream.job.id), None) if snap else None
        if job is not None and job.running:
            self.run_worker(self._refresh_jobs(stream.job.host), group="command")

    async def _refresh_jobs(self, host: str) -> None:
        try:
            await self.source.session(host).list_jobs()
        except Exception:  # reconnecting: the next connect lists the jobs anyway
            pass

    def _apply(self, snaps: dict[str, M.HostSnapshot]) -> None:
        started = frozenset(i for h, i in self._started)
        urgent = False
        for name, snap in snaps.items():
            old = self.hosts.get(name)
            urgent = urgent or old is None or old.state != snap.state or old.jobs != snap.jobs
            self.hosts[name] = snap
            self._rows[name] = host_row(snap, self.palette)  # built now, not all hosts at the repaint
            if name not in self.host_order:
                self.host_order.append(name)
            if old is not None and not self._shutting_down:
                from . import notices

                for n in notices.diff(
                    old, snap, started if any(h == name for h, _ in self._started) else frozenset()
                ):
                    self.notify(n.message, severity=n.severity, timeout=NOTIFY_S)  # type: ignore[arg-type]
            self._mark_stream(old, snap)
        if self.selected_host is None and self.host_order:
            self.selected_host = self.host_order[0]
        self._fleet_dirty = True
        if self.selected_host in snaps:
            self._host_dirty = True
        if urgent:  # a change of state or jobs: drawn now; metrics alone wait for the once-a-second repaint
            self._render_metrics()
        self._check_budget()
        self._refresh_keys()

    def _check_budget(self) -> None:
        """Notify once per budget alert (warn, then exceeded) as the fleet's spending crosses it."""
        alerts = fleet_spend(list(self.hosts.values()), self.config).alerts
        for alert in alerts:
            if (alert.period, alert.level) not in self._budget_seen:
                level = "error" if alert.level == "exceeded" else "warning"
                self.notify(alert.message, title="budget", severity=level, timeout=2 * NOTIFY_S)
        self._budget_seen = {(a.period, a.level) for a in alerts}
        if alerts:  # on_exceed = "release-idle": the release flow loads with the first alert
            from .flows import release

            release.release_idle(self, alerts, self._auto_released)

    def _mark_stream(self, old: M.HostSnapshot | None, new: M.HostSnapshot) -> None:
        """Markers in the open log when its host drops and comes back (the core resumes the follow)."""
        stream = self.stream
        if stream is None or stream.job.host != new.name or old is None:
            return
        if old.state == M.CONNECTED and new.state != M.CONNECTED and not self._stream_lost:
            self._stream_lost = True
            at = f"; will resume at byte {stream.cursor}" if stream.cursor is not None else ""
            stream.mark(f"connection lost ({new.error or new.state}){at}")
        elif new.state == M.CONNECTED and self._stream_lost:
            self._stream_lost = False
            stream.mark("reconnected; output resumes where it stopped")

    # --- rendering --------------------------------------------------------------------------------------------
    def _render_all(self) -> None:
        with self.batch_update():
            self._render_fleet()
            self._render_host()
            self._render_log_info()

    def _render_metrics(self) -> None:
        """The fleet, and the selected host if its snapshot moved: one frame."""
        self._render_fleet()
        if self._host_dirty:
            self._render_host()

    def _render_fleet(self) -> None:
        self._fleet_dirty, self._last_fleet = False, time.monotonic()
        pal = self.palette
        snaps = [self.hosts[n] for n in self.host_order]
        self.query_one("#summary", TextBox).show(fleet_summary(snaps, fleet_spend(snaps, self.config), pal))
        rows = []
        for snap in snaps:
            cells = self._rows.get(snap.name)
            if cells is None:
                cells = self._rows[snap.name] = host_row(snap, pal)
            rows.append((snap.name, cells))
        self.query_one(FleetTable).show(rows)

    def _render_host(self) -> None:
        self._host_dirty = False
        snap = self.hosts.get(self.selected_host or "")
        pal = self.palette
        self.query_one("#host-info", TextBox).show(host_info(snap, pal) if snap else "")
        set_class(self.query_one("#host-pane"), self._host_stale(), "-stale")
        self.query_one(GpuGrid).show(snap, pal)
        jobs = self._render_jobs()
        self.query_one(ProcsTable).show(snap, pal)
        if self.selected_job is None or (snap and self.selected_job not in {j.id for j in snap.jobs}):
            self._select_job(jobs.cursor_key)

    def _host_stale(self) -> bool:
        """The selected host's data is its last known, not live (it is not connected)."""
        snap = self.hosts.get(self.selected_host or "")
        return snap is not None and snap.state != M.CONNECTED

    def _render_jobs(self) -> JobsTable:
        jobs = self.query_one(JobsTable)
        jobs.show(self.hosts.get(self.selected_host or ""), self._insights_for, self.clock(), self.palette)
        return jobs

    def _insights_for(self, job: M.Job) -> JobInsights | None:
        stream = self.stream
        if stream is not None and stream.key == (job.host, job.id):
            return stream.snapshot()
        return job.insights

    def current_job(self) -> M.Job | None:
        snap = self.hosts.get(self.selected_host or "")
        if snap is None or self.selected_job is None:
            return None
        return next((j for j in snap.jobs if j.id == self.selected_job), None)

    def _render_log_info(self) -> None:
        pane = self.query_one(LogPane)
        stream = self.stream
        job = self.current_job()
        if stream is not None and job is not None and stream.key != (job.host, job.id):
            job = None
        if stream is not None and job is None:
            job = stream.job
        ins = self._insights_for(job) if job is not None else None
        pane.show_info(job, ins, self._hints(job, ins), self.palette)

    def _hints(self, job: M.Job | None, ins: JobInsights | None) -> list[Hint]:
        if job is None:
            return []
        from gputui.core.insights import job_hints

        return job_hints(job, ins, self.hosts.get(job.host))

    # --- selection --------------------------------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        if isinstance(event.data_table, FleetTable) and key:
            self.select_host(key)
        elif isinstance(event.data_table, JobsTable) and key:
            if self._job_timer is not None:
                self._job_timer.stop()
                self._job_timer = None
            if key != self.selected_job:
                self._job_timer = self.set_timer(JOB_SELECT_DELAY_S, lambda: self._select_job(key))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, FleetTable):
            self.query_one(JobsTable).focus()
        elif isinstance(event.data_table, JobsTable):
            self._select_job(event.row_key.value)
            self.action_toggle_log()

    def select_host(self, name: str) -> None:
        if name == self.selected_host or name not in self.hosts:
            return
        self.selected_host = name
        self.selected_job = None
        with self.batch_update():
            self._render_host()
            self._render_log_info()
        self._refresh_keys()

    def _select_job(self, job_id: str | None) -> None:
        if len(self.query(LogPane)) == 0:  # a selection timer that fires while the app closes: its panes are gone
            return
        self.selected_job = job_id
        job = self.current_job()
        if job is not None:
            self._open_log(job)
        else:
            self._close_log()
        self._refresh_keys()

    def _close_log(self) -> None:
        if self.stream is not None:
            self.run_worker(self.stream.stop(), group="log-stop")
            self.stream = None
            self.query_one(LogView).show_buffer(None)
        self._render_log_info()

    def select_job(self, host: str, job_id: str) -> None:
        """Make ``job_id`` on ``host`` the selected job (applying pending snapshots first)."""
        if self._pending:
            self._apply_snapshots()
        self.query_one(FleetTable).select_key(host)
        self.select_host(host)
        self.query_one(JobsTable).select_key(job_id)
        self._select_job(job_id)

    def _open_log(self, job: M.Job) -> None:
        if self.stream is not None and self.stream.key == (job.host, job.id):
            return
        old = self.stream
        if old is not None:
            self.run_worker(old.stop(), group="log-stop")
        stream = LogStream(self.source.session(job.host), job, self.log_max_lines, wake=self._wake)
        self.stream, self._stream_lost = stream, False
        self.query_one(LogView).show_buffer(stream.buffer)
        self._render_log_info()
        self.run_worker(stream.start(), group="log", exclusive=False)

    # --- events from the log pane ------------------------------------------------------------------------------
    def on_log_view_state_changed(self, _event: LogView.StateChanged) -> None:
        self._render_log_info()

    def on_log_view_search_requested(self, _event: LogView.SearchRequested) -> None:
        self.action_search()

    # --- actions ----------------------------------------------------------------------------------------------
    def _refresh_keys(self) -> None:
        """Footer and palette follow what is possible now; recomputed only when that changed."""
        job = self.current_job()
        sig = (
            bool(self.host_order),
            self.selected_host,
            job is not None and job.running,
            self.stream is not None,
        )
        if sig != self._keys_sig:
            self._keys_sig = sig
            self.refresh_bindings()

    def _can_suspend(self) -> bool:
        return self._driver is not None and self._driver.can_suspend

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Keys that cannot act now still run, so that the action can say why (a silent key looks broken).
        if action == "attach":
            return self._can_suspend()
        if action in ("snooze_autostop", "cancel_autostop"):  # offered only while an autostop is armed
            snap = self.hosts.get(self.selected_host or "")
            return snap is not None and snap.cost is not None and snap.cost.autostop_in_s is not None
        return True

    def action_focus_pane(self, pane_id: str) -> None:
        self.query_one(f"#{pane_id}").focus()

    def action_help(self) -> None:
        from .screens.help import HelpScreen

        self.push_screen(HelpScreen(help_sections()))

    @property
    def log_full(self) -> bool:
        return not self.query_one(FleetTable).display

    def action_toggle_log(self) -> None:
        """Full-screen log on/off (display flips on three panes: cheaper than restyling the app)."""
        full = not self.log_full
        for pane in ("#summary", "#hosts", "#host-pane"):
            self.query_one(pane).display = not full
        if full:
            self.query_one(LogView).focus()

    def action_search(self) -> None:
        if self.stream is None:
            self.notify("open a job's log first (pick a job in the jobs table)", timeout=NOTIFY_S)
            return
        self.query_one(LogPane).open_search()

    def _no_host(self) -> bool:
        """True (after saying so) when there is no host to act on."""
        if self.selected_host is None:
            self.notify("no hosts: add a [hosts.NAME] table to the config", timeout=NOTIFY_S)
            return True
        return False

    def action_add_host(self) -> None:
        """The ``+`` dialog; the host saved joins the fleet at once (the config watcher then sees no change)."""
        from .screens.add_host import AddHostScreen

        path = self.config.path or cfg.resolve_path(None)[0]
        assert path is not None

        def saved(config: cfg.Config | None) -> None:
            if config is not None:
                if self._watch is None and config.path is not None:
                    self._watch = ConfigWatch(config.path)
                self.run_worker(self.use_config(config), group="config")

        self.push_screen(AddHostScreen(path), saved)

    def action_new_job(self) -> None:
        if self._no_host():
            return
        from .screens.new_job import NewJobScreen  # dialogs and reports load when first opened

        local = frozenset(n for n, h in self.config.hosts.items() if h.transport == "local")
        draft, self._draft = self._draft, None  # a job that could not start: its fields again
        screen = NewJobScreen(list(self.host_order), self.selected_host, dict(self.hosts), os.getcwd(), local,
                              *(draft or (None, "")))
        self.push_screen(screen, self._on_job_spec)

    def _on_job_spec(self, spec: JobSpec | None) -> None:
        if spec is not None:
            self.run_worker(self._start_job(spec), group="command")

    async def _start_job(self, spec: JobSpec) -> None:
        asked = spec
        if spec.sync is not None:  # the tree goes first; the job then runs in the synced dir
            from .flows import files

            synced = await files.sync_first(self, spec)
            if synced is None:
                self._draft = (asked, "the sync failed, the job did not start")
                return
            spec = synced
        from gputui.core.jobs.usecases import start_job

        snap = self.hosts.get(spec.host)
        if snap is not None and snap.state in (M.CONNECTING, M.RECONNECTING):  # else 30 s of silence
            self.notify(f"{spec.host} is {snap.state}: the job starts once it is up (at most 30 s)…", timeout=NOTIFY_S)
        try:
            job = await start_job(self.source.session(spec.host), self.config, spec)
        except Exception as exc:
            self._draft = (asked, f"could not start: {exc}")  # n opens the dialog with it: nothing is retyped
            self.notify(f"could not start the job on {spec.host}: {exc} (n: edit it and try again)",
                        severity="error", timeout=NOTIFY_S)
            return
        self._started.add((spec.host, job.id))
        verb = f"queued (position {job.queue_position})" if job.state == M.JOB_QUEUED else "started"
        self.notify(f"{verb} job {job.id} ({fmt.job_name(job.name, job.command)}) on {spec.host}", timeout=NOTIFY_S)
        self.select_job(spec.host, job.id)

    def action_kill_job(self) -> None:
        job = self.current_job()
        if job is None:
            self.notify("no job selected: pick a running job in the jobs table", timeout=NOTIFY_S)
            return
        if job.state == M.JOB_QUEUED and not job.record.get("slurm"):  # the host's queue: remove it
            self._remove_queued(job)
            return
        if job.state in M.JOB_ENDED_STATES:  # a queued Slurm job may be killed: it is cancelled
            self.notify(f"job {job.id} is not running ({job.state}): nothing to kill", timeout=NOTIFY_S)
            return
        g = self.kill_grace_s
        name, host = (
            safetext.clean(t, limit=NAME_CHARS) for t in (fmt.job_name(job.name, job.command), job.host)
        )
        body = (
            f"Kill job {safetext.clean(job.id, limit=NAME_CHARS)} ({name}) on {host}?\n\n"
            f"SIGINT goes to the job's process group now; if it is still running after {g:g} s it gets "
            f"SIGTERM, and {g:g} s after that SIGKILL. Its log and exit status stay on the host."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._kill(job), group="command")

        self.confirm("Kill job", body, "Kill", answered)

    def _remove_queued(self, job: M.Job) -> None:
        """Kill of a queued job: it leaves the host's queue and never starts (confirmed like a kill)."""
        name, host = (safetext.clean(t, limit=NAME_CHARS) for t in (fmt.job_name(job.name, job.command), job.host))
        body = f"Remove job {safetext.clean(job.id, limit=NAME_CHARS)} ({name}) from the queue on {host}?\n\nIt never starts."

        def answered(yes: bool | None) -> None:
            if yes:  # only the removal: a job the scheduler started meanwhile is not killed
                self.run_worker(self._kill(job, queued_only=True), group="command")

        self.confirm("Remove queued job", body, "Remove", answered)

    async def _kill(self, job: M.Job, queued_only: bool = False) -> None:
        self.notify(f"killing job {job.id} on {job.host}…", timeout=NOTIFY_S)
        try:
            done = await self.source.session(job.host).kill_job(job.id, self.kill_grace_s, queued_only)
        except Exception as exc:
            self.notify(f"could not kill job {job.id}: {exc}", severity="error", timeout=NOTIFY_S)
            return
        outcome = "removed from the queue" if done.started_at is None else f"{done.state} (exit {done.exit_code})"
        self.notify(f"job {done.id} on {job.host}: {outcome}", timeout=NOTIFY_S)

    def action_release(self) -> None:
        host = self.selected_host
        if not self._no_host() and host is not None:
            from .flows import release

            release.ask(self, host)

    def action_start_instance(self) -> None:
        host = self.selected_host
        if not self._no_host() and host is not None:
            from .flows import instance

            instance.ask(self, host)

    def action_forward_url(self) -> None:
        job = self.current_job()
        if job is None:
            self.notify("no job selected: pick the job that printed the URL", timeout=NOTIFY_S)
            return
        from .flows import files

        self.run_worker(files.forward_url(self, job, self.forwards), group="command")

    def action_snooze_autostop(self) -> None:
        self._autostop(lambda s: autostop.snooze(s, 60), "autostop snoozed for 60 min")

    def action_cancel_autostop(self) -> None:
        self._autostop(autostop.cancel, "autostop cancelled until the host reboots")

    def action_autostop_unarmed(self) -> None:
        host = self.selected_host
        if not self._no_host():
            self.notify(f"{host} has no autostop counting down: set autostop_minutes (with release_remote) "
                        "or a deadline in its [hosts.NAME] table", timeout=NOTIFY_S)

    def _autostop(self, change: Callable[[Any], Awaitable[None]], done: str) -> None:
        host = self.selected_host
        if host is None:
            return

        async def send() -> None:
            try:
                await change(self.source.session(host))
            except Exception as exc:
                self.notify(f"{host}: {exc}", severity="error", timeout=NOTIFY_S)
                return
            self.notify(f"{host}: {done}", timeout=NOTIFY_S)

        self.run_worker(send(), group="command")

    def action_doctor(self) -> None:
        from gputui.core.hosts.doctor import run_doctor

        from .screens.reports import ReportScreen, doctor_table

        host = self.selected_host
        if self._no_host() or host is None:
            return

        async def load() -> Any:
            return doctor_table(await run_doctor(self.source.session(host)))

        self.push_screen(ReportScreen(f"Doctor: {host}", load))

    def action_chart(self) -> None:
        from .screens.chart import JobChartScreen

        job = self.current_job()
        if job is None:
            self.notify("No job selected: pick one in the jobs table", severity="warning")
            return
        session = self.source.session(job.host)
        self.push_screen(JobChartScreen(job, lambda: session.job_series(job.id), self.palette))

    def action_gpu_chart(self) -> None:
        from .screens.chart import GpuChartScreen

        host = self.selected_host
        if host is not None and host in self.hosts:
            self.push_screen(GpuChartScreen(host, lambda: self.hosts.get(host), self.palette))

    def action_compare_runs(self) -> None:
        from gputui.core.jobs.compare import load_runs
        from gputui.core.jobs.usecases import collect_history

        from .screens.compare import RunsScreen

        async def records() -> list[dict[str, Any]]:
            recs, _errors = await collect_history(self.source, self.config, self.host_order, connect=False)
            return recs

        async def runs(refs: list[tuple[str, str]]) -> Any:
            return await load_runs(self.source, self.config, refs, connect=False)

        self.push_screen(RunsScreen(records, runs, self.palette))

    def action_history(self) -> None:
        from .screens.reports import ReportScreen, history_table

        async def load() -> Any:  # an unreachable host has no history to show right now
            from gputui.core.jobs.usecases import collect_history

            recs, _errors = await collect_history(
                self.source, self.config, self.host_order, connect=False
            )
            return history_table(recs, self.clock())

        self.push_screen(ReportScreen("History: finished runs", load))

    async def action_attach(self) -> None:
        job = self.current_job()
        snap = self.hosts.get(job.host) if job else None
        if job is None or snap is None:
            self.notify("no job selected: pick a running job in the jobs table", timeout=NOTIFY_S)
            return
        try:
            argv = attach_argv(self.source.session(job.host).transport.terminal_prefix(), snap, job)
        except ValueError as exc:
            self.notify(str(exc), timeout=NOTIFY_S)
            return
        if not self._can_suspend():
            self.notify(
                "this terminal cannot hand itself over; attach with: " + shlex.join(argv), timeout=NOTIFY_S
            )
            return
        with self.suspend(), self.batch_update():  # the loop keeps links alive; nothing is painted meanwhile
            code = await asyncio.to_thread(self.attach_runner, argv)
        if code:
            self.notify(f"attach ended with exit status {code}", severity="warning", timeout=NOTIFY_S)

    # --- command palette --------------------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in APP_KEYS:
            if b.action in ("quit", "change_theme") or self.check_action(b.action.split("(")[0], ()) is False:
                continue
            yield SystemCommand(
                f"{b.description} ({key_label(b)})",
                b.tooltip or b.description,
                self._palette_action(b.action),
            )
        yield SystemCommand("Follow log (f)", "Jump to the end of the log and keep following", self._follow)
        for name in sorted(self.available_themes):
            yield SystemCommand(f"Theme: {name}", "Use this theme (remembered)", self._palette_theme(name))

    def _palette_action(self, action: str) -> Callable[[], Any]:
        return lambda: self.run_action(action)

    def _palette_theme(self, name: str) -> Callable[[], None]:
        def use() -> None:
            self.theme = name

        return use

    def _follow(self) -> None:
        self.query_one(LogView).action_follow()

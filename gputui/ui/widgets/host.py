"""The selected host: its summary lines, one card per GPU, its jobs and its GPU processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual.containers import Container, Vertical

from gputui.core import safetext
from gputui.core.hosts.cluster import cluster_text
from gputui.core.session import model as M
from gputui.core.session.metrics_history import GpuSeries, MetricsHistory

from .. import fmt
from ..logstream import progress_text
from ..palette import Palette
from .keyed_table import KeyedTable
from .textbox import TextBox, set_display

if TYPE_CHECKING:
    from gputui.core.insights import JobInsights

CARD_WIDTH = 40  # outer width of a GPU card, border included
BAR_WIDTH = 10
SPARK_WIDTH = 15
HISTORY_WINDOW = 300  # samples (seconds at 1 Hz) the sparklines summarise
NAME_CHARS = 60  # a host's name, hostname, reconnect detail in the host lines (a host may send megabytes)
ERROR_CHARS = 300


def host_info(snap: M.HostSnapshot, pal: Palette) -> Text:
    """Two or three lines: identity and host resources; connection trouble; money."""
    out = Text()
    out.append(safetext.clean(snap.name, limit=NAME_CHARS), style="bold")
    hostname = snap.facts.get("hostname")
    if hostname and hostname != snap.name:
        out.append(f" ({safetext.clean(hostname, limit=NAME_CHARS)})", style=pal.muted)
    m = snap.metrics
    if m is not None:
        h = m.host
        parts = [
            f"cpu {fmt.pct(h.cpu_percent)}" + (f" of {h.cpu_count:g}" if h.cpu_count else ""),
            f"load {h.load1:.2f}" if h.load1 is not None else None,
            f"mem {fmt.mem_pair(h.mem_used_mib, h.mem_total_mib)}"
            + (" (container limit)" if h.mem_scope == "cgroup" else ""),
            f"disk {h.disk_free_gib:.0f} GiB free" if h.disk_free_gib is not None else None,
            f"up {fmt.duration(h.uptime_s)}" if h.uptime_s is not None else None,
            f"gpu via {m.gpu_source}" if m.gpu_source else None,
        ]
        out.append(safetext.clean("   " + " · ".join(p for p in parts if p)))
    if snap.state == M.RECONNECTING:
        out.append("\n")
        detail = safetext.clean(snap.detail or "waiting", limit=NAME_CHARS)
        out.append(f"reconnecting ({detail})", style=f"bold {pal.warm}")
        out.append(f": {safetext.clean(snap.error, limit=ERROR_CHARS)}" if snap.error else "", style=pal.warm)
        out.append(" — last known data shown", style=pal.muted)
    elif snap.state == M.ERROR:
        out.append("\n")
        out.append(
            f"error: {safetext.clean(snap.error or 'unknown', limit=ERROR_CHARS)}", style=f"bold {pal.hot}"
        )
    elif snap.state == M.CONNECTING:
        out.append("\n")
        out.append("connecting…", style=pal.muted)
    if snap.state != M.CONNECTED and snap.instance is not None:
        out.append("\n")
        out.append(f"{snap.instance.state}: ", style=f"bold {pal.warm}")
        out.append(safetext.clean(snap.instance.detail, limit=ERROR_CHARS))
    c = snap.cost
    if c is not None:
        parts = Text()
        if c.price_per_hour is not None or c.accrued:
            parts.append(fmt.money(c.price_per_hour, c.currency, per_hour=True), style="bold")
            if c.price_source not in (None, "config"):
                parts.append(f" · {c.price_source}", style=pal.muted)
            parts.append(
                f" · accrued {fmt.money(c.accrued, c.currency)} · today {fmt.money(c.today, c.currency)}"
            )
        elif c.price_unknown:  # the provider's figure was unusable (the reason is in status --json)
            parts.append("price unknown", style=pal.muted)
        if c.idle:
            money = f" ({fmt.money(c.idle_cost, c.currency)})" if c.price_per_hour is not None else ""
            parts.append(
                f"{' · ' if parts else ''}idle {fmt.duration(c.idle_seconds)}{money}", style=pal.warm
            )
        elif c.reasons:
            busy = safetext.clean(", ".join(c.reasons[:3]), limit=2 * NAME_CHARS)
            parts.append(f"{' · ' if parts else ''}busy: {busy}", style=pal.muted)
        if c.autostop_in_s is not None:
            parts.append(f" · autostop in {fmt.duration(c.autostop_in_s)}", style=pal.warm)
        if c.release_check_ok is not None and (c.autostop_in_s is not None or c.deadline_in_s is not None
                                                or not c.release_check_ok):
            ago = "" if c.release_check_at is None else f" {fmt.duration(max(0.0, time.time() - c.release_check_at))} ago"
            verdict = "release checked" + ago if c.release_check_ok else "release check FAILED" + ago
            parts.append(f" · {verdict}", style=pal.muted if c.release_check_ok else f"bold {pal.hot}")
        if c.release_failed:
            reason = safetext.clean(c.release_failed, limit=2 * NAME_CHARS)
            parts.append(f" · RELEASE FAILED, still billing: {reason}", style=f"bold {pal.hot}")
        if c.deadline_in_s is not None:
            parts.append(f" · release deadline in {fmt.duration(c.deadline_in_s)}", style=pal.hot)
        if c.released:
            parts.append(" · released", style=pal.muted)
        if parts:
            out.append("\n")
            out.append_text(parts)
    if snap.cluster is not None:
        out.append("\n")
        out.append(safetext.clean(cluster_text(snap.cluster), limit=4 * NAME_CHARS), style=pal.muted)
    return out



Series = dict[int, GpuSeries]


def gpu_series(history: MetricsHistory, window: int = HISTORY_WINDOW) -> Series:
    """Per GPU index: (util %, memory fraction, temperature) over the last ``window`` samples."""
    return history.gpus(window)


def _bar(text: Text, fraction: float | None, color: str, pal: Palette) -> None:
    filled = fmt.bar(fraction, BAR_WIDTH)
    text.append(filled, style=f"{color} on {pal.empty}")


def lost_card(g: M.GpuSample, pal: Palette) -> Text:
    """Three lines for a GPU the driver cannot reach: LOST, then the driver's words (as text, never markup)."""
    width = CARD_WIDTH - 4  # border and padding
    words = safetext.clean(g.error or "no reading", limit=2 * width)
    t = Text(no_wrap=True, overflow="crop")
    t.append("LOST", style=f"bold {pal.hot}")
    t.append(" · reboot or new instance", style=pal.muted)
    for k in range(0, min(len(words), 2 * width), width):
        t.append("\n" + words[k : k + width], style=pal.hot)
    return t


def health_line(gpus: tuple[M.GpuSample, ...]) -> str:
    """"GPU 2 lost: <the driver's words>. Fix: ...", "GPU 0 throttled: thermal slowdown at 91°C", ... for each GPU
    with a problem; "" when all is well."""
    lines = []
    for g in gpus:
        if g.lost:
            lines.append(f"GPU {g.index} lost: {safetext.clean(g.error or '?', limit=ERROR_CHARS)} "
                         f"Fix: {safetext.clean(g.fix or '?', limit=ERROR_CHARS)}")
        else:
            lines += [f"GPU {g.index} {p}" for p in g.problems]
    return "\n".join(lines)


def gpu_card(g: M.GpuSample, series: GpuSeries | None, pal: Palette) -> Text:
    """Three lines: utilisation, memory, temperature/power, each with its sparkline (a lost GPU: lost_card)."""
    if g.lost:
        return lost_card(g, pal)
    util_h, mem_h, temp_h = series or ([], [], [])
    memf = fmt.ratio(g.mem_used_mib, g.mem_total_mib)
    t = Text(no_wrap=True, overflow="crop")
    t.append("util ", style=pal.muted)
    _bar(t, None if g.util_percent is None else g.util_percent / 100, pal.util(g.util_percent), pal)
    t.append(f" {fmt.pct(g.util_percent):>4} ")
    t.append(fmt.spark(util_h, SPARK_WIDTH, 0, 100), style=pal.spark)
    t.append("\nmem  ", style=pal.muted)
    _bar(t, memf, pal.mem(memf), pal)
    t.append(f" {fmt.pct(None if memf is None else memf * 100):>4} ")
    t.append(fmt.spark(mem_h, SPARK_WIDTH, 0, 1), style=pal.spark)
    t.append("\ntemp ", style=pal.muted)
    t.append(f"{'-' if g.temp_c is None else f'{g.temp_c:.0f}°C':<5}", style=f"bold {pal.temp(g.temp_c)}")
    power = "-" if g.power_w is None else f"{g.power_w:.0f}"
    limit = f"/{g.power_limit_w:.0f}" if g.power_limit_w else ""
    t.append(f" {power + limit + 'W':>9} ")
    t.append(fmt.spark(temp_h, SPARK_WIDTH, 20, 95), style=pal.temp(g.temp_c))
    return t


class GpuCard(TextBox):
    """One GPU; title and subtitle sit in its border."""

    _title = ""

    def show_gpu(self, g: M.GpuSample, series: GpuSeries | None, pal: Palette) -> None:
        title = safetext.clean(f"{g.index} · {fmt.clip(fmt.short_gpu_name(g.name), 22)}")
        problems = [p.split(":")[0] for p in g.problems]  # lost, throttled, ECC
        subtitle = "lost" if g.lost else "⚠ " + ", ".join(problems) if problems else fmt.mem_pair(g.mem_used_mib,
                                                                                                 g.mem_total_mib)
        if title != self._title:  # border titles are markup when given as str: a Text is taken literally
            self._title = title
            self.border_title = Text(title)
        if subtitle != self.border_subtitle:
            self.border_subtitle = subtitle
        self.show(gpu_card(g, series, pal))


class GpuGrid(Vertical):
    """Cards in as many columns as fit; a line of text when the host has no GPU readings."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._cards: list[GpuCard] = []
        self._note = TextBox(classes="gpu-note")
        self._grid = Container(classes="cards")

    def compose(self):
        yield self._note
        yield self._grid

    def on_resize(self) -> None:
        self._grid.styles.grid_size_columns = max(1, self.size.width // CARD_WIDTH)

    def show(self, snap: M.HostSnapshot | None, pal: Palette) -> None:
        gpus = snap.gpus if snap else ()
        if len(gpus) != len(self._cards):
            for card in self._cards[len(gpus) :]:
                card.remove()
            del self._cards[len(gpus) :]
            new = [GpuCard(classes="gpu-card") for _ in range(len(gpus) - len(self._cards))]
            if new:
                self._grid.mount_all(new)
                self._cards.extend(new)
        note, style = "", pal.muted
        if snap is not None and not gpus:
            m = snap.metrics
            if m is None:
                note = "no metrics yet" if snap.state in (M.CONNECTING, M.CONNECTED) else "no data"
            else:
                note = f"no GPUs: {m.gpu_error or 'none found'} (host metrics only)"
        elif health_line(gpus):  # a health line only when something is wrong
            note, style = health_line(gpus), f"bold {pal.hot}"
        self._note.show(Text(safetext.clean(note, limit=2000, multiline=True), style=style))
        set_display(self._note, bool(note))
        set_display(self._grid, bool(gpus))
        series = gpu_series(snap.history) if gpus and snap else {}
        for card, g in zip(self._cards, gpus, strict=False):
            card.show_gpu(g, series.get(g.index), pal)


def job_row(job: M.Job, ins: JobInsights | None, now: float, pal: Palette) -> tuple[object, ...]:
    progress, eta = progress_text(ins)
    eta = eta if job.running else ""  # an ended job's last ETA is not coming
    state_style = {
        M.JOB_QUEUED: pal.muted,
        M.JOB_RUNNING: pal.ok,
        M.JOB_SUCCEEDED: pal.muted,
        M.JOB_FAILED: pal.hot,
        M.JOB_KILLED: pal.warm,
        M.JOB_LOST: pal.warm,
    }.get(job.state, "")
    state = job.state
    if job.running and job.stalled:  # still running, but its GPUs idle and its log silent (stall_minutes)
        state, state_style = "stalled", pal.warm
    name = Text(safetext.clean(fmt.job_name(job.name, job.command), limit=500), no_wrap=True, overflow="ellipsis")
    gpus = job.gpus or "all"
    if job.state == M.JOB_QUEUED:  # its place in the host's queue, and what it waits for (host text: plain)
        state = f"queued #{job.queue_position}" if job.queue_position else "queued"
        name.append(" · " + safetext.clean(job.queue_reason or "waiting", limit=300), style=pal.muted)
        count = (job.record.get("queue") or {}).get("gpu_count")
        gpus = f"any {count}" if count else gpus
    slurm = job.record.get("slurm") or {}
    if slurm and job.state != M.JOB_QUEUED:  # a Slurm job: its nodes, and GPUs per node x nodes
        if slurm.get("nodes"):
            name.append(" · on " + safetext.clean(slurm["nodes"], limit=300), style=pal.muted)
        nodes = slurm.get("nodes_count") or 1
        gpus = f"{slurm.get('gpus') or 0}x{nodes}" if nodes > 1 else str(slurm.get("gpus") or 0)
    if job.image is not None:  # run in a container image: which one (host text: plain)
        name.append(" · in " + safetext.clean(job.image["image"], limit=200), style=pal.muted)
    group = job.record.get("group")
    if isinstance(group, dict) and isinstance(group.get("hosts"), list):  # one part of a job over several hosts
        hosts = ",".join(safetext.clean(str(h), limit=64) for h in group["hosts"])
        name.append(f" · rank {group.get('rank')} of {safetext.clean(hosts, limit=300)}", style=pal.muted)
    runtime = None
    if job.started_at is not None:
        runtime = (job.ended_at if job.ended_at is not None else now) - job.started_at
    exit_style = pal.hot if job.exit_code not in (None, 0) else ""
    return (
        Text(safetext.clean(job.id, limit=50), justify="right"),
        name,
        Text(safetext.clean(state), style=state_style),
        Text(fmt.duration(runtime), justify="right"),
        Text(safetext.clean(gpus)),
        Text(progress, justify="right"),
        Text(eta, justify="right"),
        Text("" if job.exit_code is None else str(job.exit_code), style=exit_style, justify="right"),
    )


class JobsTable(KeyedTable):
    """Jobs of the selected host, newest first; the cursor row is the selected job."""

    RIGHT = frozenset({"id", "runtime", "progress", "eta", "exit"})

    COLUMNS = (
        ("id", "ID", 4),
        ("name", "Name", 30),
        ("state", "State", 9),
        ("runtime", "Runtime", 7),
        ("gpus", "GPUs", 5),
        ("progress", "Prog", 4),
        ("eta", "ETA", 6),
        ("exit", "Exit", 4),
    )

    def show(
        self,
        snap: M.HostSnapshot | None,
        insights: Callable[[M.Job], JobInsights | None],
        now: float,
        pal: Palette,
    ) -> None:
        jobs = reversed(snap.jobs) if snap else ()
        self.sync([(j.id, job_row(j, insights(j), now, pal)) for j in jobs])


def proc_job(p: M.GpuProcess, names: dict[str, str]) -> str:
    """The job column: "7 train", or "~7 train" when matched by its GPUs (its pid is in another PID namespace)."""
    if not p.job:
        return ""
    mark = "~" if p.inferred else ""
    return safetext.clean(f"{mark}{p.job} {names.get(p.job, '')}".strip(), limit=200)


class ProcsTable(KeyedTable):
    """Processes on the selected host's GPUs, with the gputui job that owns each."""

    RIGHT = frozenset({"gpu", "pid", "mem", "cpu", "workers", "rss"})

    COLUMNS = (
        ("gpu", "GPU", 3),
        ("pid", "PID", 7),
        ("job", "Job", 14),
        ("mem", "GPU mem", 8),
        ("cpu", "CPU", 5),  # of one core: a process at 100 % feeding a GPU at 30 % is the data loader's bottleneck
        ("workers", "Workers", 10),  # the processes it started (DataLoader workers) and their CPU together
        ("rss", "RAM", 8),
        ("name", "Process", 18),
    )

    def show(self, snap: M.HostSnapshot | None, pal: Palette) -> None:
        rows = []
        names = {j.id: j.name for j in snap.jobs} if snap else {}
        for g in snap.gpus if snap else ():
            for p in g.processes:
                job = proc_job(p, names)
                rows.append(
                    (
                        f"{g.index}:{p.pid}",
                        (
                            Text(str(g.index), justify="right"),
                            Text(str(p.pid), justify="right"),
                            Text(job, style="" if job else pal.muted, no_wrap=True, overflow="ellipsis"),
                            Text(
                                fmt.gib(p.mem_mib) + " GiB" if p.mem_mib is not None else "-", justify="right"
                            ),
                            Text("-" if p.cpu_percent is None else f"{p.cpu_percent:.0f}%", justify="right"),
                            Text(_workers(p), justify="right"),
                            Text("-" if p.rss_mib is None else fmt.gib(p.rss_mib) + " GiB", justify="right"),
                            Text(safetext.clean(p.name or "-", limit=200), no_wrap=True, overflow="ellipsis"),
                        ),
                    )
                )
        self.sync(rows)


def _workers(p: M.GpuProcess) -> str:
    """``4 at 390%``: the processes a GPU process started and their CPU together; ``0`` for none; ``-`` unknown."""
    if not p.children:
        return "-" if p.children is None else "0"
    return f"{p.children} at {p.children_cpu_percent:.0f}%" if p.children_cpu_percent is not None else str(p.children)

"""Charts: the selected job's metrics (live while it runs), a host's GPU history, runs overlaid.

Keys: ``m`` the next group of metrics (losses, scores, the rest), ``y`` log/linear y, ``z`` the last N of x,
escape closes. Series names are text from logs: shown literally.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Static

from gputui.core import safetext
from gputui.core.insights.metrics import metric_kind
from gputui.core.session import model as M
from gputui.core.session.series import X_EPOCH, X_LINE, X_STEP, JobSeries, Series

from ..palette import Palette
from ..widgets.chart import Chart, Line

LIVE_S = 5.0  # a running job's series are asked for again this often
GPU_LIVE_S = 2.0  # the GPU chart is drawn again this often
ZOOMS: tuple[float | None, ...] = (None, 10_000, 1_000, 100)
MAX_LINES = 8
GROUPS = (("losses", "min"), ("scores", "max"), ("other", "last"))
X_TITLES = {X_STEP: "x: step", X_EPOCH: "x: epoch", X_LINE: "x: log line (no step or epoch printed)"}
GPU_QUANTITIES = (
    ("utilisation %", "util", 1.0),
    ("memory used %", "mem", 100.0),
    ("temperature °C", "temp", 1.0),
)


def colors(pal: Palette) -> list[str]:
    return [pal.primary, pal.warm, pal.ok, pal.marker, pal.hot, pal.spark, pal.match, pal.muted]


def common_x(series: Sequence[Series]) -> str:
    """The x axis every one of ``series`` has: step, else epoch, else the log's line."""
    labels = {s.x_label for s in series}
    if labels == {X_STEP}:
        return X_STEP
    return (
        X_EPOCH
        if labels <= {X_STEP, X_EPOCH} and all(p.epoch is not None for s in series for p in s.points)
        else X_LINE
    )


def group_of(name: str) -> str:
    return metric_kind(name) or "last"


class ChartScreen(ModalScreen[None]):
    """A chart with a title, a status line and the keys m, y, z; subclasses say what it draws."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("m", "next_group", "Metrics"),
        Binding("y", "toggle_log", "Log y"),
        Binding("z", "zoom", "Last N"),
    ]
    DEFAULT_CSS = """
    ChartScreen { align: center middle; }
    ChartScreen > Vertical { width: 100%; height: 100%; border: round $primary; background: $surface; }
    ChartScreen #chart-title { height: 1; text-style: bold; }
    ChartScreen #chart-status { height: 1; color: $text-muted; }
    """

    def __init__(self, title: str, palette: Palette) -> None:
        super().__init__()
        self.title_text, self.palette = title, palette
        self.group, self.log_y, self.zoom = 0, False, 0

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(safetext.clean(self.title_text, limit=200)), id="chart-title")
            yield Chart(id="chart")
            yield Static(id="chart-status")

    def lines(self) -> tuple[list[Line], str, str]:
        """(the lines, the x axis' title, a status) to draw now."""
        raise NotImplementedError

    def redraw(self) -> None:
        lines, x_title, status = self.lines()
        zoom = ZOOMS[self.zoom]
        shown = "all x" if zoom is None else f"last {zoom:g}"
        keys = f"m next · y {'linear' if self.log_y else 'log'} y · z zoom ({shown}) · esc"
        self.query_one("#chart-status", Static).update(Text(safetext.clean(f"{status}  {keys}", limit=400)))
        self.query_one(Chart).show(lines, x_title, self.log_y, zoom, self.palette.muted)

    def action_next_group(self) -> None:
        self.group += 1
        self.redraw()

    def action_toggle_log(self) -> None:
        self.log_y = not self.log_y
        self.redraw()

    def action_zoom(self) -> None:
        self.zoom = (self.zoom + 1) % len(ZOOMS)
        self.redraw()


class JobChartScreen(ChartScreen):
    """The job's metric series from its host, asked for again every LIVE_S while it runs."""

    def __init__(self, job: M.Job, load: Callable[[], Awaitable[JobSeries]], palette: Palette) -> None:
        super().__init__(f"Metrics: {job.host} job {job.id} ({job.name})", palette)
        self.job, self.load = job, load
        self.data: JobSeries | None = None
        self.error: str | None = None
        self.live: Timer | None = None

    def on_mount(self) -> None:
        self.run_worker(self.reload(), exclusive=True)
        if self.job.running:
            self.live = self.set_interval(LIVE_S, lambda: self.run_worker(self.reload(), exclusive=True))
        self.redraw()

    async def reload(self) -> None:
        try:
            self.data, self.error = await self.load(), None
        except Exception as exc:  # noqa: BLE001 - shown on the chart: an unreachable host, an old agent
            self.error = str(exc)
        if self.data is not None and self.data.done and self.live is not None:
            self.live.stop()  # the job ended and its series are final
            self.live = None
        self.redraw()

    def groups(self) -> list[tuple[str, list[Series]]]:
        found = self.data.series if self.data else ()
        out = [(label, [s for s in found if group_of(s.name) == kind]) for label, kind in GROUPS]
        return [g for g in out if g[1]]

    def lines(self) -> tuple[list[Line], str, str]:
        if self.data is None:
            return (
                [],
                "",
                f"could not load the series: {self.error}" if self.error else "loading the series...",
            )
        groups = self.groups()
        if not groups:
            return [], "", "no metrics found in the log yet" + (" (live)" if self.job.running else "")
        label, series = groups[self.group % len(groups)]
        series = series[:MAX_LINES]
        x = common_x(series)
        cols = colors(self.palette)
        lines = [Line(s.name, s.xy(x), cols[i % len(cols)], marked=s.is_eval) for i, s in enumerate(series)]
        state = "live" if self.job.running and not self.data.done else "final" if self.data.done else "so far"
        return lines, X_TITLES[x], f"{label} ({state}, ◆ eval points)"


class GpuChartScreen(ChartScreen):
    """A host's GPU history (the kept window), one line per GPU: utilisation, memory, temperature."""

    def __init__(self, host: str, snap_of: Callable[[], M.HostSnapshot | None], palette: Palette) -> None:
        super().__init__(f"GPU history: {host}", palette)
        self.snap_of = snap_of

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(GPU_LIVE_S, self.redraw)  # the host's newest readings, as the app gets them

    def lines(self) -> tuple[list[Line], str, str]:
        label, field, scale = GPU_QUANTITIES[self.group % len(GPU_QUANTITIES)]
        snap = self.snap_of()
        if snap is None:
            return [], "", "the host is gone from the fleet"
        hist = snap.history
        times = hist.times()
        if not times:
            return [], "", "no GPU readings kept yet"
        now, cols, lines = times[-1], colors(self.palette), []
        for i, (index, series) in enumerate(sorted(hist.gpus().items())[:MAX_LINES]):
            values: list[float | None] = getattr(series, field)
            start = len(times) - len(values)  # a GPU missing from older samples has fewer readings
            pts = [
                ((times[start + k] - now) / 60.0, v * scale) for k, v in enumerate(values) if v is not None
            ]
            lines.append(Line(f"GPU {index}", pts, cols[i % len(cols)]))
        return (
            lines,
            "x: minutes (0 = the last reading)",
            f"{label} ({len(times)} readings; power is not kept)",
        )


class CompareChartScreen(ChartScreen):
    """Runs overlaid: one metric at a time (m), one line per run, and the table of what differed."""

    DEFAULT_CSS = "CompareChartScreen #compare-table { height: auto; max-height: 50%; }"

    def __init__(
        self, labels: list[str], series: list[JobSeries | None], table: Any, palette: Palette
    ) -> None:
        super().__init__("Compare: " + "  ".join(labels), palette)
        self.labels, self.series, self.table = labels, series, table
        names = {s.name for js in series if js is not None for s in js.series}
        self.names = sorted(names, key=lambda n: (group_of(n) != "min", n))

    def compose(self) -> ComposeResult:
        yield from super().compose()

    def on_mount(self) -> None:
        self.query_one(Vertical).mount(Static(self.table, id="compare-table"))
        self.redraw()

    def lines(self) -> tuple[list[Line], str, str]:
        if not self.names:
            return [], "", "no metric series on these runs"
        name = self.names[self.group % len(self.names)]
        got = [(lab, js.get(name) if js else None) for lab, js in zip(self.labels, self.series, strict=True)]
        found = [s for _, s in got if s is not None]
        x, cols = common_x(found), colors(self.palette)
        lines = [Line(lab, s.xy(x), cols[i % len(cols)]) for i, (lab, s) in enumerate(got) if s is not None]
        return lines, X_TITLES[x], f"{name} ({self.group % len(self.names) + 1}/{len(self.names)})"


def compare_table(labels: Sequence[str], rows: Sequence[Any]) -> Any:
    """The rows of ``core.compare.compare_rows`` as a table: one column per run, rows that differ in bold."""
    from rich.table import Table

    table = Table(box=None, padding=(0, 1), show_edge=False)
    table.add_column("", no_wrap=True)
    for label in labels:
        table.add_column(Text(safetext.clean(label, limit=40)), overflow="ellipsis", no_wrap=True)
    for row in rows:
        style = "bold" if row.differs else ""
        table.add_row(Text(("* " if row.differs else "  ") + row.field, style=style),
                      *(Text(c, style=style) for c in row.cells))
    return table

"""Doctor and history views: modal screens that load a report in a worker and show it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gputui.core import safetext
from gputui.core.hosts.doctor import FAIL, OK, SKIP, WARN, DoctorReport
from gputui.core.jobs.headline import ranked

from .. import fmt

STATUS_STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def doctor_table(report: DoctorReport) -> Table | Text:
    if report.error is not None:
        return Text(
            safetext.clean(f"{report.host}: not checked ({report.error})", multiline=True), style="bold red"
        )
    table = Table.grid(padding=(0, 2))
    table.add_column(min_width=4)
    table.add_column(style="bold")
    table.add_column()
    for ch in report.checks:
        detail = Text(safetext.clean(ch.detail, multiline=True))
        if ch.fix and ch.status != OK:
            detail.append(safetext.clean(f"\nfix: {ch.fix}", multiline=True), style="italic")
        status = Text(safetext.clean(ch.status.upper()), style=STATUS_STYLE.get(ch.status, ""))
        table.add_row(status, Text(safetext.clean(ch.title)), detail)
    return table


# (header, widest cell, right-aligned); the metrics column gets the width that is left and wraps
HISTORY_COLUMNS = (
    ("host", 20, False), ("id", 8, True), ("state", 9, False), ("exit", 4, True), ("ended", 10, True),
    ("time", 6, True), ("cost", 10, True), ("GPU mem", 7, True), ("util", 4, True),
    ("metrics", 0, False), ("name", 36, False),
)
METRICS_MIN = 16


def history_table(records: list[dict[str, Any]], now: float | None = None) -> Table | Text:
    """Finished runs, newest first. Every cell is literal text cut to its column's width, so the headers
    stay whole and the metrics keep their room whatever a run's name, host or id."""
    if not records:
        return Text("No finished runs yet.", style="dim")
    now = time.time() if now is None else now
    table = Table(box=None, padding=(0, 1, 0, 0), header_style="bold", expand=True)
    for header, widest, right in HISTORY_COLUMNS:
        if not widest:
            table.add_column(header, min_width=METRICS_MIN, ratio=2, overflow="fold")
        elif header == "name":  # shares what is left with the metrics, a third of it at most
            table.add_column(header, no_wrap=True, min_width=8, max_width=widest, ratio=1)
        else:
            justify = "right" if right else "left"
            table.add_column(header, no_wrap=True, min_width=len(header), max_width=widest, justify=justify)
    widths = [w or 1000 for _, w, _ in HISTORY_COLUMNS]
    for r in records:
        m = r["metrics"]  # the metrics that matter first (the CLI's rule), as many as the column wraps to
        metrics = " ".join(f"{k}={m[k]['last']:.4g}" for k in ranked(m)[:6] if m[k].get("last") is not None)
        cost = "-" if r["cost"] is None else fmt.money(r["cost"], r["currency"])
        mem = "-" if not r["gpu_peak_mem_mib"] else f"{r['gpu_peak_mem_mib'] / 1024:.1f}G"
        util = "-" if r["gpu_mean_util"] is None else f"{r['gpu_mean_util']:.0f}%"
        ended = "-" if r["ended_at"] is None else fmt.duration(now - r["ended_at"]) + " ago"
        dur = "-" if r["duration_s"] is None else fmt.duration(r["duration_s"])
        name = fmt.job_name(r["name"], r.get("command") or ())
        cells = (
            r["host"], r["id"], r["state"], "-" if r["exit_code"] is None else str(r["exit_code"]),
            ended, dur, cost, mem, util, metrics, name,
        )
        table.add_row(
            *(Text(fmt.clip(safetext.clean(c, limit=w + 1), w)) for c, w in zip(cells, widths, strict=True))
        )
    return table


class ReportScreen(ModalScreen[None]):
    """Shows ``loading`` until ``load()`` returns something rich can render (or raises: the error shows)."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, title: str, load: Callable[[], Awaitable[Any]]) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text, self.load = title, load

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide report"):
            yield Static(Text(safetext.clean(self.title_text)), classes="dialog-title")
            yield Static(Text("loading…", style="dim"), id="report-body")
            yield Static("Esc or q closes this.", classes="hint")

    def on_mount(self) -> None:
        self.run_worker(self._load(), exclusive=True)

    async def _load(self) -> None:
        try:
            body = await self.load()
        except Exception as exc:  # shown, not raised: a report is information
            body = Text(safetext.clean(f"could not load: {exc}", multiline=True), style="bold red")
        self.query_one("#report-body", Static).update(body)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)

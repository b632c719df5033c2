"""Finished runs to compare: mark 2-8 (any hosts) with space, then c overlays their curves beside the table
of what differed (``CompareChartScreen``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from gputui.core import safetext
from gputui.core.jobs.compare import MAX_RUNS, MIN_RUNS, Run, compare_rows
from gputui.core.jobs.headline import ranked

from ..palette import Palette
from .chart import CompareChartScreen, compare_table

MARK = "●"


def _key(rec: dict[str, Any]) -> tuple[str, str]:
    return str(rec["host"]), str(rec["id"])


class RunsScreen(ModalScreen[None]):
    """The finished runs, newest first; ``space`` marks one, ``c`` compares the marked ones."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
    ]
    DEFAULT_CSS = """
    RunsScreen { align: center middle; }
    RunsScreen > Vertical { width: 100%; height: 100%; border: round $primary; background: $surface; }
    RunsScreen #runs-hint { height: 1; color: $text-muted; }
    """

    def __init__(
        self,
        records: Callable[[], Awaitable[list[dict[str, Any]]]],
        runs: Callable[[list[tuple[str, str]]], Awaitable[list[Run]]],
        palette: Palette,
    ) -> None:
        super().__init__()
        self.load_records, self.load_runs, self.palette = records, runs, palette
        self.records: list[dict[str, Any]] = []
        self.marked: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Compare runs: mark 2-8 with space, then c", style="bold"))
            yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
            yield Static(Text("loading the finished runs…"), id="runs-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(" ", "host", "id", "state", "name", "final")
        self.run_worker(self._load(), exclusive=True)

    def hint(self, text: str) -> None:
        self.query_one("#runs-hint", Static).update(Text(safetext.clean(text, limit=300)))

    async def _load(self) -> None:
        try:
            self.records = await self.load_records()
        except Exception as exc:  # noqa: BLE001 - shown: the history is information
            self.hint(f"could not load the runs: {exc}")
            return
        table = self.query_one(DataTable)
        for rec in self.records:
            m = rec.get("metrics") or {}
            final = " ".join(f"{k}={m[k]['last']:.4g}" for k in ranked(m)[:2] if m[k].get("last") is not None)
            cells = [rec["host"], rec["id"], rec["state"], rec.get("name") or "", final]
            table.add_row(
                " ", *(Text(safetext.clean(c, limit=60)) for c in cells), key="\x00".join(_key(rec))
            )
        self.hint(
            f"{len(self.records)} finished runs; none marked" if self.records else "no finished runs yet"
        )

    def action_mark(self) -> None:
        table = self.query_one(DataTable)
        if not self.records:
            return
        rec = self.records[table.cursor_row]
        key = _key(rec)
        if key in self.marked:
            self.marked.remove(key)
        elif len(self.marked) >= MAX_RUNS:
            self.hint(f"at most {MAX_RUNS} runs: unmark one first")
            return
        else:
            self.marked.append(key)
        table.update_cell("\x00".join(key), table.ordered_columns[0].key, MARK if key in self.marked else " ")
        self.hint(f"{len(self.marked)} marked: " + " ".join(f"{h}:{j}" for h, j in self.marked))

    def action_compare(self) -> None:
        if not MIN_RUNS <= len(self.marked) <= MAX_RUNS:
            self.hint(f"mark {MIN_RUNS} to {MAX_RUNS} runs first (space), then c")
            return
        self.run_worker(self._compare(list(self.marked)), exclusive=True)

    async def _compare(self, refs: list[tuple[str, str]]) -> None:
        self.hint("loading their series…")
        try:
            runs = await self.load_runs(refs)
        except Exception as exc:  # noqa: BLE001 - an unreachable host: said, the list stays
            self.hint(f"could not compare: {exc}")
            return
        labels = [r.label for r in runs]
        table = compare_table(labels, compare_rows(runs))
        self.app.push_screen(CompareChartScreen(labels, [r.series for r in runs], table, self.palette))

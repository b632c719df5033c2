"""Every key, grouped by where it works (the table: gputui/ui/keys.py)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..keys import Section


def keys_table(sections: Sequence[Section]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(justify="right", style="bold", min_width=12)
    table.add_column()
    for i, (title, rows) in enumerate(sections):
        if i:
            table.add_row("", "")
        table.add_row("", Text(title, style="bold underline"))
        for key, what in rows:
            table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: Sequence[Section]) -> None:
        super().__init__(classes="dialog-screen")
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide help"):
            yield Static("Keys", classes="dialog-title")
            yield Static(keys_table(self.sections))
            yield Static(
                "Esc, q or ? closes this. Every action is also in the command palette (ctrl+p).",
                classes="hint",
            )

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)

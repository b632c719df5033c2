"""A yes/no dialog for anything destructive (kill, release). Cancel has the focus."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gputui.core import safetext

from ..keys import CONFIRM_KEYS


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [*CONFIRM_KEYS]

    def __init__(self, title: str, body: str, confirm: str = "Yes") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text, self.body, self.confirm = title, body, confirm

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(safetext.clean(self.title_text)), classes="dialog-title")
            yield Static(Text(safetext.clean(self.body, multiline=True)), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel (n)", id="cancel")
                yield Button(f"{self.confirm} (y)", id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

"""The release dialog when artifacts would be lost: pull them first, release without them, or cancel."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gputui.core import safetext
from gputui.core.files.artifacts import Check

from ..keys import RELEASE_KEYS

PULL, RELEASE = "pull", "release"
SHOWN = 8  # artifact names listed; the rest counted


class ReleaseScreen(ModalScreen[str | None]):
    """Answers PULL (pull the artifacts, then release), RELEASE (without them) or None. Cancel has the focus."""

    BINDINGS = [*RELEASE_KEYS]  # p, d (never y: see keys.py), n

    def __init__(self, body: str, found: Check, dest: str) -> None:
        super().__init__(classes="dialog-screen")
        self.body, self.found, self.dest = body, found, dest

    def text(self) -> str:
        lines = [self.body, ""]
        n = len(self.found.unpulled)
        if n:
            size = f"{self.found.bytes / 1e6:,.1f} MB"
            lines.append(f"{n} artifact file{'s' if n != 1 else ''} ({size}) changed since the last pull:")
            # host file names: one line each, whatever they hold (a line break must not fake a line of ours)
            lines += [f"  {safetext.clean(a.dest_rel)}" for a in self.found.unpulled[:SHOWN]]
            lines += [f"  and {n - SHOWN} more"] if n > SHOWN else []
            lines.append(f"Pull first puts them in {self.dest}/{self.found.host}/.")
        lines += [f"Could not check artifacts: {safetext.clean(p)}" for p in self.found.problems[:SHOWN]]
        return "\n".join(lines)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text("Release host: artifacts would be lost"), classes="dialog-title")
            yield Static(Text(safetext.clean(self.text(), multiline=True)), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel (n)", id="cancel")
                if self.found.unpulled and not self.found.problems:
                    yield Button("Pull first (p)", id=PULL, variant="primary")
                yield Button("Release without (d)", id=RELEASE, variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id if event.button.id in (PULL, RELEASE) else None)

    def action_answer(self, choice: str | None) -> None:
        if choice == PULL and (not self.found.unpulled or self.found.problems):
            return  # nothing (safely) pullable: only release-without or cancel
        self.dismiss(choice)

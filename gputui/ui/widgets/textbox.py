"""Text that repaints in place: no relayout unless its number of lines changed, nothing if it is the same."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextBox(Widget):
    """A cheaper Static for text that changes every second (summaries, cards, titles)."""

    DEFAULT_CSS = "TextBox { height: auto; }"

    def __init__(self, text: Text | str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self._text = Text(text) if isinstance(text, str) else text
        self._lines = self._text.plain.count("\n") + 1

    @property
    def text(self) -> Text:
        return self._text

    def render(self) -> Text:
        return self._text

    def show(self, text: Text | str) -> None:
        text = Text(text) if isinstance(text, str) else text
        if text == self._text and text.style == self._text.style:
            return
        lines = text.plain.count("\n") + 1
        self._text = text
        self.refresh(layout=lines != self._lines)
        self._lines = lines


def set_display(widget: Widget, show: bool) -> None:
    """Change ``display`` only when it changes (each change costs a relayout)."""
    if widget.display != show:
        widget.display = show


def set_class(widget: Widget, on: bool, name: str) -> None:
    """Add or remove a class only when that changes anything (each change restyles the subtree)."""
    if widget.has_class(name) != on:
        widget.set_class(on, name)

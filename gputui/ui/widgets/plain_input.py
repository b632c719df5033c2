"""An Input that holds no terminal controls: pasted text is data and must not drive the terminal."""

from __future__ import annotations

from textual.widgets import Input

from gputui.core import safetext

_DROP = {c: None for c in safetext.DROP if c not in (0x09, 0x0A)}  # tabs and newlines are the user's text


class PlainInput(Input):
    """ESC, the other C0/C1 controls and bidi overrides are dropped as they arrive; the rest is kept."""

    def validate_value(self, value: str) -> str:
        return value.translate(_DROP)

"""A DataTable with fixed columns that takes whole row sets and applies only what changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

Row = tuple[str, tuple[Any, ...]]


class KeyedTable(DataTable):
    """``COLUMNS``: (key, label, width). ``sync(rows)`` updates changed cells in place; a changed set or
    order of keys rebuilds the rows and keeps the cursor on the same key. Columns named in ``RIGHT`` have
    right-aligned headers (over their right-aligned values). Home/End go to the first/last row."""

    COLUMNS: ClassVar[Sequence[tuple[str, str, int]]] = ()
    RIGHT: ClassVar[frozenset[str]] = frozenset()
    BINDINGS = [
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._keys: list[str] = []
        self._cells: dict[str, tuple[Any, ...]] = {}

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(
                Text(label, justify="right" if key in self.RIGHT else "left"), width=width, key=key
            )

    @property
    def cursor_key(self) -> str | None:
        if not self._keys or not 0 <= self.cursor_row < len(self._keys):
            return None
        return self._keys[self.cursor_row]

    def sync(self, rows: Sequence[Row]) -> None:
        keys = [k for k, _ in rows]
        if keys != self._keys:
            keep = self.cursor_key
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            self._keys = keys
            self._cells = dict(rows)
            if keep in self._cells:
                self.move_cursor(row=keys.index(keep), animate=False)
            return
        columns = [c for c, _, _ in self.COLUMNS]
        for key, cells in rows:
            old = self._cells.get(key)
            if old == cells:
                continue
            for i, value in enumerate(cells):
                if old is None or old[i] != value:
                    self.update_cell(key, columns[i], value)
            self._cells[key] = cells

    def select_key(self, key: str) -> None:
        if key in self._cells:
            self.move_cursor(row=self._keys.index(key), animate=False)

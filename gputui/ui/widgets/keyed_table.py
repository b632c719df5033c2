"""A DataTable with fixed columns that takes whole row sets and applies only what changed.

Textual's ``DataTable.update_cell`` bumps the table's update count, which is part of every cell's, row's and
line's render-cache key: one changed number would re-render every visible cell through Rich. ``sync`` writes
changed cells itself and drops only their cached renders, so an unchanged cell is never rendered again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

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
        changed: dict[str, list[tuple[str, Any]]] = {}
        for key, cells in rows:
            old = self._cells.get(key)
            if old == cells:
                continue
            changed[key] = [(columns[i], v) for i, v in enumerate(cells) if old is None or old[i] != v]
            self._cells[key] = cells
        if changed:
            self._write_cells(changed)

    def _write_cells(self, changed: dict[str, list[tuple[str, Any]]]) -> None:
        """Put new cell values in place and forget the cached renders of those cells and their rows only
        (the update count, part of every cache key, stays: the other cells' renders stay valid)."""
        caches = [getattr(self, n, None) for n in ("_cell_render_cache", "_row_render_cache", "_line_cache")]
        if any(c is None for c in caches) or not hasattr(self, "_row_renderable_cache"):
            for key, cells in changed.items():  # a Textual without these caches: the plain way
                for column, value in cells:
                    self.update_cell(key, column, value)
            return
        cell_cache, row_cache, line_cache = caches
        cells: set[tuple[RowKey, ColumnKey]] = set()
        for key, values in changed.items():
            row_key = RowKey(key)
            data = self._data[row_key]
            for column, value in values:
                column_key = ColumnKey(column)
                data[column_key] = value
                cells.add((row_key, column_key))
        rows = {row for row, _ in cells}
        header = self.header_height if self.show_header else 0
        offsets = self._y_offsets  # one entry per line of the table body: (row key, line in row)

        def line_row(y: int) -> RowKey | None:  # the row a line of the whole table (header included) shows
            return offsets[y - header][0] if 0 <= y - header < len(offsets) else None

        for cache, stale in (
            (cell_cache, lambda k: (k[0], k[1]) in cells),  # (row, column, styles..., update count, ...)
            (row_cache, lambda k: k[0] in rows),  # (row, line in row, styles..., update count, ...)
            (line_cache, lambda k: line_row(k[0]) in rows),  # (y, crop, cursor..., update count, ...)
        ):
            keys = cache.keys()
            for k in [k for k in keys if stale(k)]:
                cache.discard(k)
        for row in rows:  # (update count, row index)
            self._row_renderable_cache.discard((self._update_count, self._row_locations.get(row)))
        self.refresh()

    def select_key(self, key: str) -> None:
        if key in self._cells:
            self.move_cursor(row=self._keys.index(key), animate=False)

"""A line chart drawn in Unicode braille (2x4 dots a cell): several series, a legend, marked points, log or
linear y, the last N of x. Our own small renderer, not textual-plot: that one needs numpy (tens of MB, a slow
import for a pane opened now and then), and a few hundred lines of braille cover what is shown here.

Series names come from logs: they are appended as literal ``Text``, never parsed as markup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from rich.text import Text
from textual.widget import Widget

from gputui.core import safetext

Y_LABEL = 9  # characters of the y axis' labels
_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # braille dot bits by (row, column)
MARK = "◆"


class Line(NamedTuple):
    name: str  # literal text
    points: Sequence[tuple[float, float]]  # (x, y), x ascending
    color: str
    marked: bool = False  # each point is a marker (eval points), not a line


def _label(v: float, log_y: bool) -> str:
    return format(10**v if log_y else v, ".4g")[:Y_LABEL].rjust(Y_LABEL - 1)


def _segment(x0: int, y0: int, x1: int, y1: int) -> list[tuple[int, int]]:
    """The dots from (x0, y0) to (x1, y1) (Bresenham)."""
    dots, dx, dy = [], abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    err = dx + dy
    while True:
        dots.append((x0, y0))
        if x0 == x1 and y0 == y1:
            return dots
        e2 = 2 * err
        if e2 >= dy:
            err, x0 = err + dy, x0 + sx
        if e2 <= dx:
            err, y0 = err + dx, y0 + sy


def prepare(lines: Sequence[Line], log_y: bool, last_x: float | None) -> tuple[list[Line], int]:
    """The lines as drawn: log10 of y (values <= 0 left out, counted), only x within ``last_x`` of the end."""
    x_end = max((p[-1][0] for p in (ln.points for ln in lines) if p), default=0.0)
    dropped, out = 0, []
    for ln in lines:
        pts = []
        for x, y in ln.points:
            if last_x is not None and x < x_end - last_x:
                continue
            if log_y:
                if y <= 0:
                    dropped += 1
                    continue
                y = math.log10(y)
            pts.append((x, y))
        out.append(ln._replace(points=pts))
    return out, dropped


def plot(lines: Sequence[Line], width: int, height: int, x_title: str, log_y: bool = False,
         last_x: float | None = None, muted: str = "") -> Text:
    """The chart as ``width`` x ``height`` cells of text: legend, plot with y labels, x axis and its title."""
    shown, dropped = prepare(lines, log_y, last_x)
    out = Text(no_wrap=True, overflow="crop")
    legend = Text(no_wrap=True, overflow="crop")
    for ln in lines:
        legend.append(MARK if ln.marked else "━", style=ln.color)
        legend.append(" " + safetext.clean(ln.name, limit=48) + "  ")
    if dropped:
        legend.append(f"(log y: {dropped} values <= 0 left out)", style=muted)
    out.append_text(legend[:width])
    out.append("\n")
    plot_w, plot_h = max(4, width - Y_LABEL - 1), max(2, height - 3)
    xs = [x for ln in shown for x, _ in ln.points]
    ys = [y for ln in shown for _, y in ln.points]
    if not xs:
        out.append("no points to draw yet".center(width), style=muted)
        return out
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x1 - x0 < 1e-12:
        x0, x1 = x0 - 0.5, x1 + 0.5
    dots_w, dots_h = plot_w * 2, plot_h * 4
    masks = [[0] * plot_w for _ in range(plot_h)]
    colors: list[list[str | None]] = [[None] * plot_w for _ in range(plot_h)]
    marks: dict[tuple[int, int], str] = {}

    def dot(x: float, y: float) -> tuple[int, int]:
        return (round((x - x0) / (x1 - x0) * (dots_w - 1)), round((y1 - y) / (y1 - y0) * (dots_h - 1)))

    for ln in shown:
        prev: tuple[int, int] | None = None
        for x, y in ln.points:
            d = dot(x, y)
            if ln.marked:
                marks[(d[1] // 4, d[0] // 2)] = ln.color
                continue
            for cx, cy in _segment(*(prev or d), *d):
                masks[cy // 4][cx // 2] |= _BITS[cy % 4][cx % 2]
                colors[cy // 4][cx // 2] = ln.color
            prev = d
    for row in range(plot_h):
        label = (
            _label(y1 - (y1 - y0) * row / max(1, plot_h - 1), log_y)
            if row in (0, plot_h // 2, plot_h - 1)
            else ""
        )
        out.append(label.rjust(Y_LABEL - 1) + " ┤" if label else " " * Y_LABEL + "│", style=muted)
        for col in range(plot_w):
            if (row, col) in marks:
                out.append(MARK, style=marks[(row, col)])
            elif masks[row][col]:
                out.append(chr(0x2800 + masks[row][col]), style=colors[row][col] or "")
            else:
                out.append(" ")
        out.append("\n")
    out.append(" " * Y_LABEL + "└" + "─" * plot_w + "\n", style=muted)
    left, right = format(x0, ".5g"), format(x1, ".5g")
    title = safetext.clean(x_title, limit=max(0, plot_w - len(left) - len(right) - 2))
    gap = max(1, plot_w - len(left) - len(right) - len(title))
    axis = " " * (Y_LABEL + 1) + left + " " * (gap // 2) + title + " " * (gap - gap // 2) + right
    out.append(axis[:width], style=muted)
    return out


class Chart(Widget):
    """A :func:`plot` sized to the widget; ``show`` sets what it draws."""

    DEFAULT_CSS = "Chart { height: 1fr; }"

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self.lines: list[Line] = []
        self.x_title, self.log_y, self.muted = "", False, ""
        self.last_x: float | None = None

    def show(self, lines: list[Line], x_title: str, log_y: bool, last_x: float | None, muted: str) -> None:
        self.lines, self.x_title, self.log_y, self.last_x, self.muted = lines, x_title, log_y, last_x, muted
        self.refresh()

    def render(self) -> Text:
        return plot(
            self.lines, self.size.width, self.size.height, self.x_title, self.log_y, self.last_x, self.muted
        )

"""The log pane: a line-API view over a LogBuffer, with follow, search and the job's insights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input

from gputui.core import safetext
from gputui.core.session import model as M

from .. import fmt
from ..keys import LOG_KEYS
from ..logbuffer import MARK, LogBuffer
from ..palette import Palette
from .plain_input import PlainInput
from .textbox import TextBox, set_display

if TYPE_CHECKING:
    from gputui.core.insights import Hint, JobInsights


class LogView(ScrollView, can_focus=True):
    """Renders only the visible lines. Follows the end until the user scrolls up; ``f`` resumes."""

    BINDINGS = [*LOG_KEYS]
    follow: reactive[bool] = reactive(True)

    class StateChanged(Message):
        """Following, the search term or the current match changed (the pane title shows them)."""

    class SearchRequested(Message):
        pass

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.buffer: LogBuffer | None = None
        self.palette = Palette()
        self.term = ""
        self.match: int | None = None
        self._count = 0
        self._dropped = 0
        self._width = 0
        self._moving = False  # True while we scroll ourselves (not the user)

    # --- content ----------------------------------------------------------------------------------------------
    def show_buffer(self, buffer: LogBuffer | None) -> None:
        self.buffer = buffer
        self._count = self._width = 0
        self._dropped = buffer.dropped if buffer else 0
        self.match = None
        self.follow = True
        self._move(lambda: self.scroll_to(0, 0, animate=False, immediate=True, force=True))
        self.sync()

    def sync(self) -> None:
        """Take in what the buffer gained since the last call."""
        buf = self.buffer
        if buf is None:
            self.virtual_size = Size(0, 0)
            self.refresh()
            return
        dropped, self._dropped = buf.dropped - self._dropped, buf.dropped
        count = len(buf)
        start = max(0, self._count - dropped - 1)
        if count > start:
            self._width = max(self._width, buf.widest_from(start))
        self._count = count
        self.virtual_size = Size(self._width + 2, count)
        if dropped and self.match is not None:
            self.match = self.match - dropped if self.match >= dropped else None
        if self.follow:
            self._to_end()
            self.call_after_refresh(self._to_end)  # again once laid out (a scrollbar may have taken a line)
        elif dropped:
            self._move(
                lambda: self.scroll_to(y=max(0, self.scroll_y - dropped), animate=False, immediate=True)
            )
        self.refresh()

    def _move(self, fn) -> None:
        self._moving = True
        try:
            fn()
        finally:
            self._moving = False

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if not self._moving:
            follow = new_value >= self.max_scroll_y
            if follow != self.follow:
                self.follow = follow

    def _to_end(self) -> None:
        if self.follow:
            self._move(lambda: self.scroll_end(animate=False, immediate=True, x_axis=False, force=True))

    def on_resize(self) -> None:
        self._to_end()  # the pane changed height (hints appeared, search box closed): stay at the end

    def watch_follow(self, follow: bool) -> None:
        self.post_message(self.StateChanged())

    # --- rendering --------------------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.rich_style
        index = scroll_y + y
        buf = self.buffer
        if buf is None or index >= len(buf):
            return Strip.blank(width, base)
        line = buf.line(index)
        pal = self.palette
        if line.startswith(MARK):
            segments = [Segment(f"── {line[1:]} ──", base + Style(color=pal.marker, italic=True))]
        elif self.term and self.term.lower() in line.lower():
            segments = self._highlight(
                line, base + Style(bgcolor=pal.match, color="black", bold=index == self.match)
            )
        else:
            segments = [Segment(line, base)]
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, base)

    def _highlight(self, line: str, hit: Style) -> list[Segment]:
        base = self.rich_style
        low, needle = line.lower(), self.term.lower()
        out, pos = [], 0
        while (i := low.find(needle, pos)) >= 0:
            out += [Segment(line[pos:i], base), Segment(line[i : i + len(needle)], hit)]
            pos = i + len(needle)
        out.append(Segment(line[pos:], base))
        return out

    # --- actions ----------------------------------------------------------------------------------------------
    # Moving up is the user's "stop following", even when the view cannot move (e.g. before its first layout).
    def action_scroll_up(self) -> None:
        self.follow = False
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.follow = False
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self.follow = False
        super().action_scroll_home()

    def on_mouse_scroll_up(self) -> None:
        self.follow = False

    def action_follow(self) -> None:
        self.follow = True
        self._move(lambda: self.scroll_end(animate=False, immediate=True, x_axis=False, force=True))

    def action_search(self) -> None:
        self.post_message(self.SearchRequested())

    def search(self, term: str) -> bool:
        self.term = term
        self.match = None
        if not term or self.buffer is None:
            self.refresh()
            self.post_message(self.StateChanged())
            return False
        top = int(self.scroll_y)
        return self._jump(self.buffer.find(term, top, forward=True))

    def action_next_match(self) -> None:
        if self.buffer is not None and self.term:
            start = (self.match + 1) if self.match is not None else int(self.scroll_y)
            self._jump(self.buffer.find(self.term, start % max(1, len(self.buffer)), forward=True))

    def action_previous_match(self) -> None:
        if self.buffer is not None and self.term:
            start = (self.match - 1) if self.match is not None else int(self.scroll_y)
            self._jump(self.buffer.find(self.term, start % max(1, len(self.buffer)), forward=False))

    def _jump(self, index: int | None) -> bool:
        self.match = index
        if index is not None:
            self.follow = False
            target = max(0, index - self.scrollable_content_region.height // 2)
            self._move(lambda: self.scroll_to(y=target, animate=False, immediate=True, force=True))
        self.refresh()
        self.post_message(self.StateChanged())
        return index is not None

    def action_clear_search(self) -> None:
        self.term, self.match = "", None
        self.refresh()
        self.post_message(self.StateChanged())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("next_match", "previous_match", "clear_search"):
            return bool(self.term)  # else the key falls through (n: new job)
        return True


def insights_text(job: M.Job | None, ins: JobInsights | None, pal: Palette) -> Text:
    """``45% ▕████▏ ETA 3m12s · epoch 2/5 · 12.3it/s · loss 0.2340 (best 0.2100) ▁▂▃``."""
    out = Text(no_wrap=True, overflow="ellipsis")
    if ins is None:
        return out
    parts: list[Text] = []
    if ins.progress is not None:
        p = Text(f"{ins.progress * 100:.0f}% ")
        p.append(fmt.bar(ins.progress, 12), style=f"{pal.primary} on {pal.empty}")
        if ins.eta_s is not None and (job is None or job.running):
            p.append(f" ETA {fmt.duration(ins.eta_s)}")
        parts.append(p)
    if ins.epoch is not None:
        parts.append(Text(f"epoch {ins.epoch}" + (f"/{ins.total_epochs}" if ins.total_epochs else "")))
    if ins.step is not None:
        parts.append(Text(f"step {ins.step}" + (f"/{ins.total_steps}" if ins.total_steps else "")))
    if ins.rate:
        parts.append(Text(safetext.clean(ins.rate, limit=40)))
    spark_done = False
    for name, m in list(ins.metrics.items())[:4]:
        item = Text(safetext.clean(f"{name} {m['last']:.4g}", limit=80))
        if m["best"] != m["last"]:
            item.append(f" (best {m['best']:.4g})", style=pal.muted)
        if "loss" in name and ins.loss_history and not spark_done:
            spark_done = True
            item.append(" " + fmt.spark(ins.loss_history, 16), style=pal.spark)
        parts.append(item)
    for i, part in enumerate(parts):
        if i:
            out.append(" · ", style=pal.muted)
        out.append_text(part)
    return out


def hints_text(hints: list[Hint], pal: Palette) -> Text:
    out = Text(no_wrap=True, overflow="ellipsis")
    for i, h in enumerate(hints[:2]):
        if i:
            out.append("\n")
        out.append(safetext.clean(f"⚠ {h.title}: ", limit=200), style=f"bold {pal.warm}")
        out.append(safetext.clean(h.fix, limit=500))
    return out


class LogPane(Vertical):
    """Title (job, follow state, search), insights and hints, the view, and the search box (mounted at the
    first ``/``: the first frame never shows it, and styling an Input costs the start-up)."""

    def compose(self):
        yield TextBox(id="log-title")
        yield TextBox(id="log-insights")
        yield TextBox(id="log-hints")
        yield LogView(id="log-view")

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def on_mount(self) -> None:
        self.show_info(None, None, [], Palette())

    def show_info(
        self, job: M.Job | None, ins: JobInsights | None, hints: list[Hint], pal: Palette, note: str = ""
    ) -> None:
        view = self.view
        title = Text(no_wrap=True, overflow="ellipsis")
        if job is None:
            title.append(safetext.clean(note or "No job selected. Press n to start one."), style=pal.muted)
        else:
            title.append(safetext.clean(f"job {job.id} ", limit=100), style="bold")
            title.append(safetext.clean(f"{job.host} · {job.state}", limit=300), style=pal.muted)
            if job.exit_code is not None:
                title.append(f" (exit {job.exit_code})", style=pal.hot if job.exit_code else pal.muted)
            title.append(" · ", style=pal.muted)
            if view.follow:
                title.append("following", style=pal.ok)
            else:
                title.append("paused: f to follow", style=f"bold {pal.warm}")
            if view.term:
                found = "" if view.match is not None else " (no match)"
                title.append(safetext.clean(f" · /{view.term}{found} n/N", limit=200), style=pal.muted)
            title.append("   ")
            title.append(safetext.clean(fmt.job_name(job.name, job.command), limit=500), style="bold")
        self.query_one("#log-title", TextBox).show(title)
        info = insights_text(job, ins, pal)
        box = self.query_one("#log-insights", TextBox)
        box.show(info)
        set_display(box, bool(info.plain))
        hint_box = self.query_one("#log-hints", TextBox)
        hint_box.show(hints_text(hints, pal))
        set_display(hint_box, bool(hints))

    def open_search(self) -> None:
        box = next(self.query("#log-search").results(Input), None)
        if box is None:  # in the DOM at once; the focus below is queued, so it lands once the box is mounted
            box = PlainInput(self.view.term, placeholder="search: Enter to find, Esc to close", id="log-search")
            self.mount(box)
        else:
            box.display = True
            box.value = self.view.term
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close_search()
        self.view.search(event.value.strip())

    def close_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = False
        self.view.focus()

    def on_key(self, event) -> None:
        if event.key == "escape" and any(box.has_focus for box in self.query("#log-search")):
            event.stop()
            self.close_search()

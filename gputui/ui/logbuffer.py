"""A bounded, display-ready view of a job's raw log bytes (no I/O, no widgets).

Bytes arrive in any chunking. ``\\n`` ends a line, a lone ``\\r`` returns to the line start, so a tqdm
bar redrawn a thousand times is one line showing its latest state (ptys end lines with ``\\r\\n``).
ANSI escapes and other control characters (C0, C1, bidi overrides) are dropped, tabs expanded, and every line is capped before
anything else (search, rendering) looks at it. The unfinished last line is kept apart as ``partial``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gputui.core import safetext

MARK = "\x00"  # first char of a marker line (gap, reconnect, end); job output never contains it
MAX_LINES = 5000
MAX_LINE_CHARS = 2000

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = {c: None for c in safetext.DROP if c not in (0x09, 0x0A, 0x0D)}  # tabs and line ends: handled


def _last_segment(line: str) -> str:
    """What a terminal shows for a line with carriage returns: the text after the last lone ``\\r``."""
    if line.endswith("\r"):
        line = line[:-1]
    cut = line.rfind("\r")
    return line[cut + 1 :] if cut >= 0 else line


class LogBuffer:
    """Complete lines (at most ``max_lines``, oldest dropped) plus the line being written."""

    def __init__(self, max_lines: int = MAX_LINES, max_line_chars: int = MAX_LINE_CHARS) -> None:
        self.max_lines, self.max_line_chars = max_lines, max_line_chars
        self.lines: list[str] = []
        self.partial = ""
        self.dropped = 0  # lines dropped from the front so far (views keep their place with it)
        self.bytes_seen = 0
        self._tail = bytearray()  # bytes of the unfinished line, after its last carriage return
        self._tail_over = 0  # bytes of the unfinished line beyond the cap, not kept
        self._tail_cap = 4 * max_line_chars

    def __len__(self) -> int:
        return len(self.lines) + (1 if self.partial else 0)

    def line(self, index: int) -> str:
        return self.lines[index] if index < len(self.lines) else self.partial

    def widest_from(self, start: int) -> int:
        """Length of the longest line from ``start`` on (the partial line included)."""
        widest = max(map(len, self.lines[start:]), default=0) if start < len(self.lines) else 0
        return max(widest, len(self.partial))

    def iter_range(self, start: int, stop: int) -> Iterator[str]:
        for i in range(max(0, start), min(stop, len(self))):
            yield self.line(i)

    # --- input ------------------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.bytes_seen += len(data)
        nl = data.rfind(b"\n")
        if nl < 0:
            self._extend_tail(data)
            self.partial = self._tail_text()
            return
        head = bytes(self._tail) + data[:nl] if self._tail else data[:nl]
        over = self._tail_over
        self._tail.clear()
        self._tail_over = 0
        self._extend_tail(data[nl + 1 :])
        text = self._clean(head.decode("utf-8", "replace"))
        if "\r\n" in text:
            text = text.replace("\r\n", "\n")  # pty line ends; lone \r (redraws) are handled per line
        self._add(text.split("\n"), over)
        self.partial = self._tail_text()

    def mark(self, text: str) -> None:
        """Add a marker line (a gap, a reconnect, the job's end) after what is there."""
        if self.partial:
            self._add([self.partial], 0)
            self._tail.clear()
            self.partial = ""
        self._add([MARK + safetext.clean(text, limit=self.max_line_chars)], 0)

    # --- internals --------------------------------------------------------------------------------------------
    def _extend_tail(self, chunk: bytes) -> None:
        self._tail += chunk
        cut = self._tail.rfind(b"\r", 0, len(self._tail) - 1)
        if cut >= 0:
            del self._tail[: cut + 1]
            self._tail_over = 0
        if len(self._tail) > self._tail_cap:
            self._tail_over += len(self._tail) - self._tail_cap
            del self._tail[self._tail_cap :]

    def _tail_text(self) -> str:
        if not self._tail:
            return ""
        text = self._clean(self._tail.decode("utf-8", "ignore"))
        return self._cap(_last_segment(text), self._tail_over)

    def _clean(self, text: str) -> str:
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        text = text.translate(_CONTROL)
        if "\t" in text:
            text = text.expandtabs(8)
        return text

    def _cap(self, line: str, over: int = 0) -> str:
        if len(line) <= self.max_line_chars and not over:
            return line
        extra = len(line) - self.max_line_chars + over
        return line[: self.max_line_chars] + f" …[+{extra} chars]"

    def _add(self, lines: list[str], over_first: int) -> None:
        cap = self.max_line_chars
        for i, line in enumerate(lines):
            if "\r" in line:
                line = lines[i] = _last_segment(line)
            if len(line) > cap or (i == 0 and over_first):
                lines[i] = self._cap(line, over_first if i == 0 else 0)
        self.lines.extend(lines)
        excess = len(self.lines) - self.max_lines
        if excess > 0:
            del self.lines[:excess]
            self.dropped += excess

    # --- search -----------------------------------------------------------------------------------------------
    def find(self, term: str, start: int, forward: bool = True) -> int | None:
        """Index of the next line (from ``start``, wrapping around) containing ``term``, ignoring case."""
        n = len(self)
        if not term or not n:
            return None
        needle = term.lower()
        order = (
            [*range(start, n), *range(0, start)]
            if forward
            else [*range(start, -1, -1), *range(n - 1, start, -1)]
        )
        for i in order:
            if 0 <= i < n and needle in self.line(i).lower():
                return i
        return None

"""Text from a host or a user, made safe for a terminal (headless: the app and the CLI both use it).

Such text is data. It may hold markup (``[/]``, ``[@click=app.quit]``), which the UI avoids by rendering
it as ``rich.text.Text`` (never parsed), and characters a terminal acts on: ESC starting CSI/OSC sequences
(colours, OSC 52 clipboard writes, titles), other C0/C1 controls, bidi overrides that reorder what is shown,
lone surrogates left by invalid UTF-8. :func:`clean` turns each of those into a visible escape such as
``\\x1b`` or ``\\u202e``, so nothing reaches the terminal raw and the user still sees what was there.
"""

from __future__ import annotations

import codecs
import re
import sys
from typing import Any, TextIO

# C0 and DEL and C1 controls; the Arabic letter mark, LRM/RLM, bidi embeddings/overrides/isolates;
# line/paragraph separators; surrogates (what invalid UTF-8 becomes under surrogateescape).
_RANGES = ((0x00, 0x1F), (0x7F, 0x9F), (0x61C, 0x61C), (0x200E, 0x200F), (0x202A, 0x202E), (0x2066, 0x2069),
           (0x2028, 0x2029), (0xD800, 0xDFFF))
_UNSAFE = re.compile("[" + "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in _RANGES) + "]")
DROP: dict[int, None] = {c: None for a, b in _RANGES for c in range(a, b + 1)}
"""A ``str.translate`` table that drops every such character (log views keep tab and line ends aside)."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": " "}
ELLIPSIS = "…"


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: object, *, multiline: bool = False, limit: int | None = None) -> str:
    """``text`` (any object; bytes are decoded as UTF-8) with every character a terminal would act on
    shown as a visible escape; tabs become spaces. ``multiline`` keeps ``\\n`` as a line break.
    ``limit``: at most this many characters (cut before escaping, so a huge string costs little)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", "backslashreplace")
    elif not isinstance(text, str):
        text = str(text)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + ELLIPSIS
    if multiline:
        return "\n".join(_UNSAFE.sub(_escape, part) for part in text.split("\n"))
    return _UNSAFE.sub(_escape, text)


def strip(text: str) -> str:
    """``text`` without the characters :func:`clean` escapes (for log output, where they are noise)."""
    return text.translate(DROP)


class TerminalGuard:
    """A text stream to a terminal that shows the control characters of what is written as visible escapes
    (line ends pass). Bytes written to its ``buffer`` pass untouched (``gputui logs`` escapes a log for a terminal itself)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(clean(text, multiline=True))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, buffer, encoding...
        return getattr(self.stream, name)


def guard_terminal() -> None:
    """Route ``sys.stdout`` and ``sys.stderr`` through a :class:`TerminalGuard` where they are terminals, so
    host names, errors and doctor details printed by the CLI never drive the terminal."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TerminalGuard) and stream.isatty():
            setattr(sys, name, TerminalGuard(stream))


def redraw(stream: Any, text: str) -> None:
    """Draw ``text`` over what the terminal ``stream`` shows (a ``--watch`` round): from its top, each line then
    the rest of that line cleared, then everything below: no flicker. The text is cleaned first: only these
    sequences of ours drive the terminal (through a :class:`TerminalGuard`, to the terminal it guards)."""
    screen = stream.stream if isinstance(stream, TerminalGuard) else stream
    screen.write("\x1b[H" + clean(text, multiline=True).replace("\n", "\x1b[K\n") + "\x1b[J")
    screen.flush()


class LogOutput:
    """Where ``logs`` writes the job's output. A pipe or a file gets the bytes as written (one write each: no
    decoding, no copying); a terminal gets them as text whose control characters but line ends and ``\\r`` are
    shown escaped (``\\x1b[31m``; a tab becomes a space): a host's bytes never drive the terminal."""

    def __init__(self, stream: Any) -> None:
        self._out = stream.buffer
        self._encoding = stream.encoding or "utf-8"
        self._text = codecs.getincrementaldecoder("utf-8")("backslashreplace") if stream.isatty() else None

    def write(self, data: bytes, final: bool = False) -> None:
        if self._text is not None:  # a UTF-8 sequence cut between two chunks waits for its end
            text = self._text.decode(data, final)
            data = "\r".join(clean(part, multiline=True) for part in text.split("\r")).encode(
                self._encoding, "backslashreplace"
            )
        if data:
            self._out.write(data)
            self._out.flush()

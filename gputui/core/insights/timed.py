"""A cold read of a log that still knows its pace: the log's bytes fed with the times they were written.

The job's runner records when its output was written (``remote_agent/jobs/logclock.py``); feeding the bytes
between two recorded offsets with the parser's clock at the later time gives a one-shot reader (``gputui
jobs --json``) the progress rates and epoch times a parser that watched the job live has.
"""

from __future__ import annotations

from collections.abc import Sequence

from .parser import LogInsights


def timed_parser(data: bytes, base: int, times: Sequence[tuple[int, float]]) -> LogInsights:
    """A parser fed ``data`` (the log from byte ``base`` on) in pieces at the recorded ``times``
    ((offset, unix time), oldest first); without times, in one piece, as before."""
    now = [times[0][1] if times else 0.0]
    parser = LogInsights(clock=lambda: now[0])
    pos = 0
    for offset, at in times:
        cut = min(offset - base, len(data))
        now[0] = at
        if cut > pos:
            parser.feed(data[pos:cut])
            pos = cut
    if pos < len(data):
        parser.feed(data[pos:])
    return parser

"""One followed job log: the core's follow callbacks fill a queue; the app drains it a few times a second.

Nothing here touches a widget: ``drain()`` moves queued bytes into a :class:`LogBuffer` and a
:class:`LogInsights`, and the log pane renders from those.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gputui.core.session import model as M

from . import fmt
from .logbuffer import LogBuffer

if TYPE_CHECKING:
    from gputui.core.insights import JobInsights

TAIL_FROM_BYTES = 4 << 20  # logs larger than this open at their tail instead of at byte 0


class LogStream:
    """The log of ``job`` on ``session``'s host, followed from where it makes sense to start."""

    def __init__(
        self, session: Any, job: M.Job, max_lines: int = 5000, wake: Callable[[], None] = lambda: None
    ) -> None:
        self.session, self.job, self._wake = session, job, wake
        self.buffer = LogBuffer(max_lines=max_lines)
        from gputui.core.insights import LogInsights  # the parser loads with the first log shown

        self.insights = LogInsights()
        self.ended: dict[str, Any] | None = None
        self.end_seen = False  # the app has looked at ``ended``
        self.error: str | None = None
        self._queue: list[bytes | str] = []  # bytes of output, str for markers, in arrival order
        self._follow: Any = None
        self._closed = False

    @property
    def key(self) -> tuple[str, str]:
        return self.job.host, self.job.id

    @property
    def cursor(self) -> int | None:
        return getattr(self._follow, "cursor", None)

    async def start(self) -> None:
        """Start following; output arrives through the callbacks until the job ends or ``stop()``."""
        offset = 0
        try:
            if self.job.log_size > TAIL_FROM_BYTES:
                offset, data, _size = await self.session.read_log(
                    self.job.id, tail_lines=self.buffer.max_lines
                )
                self.mark(f"{offset / (1 << 20):.1f} MiB of earlier output not loaded")
                self._on_data(data)
                offset += len(data)
            if self._closed:
                return
            self._follow = await self.session.follow_log(
                self.job.id, offset, self._on_data, self._on_end, self._on_gap
            )
        except Exception as exc:  # the host is unreachable or the job is gone: say so in the pane
            self.error = str(exc) or type(exc).__name__
            self.mark(f"cannot follow this log: {self.error}")

    async def stop(self) -> None:
        self._closed = True
        if self.ended is None:
            with contextlib.suppress(Exception):
                await self.session.unfollow_log(self.job.id)

    def mark(self, text: str) -> None:
        self._queue.append(text)
        self._wake()

    def _on_data(self, data: bytes) -> None:
        if not self._closed:
            self._queue.append(data)
            self._wake()

    def _on_gap(self, message: str) -> None:
        self.mark(f"gap: {message}")

    def _on_end(self, info: dict[str, Any]) -> None:
        self.ended = info
        state, code = info.get("job_state", "ended"), info.get("exit_code")
        self.mark(f"job {state}" + (f" (exit {code})" if code is not None else ""))

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def drain(self) -> bool:
        """Move queued output into the buffer and the insights; True when anything changed."""
        if not self._queue:
            return False
        queue, self._queue = self._queue, []
        run: list[bytes] = []
        for item in queue:
            if isinstance(item, bytes):
                run.append(item)
                continue
            self._feed(b"".join(run))
            run.clear()
            self.buffer.mark(item)
        self._feed(b"".join(run))
        return True

    def _feed(self, data: bytes) -> None:
        if data:
            self.buffer.feed(data)
            self.insights.feed(data)  # every line: the parser keeps up with floods (bench/insights.py)

    def snapshot(self) -> JobInsights:
        return self.insights.snapshot()


def progress_text(ins: JobInsights | None) -> tuple[str, str]:
    """(progress, ETA) cells for a jobs table: ``45%`` and ``3m12s``, ``""`` when unknown."""
    if ins is None or ins.progress is None:
        return "", ""
    return f"{ins.progress * 100:.0f}%", fmt.duration(ins.eta_s) if ins.eta_s is not None else ""

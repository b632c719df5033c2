"""Link: the client's end of the agent protocol over any pair of byte streams."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from gputui.core.errors import ExitStatus, GputuiError, Unreachable, UsageError
from remote_agent import protocol as P

log = logging.getLogger(__name__)

READ_BYTES = 256 * 1024
#: Flow control (remote_agent/protocol.py): the window the client allows is what it received in about
#: FLOW_TARGET_S at the rate it measures, so a reply or heartbeat never queues behind much more than that.
FLOW_TARGET_S = 1.0
FLOW_MIN_WINDOW = 2 * P.FLOW_MIN_ROOM  # an agent waiting for room always gets a credit frame (see _credit)
FLOW_MAX_WINDOW = 4 * 1024 * 1024

EventHandler = Callable[[str, Any], None]


class LinkClosed(Unreachable, ConnectionError):
    """The agent channel ended (link loss, agent exit); pending requests fail with this."""


class RequestTimeout(LinkClosed):
    """The agent did not answer one request in time; the link itself stays open."""


class RequestTooLarge(UsageError, ValueError):
    """A request that would exceed the agent's frame limit: refused before sending (a usage error)."""


class AgentError(GputuiError, RuntimeError):
    """The agent answered a request with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def status(self) -> ExitStatus:  # type: ignore[override]
        return ExitStatus.NOT_FOUND if self.code == "not_found" else ExitStatus.FAILED


class ByteReader(Protocol):
    async def readline(self) -> bytes: ...

    async def read(self, n: int) -> bytes: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> Any: ...


class Link:
    """Sends requests, matches replies by id, hands pushed events to ``on_event``.

    A frame cut short by a dying link (no trailing newline) is discarded, never parsed. ``last_rx`` is when
    any byte last arrived: on a slow link a frame may take long to arrive whole while the link is alive.
    """

    def __init__(self, reader: ByteReader, writer: ByteWriter, on_event: EventHandler) -> None:
        self._reader, self._writer, self._on_event = reader, writer, on_event
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._hello: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.close_reason = "link not started"
        self.last_rx = asyncio.get_running_loop().time()
        # Flow control: bytes of whole frames received since the hello frame, and the credit given so far.
        self._rx = 0
        self._window = P.FLOW_WINDOW
        self._credit_at, self._credit_time = 0, self.last_rx

    def silent_for(self) -> float:
        """Seconds since any byte arrived from the agent."""
        return asyncio.get_running_loop().time() - self.last_rx

    async def start(self, timeout: float = 20.0) -> dict[str, Any]:
        """Start reading; return the agent's hello once it arrives."""
        self._task = asyncio.create_task(self._read_loop())
        try:
            return await asyncio.wait_for(asyncio.shield(self._hello), timeout)
        except asyncio.TimeoutError:
            self._finish(f"no hello from the agent within {timeout:.0f} s")
            raise LinkClosed(self.close_reason) from None

    async def request(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        if self.closed.is_set():
            raise LinkClosed(self.close_reason)
        req_id = next(self._ids)
        line = P.encode(P.request(req_id, op, args))
        if len(line) > P.MAX_FRAME_BYTES:
            raise RequestTooLarge(
                f"the {op} request is {len(line):,} bytes once encoded, over the agent's limit of "
                f"{P.MAX_FRAME_BYTES:,} bytes per frame: shorten it (a long command line belongs in a script)"
            )
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        try:
            try:
                self._writer.write(line)
                drain = getattr(self._writer, "drain", None)
                if drain is not None:
                    await asyncio.wait_for(drain(), timeout)
            except asyncio.TimeoutError:  # before OSError: on Python >= 3.11 it is one
                raise RequestTimeout(f"could not send {op} to the agent within {timeout:g} s") from None
            except (OSError, EOFError) as exc:
                self._finish(f"cannot send {op} to the agent: {exc or type(exc).__name__}")
                raise LinkClosed(self.close_reason) from exc
            # Waiting apart from writing: on Python >= 3.11 asyncio.TimeoutError is an OSError.
            try:
                return await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                raise RequestTimeout(f"agent did not answer {op} within {timeout:g} s") from None
        finally:
            self._pending.pop(req_id, None)

    async def _read_loop(self) -> None:
        reason = "agent closed the channel"
        buf = bytearray()
        scanned = 0  # buf[:scanned] holds no newline
        skipping = False  # inside an oversized frame: drop bytes up to its newline
        loop = asyncio.get_running_loop()
        try:
            while data := await self._reader.read(READ_BYTES):  # b"" at EOF; a cut frame stays unparsed
                self.last_rx = loop.time()
                buf += data
                start = 0
                while (end := buf.find(b"\n", scanned)) >= 0:
                    if not skipping:
                        self._line(bytes(buf[start : end + 1]))
                    self._rx += end + 1 - start
                    start = scanned = end + 1
                    skipping = False
                del buf[:start]
                scanned = len(buf)
                if len(buf) > P.MAX_FRAME_BYTES:
                    if not skipping:
                        log.warning("dropping a frame from the agent longer than %d bytes", P.MAX_FRAME_BYTES)
                    skipping = True
                    self._rx += len(buf)
                    buf.clear()
                    scanned = 0
                self._credit(loop.time())
        except asyncio.CancelledError:
            reason = "link closed"
        except Exception as exc:  # OSError, asyncssh errors, ConnectionResetError
            reason = f"link lost: {exc or type(exc).__name__}"
        self._finish(reason)

    def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            frame = P.decode(line)
        except P.ProtocolError as exc:
            if self._hello.done():  # before it: what a login script printed, not the agent
                log.warning("dropping malformed frame from agent: %s", exc)
            return
        if not self._hello.done() and frame.get("event") == P.EV_HELLO:
            self._rx = -len(line)  # the agent counts its bytes from the end of the hello frame
            self._credit_time = self.last_rx
        self._dispatch(frame)

    def _credit(self, now: float) -> None:
        """Allow the agent more log bytes once half the window arrived; size the window to the rate seen.

        An agent waiting for room has sent more than ``window - FLOW_MIN_ROOM >= window / 2`` bytes past the
        last credit, so that credit is sure to come once they arrive: no stall at any rate.
        """
        got = self._rx - self._credit_at
        if not self._hello.done() or got < self._window // 2:
            return
        rate = got / max(now - self._credit_time, 1e-3)
        # At most doubling: a burst from buffers that filled during a stall must not look like a fast link.
        wanted = min(rate * FLOW_TARGET_S, 2 * self._window, FLOW_MAX_WINDOW)
        self._window = int(max(FLOW_MIN_WINDOW, wanted))
        self._credit_at, self._credit_time = self._rx, now
        frame = {"op": P.OP_CREDIT, "args": {"upto": self._rx + self._window}}
        with contextlib.suppress(OSError, EOFError):  # a broken link shows up as EOF on the read side
            self._writer.write(P.encode(frame))

    def _dispatch(self, frame: dict[str, Any]) -> None:
        if "event" in frame:
            if frame["event"] == P.EV_HELLO and not self._hello.done():
                self._hello.set_result(frame.get("data") or {})
                return
            try:
                self._on_event(frame["event"], frame.get("data"))
            except Exception:
                log.exception("event handler failed for %s", frame["event"])
            return
        fut = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
        if fut is None or fut.done():
            if not frame.get("ok", True):
                log.warning("agent error: %s", frame.get("error"))
            return
        if frame.get("ok"):
            fut.set_result(frame.get("result"))
        else:
            err = frame.get("error") or {}
            fut.set_exception(
                AgentError(str(err.get("code", "failed")), str(err.get("message", "agent error")))
            )

    def _finish(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(LinkClosed(reason))
        if not self._hello.done():
            self._hello.set_exception(LinkClosed(reason))
            self._hello.exception()  # mark retrieved

    async def close(self, reason: str = "link closed") -> None:
        self._finish(reason)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.wait({self._task})  # never raises; a cancel of our own caller is not swallowed

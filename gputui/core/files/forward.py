"""gputui forward: a port on the host reachable at 127.0.0.1 here, over the host's one SSH connection.

The listener is ours (127.0.0.1 only) and outlives the link: each new local connection opens a TCP channel
on whatever SSH connection the session holds at that moment, so after a reconnect the forward works again
by itself. Connections open during a drop end with it (as with ``ssh -L``); the client opens new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gputui.core.errors import UsageError
from gputui.core.session.host import HostSession
from gputui.core.transport.ssh import SSHTransport
from gputui.core.transport.sshlib import asyncssh

log = logging.getLogger(__name__)

#: How long a new local connection waits for the host's link to come back before it is closed.
RECONNECT_WAIT_S = 60.0
CHUNK = 64 * 1024


#: A URL a job printed for a server on the host's own addresses (TensorBoard, Jupyter, Gradio...).
#: The tail takes only the characters a URL may hold (RFC 3986, less quotes): a control or bidi character a host
#: printed (an escape sequence, U+202E) ends the URL, so what the app copies to the clipboard is clean.
_URL = re.compile(
    r"https?://(?:localhost|127(?:\.\d{1,3}){3}|0\.0\.0\.0|\[::1?\])"
    r":(?P<port>\d{1,5})(?P<tail>[/?#][A-Za-z0-9\-._~:/?#\[\]@!$&()*+,;=%]*)?"
)
#: How much of a log ``job_urls`` looks at (the newest lines first).
URL_SCAN_LINES = 2000


@dataclass(frozen=True)
class WebUrl:
    """A URL as the job printed it; ``tail`` is its path, query (a Jupyter token) and fragment."""

    text: str
    port: int
    tail: str

    def here(self, local_port: int) -> str:
        """The same page through a forward at 127.0.0.1:``local_port``, token and all."""
        return f"http://127.0.0.1:{local_port}{self.tail or '/'}"


def job_urls(lines: Iterable[str]) -> list[WebUrl]:
    """The local web URLs in ``lines`` (given newest first), newest first, one per port."""
    found: dict[int, WebUrl] = {}
    for n, line in enumerate(lines):
        if n >= URL_SCAN_LINES:
            break
        for m in reversed(list(_URL.finditer(line))):
            port = int(m.group("port"))
            if 0 < port < 65536 and port not in found:  # a sentence's closing punctuation is not the URL's
                tail = (m.group("tail") or "").rstrip(".,;:)]")
                found[port] = WebUrl(m.group(0).rstrip(".,;:)]"), port, tail)
    return list(found.values())


class ForwardError(UsageError):
    """The forward cannot be set up; the message says why."""


async def _pipe(reader: Any, writer: Any) -> None:
    """Copy until EOF or error; then half-close the far side (bounded: one chunk at a time, with drain)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()
    except (OSError, asyncssh.Error, asyncio.IncompleteReadError):
        pass


class Forward:
    """127.0.0.1:``local_port`` here -> ``localhost:remote_port`` on the host."""

    def __init__(
        self,
        session: HostSession,
        remote_port: int,
        local_port: int = 0,
        on_error: Callable[[str], None] = log.warning,
    ) -> None:
        if not isinstance(session.transport, SSHTransport):
            raise ForwardError(f"{session.name} is this machine: no forward is needed")
        self.session, self.transport = session, session.transport
        self.remote_port, self.local_port = remote_port, local_port
        self.on_error = on_error  # a local connection that could not be forwarded, and why
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}/"

    async def start(self) -> str:
        """Listen on 127.0.0.1 (only) and keep the session reconnecting; the local URL."""
        try:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.local_port)
        except OSError as exc:
            raise ForwardError(
                f"cannot listen on 127.0.0.1:{self.local_port}: {exc.strerror or exc}"
            ) from None
        self.local_port = self._server.sockets[0].getsockname()[1]
        self.session.run_in_background()
        return self.url

    async def _open(self) -> tuple[Any, Any, asyncio.Event]:
        """A channel to the remote port on the current connection, waiting out a reconnect; with the event that
        says the link it was opened on is lost."""
        deadline = time.monotonic() + RECONNECT_WAIT_S
        while True:
            try:
                await self.session.wait_connected(max(0.1, deadline - time.monotonic()))
                link = self.session.link
                lost = link.closed if link is not None else asyncio.Event()
                remote = await asyncio.wait_for(self.transport.open_tcp("localhost", self.remote_port), 15)
                return (*remote, lost)
            except asyncssh.ChannelOpenError as exc:  # refused by sshd, or nothing listens there
                raise ForwardError(
                    f"{self.session.name} refused the forward to port {self.remote_port}: {exc.reason} (nothing "
                    "listens there yet, or the host's sshd forbids forwarding: AllowTcpForwarding)"
                ) from None
            except (OSError, asyncssh.Error, asyncio.TimeoutError, ConnectionError) as exc:
                if time.monotonic() >= deadline:
                    raise ForwardError(f"link to {self.session.name} not back: {exc}") from None
                await asyncio.sleep(0.2)

    async def _serve(self, local_r: asyncio.StreamReader, local_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                remote_r, remote_w, lost = await self._open()
            except ForwardError as exc:
                self.on_error(str(exc))
                return
            # Ends with both directions, or at once when the link it runs over is lost (a reset or a
            # blackhole): its bytes can no longer arrive, and the client's next connection goes over the new one.
            copies: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(asyncio.gather(_pipe(local_r, remote_w), _pipe(remote_r, local_w))),
                asyncio.ensure_future(lost.wait()),
            ]
            try:
                await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for each in copies:
                    each.cancel()
                await asyncio.gather(*copies, return_exceptions=True)
                remote_w.close()
        finally:
            local_w.close()
            self._tasks.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

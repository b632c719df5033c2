"""A TCP proxy that breaks links on purpose: pass, reset, blackhole, restore.

It runs its own asyncio loop in a thread, so the client under test may be a subprocess or live in the
test's own event loop. Every method is thread-safe and returns once the fault is in place.

* ``reset()``: every open connection gets a TCP RST on both sides (SO_LINGER 0), like a NAT or VPN drop.
* ``blackhole()``: open connections stay open but every byte is dropped, like a dead Wi-Fi; new
  connections wait unaccepted in the listen backlog (their SYNs "hang") until ``restore()``.
* ``restore()``: new connections pass again; connections that lost bytes are reset (the far end's TCP gives
  up eventually; here it does so at once).
* ``rate_limit(bytes_per_s)``: every connection, open or new, carries at most that many bytes a second in
  each direction (a slow link: a congested VPN, a satellite hop); ``rate_limit(None)`` lifts it. Bytes are
  delayed, never dropped, and the proxy holds little: the sender's TCP buffers fill and it slows down.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

CHUNK = 256 * 1024
SLOW_CHUNK = 1024  # bytes forwarded at a time while rate-limited: delivery stays smooth


@dataclass(eq=False)  # compared (and hashed) by identity: kept in a set
class _Conn:
    client: socket.socket
    upstream: socket.socket
    dead: bool = False  # bytes were dropped: this stream can never be valid again
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _rst(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.accepted = 0  # connections accepted so far
        self.bytes_dropped = 0
        self.rate: float | None = None  # bytes per second per direction, None: unlimited
        self._conns: set[_Conn] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy", daemon=True)
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._passing: asyncio.Event | None = None
        self._accept_task: asyncio.Task[None] | None = None

    # --- control (thread-safe) --------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._listener.close()

    def reset(self) -> None:
        self._call(self._reset(lambda c: True))

    def blackhole(self) -> None:
        self._call(self._blackhole())

    def restore(self) -> None:
        self._call(self._restore())

    def rate_limit(self, bytes_per_s: float | None) -> None:
        self.rate = bytes_per_s  # read by the pumps before every chunk

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # --- inside the proxy's loop ------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._passing = asyncio.Event()
        self._passing.set()
        self._accept_task = asyncio.create_task(self._accept_loop())

    async def _stop(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
        await self._reset(lambda c: True)

    async def _reset(self, which: Any) -> None:
        for conn in [c for c in self._conns if which(c)]:
            self._conns.discard(conn)
            for task in conn.tasks:
                task.cancel()
            _rst(conn.client)
            _rst(conn.upstream)

    async def _blackhole(self) -> None:
        assert self._passing is not None
        self._passing.clear()
        for conn in self._conns:
            conn.dead = True

    async def _restore(self) -> None:
        assert self._passing is not None
        await self._reset(lambda c: c.dead)
        self._passing.set()

    async def _accept_loop(self) -> None:
        assert self._passing is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._passing.wait()  # while blackholed, new connections wait in the backlog
            client, _ = await loop.sock_accept(self._listener)
            if not self._passing.is_set():  # accepted just as the blackhole began: it hangs too
                await self._passing.wait()
            try:
                await self._open(client)
            except Exception as exc:  # never let the accept loop die quietly
                print(f"faultproxy: dropping a connection: {exc!r}", file=sys.stderr)
                _rst(client)

    async def _open(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        client.setblocking(False)
        try:
            await loop.sock_connect(upstream, self.target)
        except OSError:
            _rst(client)
            upstream.close()
            return
        self.accepted += 1
        conn = _Conn(client, upstream)
        self._conns.add(conn)
        conn.tasks = [
            asyncio.create_task(self._pump(conn, client, upstream)),
            asyncio.create_task(self._pump(conn, upstream, client)),
        ]

    async def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        due = time.monotonic()  # when the next byte may go out under a rate limit
        try:
            while True:
                rate = self.rate
                data = await loop.sock_recv(src, SLOW_CHUNK if rate else CHUNK)
                if not data:
                    break
                if conn.dead:
                    self.bytes_dropped += len(data)
                    continue
                if not rate:
                    await loop.sock_sendall(dst, data)
                    continue
                for i in range(0, len(data), SLOW_CHUNK):  # what a read before the limit began got, too
                    piece = data[i : i + SLOW_CHUNK]
                    due = max(due, time.monotonic()) + len(piece) / rate
                    await asyncio.sleep(due - time.monotonic())
                    await loop.sock_sendall(dst, piece)
        except OSError:
            pass
        if conn.dead:
            return  # a dead path tells nobody anything; restore() or stop() resets it
        self._conns.discard(conn)
        for task in conn.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.close()

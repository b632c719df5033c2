"""The session service's process: ``python -m gputui.service.server CONFIG [--default]`` (started by a command,
detached). It holds the fleet of one config file, connected on first use and kept while commands come, and
answers ``gputui status``, ``jobs``, ``history``, ``logs``, ``kill -y`` and ``release -y`` over a Unix socket: one
JSON request line, one JSON answer, per connection, with a newline every ``TICK_S`` before it while at work; a
``logs`` answer is a JSON header line, then frames (``client.FRAME``) of the log's bytes, the last one the exit
status. A client is sent at most ``FLOW_HIGH`` bytes more than it has taken.

Trust: the socket is 0600 in a 0700 dir of the user's (``address.runtime_dir``), every peer's uid is checked
(SO_PEERCRED), and no TCP port is opened. A request names only a form of ``status``, ``jobs``, ``history``,
``logs``, ``kill`` or ``release`` (a host of the config and a job): the service reaches the hosts of its config
and nothing else, with the direct command's own code (host key checks included), and its answer is that code's
output and exit status, byte for byte. It exits when no command came for ``service_idle_minutes`` (closing
every connection), when asked (``gputui service stop``), and after its last request once a command of another
build came. A lock held for its whole life keeps it one per key."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputui.core import paths, safetext
from gputui.core.config import file as cfg
from gputui.core.errors import ExitStatus, GputuiError, Unreachable
from gputui.core.hosts.fleet import Fleet
from gputui.core.session import model as M
from gputui.core.session.gather import gather_hosts
from gputui.core.session.host import HostSession

from .address import build_id, lock_path, peer_uid, socket_path
from .client import DATA, END, FRAME, GAP, KEEPALIVE, SEEK

log = logging.getLogger("gputui.service")
MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
LOOK_EVERY_S = 60.0  # a host that does not answer: its provider is asked at most this often
METRICS_S = 1.0  # each host streams its metrics this often while the service holds it (as to the app)
STALE_S = 3.0  # a host whose snapshot is older than this is sampled afresh before the answer
LOG_MAX_BYTES = 1024 * 1024
FORMS = ("json", "short", "text")
STATUS_FORMS = (*FORMS, "json-line")  # (json-line: a status --watch round to a pipe)
FLOW_HIGH = 4 * 1024 * 1024  # a client's bytes not yet taken that the service holds at most (plus one chunk)
STALL_S = 300.0  # a client that takes nothing for this long is let go (it goes on directly from its offset)
KEEPALIVE_S = 20.0  # a follow with nothing to say tells its client it is alive this often
TICK_S = 1.0  # until its answer (or a log's header) is ready, a client is sent a newline this often (client.QUIET_S)
MAX_TAIL = 10_000_000  # as ``gputui logs --tail``


class Service:
    def __init__(self, config: Path, default: bool) -> None:
        self.config, self.default = config, default
        self.build = build_id()
        self.started = time.time()
        self.last_used = time.monotonic()
        self.served = 0
        self.busy = 0
        self.following: set[tuple[str, str]] = set()  # (host, job) of the logs followed now (one client each)
        self.streams = 0  # logs being sent now
        self.stop = asyncio.Event()
        self.retiring = False
        self.fleet: Fleet | None = None
        self.stamp: tuple[int, int, int] | None = None  # the config file as the fleet was built from it
        self.probing: asyncio.Task[Any] | None = None
        self.releasing: dict[str, asyncio.Lock] = {}  # per host: its releases one after the other
        self.idle_s = 600.0

    # --- the fleet ------------------------------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.config.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    async def current_fleet(self) -> Fleet:
        """The fleet of the config as it is now (after an edit, the hosts it changed connect again; the others
        keep their link); a config that does not load raises ``ConfigError`` (the command then says it, directly)."""
        stamp = self._stamp()
        if self.fleet is not None:
            self.fleet.ledger.merge_saved()  # a release (or start) a command saved meanwhile
        if self.fleet is not None and stamp == self.stamp:
            return self.fleet
        config = cfg.load(None if self.default else str(self.config))
        if self.fleet is None:
            self.fleet = Fleet(config, metrics_interval=METRICS_S)
        else:
            added, removed = await self.fleet.reconfigure(config)  # the hosts the edit did not change keep their link
            log.info("config changed: hosts started %s, closed %s", added, removed)
        self.stamp = stamp
        self.idle_s = config.service_idle_minutes * 60.0
        return self.fleet

    async def probe(self) -> tuple[dict[str, M.HostSnapshot], dict[str, object]]:
        """Every host as its kept link shows it: connected first where it is not (with its job list), its
        metrics streamed every ``METRICS_S`` and sampled afresh where none came for a while. Requests at the
        same time share one probe."""
        if self.probing is None or self.probing.done():
            self.probing = asyncio.ensure_future(self._probe(await self.current_fleet()))
        return await asyncio.shield(self.probing)

    async def as_it_is(self) -> tuple[dict[str, M.HostSnapshot], dict[str, object]]:
        """``status --now``: every host as the service has it this moment (its metrics stream keeps a connected
        one live), waiting on none; a probe is started for the next answer. A host whose last connect failed is
        said with its error, as ``probe`` would."""
        fleet = await self.current_fleet()
        if self.probing is None or self.probing.done():
            self.probing = asyncio.ensure_future(self._probe(fleet))
            self.probing.add_done_callback(lambda t: t.cancelled() or t.exception())  # said by the next probe
        snaps = {name: fleet.with_cost(s.snapshot) for name, s in fleet.sessions.items()}
        return snaps, {name: Unreachable(s.error or "no answer") if s.state == M.ERROR else None
                       for name, s in snaps.items()}

    async def _probe(self, fleet: Fleet) -> tuple[dict[str, M.HostSnapshot], dict[str, object]]:
        async def look(s: HostSession) -> None:  # connected first (the job list and the metrics stream with it)
            snap = s.snapshot  # (just connected: the stream's first sample may not have come yet)
            if snap.metrics is None or time.time() - snap.updated_at > STALE_S:
                await s.sample()
            if s.scheduler == "slurm" and snap.cluster is None:
                await s.cluster_info()  # (then kept fresh with the metrics)

        results = await gather_hosts(fleet, list(fleet.sessions), look)
        await fleet.look_down(LOOK_EVERY_S)
        return {name: fleet.with_cost(fleet.sessions[name].snapshot) for name in results}, dict(results)

    # --- requests -------------------------------------------------------------------------------------------
    async def answer(self, request: dict[str, Any], reader: asyncio.StreamReader | None = None,
                     writer: asyncio.StreamWriter | None = None,
                     begun: Callable[[], None] | None = None) -> dict[str, Any] | None:
        """The reply to ``request``; None where it was sent as a stream (``logs``) on ``writer``, calling
        ``begun()`` before its first byte."""
        op = request.get("op")
        width = request.get("columns")
        columns = width if isinstance(width, int) and not isinstance(width, bool) and 20 <= width <= 1000 else 80
        if request.get("build") != self.build:
            self.retiring = True  # a command of another build: it goes direct; this service ends after its requests
            return {"direct": "another build"}
        if op == "status" and request.get("form") in STATUS_FORMS:
            try:
                snaps, results = await (self.as_it_is() if request.get("now") is True else self.probe())
            except cfg.ConfigError:
                return {"direct": "the config does not load"}
            from gputui.cli.fleet import show_status

            return self.printed(columns, show_status, snaps, results, str(request["form"]))
        if op in ("jobs", "history") and isinstance(request.get("host"), (str, type(None))) and request.get("form") in FORMS:
            return await self.jobs(op, request.get("host"), request["form"] == "json", columns)
        if op == "logs" and reader is not None and writer is not None:
            return await self.logs(request, reader, writer, begun or (lambda: None))
        if op == "kill":
            return await self.kill(request)
        if op == "release":
            return await self.release(request)
        if op == "info":
            return self.info()
        if op == "stop":
            self.stop.set()
            return {"stopped": True}
        return {"direct": f"unknown op {str(op)[:40]!r}"}

    async def jobs(self, op: str, host: str | None, as_json: bool, columns: int) -> dict[str, Any]:
        """``gputui jobs`` or ``gputui history`` (``[HOST] [--json]``) over the kept links; an unknown host is the
        command's to say."""
        from gputui.cli.common import CliError, host_names
        from gputui.cli.jobs import show_history, show_jobs
        from gputui.core.jobs import group as job_group
        from gputui.core.jobs.usecases import collect_history, collect_jobs

        try:
            fleet = await self.current_fleet()
            names = host_names(fleet.config, host)
        except (cfg.ConfigError, CliError):
            return {"direct": "the command says what is wrong"}
        if op == "history":
            records, errors = await collect_history(fleet, fleet.config, names)
            return self.printed(columns, show_history, records, errors, as_json)
        jobs, errors = await collect_jobs(fleet, names)
        return self.printed(columns, show_jobs, job_group.merge_parts(jobs), errors, as_json)

    @staticmethod
    def printed(columns: int, show: Any, *args: Any) -> dict[str, Any]:
        """What ``show`` prints, as the command would print it on its terminal (``columns`` wide), and its exit
        status. Nothing awaits in here: no other request's output or width can mix in."""
        out, err = io.StringIO(), io.StringIO()
        before = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = str(columns)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = show(*args)
        finally:
            if before is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = before
        return {"out": out.getvalue(), "err": err.getvalue(), "rc": int(rc)}

    async def kill(self, request: dict[str, Any]) -> dict[str, Any]:
        """``gputui kill HOST JOB --yes [--grace S]`` as ``cmd_kill`` does it, carried out to its end even when the
        command goes away meanwhile; a job over several hosts is the command's to kill."""
        from gputui.cli.common import job_errors
        from gputui.cli.jobs import kill_line
        from gputui.core.jobs import group as job_group
        from gputui.core.session.host import MAX_KILL_GRACE_S

        host, job, grace = request.get("host"), request.get("job"), request.get("grace")
        if not (isinstance(host, str) and isinstance(job, str) and isinstance(grace, (int, float))
                and not isinstance(grace, bool) and 0 <= grace <= MAX_KILL_GRACE_S):
            return {"direct": "a kill request the command reads itself"}
        try:
            session = (await self.current_fleet()).session(host)
        except cfg.ConfigError:
            return {"direct": "the command says what is wrong"}
        try:
            with job_errors(host):
                await session.ensure_connected()
                if job_group.group_of(await session.get_job(job)) is not None:
                    return {"direct": "a job over several hosts"}
                killed = await session.kill_job(job, float(grace))
        except GputuiError as exc:
            return said(exc)
        return {"out": kill_line(host, killed) + "\n", "err": "", "rc": 0}

    async def release(self, request: dict[str, Any]) -> dict[str, Any]:
        """``gputui release HOST --yes [--force] [--no-pull]`` as ``cmd_release`` does it, carried out to its end
        even when the command goes away meanwhile; releases of one host are carried out one after the other.
        Once begun it is never handed back to the command (which would ask again): an unexpected failure is
        said as the release's failure."""
        from gputui.cli.release import UNCONFIRMED, release

        host, force, pull = request.get("host"), request.get("force"), request.get("pull")
        if not (isinstance(host, str) and isinstance(force, bool) and (pull is None or pull is False)):
            return {"direct": "a release request the command reads itself"}  # --pull pulls into its own dir
        try:
            fleet = await self.current_fleet()
        except cfg.ConfigError:
            return {"direct": "the command says what is wrong"}
        warned: list[str] = []
        args = argparse.Namespace(host=host, yes=True, force=force, pull=pull)
        async with self.releasing.setdefault(host, asyncio.Lock()):
            try:
                lines = await release(args, fleet, warned.append)
            except GputuiError as exc:
                return {**said(exc), "err": "".join(f"{line}\n" for line in warned) + f"gputui: {exc}\n"}
            except Exception as exc:
                log.exception("release of %s failed", host)
                return {"out": "", "err": f"gputui: {host}: the release failed in the session service "
                        f"({type(exc).__name__}); it is NOT confirmed: {UNCONFIRMED}\n", "rc": int(ExitStatus.FAILED)}
        return {"out": "".join(f"{line}\n" for line in lines), "err": "".join(f"{line}\n" for line in warned), "rc": 0}

    async def logs(
        self, request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        begun: Callable[[], None],
    ) -> dict[str, Any] | None:
        """``gputui logs HOST JOB [--tail N] [-f]`` as ``cmd_logs`` does it, its bytes sent as frames at the pace
        the client takes them; an error before the first byte is the one-line reply, a host link lost on the
        way tells the client to go on directly from its offset. None once sent."""
        from gputui.cli.common import job_errors

        host, job, tail, follow = request.get("host"), request.get("job"), request.get("tail"), request.get("follow")
        if not (isinstance(host, str) and isinstance(job, str) and isinstance(follow, bool) and (tail is None or (
                isinstance(tail, int) and not isinstance(tail, bool) and 0 <= tail <= MAX_TAIL))):
            return {"direct": "a logs request the command reads itself"}
        if follow and (host, job) in self.following:
            return {"direct": "another command follows this log"}  # a host follows a job's log once per link
        try:
            session = (await self.current_fleet()).session(host)
        except cfg.ConfigError:
            return {"direct": "the command says what is wrong"}
        stream = LogStream(reader, writer)
        offset, first = 0, b""
        try:
            with job_errors(host):
                await session.ensure_connected()
                if tail is not None:
                    offset, first, _ = await session.read_log(job, tail_lines=tail)
        except GputuiError as exc:
            return said(exc)
        self.streams += 1
        if follow:
            self.following.add((host, job))
        try:
            begun()
            stream.start(offset, first)
            with job_errors(host):
                if follow:
                    reply = await self.follow(session, job, offset + len(first), stream)
                else:
                    await session.copy_log(job, offset + len(first), stream.data, stream.pace)
                    reply = {"out": "", "err": "", "rc": 0}
        except GputuiError as exc:
            reply = {"direct": "the host's link was lost"} if isinstance(exc, Unreachable) else said(exc)
        except ConnectionError:  # the client went away, or took nothing for STALL_S
            reply = None
        finally:
            self.streams -= 1
            self.following.discard((host, job))
        stream.end(reply)
        return None

    async def follow(self, session: HostSession, job: str, offset: int, stream: LogStream) -> dict[str, Any] | None:
        """``logs -f``: the log from ``offset`` until the job ends (its exit status as ``job_exit`` says it). A
        client that has not taken ``FLOW_HIGH`` bytes stops the host's follow until it has (the agent channel is
        every request's: it is never left unread); one that goes away ends it."""
        from gputui.cli.common import job_exit

        stream.may_drop = True
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        gone: asyncio.Future[Any] = asyncio.ensure_future(stream.reader.read(1))  # b"" once the client left

        def end(info: dict[str, Any]) -> None:
            if not done.done():
                done.set_result(info)

        def data(chunk: bytes) -> None:  # the follow's cursor is the chunk's end: the client is told any jump
            at = session.log_cursor(job)
            stream.data(chunk, None if at is None else at - len(chunk))

        def gap(message: str) -> None:  # after a reset the cursor is the log's new start already
            stream.gap(message, session.log_cursor(job))

        try:
            while True:
                link = session.link
                if link is None:
                    return {"direct": "the host's link was lost"}
                ended: asyncio.Future[Any] = asyncio.ensure_future(link.closed.wait())
                following = await session.follow_log(job, offset, data, end, gap, stream.pace)
                try:
                    while not (done.done() or gone.done() or ended.done()):
                        if stream.full.is_set():
                            if following.catchup is None:
                                break  # paused below
                            stream.full.clear()  # the catch-up paces itself
                        filled: asyncio.Future[Any] = asyncio.ensure_future(stream.full.wait())
                        try:
                            woke, _ = await asyncio.wait({done, gone, ended, filled}, timeout=KEEPALIVE_S,
                                                         return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            filled.cancel()
                        if not woke:
                            stream.keepalive()
                finally:
                    ended.cancel()
                    await session.unfollow_log(job)  # no-op once it ended
                    dropped, stream.dropping = stream.dropping, False
                    offset = stream.offset  # the first byte the client did not get: the follow goes on there
                if done.done() and not dropped:
                    return self.printed(80, job_exit, done.result())
                if done.done():  # the end came after bytes not sent yet: it comes again after them
                    done = asyncio.get_running_loop().create_future()
                if gone.done():
                    return None
                if link.closed.is_set():
                    return {"direct": "the host's link was lost"}
                await stream.pace()  # the client takes what it has (or is let go), then the follow goes on
        finally:
            gone.cancel()

    def info(self) -> dict[str, Any]:
        sessions = self.fleet.sessions if self.fleet is not None else {}
        rss = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
        return {"pid": os.getpid(), "config": str(self.config), "build": self.build, "started": self.started,
                "requests": self.served, "clients": self.busy - 1, "streams": self.streams, "rss_mib": rss,
                "idle_minutes": self.idle_s / 60.0,
                "hosts": {name: ("connected" if s.connected else s.snapshot.state) for name, s in sessions.items()}}

    async def serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        self.busy += 1
        try:
            if peer_uid(sock) != os.getuid():  # the 0700 dir keeps others out; this is the second lock
                return
            try:
                line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
                request = json.loads(line)
            except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError, ConnectionError):
                return
            if not isinstance(request, dict):
                return
            ticking = asyncio.ensure_future(tick(writer))
            try:
                reply = await self.answer(request, reader, writer, ticking.cancel)
            except Exception as exc:  # anything unexpected: the command goes direct, the service goes on
                log.exception("request %s failed", str(request.get("op"))[:40])
                reply = {"direct": f"the service failed: {type(exc).__name__}"}
            finally:
                ticking.cancel()
            if reply is None or "rc" in reply:  # a command answered (not info, stop, or "go direct")
                self.served += 1
            if reply is None or writer.is_closing():
                return
            writer.write(json.dumps(reply).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            self.busy -= 1
            self.last_used = time.monotonic()
            writer.close()  # what is still buffered goes first
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), STALL_S)
            writer.transport.abort()  # a client that never took it is cut off (nothing to do once closed)

    async def run(self) -> None:
        path = socket_path(self.config)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # the lock is ours: a socket there is a dead service's
        old = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self.serve_one, path=str(path), limit=MAX_REQUEST)
        finally:
            os.umask(old)
        inode = path.stat().st_ino
        log.info("serving %s on %s (build %s, pid %d)", self.config, path, self.build, os.getpid())
        try:
            while not self.stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 1.0)
                idle = self.busy == 0 and time.monotonic() - self.last_used > self.idle_s
                if idle or (self.retiring and self.busy == 0):
                    log.info("exiting: %s", "idle" if idle else "a command of another build came")
                    break
        finally:
            server.close()
            with contextlib.suppress(OSError):
                if path.stat().st_ino == inode:
                    path.unlink()
            if self.fleet is not None:
                await self.fleet.close()


async def tick(writer: asyncio.StreamWriter) -> None:
    """A newline every ``TICK_S`` (whitespace before the JSON answer): the service is at work, not stuck."""
    while not writer.is_closing():
        await asyncio.sleep(TICK_S)
        writer.write(b"\n")


def said(exc: GputuiError) -> dict[str, Any]:
    """The reply of a command that failed with ``exc``: what the direct command prints and its exit status."""
    return {"out": "", "err": f"gputui: {exc}\n", "rc": int(exc.status)}


class LogStream:
    """One ``logs`` reply as it goes to its client: the header line, then ``FRAME``s; ``full`` once the client
    has ``FLOW_HIGH`` bytes or more not yet taken. ``offset`` is the log's offset of the next byte the client
    gets: where the log's bytes jump (a reset, a gap), a ``SEEK`` frame tells the client the new one. A follow's
    chunks (and gaps) that come while it has twice ``FLOW_HIGH`` are dropped (``dropping``): the follow is
    stopped and goes on from ``offset``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.full = asyncio.Event()
        self.offset = 0
        self.dropping = False
        self.may_drop = False  # a follow's (it resumes from an offset); never a copy's (paced chunk by chunk)
        writer.transport.set_write_buffer_limits(high=FLOW_HIGH)

    def start(self, offset: int, first: bytes) -> None:
        """The header (the log's offset of the first byte sent), and the first bytes (``--tail``'s)."""
        self.writer.write(json.dumps({"offset": offset}).encode() + b"\n")
        self.offset = offset
        if first:
            self.data(first)

    def _frame(self, kind: bytes, payload: bytes) -> None:
        if not self.writer.is_closing():  # a client gone: nothing piles up for it
            self.writer.writelines([FRAME.pack(kind, len(payload)), payload])
            if self.writer.transport.get_write_buffer_size() >= FLOW_HIGH:
                self.full.set()

    def _dropped(self) -> bool:
        """Whether what comes now is dropped, to come again after the pause (the agent pushed it faster than
        the client takes it)."""
        if self.may_drop and not self.dropping and self.writer.transport.get_write_buffer_size() >= 2 * FLOW_HIGH:
            self.dropping = True
        return self.dropping

    def _seek(self, at: int | None) -> None:
        if at is not None and at != self.offset:
            self._frame(SEEK, str(at).encode())
            self.offset = at

    def data(self, chunk: bytes, at: int | None = None) -> None:
        """``chunk`` of the log, from its offset ``at`` (None: the next byte's)."""
        if not self._dropped():
            self._seek(at)
            self._frame(DATA, chunk)
            self.offset += len(chunk)

    def gap(self, message: str, at: int | None = None) -> None:
        """A gap's message, the log going on at ``at`` after it (None: not known yet). One that comes while the
        follow's bytes are dropped is too: the follow, gone on from ``offset``, finds it again."""
        if not self._dropped():
            self._frame(GAP, message.encode())
            self._seek(at)

    def keepalive(self) -> None:
        if not self.full.is_set():
            self._frame(KEEPALIVE, b"")

    def end(self, reply: dict[str, Any] | None) -> None:
        """The last frame: the exit status and stderr, or ``direct`` (the client goes on itself)."""
        if reply is not None:
            self._frame(END, json.dumps(reply).encode())

    async def pace(self) -> None:
        """Return once the client holds less than ``FLOW_HIGH`` bytes not taken; ConnectionError when it went
        away or took nothing for ``STALL_S`` (it is let go: it goes on directly from its offset)."""
        if self.writer.is_closing():
            raise ConnectionResetError("the command went away")
        try:
            await asyncio.wait_for(self.writer.drain(), STALL_S)
        except asyncio.TimeoutError:
            self.writer.transport.abort()
            raise ConnectionResetError(f"the command took nothing for {STALL_S:g} s") from None
        self.full.clear()


def _log_to_file() -> None:
    state = paths.state_dir()
    paths.make_dirs(state)
    logging.basicConfig(level=logging.INFO, handlers=[log_handler(state / "service.log")])


def log_handler(file: Path) -> logging.Handler:
    """The service's log: at most ``LOG_MAX_BYTES`` and one older file beside it however long the service runs
    (a prompt that asks every few seconds keeps it up for weeks), each record's text cleaned of anything a
    terminal would act on (an error may quote a host)."""
    from logging.handlers import RotatingFileHandler

    handler = RotatingFileHandler(file, maxBytes=LOG_MAX_BYTES, backupCount=1)
    handler.setFormatter(_CleanFormatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    return handler


class _CleanFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return safetext.clean(super().format(record), multiline=True)


def main(argv: list[str]) -> int:
    config, default = Path(argv[0]), "--default" in argv[1:]
    lock = os.open(lock_path(config), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)  # held until the end
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another service of this key runs
    _log_to_file()
    asyncio.run(Service(config, default).run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The session service's process: ``python -m gputui.service.server CONFIG [--default]`` (started by a command,
detached). It holds the fleet of one config file, connected on first use and kept while commands come, and
answers ``gputui status``, ``jobs`` and ``history`` over a Unix socket: one JSON request line, one JSON answer, per connection.

Trust: the socket is 0600 in a 0700 dir of the user's (``address.runtime_dir``), every peer's uid is checked
(SO_PEERCRED), and no TCP port is opened. A request names only a form of ``status``, ``jobs`` or ``history``: the service reaches the
hosts of its config and nothing else, with the direct command's own code (host key checks included), and its
answer is that code's output and exit status, byte for byte. It exits when no command came for
``service_idle_minutes`` (closing every connection), when asked (``gputui service stop``), and after its
last request once a command of another build came. A lock held for its whole life keeps it one per key."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from gputui.core import paths
from gputui.core.config import file as cfg
from gputui.core.hosts.fleet import Fleet
from gputui.core.session import model as M
from gputui.core.session.gather import gather_hosts
from gputui.core.session.host import HostSession

from .address import build_id, lock_path, peer_uid, socket_path

log = logging.getLogger("gputui.service")
MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT_S = 10.0
LOOK_EVERY_S = 60.0  # a host that does not answer: its provider is asked at most this often
METRICS_S = 1.0  # each host streams its metrics this often while the service holds it (as to the app)
STALE_S = 3.0  # a host whose snapshot is older than this is sampled afresh before the answer
LOG_MAX_BYTES = 1024 * 1024
FORMS = ("json", "short", "text")


class Service:
    def __init__(self, config: Path, default: bool) -> None:
        self.config, self.default = config, default
        self.build = build_id()
        self.started = time.time()
        self.last_used = time.monotonic()
        self.served = 0
        self.busy = 0
        self.stop = asyncio.Event()
        self.retiring = False
        self.fleet: Fleet | None = None
        self.stamp: tuple[int, int, int] | None = None  # the config file as the fleet was built from it
        self.probing: asyncio.Task[Any] | None = None
        self.idle_s = 600.0

    # --- the fleet ------------------------------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.config.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    async def current_fleet(self) -> Fleet:
        """The fleet of the config as it is now (built again, its connections with it, after an edit); a
        config that does not load raises ``ConfigError`` (the command then says it, directly)."""
        stamp = self._stamp()
        if self.fleet is not None and stamp == self.stamp:
            return self.fleet
        config = cfg.load(None if self.default else str(self.config))
        if self.fleet is not None:
            log.info("config changed: connecting again")
            await self.fleet.close()
        self.fleet, self.stamp = Fleet(config, metrics_interval=METRICS_S), stamp
        self.idle_s = config.service_idle_minutes * 60.0
        return self.fleet

    async def probe(self) -> tuple[dict[str, M.HostSnapshot], dict[str, object]]:
        """Every host as its kept link shows it: connected first where it is not (with its job list), its
        metrics streamed every ``METRICS_S`` and sampled afresh where none came for a while. Requests at the
        same time share one probe."""
        if self.probing is None or self.probing.done():
            self.probing = asyncio.ensure_future(self._probe(await self.current_fleet()))
        return await asyncio.shield(self.probing)

    async def _probe(self, fleet: Fleet) -> tuple[dict[str, M.HostSnapshot], dict[str, object]]:
        async def look(s: HostSession) -> None:  # connected first (the job list and the metrics stream with it)
            if time.time() - s.snapshot.updated_at > STALE_S:
                await s.sample()

        results = await gather_hosts(fleet, list(fleet.sessions), look)
        await fleet.look_down(LOOK_EVERY_S)
        return {name: fleet.with_cost(fleet.sessions[name].snapshot) for name in results}, dict(results)

    # --- requests -------------------------------------------------------------------------------------------
    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        width = request.get("columns")
        columns = width if isinstance(width, int) and not isinstance(width, bool) and 20 <= width <= 1000 else 80
        if request.get("build") != self.build:
            self.retiring = True  # a command of another build: it goes direct; this service ends after its requests
            return {"direct": "another build"}
        if op == "status" and request.get("form") in FORMS:
            try:
                snaps, results = await self.probe()
            except cfg.ConfigError:
                return {"direct": "the config does not load"}
            from gputui.cli.fleet import show_status

            return self.printed(columns, show_status, snaps, results, str(request["form"]))
        if op in ("jobs", "history") and isinstance(request.get("host"), (str, type(None))) and request.get("form") in FORMS:
            return await self.jobs(op, request.get("host"), request["form"] == "json", columns)
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

    def info(self) -> dict[str, Any]:
        sessions = self.fleet.sessions if self.fleet is not None else {}
        rss = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
        return {"pid": os.getpid(), "config": str(self.config), "build": self.build, "started": self.started,
                "requests": self.served, "clients": self.busy - 1, "rss_mib": rss, "idle_minutes": self.idle_s / 60.0,
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
            try:
                reply = await self.answer(request)
            except Exception as exc:  # anything unexpected: the command goes direct, the service goes on
                log.exception("request %s failed", str(request.get("op"))[:40])
                reply = {"direct": f"the service failed: {type(exc).__name__}"}
            if "rc" in reply:  # a command answered (not info, stop, or "go direct")
                self.served += 1
            writer.write(json.dumps(reply).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            self.busy -= 1
            self.last_used = time.monotonic()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

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


def _log_to_file() -> None:
    state = paths.state_dir()
    paths.make_dirs(state)
    file = state / "service.log"
    with contextlib.suppress(OSError):
        if file.stat().st_size > LOG_MAX_BYTES:
            file.replace(file.with_suffix(".log.1"))
    handler = logging.FileHandler(file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


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

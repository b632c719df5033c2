"""The command's side of the session service (stdlib only: no asyncio, no asyncssh): answer ``gputui status``
(and ``jobs``, ``history``, ``logs``, ``kill``) from the service of this config file and environment, or say the command
must go on directly, starting a service for the next command when there is none."""

from __future__ import annotations

import atexit
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

from .address import UnsafeDir, build_id, peer_cred, peer_uid, runtime_dir, socket_path

CONNECT_TIMEOUT_S = 2.0
#: A service that sends nothing for this long before its answer is stuck (stopped, its loop blocked): the command
#: goes on directly. A service at work says so with a newline (``server.TICK_S``) until its answer is ready.
QUIET_S = 10.0
MAX_REPLY = 64 * 1024 * 1024
MAX_HEADER = 64 * 1024
#: A ``logs`` answer after its JSON header line: frames of a kind byte and a payload's length, then the payload.
FRAME = struct.Struct(">cI")
DATA, GAP, KEEPALIVE, END = b"d", b"g", b"k", b"e"  # log bytes; a gap's message; alive; the final JSON reply
SEEK = b"s"  # the log's offset of the next bytes, in ASCII digits: they do not follow the last (a log reset)
SILENT_S = 90.0  # a service that sends no frame (data or keepalive) for this long is gone: go on directly
TYPE_CHECKING = False  # (typing.TYPE_CHECKING: a command's light side never imports typing)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, BinaryIO


def config_path(explicit: str | None) -> Path:
    """The config file a command reads (``gputui.core.config.file.resolve_path``'s order), absent or not."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("GPUTUI_CONFIG"):
        return Path(os.environ["GPUTUI_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gputui" / "config.toml"


def ask(config: Path, request: dict[str, Any], quiet_s: float = QUIET_S) -> dict[str, Any] | None:
    """The service's answer to ``request``; None when there is none to ask or it cannot answer (no service,
    one of another build, a socket that is not this user's, a broken answer, nothing from it for ``quiet_s``)."""
    sock = connect(config)
    if sock is None:
        return None
    with sock:
        sock.settimeout(quiet_s)
        try:
            _send(sock, request)
        except OSError:
            return None
        reply = _reply(sock)
    return reply if reply is not None and "direct" not in reply else None


def _send(sock: socket.socket, request: dict[str, Any]) -> None:
    """``request`` as the one JSON line the service reads, with this command's build."""
    sock.sendall(json.dumps({**request, "build": build_id()}).encode() + b"\n")


def _reply(sock: socket.socket) -> dict[str, Any] | None:
    """The service's one JSON answer on ``sock`` (read to its end; the newlines it sends while at work are
    JSON's whitespace); None when none came whole (it went away, went quiet, or sent something else)."""
    chunks, size = [], 0
    try:
        while size <= MAX_REPLY:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        reply = json.loads(b"".join(chunks)) if size <= MAX_REPLY else None
    except TimeoutError:
        _went_quiet(sock)
        return None
    except (OSError, ValueError):
        return None
    return reply if isinstance(reply, dict) else None


#: The pid of a service this command found taking connections but saying nothing for ``QUIET_S`` (stuck).
quiet: list[int] = []


def _went_quiet(sock: socket.socket) -> None:
    cred = peer_cred(sock)
    if cred is not None:
        quiet.append(cred[0])


#: Why no service could be used that the user must hear of: a runtime dir or a socket that is not theirs.
refused: list[str] = []


def _say_why() -> None:
    """Where the command goes on directly after a service went quiet, or where a dir or socket that is not the
    user's was refused: say why, and what to do."""
    if quiet:
        print(f"gputui: the session service (pid {quiet[0]}) said nothing for {QUIET_S:g} s: going on without it "
              "(gputui service stop ends it)", file=sys.stderr)
    for reason in refused[:1]:
        print(f"gputui: {reason}", file=sys.stderr)


def connect(config: Path) -> socket.socket | None:
    """A connection to the service of ``config``, checked to be this user's; None where there is none."""
    try:
        path = socket_path(config)
    except UnsafeDir as exc:
        refused.append(f"{exc}: no session service is used (make it 0700 and yours, or remove it)")
        return None
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(str(path))
    except OSError:  # none running (or a stale socket a new service will replace)
        sock.close()
        return None
    uid = peer_uid(sock)
    if uid != os.getuid():  # (None: not Linux, where the peer cannot be told: no service is used)
        sock.close()
        if uid is not None:
            refused.append(f"{path} is served by uid {uid}, not you: nothing was sent to it")
        return None
    return sock


def start(config: Path, explicit: bool) -> None:
    """Start a service for ``config`` in the background once this command ends (so that its start takes no CPU
    from the command, which goes on directly), detached; it exits on its own when idle. A second one started at
    the same time finds the first's lock and exits."""
    if not _starting:
        _starting.append(config)
        atexit.register(_start_now, config, explicit)


_starting: list[Path] = []  # the service this command starts when it ends (at most one)


def _start_now(config: Path, explicit: bool) -> None:
    import subprocess

    try:
        runtime_dir()
    except (OSError, UnsafeDir):
        return
    argv = [sys.executable, "-m", "gputui.service.server", str(config.expanduser().resolve())]
    if not explicit:
        argv.append("--default")  # the default path: a config that is absent is no error
    try:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True, cwd="/")
    except OSError:
        pass


def usable(explicit: str | None) -> tuple[Path, bool] | None:
    """The config file a command reads and whether it was named; None when the command says what is wrong."""
    config = config_path(explicit)
    named = bool(explicit or os.environ.get("GPUTUI_CONFIG"))
    return None if named and not config.is_file() else (config, named)


def printed(reply: dict[str, Any]) -> int:
    """Write a command's answer (``out``, ``err``) and return its exit status ``rc``."""
    sys.stderr.write(str(reply.get("err") or ""))
    sys.stdout.write(str(reply.get("out") or ""))
    return int(reply["rc"])


def answer(explicit: str | None, request: dict[str, Any]) -> int | None:
    """A command (``status``, ``jobs``, ``history``) through the service: print its answer and return the exit status; None
    when the command must go on directly (a service is then started for the next command)."""
    reply = _answered(explicit, request)
    return printed(reply) if reply is not None else None


def _answered(explicit: str | None, request: dict[str, Any]) -> dict[str, Any] | None:
    """The service's answer to a command's ``request`` (for this terminal's width); None where the command must
    go on directly (a service is then started for the next command, and why none answered said where it must)."""
    found = usable(explicit)
    if found is None:
        return None
    reply = ask(found[0], {**request, "columns": columns()})
    if reply is None or not isinstance(reply.get("rc"), int):
        start(*found)
        _say_why()
        return None
    return reply


def watch(explicit: str | None, request: dict[str, Any], every: float, go_on: Callable[[], int]) -> int | None:
    """``status --watch S`` through the service: its answer to ``request`` every ``every`` seconds, drawn over the
    last round on a terminal (errors included, under :func:`watch_heading`), else one round after another; None
    where no service answers the first round (the command watches directly; a service is started for the next
    command). Where the service stops answering later, ``go_on()`` watches directly from then on. Ctrl-C ends it
    (exit 130, as the CLI's)."""
    from gputui.core import safetext

    tty, first = sys.stdout.isatty(), True
    try:
        while True:
            reply = _answered(explicit, request)
            if reply is None:
                return None if first else go_on()
            first = False
            if tty:
                text = f"{reply.get('out') or ''}{reply.get('err') or ''}"
                safetext.redraw(sys.stdout, f"{watch_heading(every, request['form'])}\n\n{text}")
            else:
                printed(reply)
                sys.stdout.write("\n" if request["form"] == "text" else "")  # a blank line between rounds
                sys.stdout.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return reader_gone()


def watch_heading(every: float, form: str) -> str:
    """The heading of a ``status --watch`` round on a terminal (the service's and the direct one's)."""
    return f"Every {every:g} s: gputui status{' --' + form if form != 'text' else ''}   {time.strftime('%Y-%m-%d %H:%M:%S')}"


def columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` says it (``$COLUMNS``, stdout's terminal, else 80)."""
    try:
        if int(os.environ["COLUMNS"]) > 0:
            return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def _open(explicit: str | None) -> tuple[tuple[Path, bool], socket.socket] | None:
    """The config a command reads (``usable``) and a connection to its service; None where there is none (a
    service is then started for the next command, where the config can be used)."""
    found = usable(explicit)
    sock = connect(found[0]) if found is not None else None
    if found is None or sock is None:
        if found is not None:
            start(*found)
            _say_why()
        return None
    return found, sock


def logs(explicit: str | None, request: dict[str, Any], go_on: Callable[[int], int]) -> int | None:
    """``gputui logs`` through the service: the log's bytes on stdout as they come, then the exit status; None
    when the command must go on directly (a service is then started for the next command). Where the service
    goes away mid-stream (or says to), ``go_on(offset)`` is the command, directly from the first byte not
    written yet: no byte is lost or written twice."""
    opened = _open(explicit)
    if opened is None:
        return None
    found, sock = opened
    with sock:
        sock.settimeout(QUIET_S)
        stream = LogReader(sock)
        try:
            _send(sock, request)
            header = json.loads(stream.line())
        except TimeoutError:
            _went_quiet(sock)
            header = None
        except (OSError, ValueError, EOFError):
            header = None
        if not isinstance(header, dict) or "direct" in header:
            start(*found)
            _say_why()
            return None
        if isinstance(header.get("rc"), int):
            return printed(header)  # said before any byte (an unknown job, a host that does not answer)
        offset = header.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool):
            return None
        out = LogWriter(sys.stdout, offset)
        try:
            reply = stream.copy(out)
        except BrokenPipeError:
            return reader_gone()
    if reply is not None and isinstance(reply.get("rc"), int):
        return printed(reply)
    start(*found)  # the service died or gave up: a new one for the next command
    return go_on(out.offset)


#: The app's first frame waits at most this long for a running service's hosts (none running: no wait at all).
SEED_TIMEOUT_S = 0.3


def seed(explicit: str | None) -> list[Any]:
    """The hosts of ``gputui status --json`` as a running session service has them now, for the app to show
    before its own links are up; [] where no service runs or it does not answer within SEED_TIMEOUT_S (the app
    goes on as without it; no service is started for it)."""
    found = usable(explicit) if not os.environ.get("GPUTUI_DIRECT") else None
    reply = ask(found[0], {"op": "status", "form": "json", "host": None, "columns": 80}, SEED_TIMEOUT_S) if found else None
    try:
        hosts = json.loads(str(reply.get("out"))).get("hosts") if reply is not None else None
    except (ValueError, AttributeError):
        return []
    return hosts if isinstance(hosts, list) else []


def act(explicit: str | None, request: dict[str, Any], go_on: Callable[[float], int]) -> int | None:
    """An action (``kill``, ``release``) through the service: its answer printed and its exit status; None when
    the command must go on directly (nothing was asked of the service, or it declined). Where the service goes
    away (or quiet) once asked, ``go_on(asked_at)`` is the command, directly: it finds out what the service did
    before doing anything (a kill under way goes on from where it was, never starting over; a release is never
    asked again)."""
    opened = _open(explicit)
    if opened is None:
        return None
    found, sock = opened
    asked_at = time.time()
    with sock:
        sock.settimeout(QUIET_S)
        try:
            _send(sock, request)
        except OSError:
            return None  # not asked whole: the service acts on a whole line only
        reply = _reply(sock)
    if reply is not None and isinstance(reply.get("rc"), int):
        return printed(reply)
    start(*found)  # for the next command (this one's service declined, or went away)
    _say_why()
    return None if reply is not None else go_on(asked_at)


class LogReader:
    """The frames of a ``logs`` answer, read from the service's socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("the service closed the stream")
            self.buf += chunk

    def line(self) -> bytes:
        """The header line (after the newlines the service sends while at work)."""
        while not self.buf.lstrip(b"\n") or b"\n" not in self.buf.lstrip(b"\n"):
            if len(self.buf) > MAX_HEADER:
                raise ValueError("no header line")
            self._fill(len(self.buf) + 1)
        line, _, self.buf = self.buf.lstrip(b"\n").partition(b"\n")
        return line

    def take(self, n: int) -> bytes:
        self._fill(n)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def copy(self, out: LogWriter) -> dict[str, Any] | None:
        """Write every frame's bytes to ``out`` until the last frame: its reply, or None where the stream
        broke or the service says to go on directly."""
        self.sock.settimeout(SILENT_S)
        try:
            while True:
                kind, size = FRAME.unpack(self.take(FRAME.size))
                if kind == DATA:
                    self._pass(size, out)
                elif kind == END:
                    out.finish()
                    reply = json.loads(self.take(size))
                    return reply if isinstance(reply, dict) and "direct" not in reply else None
                elif kind == GAP:
                    message = self.take(size).decode("utf-8", "replace")
                    print(f"\ngputui: --- {message} ---", file=sys.stderr)
                elif kind == SEEK:
                    at = self.take(size)
                    if not (at.isdigit() and at.isascii()):
                        raise ValueError("a broken stream")
                    out.offset = int(at)
                else:
                    self.take(size)  # KEEPALIVE
        except BrokenPipeError:  # stdout's: the caller's
            raise
        except (OSError, ValueError, EOFError):
            return None

    def _pass(self, size: int, out: LogWriter) -> None:
        """``size`` bytes of log to ``out`` as they arrive (no frame is held whole)."""
        while size:
            if not self.buf:
                self._fill(1)
            data, self.buf = self.buf[:size], self.buf[size:]
            out.write(data)
            size -= len(data)


class LogWriter:
    """Where the log's bytes go (``safetext.LogOutput``'s rules: raw to a pipe or file; on a terminal made
    safe, imported then only), and the log offset of the next byte to write."""

    def __init__(self, stream: Any, offset: int) -> None:
        self.offset = offset
        self.raw: BinaryIO | None = None if stream.isatty() else stream.buffer
        self.text: Any = None
        if self.raw is None:
            from gputui.core.safetext import LogOutput

            self.text = LogOutput(stream)

    def write(self, data: bytes) -> None:
        if self.raw is not None:
            self.raw.write(data)
            self.raw.flush()
        else:
            self.text.write(data)
        self.offset += len(data)

    def finish(self) -> None:
        if self.text is not None:
            self.text.write(b"", final=True)  # a UTF-8 sequence the log ends inside


def reader_gone() -> int:
    """The reader of stdout went away: exit as the command does then (141, nothing left to flush)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141

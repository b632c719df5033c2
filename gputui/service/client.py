"""The command's side of the session service (stdlib only: no asyncio, no asyncssh): answer ``gputui status``
(and ``jobs``, ``history``) from the service of this config file and environment, or say the command must go on directly, starting a
service for the next command when there is none."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .address import UnsafeDir, build_id, peer_uid, runtime_dir, socket_path

CONNECT_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 300.0  # a status of hosts that do not answer waits as long as a direct one would
MAX_REPLY = 64 * 1024 * 1024


def config_path(explicit: str | None) -> Path:
    """The config file a command reads (``gputui.core.config.file.resolve_path``'s order), absent or not."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("GPUTUI_CONFIG"):
        return Path(os.environ["GPUTUI_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gputui" / "config.toml"


def ask(config: Path, request: dict[str, Any], timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any] | None:
    """The service's answer to ``request``; None when there is none to ask or it cannot answer (no service,
    one of another build, a socket that is not this user's, a broken answer)."""
    try:
        path = socket_path(config)
    except (OSError, UnsafeDir):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(str(path))
        except OSError:  # none running (or a stale socket a new service will replace)
            return None
        if peer_uid(sock) != os.getuid():
            return None
        sock.settimeout(timeout_s)
        try:
            sock.sendall(json.dumps({**request, "build": build_id()}).encode() + b"\n")
            chunks, size = [], 0
            while size <= MAX_REPLY:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            reply = json.loads(b"".join(chunks)) if size <= MAX_REPLY else None
        except (OSError, ValueError):
            return None
    return reply if isinstance(reply, dict) and "direct" not in reply else None


def start(config: Path, explicit: bool) -> None:
    """Start a service for ``config`` in the background (detached; it exits on its own when idle). A second one
    started at the same time finds the first's lock and exits."""
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


def answer(explicit: str | None, request: dict[str, Any]) -> int | None:
    """A command (``status``, ``jobs``, ``history``) through the service: print its answer and return the exit status; None
    when the command must go on directly (a service is then started for the next command)."""
    config = config_path(explicit)
    named = bool(explicit or os.environ.get("GPUTUI_CONFIG"))
    if named and not config.is_file():
        return None  # the command says what is wrong with the path
    reply = ask(config, {**request, "columns": shutil.get_terminal_size().columns})
    if reply is None or not isinstance(reply.get("rc"), int):
        start(config, named)
        return None
    sys.stderr.write(str(reply.get("err") or ""))
    sys.stdout.write(str(reply.get("out") or ""))
    return int(reply["rc"])

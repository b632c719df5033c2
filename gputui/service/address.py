"""Where the session service of a config file listens, and which build of gputui a process is. Stdlib only:
the command's light side imports this before anything else."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent  # holds gputui/ and remote_agent/


class UnsafeDir(OSError):
    """The socket's dir is not a private dir of this user's: no service is used."""


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/gputui``, else ``TMPDIR/gputui-UID``: made 0700, and refused unless it is a real dir
    of this user's that no one else can enter (another user must never place or reach a socket there)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        path = Path(base) / "gputui"
    else:
        import tempfile  # only here: the command's light side

        path = Path(tempfile.gettempdir()) / f"gputui-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UnsafeDir(f"{path} is not a private dir of yours (owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)})")
    return path


#: What a command's answer depends on besides its config file: a service serves only commands with the same
#: values (it keeps the environment of the command that started it: the ssh-agent, the provider keys).
ENVIRONMENT = ("HOME", "PATH", "SSH_AUTH_SOCK", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME",
               "RUNPOD_API_KEY", "VAST_API_KEY", "LAMBDA_API_KEY")


def key(config: Path) -> str:
    """One service per config file and environment: a digest of the file's resolved path and ``ENVIRONMENT``'s
    values (which never leave the process otherwise)."""
    text = "\0".join([str(config.expanduser().resolve()), *(f"{k}={os.environ.get(k, '')}" for k in ENVIRONMENT)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_path(config: Path) -> Path:
    return runtime_dir() / f"service-{key(config)}.sock"


def lock_path(config: Path) -> Path:
    """Held by the serving process for its whole life: two services of one config never run at once."""
    return runtime_dir() / f"service-{key(config)}.lock"


def build_id() -> str:
    """This install of gputui: each source file's path, size and modification time (a new version, or an edit
    of a checkout, is another build). A command never talks to a service of another build. Read once per
    process: the build a process runs is the one it started as (a ``--watch`` asks every round)."""
    if not _build:
        _build.append(_read_build())
    return _build[0]


_build: list[str] = []


def _read_build() -> str:
    digest = hashlib.sha256()
    for package in ("gputui", "remote_agent"):
        for folder, dirs, files in os.walk(ROOT / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                st = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def peer_uid(sock: socket.socket | None) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED); None where it cannot be told
    (not Linux): no service is used then."""
    cred = peer_cred(sock)
    return cred[1] if cred is not None else None


def peer_cred(sock: socket.socket | None) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED); None where it cannot be told."""
    if sock is None:
        return None
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (AttributeError, OSError):
        return None
    return int(pid), int(uid)

"""Crash-safe, symlink-safe file helpers for the state dir.

Every state file is written to a temp name and renamed into place. Files inside the state dir are opened
without following symlinks and without blocking on a FIFO: a planted link or a special file there is an
error for that one file, never a write outside the state dir or a hang.
"""

import errno
import json
import os
import stat
from typing import Any, Optional


class StateDirError(Exception):
    """The state dir cannot be used safely; the message names the path and why."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """Open ``path`` as a regular file: never through a symlink, never blocking on a FIFO; OSError otherwise."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a symlink; a FIFO without reader; a dir
            try:
                kind = _kind(os.lstat(path).st_mode)
            except OSError:
                raise exc from None
            raise OSError(
                exc.errno, "%s is %s, not a regular file" % (os.path.basename(path), kind)
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(
                errno.EINVAL, "%s is %s, not a regular file" % (os.path.basename(path), _kind(st.st_mode))
            )
        os.set_blocking(fd, True)  # O_NONBLOCK was only for the open
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new content, never a mix."""
    import tempfile  # here: it loads random and hashlib, which the app's first frame need not wait for

    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # replaces a planted symlink itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def user_umask() -> int:
    """The umask the user's login had (``GPUTUI_USER_UMASK``, set by whoever started the agent with its own
    umask 077): a job's files get the user's usual modes, the agent's own files stay private. 022 when unset."""
    try:
        value = int(os.environ.get("GPUTUI_USER_UMASK", ""), 8)
    except ValueError:
        return 0o022
    return value if 0 <= value <= 0o777 else 0o022


def write_json(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode("utf-8") + b"\n")


def read_bytes(path: str, limit: int = 16 * 1024 * 1024) -> bytes:
    """A regular file's content; OSError for a symlink, FIFO, dir, a file over ``limit`` bytes or a read error."""
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise OSError(errno.EFBIG, "%s is too large (%d bytes)" % (os.path.basename(path), size))
        return f.read(size)


def read_json(path: str) -> Optional[Any]:
    """Return the parsed file, or None when it is missing or unreadable (a torn write cannot happen)."""
    try:
        return json.loads(read_bytes(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def ensure_private_dir(path: str, top: bool = False) -> str:
    """Create ``path`` (mode 0700) unless it exists; return its absolute form.

    A dir we did not create keeps its mode. It must be ours and writable by nobody else, else
    StateDirError; below the ``top`` state dir a symlink is refused too (the top may be a link the user made).
    """
    path = os.path.abspath(os.path.expanduser(path))
    created = False
    try:
        if top:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateDirError("cannot create state dir %s: %s" % (path, exc.strerror or exc)) from None
    try:
        st = os.stat(path) if top else os.lstat(path)
    except OSError as exc:
        raise StateDirError("cannot use state dir %s: %s" % (path, exc.strerror or exc)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError("cannot use %s as a state dir: it is %s" % (path, _kind(st.st_mode)))
    if st.st_uid != os.getuid():
        raise StateDirError(
            "refusing state dir %s: it belongs to uid %d, not to you (uid %d); set remote_dir to a dir of "
            "your own, e.g. ~/.gputui" % (path, st.st_uid, os.getuid())
        )
    if st.st_mode & 0o022:
        raise StateDirError(
            "refusing state dir %s: it is writable by others (mode %s); set remote_dir to a private dir, "
            "e.g. ~/.gputui" % (path, oct(stat.S_IMODE(st.st_mode))[2:])
        )
    if created:
        os.chmod(path, 0o700)  # mkdir's mode went through the umask
    return path

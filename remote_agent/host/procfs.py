"""Small readers of /proc shared by the host readings and the container checks. Stdlib only, Python 3.8+."""

import os
import stat
from typing import Iterator, Optional

#: The most of one /proc or /sys file read: theirs are small; a bigger one is not what it claims to be.
READ_LIMIT = 1024 * 1024


def read_text(path: str, limit: int = READ_LIMIT) -> Optional[str]:
    """The regular file's text (at most ``limit`` bytes), or None when it cannot be read. Never blocks on a
    FIFO or a device someone put in its place."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def process_name(pid: int, proc: str = "/proc") -> Optional[str]:
    """The process's comm name, or None when it is gone or unreadable."""
    text = read_text(os.path.join(proc, str(pid), "comm"))
    if text is None:
        return None
    return text.strip() or None


def ancestors(pid: int, limit: int = 64, proc: str = "/proc") -> Iterator[int]:
    """``pid``, its parent, grandparent, ... up to (not including) init, at most ``limit`` of them."""
    for _ in range(limit):
        if pid <= 1:
            return
        yield pid
        try:
            with open("%s/%d/stat" % (proc, pid), "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return

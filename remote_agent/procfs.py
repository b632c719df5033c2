"""Small readers of /proc shared by the host readings and the container checks. Stdlib only, Python 3.8+."""

import os
from typing import Iterator, Optional


def read_text(path: str) -> Optional[str]:
    """The file's text, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


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

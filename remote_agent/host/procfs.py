"""Small readers of /proc shared by the host readings and the container checks. Stdlib only, Python 3.8+."""

import os
import stat
import time
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

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


#: At most this many children are listed per process (DataLoader workers: a few dozen at most).
MAX_CHILDREN = 256


def children(pid: int, proc: str = "/proc") -> List[int]:
    """The processes ``pid``'s main thread started (its ``children`` list, Linux 3.5+): PyTorch's DataLoader
    workers of a training process. At most MAX_CHILDREN; [] where the kernel does not list them."""
    words = (read_text("%s/%d/task/%d/children" % (proc, pid, pid), 65536) or "").split()
    return [int(w) for w in words[:MAX_CHILDREN] if w.isdigit()]


class ProcessUse:
    """CPU % and resident memory of processes from ``/proc/PID/stat``. CPU % is over the time since the previous
    reading of that pid (the same process: its start time is checked); a pid's first reading gives its average
    since it started. A pid not in this /proc (gone, or of another PID namespace) reads as (None, None)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._last: Dict[int, Tuple[float, float, int]] = {}  # pid: (CPU seconds, monotonic, start ticks)
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page_mib = os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)

    def read(self, pids: Iterable[int]) -> Dict[int, Tuple[Optional[float], Optional[float]]]:
        """``{pid: (cpu_percent, rss_mib)}`` for each pid; readings of pids not asked for again are dropped."""
        now, out, seen = time.monotonic(), {}, {}
        uptime: List[Optional[float]] = []  # /proc/uptime, read once, when a pid's first reading needs it
        for pid in pids:
            text = read_text("%s/%d/stat" % (self.proc, pid), 4096)
            try:
                fields = (text or "").rpartition(")")[2].split()
                cpu = (int(fields[11]) + int(fields[12])) / self._ticks  # utime + stime (proc(5) fields 14, 15)
                start, rss = int(fields[19]), int(fields[21])  # starttime and rss (fields 22, 24)
            except (IndexError, ValueError):
                out[pid] = (None, None)
                continue
            last = self._last.get(pid)
            if last is not None and last[2] == start and now > last[1]:
                share = (cpu - last[0]) / (now - last[1])
            else:
                if not uptime:
                    uptime.append(_uptime(self.proc))
                share = _since_start(cpu, start / self._ticks, uptime[0])
            seen[pid] = (cpu, now, start)
            out[pid] = (None if share is None else round(max(share, 0.0) * 100.0, 1), round(rss * self._page_mib, 1))
        self._last = seen
        return out


def _uptime(proc: str) -> Optional[float]:
    try:
        return float((read_text(proc + "/uptime", 256) or "").split()[0])
    except (IndexError, ValueError):
        return None


def _since_start(cpu: float, started: float, uptime: Optional[float]) -> Optional[float]:
    """The CPU share of a process over its life (``started``: seconds after boot)."""
    if uptime is None or uptime - started <= 0.5:
        return None
    return cpu / (uptime - started)

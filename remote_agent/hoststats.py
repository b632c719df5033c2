"""Host readings from /proc and statvfs: CPU, load, memory, disk, uptime.

Stdlib only, Python 3.8+. Every reading may be None when unreadable; nothing here raises.
"""

import os
from typing import Any, Dict, Iterator, Optional, Tuple

MIB = 1024 * 1024
GIB = 1024 * MIB


def read_text(path: str) -> Optional[str]:
    """The file's text, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def cpu_times(proc: str = "/proc") -> Optional[Tuple[int, int]]:
    """(total, idle) jiffies from the aggregate ``cpu`` line of /proc/stat."""
    text = read_text(os.path.join(proc, "stat"))
    if not text:
        return None
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                # user nice system idle iowait irq softirq steal (guest, guest_nice are inside user/nice)
                values = [int(v) for v in parts[1:9]]
            except ValueError:
                return None
            if len(values) < 4:
                return None
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return sum(values), idle
    return None


def nearest_existing(path: str) -> str:
    """``path`` itself or its nearest existing parent (the state dir may not exist yet)."""
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def process_name(pid: int, proc: str = "/proc") -> Optional[str]:
    """The process's comm name, or None when it is gone or unreadable."""
    text = read_text(os.path.join(proc, str(pid), "comm"))
    if text is None:
        return None
    return text.strip() or None


class HostStats:
    """Host readings; CPU percent comes from /proc/stat deltas between calls (primed at construction)."""

    def __init__(self, state_dir: str, proc: str = "/proc") -> None:
        self.state_dir = state_dir
        self.proc = proc
        self._last_cpu = cpu_times(proc)
        self._last_percent: Optional[float] = None

    def cpu_percent(self) -> Optional[float]:
        now, last = cpu_times(self.proc), self._last_cpu
        if now is None or last is None:
            self._last_cpu = now
            return None
        total, idle = now[0] - last[0], now[1] - last[1]
        if total <= 0:  # called again within one clock tick: keep the baseline
            return self._last_percent
        self._last_cpu = now
        self._last_percent = round(max(0.0, min(100.0, 100.0 * (total - idle) / total)), 1)
        return self._last_percent

    def memory(self) -> Tuple[Optional[int], Optional[int]]:
        """(used MiB, total MiB) where used = MemTotal - MemAvailable."""
        text = read_text(os.path.join(self.proc, "meminfo"))
        fields: Dict[str, int] = {}
        for line in (text or "").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0])  # kB
        total = fields.get("MemTotal")
        avail = fields.get("MemAvailable")
        if total is None:
            return None, None
        used = (total - avail) // 1024 if avail is not None else None
        return used, total // 1024

    def disk(self) -> Tuple[Optional[float], Optional[float]]:
        """(free GiB, total GiB) of the filesystem holding the state dir."""
        try:
            st = os.statvfs(nearest_existing(self.state_dir))
        except OSError:
            return None, None
        return round(st.f_bavail * st.f_frsize / GIB, 2), round(st.f_blocks * st.f_frsize / GIB, 2)

    def uptime(self) -> Optional[float]:
        text = read_text(os.path.join(self.proc, "uptime"))
        try:
            return float(text.split()[0]) if text else None
        except (ValueError, IndexError):
            return None

    def sample(self) -> Dict[str, Any]:
        try:
            load: Tuple[Optional[float], ...] = os.getloadavg()
        except OSError:
            load = (None, None, None)
        used, total = self.memory()
        free_gib, total_gib = self.disk()
        return {
            "cpu_percent": self.cpu_percent(),
            "cpu_count": os.cpu_count(),
            "load1": load[0],
            "load5": load[1],
            "load15": load[2],
            "mem_used_mib": used,
            "mem_total_mib": total,
            "disk_free_gib": free_gib,
            "disk_total_gib": total_gib,
            "uptime_s": self.uptime(),
        }


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

"""Host readings from /proc and statvfs: CPU, load, memory, disk, uptime.

In a container with cgroup limits, memory and CPU are those of the container (its limit, its usage), and
``mem_scope`` / ``cpu_scope`` say ``cgroup`` instead of ``host``.

Stdlib only, Python 3.8+. Every reading may be None when unreadable; nothing here raises.
"""

import os
import time
from typing import Any, Dict, Optional, Tuple

from . import container
from .procfs import ancestors, process_name, read_text  # noqa: F401 (read here, and re-exported)

MIB = 1024 * 1024
GIB = 1024 * MIB


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


class HostStats:
    """Host readings; CPU percent comes from /proc/stat deltas between calls (primed at construction)."""

    def __init__(self, state_dir: str, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> None:

        self.container = container
        self.state_dir = state_dir
        self.proc = proc
        self.cgroup_root = cgroup_root
        self._last_cpu = cpu_times(proc)
        self._last_percent: Optional[float] = None
        self.cpu_limit = container.cpu_limit(proc, cgroup_root)
        self._last_cg = self._cgroup_cpu() if self.cpu_limit else None

    def _cgroup_cpu(self) -> Optional[Tuple[float, float]]:
        used = self.container.cpu_usage_s(self.proc, self.cgroup_root)
        return None if used is None else (time.monotonic(), used)

    def cgroup_cpu_percent(self) -> Optional[float]:
        """Percent of the container's CPU quota used since the last call."""
        now, last = self._cgroup_cpu(), self._last_cg
        if now is None or last is None or not self.cpu_limit:
            self._last_cg = now
            return None
        wall = now[0] - last[0]
        if wall <= 0.01:
            return self._last_percent
        self._last_cg = now
        self._last_percent = round(
            max(0.0, min(100.0, 100.0 * (now[1] - last[1]) / wall / self.cpu_limit)), 1
        )
        return self._last_percent

    def cpu_count(self) -> Optional[float]:
        """CPUs this process may use: the cgroup quota, the affinity mask, the machine (tightest first)."""
        try:
            count: Optional[float] = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            count = os.cpu_count()
        if self.cpu_limit and (count is None or self.cpu_limit < count):
            return round(self.cpu_limit, 2)
        return count

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

    def memory_scoped(self) -> Tuple[Optional[int], Optional[int], str]:
        """(used MiB, total MiB, "cgroup" or "host"): the container's limit when it is below the machine's RAM."""
        used, total = self.memory()
        limit = self.container.memory_limit(self.proc, self.cgroup_root)
        if limit is not None and (total is None or limit[0] // MIB < total):
            return limit[1] // MIB, limit[0] // MIB, "cgroup"
        return used, total, "host"

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
        used, total, mem_scope = self.memory_scoped()
        free_gib, total_gib = self.disk()
        in_cgroup = bool(self.cpu_limit) and self._last_cg is not None
        return {
            "cpu_percent": self.cgroup_cpu_percent() if in_cgroup else self.cpu_percent(),
            "cpu_count": self.cpu_count(),
            "cpu_scope": "cgroup" if in_cgroup else "host",
            "mem_scope": mem_scope,
            "load1": load[0],
            "load5": load[1],
            "load15": load[2],
            "mem_used_mib": used,
            "mem_total_mib": total,
            "disk_free_gib": free_gib,
            "disk_total_gib": total_gib,
            "uptime_s": self.uptime(),
        }

"""Facts of this boot, read by the server and the detached watchdog: its id (new on every reboot) and start."""

from typing import Optional


def _read_first(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_id() -> Optional[str]:
    """The kernel's random id of this boot, or None where it cannot be read."""
    return _read_first("/proc/sys/kernel/random/boot_id") or None


def boot_time() -> Optional[float]:
    """When this boot started (Unix time, from /proc/stat's ``btime``), or None where it cannot be read."""
    for line in _read_first("/proc/stat").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def life_start(stat_path: str = "/proc/1/stat") -> Optional[float]:
    """When this machine's or container's life began: PID 1's start (in a container, the container's start,
    which a RunPod or vast.ai stop and start renews while the machine's boot stays), else the boot's."""
    booted = boot_time()
    fields = _read_first(stat_path).rpartition(")")[2].split()
    try:
        ticks = int(fields[19])  # field 22 of proc(5)'s /proc/PID/stat: starttime, in clock ticks since boot
        return None if booted is None else booted + ticks / _clock_ticks()
    except (IndexError, ValueError, OSError):
        return booted


def _clock_ticks() -> int:
    import os

    return os.sysconf("SC_CLK_TCK")

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

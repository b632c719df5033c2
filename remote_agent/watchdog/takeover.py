"""One watchdog per state dir, and a newer build taking over from an older one: the lock (``LOCK``), who holds
it (``OWNER``), the request that it exit at its next safe point (``STOP``, one waiter at a time: ``TAKEOVER``),
and ``ensure_running``, which starts a watchdog detached unless one of this build (or a newer one) runs.

Legacy: ``legacy_holder``, ``_children``, ``_mid_release``, ``_end_legacy`` and ``_take_from_legacy`` replace a
watchdog of a build from before owner records (REVISION 3), which cannot be asked to exit. Delete them once no
host can still run such a build: when the oldest agent build a client may meet (tests/test_version_skew.py's)
writes ``OWNER``.
"""

import fcntl
import os
import re
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional

from .. import build_id
from ..fsutil import open_regular, read_json, write_json
from . import notify
from .state import APPEND, CONFIG, LOCK, LOG, OWNER, REVISION, STATE, STOP, TAKEOVER, log_line


def owner(state_dir: str) -> Optional[Dict[str, Any]]:
    """The running watchdog's record (``OWNER``), or None when none says who it is."""
    record = read_json(os.path.join(state_dir, OWNER))
    return record if isinstance(record, dict) else None


def lock_holder(state_dir: str) -> Optional[int]:
    """The pid that holds the watchdog lock, as ``/proc/locks`` says, or None (none, or unknown)."""
    try:
        ino = os.stat(os.path.join(state_dir, LOCK)).st_ino
        with open("/proc/locks") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2147826 0 EOF" ("1: -> FLOCK ...": a waiter)
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino):
            return int(parts[4]) if parts[4].isdigit() else None
    return None


def legacy_holder(state_dir: str) -> Optional[int]:
    """The pid of a watchdog from a build before ``OWNER`` records (it records nothing, so it cannot be asked
    to exit) that holds the lock: its command line names this state dir. None when the holder is not one."""
    pid = lock_holder(state_dir)
    record = owner(state_dir)
    if pid is None or (record is not None and record.get("pid") == pid):
        return None
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read(1 << 16).split(b"\0")
    except OSError:
        return None
    return pid if b"watchdog" in argv and os.fsencode(state_dir) in argv else None


def _children(pid: int) -> bool:
    """Whether ``pid`` has a child process (a hook, nvidia-smi, tmux...)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        return True
            except (OSError, IndexError, ValueError):
                continue
    return False


_RELEASE_STEP = re.compile(
    r"^\S+ \S+ (releasing: |release_remote: exit |not releasing: |provider release: confirmed|release failed)"
)


def _mid_release(state_dir: str) -> bool:
    """Whether the watchdog log's last release step is a ``releasing:`` not yet followed by its outcome."""
    try:
        with open(os.path.join(state_dir, LOG), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return True  # cannot tell: wait
    steps = [m.group(1) for m in map(_RELEASE_STEP.match, lines) if m]
    return bool(steps) and steps[-1] == "releasing: "


def _end_legacy(state_dir: str, pid: int) -> bool:
    """End a legacy watchdog only where that is safe: frozen (SIGSTOP), it runs no child and its log shows no
    release under way, so it is between passes or in a pass that starts nothing; then SIGKILL (it writes its
    files by rename: none is left half-written). Otherwise it goes on (SIGCONT) and this is tried again."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        return False
    safe = legacy_holder(state_dir) == pid and not _children(pid) and not _mid_release(state_dir)
    try:
        os.kill(pid, signal.SIGKILL if safe else signal.SIGCONT)
    except OSError:
        return False  # it went meanwhile
    return safe


def replaceable(record: Optional[Dict[str, Any]]) -> bool:
    """Whether this build should take over from the watchdog ``record`` describes: another build, of no higher
    revision. (One that recorded nothing is a build from before records: see ``legacy_holder``.)"""
    if record is None or record.get("build") == build_id():
        return False
    try:
        return int(record.get("revision") or 0) <= REVISION
    except (TypeError, ValueError):
        return True


def takeover_wait_s(config: Optional[Dict[str, Any]]) -> float:
    """How long a new watchdog waits for the old one to reach a safe point: a pass, with its hooks and sends."""
    config = config or {}
    hooks = 0.0
    for key, default in (("interval", 15.0), ("pre_stop_timeout", 300.0), ("release_timeout", 120.0)):
        try:
            hooks += float(config.get(key, default))
        except (TypeError, ValueError):
            hooks += default
    return hooks + 3 * notify.TIMEOUT_S + 60.0


def _locked(lock: Any) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _taking_over(state_dir: str) -> bool:
    """Whether a new watchdog is waiting to take over (it holds ``TAKEOVER``)."""
    try:
        with os.fdopen(open_regular(os.path.join(state_dir, TAKEOVER), os.O_WRONLY | os.O_CREAT), "w") as f:
            return not _locked(f)
    except OSError:
        return False


def _take_over(state_dir: str, lock: Any) -> bool:
    """Hold the lock another watchdog holds, when it is an older build's: one waiter at a time (``TAKEOVER``)."""
    try:
        with os.fdopen(open_regular(os.path.join(state_dir, TAKEOVER), os.O_WRONLY | os.O_CREAT), "w") as f:
            return _locked(f) and _take_lock(state_dir, lock)
    except OSError:
        return False


def _take_lock(state_dir: str, lock: Any) -> bool:
    """Hold the lock; when an older build holds it, ask that one to exit and wait for it (bounded)."""
    if _locked(lock):
        return True
    legacy = legacy_holder(state_dir)
    if legacy is not None:
        return _take_from_legacy(state_dir, lock, legacy)
    old = owner(state_dir)
    if not replaceable(old) or old is None:
        return False
    pid, build = old.get("pid"), build_id()
    write_json(os.path.join(state_dir, STOP), {"pid": pid, "build": build, "by": os.getpid()})
    wait = takeover_wait_s(read_json(os.path.join(state_dir, CONFIG)))
    log_line(state_dir, "build %s asks the watchdog of build %s (pid %s) to exit at its next safe point; waiting "
                        "up to %.0f s" % (build, old.get("build"), pid, wait))
    end = time.monotonic() + wait
    while time.monotonic() < end:
        time.sleep(0.2)
        if _locked(lock):
            last = read_json(os.path.join(state_dir, STATE)) or {}
            if last.get("pid") == pid and last.get("action") == "released":
                log_line(state_dir, "build %s: the watchdog it replaces released the host; not taking over" % build)
                _clear_stop(state_dir, pid)
                return False
            log_line(state_dir, "build %s takes over from build %s" % (build, old.get("build")))
            return True
        holder = owner(state_dir)
        if holder is not None and holder.get("pid") != pid:  # another new watchdog took over first
            _clear_stop(state_dir, pid)
            return False
    _clear_stop(state_dir, pid)
    log_line(state_dir, "the watchdog of build %s (pid %s) did not exit within %.0f s: it keeps running"
                        % (old.get("build"), pid, wait))
    return False


def _take_from_legacy(state_dir: str, lock: Any, pid: int) -> bool:
    """Replace a watchdog that cannot be asked to exit: end it at a safe moment (``_end_legacy``), bounded."""
    wait = takeover_wait_s(read_json(os.path.join(state_dir, CONFIG)))
    log_line(state_dir, "build %s replaces the watchdog pid %d (a build from before build records) when it is "
                        "between passes; waiting up to %.0f s" % (build_id(), pid, wait))
    end = time.monotonic() + wait
    while time.monotonic() < end:
        if _locked(lock):
            last = read_json(os.path.join(state_dir, STATE)) or {}
            if last.get("pid") == pid and last.get("action") == "released":
                log_line(state_dir, "build %s: the watchdog it replaces released the host; not taking over" % build_id())
                return False
            log_line(state_dir, "build %s takes over from the watchdog pid %d" % (build_id(), pid))
            return True
        if lock_holder(state_dir) not in (pid, None):
            return False  # another one took over first
        _end_legacy(state_dir, pid)
        time.sleep(0.2)
    log_line(state_dir, "the watchdog pid %d was never between passes within %.0f s: it keeps running" % (pid, wait))
    return False


def hold(state_dir: str, lock: Any) -> bool:
    """Hold the watchdog ``lock`` for this process, taking over from an older build's watchdog where one holds
    it, and record this one as the owner; False when another watchdog keeps it."""
    if not _locked(lock) and not _take_over(state_dir, lock):
        return False
    _clear_stop(state_dir, None)  # first: whoever reads this process as the owner finds no stop request left
    write_json(os.path.join(state_dir, OWNER), {"pid": os.getpid(), "build": build_id(), "revision": REVISION})
    return True


def _clear_stop(state_dir: str, pid: Any) -> None:
    """Remove the stop request (only the one for ``pid`` when given)."""
    path = os.path.join(state_dir, STOP)
    request = read_json(path)
    if request is None or (pid is not None and isinstance(request, dict) and request.get("pid") != pid):
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def _request(state_dir: str, pid: Any) -> Optional[Dict[str, Any]]:
    """The stop request for the watchdog ``pid`` while the watchdog that wrote it still waits, else None (one
    that died waiting must not leave the host with no watchdog at all)."""
    request = read_json(os.path.join(state_dir, STOP))
    if not isinstance(request, dict) or request.get("pid") != pid or not isinstance(request.get("by"), int):
        return None
    try:
        os.kill(request["by"], 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass  # alive, another uid's (it cannot be: the state dir is ours alone)
    return request


def stop_requested(state_dir: str) -> Optional[str]:
    """The build that asked this watchdog to exit, or None."""
    request = _request(state_dir, os.getpid())
    return None if request is None else str(request.get("build"))


def ensure_running(state_dir: str, launcher: List[str]) -> bool:
    """Start the watchdog detached (own session, no stdio) unless one of this build (or a newer one) holds the
    lock; one of an older build is replaced (the new one asks it to exit: see ``run``)."""
    try:
        with os.fdopen(open_regular(os.path.join(state_dir, LOCK), os.O_WRONLY | os.O_CREAT), "w") as lock:
            free = _locked(lock)
            if free:
                fcntl.flock(lock, fcntl.LOCK_UN)
    except OSError:
        return False  # a lock file that is not ours to use
    if not free:
        if _taking_over(state_dir):
            return True  # a watchdog of a newer build already waits to take over
        if legacy_holder(state_dir) is None and not replaceable(owner(state_dir)):
            return False  # already running
    log_fd = open_regular(os.path.join(state_dir, LOG), APPEND)
    with open(os.devnull, "rb") as null_in, os.fdopen(log_fd, "ab") as log:
        subprocess.Popen(
            launcher + ["watchdog", state_dir], stdin=null_in, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )
    return True

"""Is the host doing anything? The idle rule, shared by the agent and the autostop watchdog.

A host is busy when a sample shows any reason: a running job, a job waiting in the queue (one that can still
start: a job caught in a loop of jobs waiting on each other is none), a GPU at or above the utilisation threshold,
a GPU process that is not a gputui job (a notebook, someone else's run), or an interactive login session.
In a pod, a GPU process from another PID namespace that could not be matched to a job (``hidden``) is not
named as foreign on a GPU that a running job was given: it is most likely that job's own.
The time of the last busy sample is kept on disk so that idleness survives agent restarts.
"""

import os
import struct
import time
from typing import AbstractSet, Any, Dict, List, Optional

from ..fsutil import read_json, write_json
from ..host.container import grant_of, holders
from ..jobs.queue import never_starts
from ..protocol import JOB_QUEUED, JOB_RUNNING

# struct utmp on Linux (glibc, 64-bit and 32-bit alike): type, pid, line, id, user, host, exit, session, tv, addr.
_UTMP = struct.Struct("hi32s4s32s256shhiii4i20s")
_USER_PROCESS = 7


def login_sessions(utmp_path: str = "/var/run/utmp") -> List[Dict[str, Any]]:
    """Interactive logins (ssh with a terminal, consoles) listed in utmp whose process is still alive."""
    sessions = []
    try:
        with open(utmp_path, "rb") as f:
            data = f.read()
    except OSError:
        return sessions
    for off in range(0, len(data) - _UTMP.size + 1, _UTMP.size):
        rec = _UTMP.unpack_from(data, off)
        if rec[0] != _USER_PROCESS:
            continue
        pid = rec[1]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue  # a stale record
        except PermissionError:
            pass
        text = [b.split(b"\0", 1)[0].decode("utf-8", "replace") for b in (rec[2], rec[4], rec[5])]
        sessions.append(
            {"pid": pid, "tty": text[0], "user": text[1], "from": text[2], "since": float(rec[9])}
        )
    return sessions


def busy_reasons(
    sample: Dict[str, Any],
    jobs: List[Dict[str, Any]],
    util_percent: float = 5.0,
    sessions: Optional[List[Dict[str, Any]]] = None,
    idle_jobs: AbstractSet[str] = frozenset(),
) -> List[str]:
    """Why the host is NOT idle in this sample (empty list: idle). ``idle_jobs``: running jobs that count as
    idle (stalled ones, when the user asked for that); their GPUs and processes still count as usual."""
    running = [j for j in jobs if j.get("state") == JOB_RUNNING]
    reasons = ["job %s running" % j["id"] for j in running if str(j["id"]) not in idle_jobs]
    doomed = never_starts(jobs, {str(j.get("id")): j for j in jobs})
    queued = [str(j["id"]) for j in jobs if j.get("state") == JOB_QUEUED and str(j["id"]) not in doomed]
    if queued:  # a queue is activity while its jobs can start: when the GPUs (and the jobs they wait for) free up
        shown = ", ".join(queued[:5]) + (" and %d more" % (len(queued) - 5) if len(queued) > 5 else "")
        reasons.append("%d job%s queued (%s)" % (len(queued), "s" if len(queued) > 1 else "", shown))
    grants = [{"id": j["id"], "gpus": grant_of(j)} for j in running]
    for gpu in sample.get("gpus") or []:
        util = gpu.get("util_percent")
        if util is not None and util >= util_percent:
            reasons.append("GPU %s at %.0f%%" % (gpu.get("index"), util))
        held = None
        for proc in gpu.get("processes") or []:
            if proc.get("job"):
                continue
            if proc.get("hidden"):
                held = holders(gpu, grants) if held is None else held
                if held:
                    continue  # unknown, from another PID namespace, on a GPU a running job holds
            name = proc.get("name")
            who = "pid %s%s" % (proc.get("pid"), " (%s)" % name if name else "")
            reasons.append("%s uses GPU %s" % (who, gpu.get("index")))
    for s in sessions or []:
        reasons.append(
            "login %s on %s%s" % (s["user"], s["tty"], " from %s" % s["from"] if s["from"] else "")
        )
    return reasons


class ActivityLog:
    """Persists the last time the host was seen busy (``activity.json`` in the state dir)."""

    WRITE_EVERY_S = 30.0
    #: A gap this long between the last observer's final sample and a new observer's first one was watched by
    #: nobody (no agent, no watchdog ran): it never counts as idle, so the idle clock starts again.
    UNOBSERVED_GAP_S = 180.0

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "activity.json")
        saved = read_json(self.path) or {}
        self.last_busy = float(saved.get("last_busy") or 0.0)
        self.last_seen = saved.get("last_seen")  # the last sample any observer wrote (None: unknown)
        self.boot_id = saved.get("boot_id")
        self._written = 0.0

    def observe(
        self, reasons: List[str], boot_id: Optional[str], boot_time: Optional[float], now: float
    ) -> float:
        """Record one sample; return the start of the current idle stretch (== now while busy)."""
        if boot_id != self.boot_id:
            # First sight of this boot: what happened before now is unknown, so the idle clock starts now
            # (never count unobserved time as idle: autostop must not release on doubt).
            self.boot_id = boot_id
            self.last_busy = now
            self._written = 0.0
        elif (
            not self._written
            and isinstance(self.last_seen, (int, float))
            and now - self.last_seen > self.UNOBSERVED_GAP_S
        ):
            self.last_busy = now  # nobody watched since last_seen: doubt counts as activity
        if reasons:
            self.last_busy = now
        if now - self._written >= self.WRITE_EVERY_S or not self._written:
            self.last_seen = now
            write_json(self.path, {"last_busy": self.last_busy, "last_seen": now, "boot_id": self.boot_id})
            self._written = now
        return self.last_busy

    def idle_since(self, jobs: List[Dict[str, Any]], boot_time: Optional[float]) -> float:
        """Start of the idle stretch as known on disk: the last busy (or first) sample, or the last job end."""
        candidates = [self.last_busy, boot_time if boot_time is not None else 0.0]
        candidates += [float(j["ended_at"]) for j in jobs if j.get("ended_at")]
        return max(candidates)


def idle_status(
    sample: Dict[str, Any],
    jobs: List[Dict[str, Any]],
    log: ActivityLog,
    facts: Dict[str, Any],
    util_percent: float,
    count_sessions: bool,
    now: Optional[float] = None,
    idle_jobs: AbstractSet[str] = frozenset(),
) -> Dict[str, Any]:
    """The host's idleness after this sample: reasons, and since when it has had none."""
    now = time.time() if now is None else now
    sessions = login_sessions() if count_sessions else []
    reasons = busy_reasons(sample, jobs, util_percent, sessions, idle_jobs)
    log.observe(reasons, facts.get("boot_id"), facts.get("boot_time"), now)
    since = now if reasons else log.idle_since(jobs, facts.get("boot_time"))
    return {"reasons": reasons, "idle_since": since, "idle_seconds": max(0.0, now - since)}

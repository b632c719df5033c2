"""Restart policies: jobs that come back after a failure, decided on the host with no client connected.

A job started with ``restart`` (``{"policy": "on-failure", "max": N, "resume_from": GLOB, ...}`` in job.json)
is not over when an attempt fails. Its runner then writes ``attempt.json`` (the attempt's end) instead of
``status.json``, and the detached watchdog (remote_agent/watchdog/daemon.py) calls ``run_pass`` every pass:

- each ended attempt is kept in ``attempts.json`` (exit, start/end, the hint found at its log's end, its
  progress: the last step/epoch it printed, from the job's series.json once the log is read through: see
  remote_agent/jobs/series.py);
- then either a restart is planned in ``restart.json`` (``due_at``: after a backoff of ``backoff_s`` doubling
  up to ``backoff_max_s``), with a marker line in output.log, or the job ends for good: ``status.json`` with
  the reason (the cap reached, a crash loop: attempts without progress between them);
- when ``due_at`` comes, the job's runner is launched again in its tmux session (``GPUTUI_ATTEMPT`` and
  ``GPUTUI_RESUME_FROM`` set by the runner: see ``attempt_env``).

Never restarted: exit 0, a job killed by the user or by gputui (kill.json), a host that was released. A job
lost with its runner (a reboot killed tmux) counts as a failed attempt; the next agent start resumes it.
"""

import glob
import os
import re
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import protocol as P
from ..fsutil import open_regular, read_json, write_json
from . import series
from .secrets import end_job

ATTEMPT, ATTEMPTS, PENDING = "attempt.json", "attempts.json", "restart.json"
POLICY_NO, POLICY_ON_FAILURE = "no", "on-failure"
#: ``on-failure`` with no N: at most this many attempts in a row (the crash-loop guard usually stops sooner).
DEFAULT_MAX = 10
MAX_ATTEMPTS = 100  # the largest N accepted
DEFAULTS = {"backoff_s": 30.0, "backoff_max_s": 600.0, "healthy_s": 600.0}
#: Attempts in a row without progress that make a crash loop.
CRASH_LOOP_ATTEMPTS = 3
#: A launched attempt whose runner has not come up after this long is given up.
LAUNCH_GRACE_S = 60.0
LOG_TAIL_BYTES = 64 * 1024  # how much of the end of an attempt's log is read for its hint
#: Reads of the log (series.READ_BYTES each) one pass may make to bring an ended attempt's series up to its end
#: (its progress); an attempt with more output unread is decided by a later pass.
CATCH_UP_READS = 16
MAX_HINT = 200
MAX_GLOB = 1000
MAX_MATCHES = 100_000  # checkpoint candidates looked at, at most
#: A match changed this recently may still be being written: it is skipped.
SETTLED_S = 2.0
_PARTIAL = (".tmp", ".part", ".partial", ".incomplete", ".lock")
_ERROR = re.compile(rb"(error|exception|traceback|nccl|killed|out of memory|oom|fatal|segmentation)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --- the request --------------------------------------------------------------------------------------------
def parse_policy(text: str) -> Dict[str, Any]:
    """``no`` or ``on-failure[:N]`` (Docker's words) as a request; ValueError with the reason otherwise."""
    text = text.strip()
    if text == POLICY_NO:
        return {"policy": POLICY_NO}
    name, sep, count = text.partition(":")
    if name != POLICY_ON_FAILURE:
        raise ValueError("restart policy %r: use 'no' or 'on-failure[:N]'" % text[:100])
    if not sep:
        return {"policy": POLICY_ON_FAILURE}
    if not count.isdigit() or not 1 <= int(count) <= MAX_ATTEMPTS:
        raise ValueError("restart policy %r: N is a whole number of attempts, 1 to %d" % (text[:100], MAX_ATTEMPTS))
    return {"policy": POLICY_ON_FAILURE, "max": int(count)}


def check_glob(pattern: Any) -> str:
    """A checkpoint glob relative to the job's working directory, never reaching outside it."""
    if not isinstance(pattern, str) or not pattern.strip() or len(pattern) > MAX_GLOB or "\x00" in pattern:
        raise ValueError("--resume-from needs a glob of at most %d characters, e.g. 'ckpt/*.pt'" % MAX_GLOB)
    if os.path.isabs(pattern) or pattern.startswith("~") or ".." in pattern.split("/"):
        raise ValueError("--resume-from %r reaches outside the job's directory: give a glob relative to it, "
                         "e.g. 'ckpt/*.pt'" % pattern[:100])
    return pattern


def check_request(request: Any) -> Optional[Dict[str, Any]]:
    """The checked ``restart`` of a start request (None: no policy); JobError-worthy ValueError otherwise."""
    if request is None:
        return None
    if not isinstance(request, dict):
        raise ValueError("restart must be an object like {\"policy\": \"on-failure\", \"max\": 3}")
    policy = request.get("policy", POLICY_NO)
    if policy not in (POLICY_NO, POLICY_ON_FAILURE):
        raise ValueError("restart policy %r: use 'no' or 'on-failure[:N]'" % str(policy)[:100])
    if policy == POLICY_NO:
        return None
    out: Dict[str, Any] = {"policy": policy, "max": request.get("max", DEFAULT_MAX)}
    if isinstance(out["max"], bool) or not isinstance(out["max"], int) or not 1 <= out["max"] <= MAX_ATTEMPTS:
        raise ValueError("restart max must be a whole number of attempts, 1 to %d" % MAX_ATTEMPTS)
    for key, default in DEFAULTS.items():
        value = request.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86400:
            raise ValueError("restart %s must be a number of seconds, 0 to 86400" % key)
        out[key] = float(value)
    if request.get("resume_from") is not None:
        out["resume_from"] = check_glob(request["resume_from"])
    return out


def policy_of(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A job record's restart policy, or None."""
    policy = record.get("restart")
    return policy if isinstance(policy, dict) and policy.get("policy") == POLICY_ON_FAILURE else None


# --- what the runner asks ------------------------------------------------------------------------------------
def current_attempt(job_dir: str) -> int:
    pending = read_json(os.path.join(job_dir, PENDING))
    n = pending.get("attempt") if isinstance(pending, dict) else None
    return n if isinstance(n, int) and n >= 1 else 1


def newest_checkpoint(cwd: str, pattern: str, now: Optional[float] = None) -> Optional[str]:
    """The newest complete match of ``pattern`` inside ``cwd`` (by mtime), or None. Matches that resolve
    outside ``cwd`` (a link), are still changing, empty, or named like a partial file are skipped."""
    now = time.time() if now is None else now
    root = os.path.realpath(cwd)
    best: Optional[Tuple[float, str]] = None
    for n, path in enumerate(glob.iglob(os.path.join(glob.escape(root), pattern))):
        if n >= MAX_MATCHES:
            break
        real = os.path.realpath(path)
        if not real.startswith(root + os.sep) or path.endswith(_PARTIAL):
            continue
        try:
            st = os.stat(real)
        except OSError:
            continue
        mtime = _newest_mtime(real, st.st_mtime) if os.path.isdir(real) else st.st_mtime
        if now - mtime < SETTLED_S or (not os.path.isdir(real) and st.st_size == 0):
            continue
        if best is None or mtime > best[0]:
            best = (mtime, path)
    return best[1] if best else None


def _newest_mtime(path: str, mtime: float) -> float:
    """A checkpoint dir is complete when nothing in it changed lately (its top level is looked at)."""
    try:
        with os.scandir(path) as entries:
            for n, entry in enumerate(entries):
                if n >= 10_000:
                    break
                try:
                    mtime = max(mtime, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return mtime


def attempt_env(job_dir: str, job: Dict[str, Any]) -> Dict[str, str]:
    """What the runner adds to an attempt's environment: ``GPUTUI_ATTEMPT`` always for a job with a policy,
    ``GPUTUI_RESUME_FROM`` from the second attempt on when the job's glob finds a checkpoint."""
    policy = policy_of(job)
    if policy is None:
        return {}
    n = current_attempt(job_dir)
    env = {"GPUTUI_ATTEMPT": str(n)}
    if n > 1 and policy.get("resume_from"):
        found = newest_checkpoint(str(job.get("cwd") or "."), str(policy["resume_from"]))
        if found:
            env["GPUTUI_RESUME_FROM"] = found
    return env


def ends_for_good(job_dir: str, job: Dict[str, Any], exit_code: int, sig: Optional[int] = None) -> bool:
    """Whether an attempt that ended with ``exit_code`` (``sig``: the signal that ended it) is the job's end
    (status.json), not one to decide on: a success, a kill (kill.json), a Ctrl-C (SIGINT) in its pane."""
    if policy_of(job) is None or exit_code == 0 or sig == signal.SIGINT:
        return True
    return os.path.exists(os.path.join(job_dir, "kill.json"))


# --- what the store shows ------------------------------------------------------------------------------------
def fill_record(record: Dict[str, Any], job_dir: str) -> bool:
    """Add the job's attempts and pending restart to its record; True while a restart is pending (the job then
    counts as running: its runner is gone but it is not over)."""
    attempts = read_json(os.path.join(job_dir, ATTEMPTS))
    if isinstance(attempts, list) and attempts:
        record["attempts"] = attempts[-MAX_ATTEMPTS:]
        first = attempts[0].get("started_at") if isinstance(attempts[0], dict) else None
        if isinstance(first, (int, float)):
            record["started_at"] = first  # the job's start: its cost counts every attempt
    pending = read_json(os.path.join(job_dir, PENDING))
    if isinstance(pending, dict) and policy_of(record):
        record["attempt"] = pending.get("attempt")
        if pending.get("due_at") is not None:
            record["restart_at"] = pending.get("due_at")
    if os.path.exists(os.path.join(job_dir, "status.json")):
        return False
    return os.path.exists(os.path.join(job_dir, ATTEMPT)) or bool(isinstance(pending, dict) and pending.get("due_at"))


def end_pending(job_dir: str, why: str) -> bool:
    """End a job waiting for its next attempt (the caller holds the queue lock and wrote kill.json); False
    when that attempt is already being launched (its runner sees kill.json and ends it)."""
    if os.path.exists(os.path.join(job_dir, "status.json")):
        return True
    pending = read_json(os.path.join(job_dir, PENDING))
    pending = pending if isinstance(pending, dict) else {}
    last = read_json(os.path.join(job_dir, ATTEMPT))
    if not isinstance(last, dict) and pending.get("launched_at") is not None:
        return False
    last = last if isinstance(last, dict) else {}
    if pending:
        write_json(os.path.join(job_dir, PENDING), dict(pending, due_at=None))
    end_job(job_dir, {"exit_code": last.get("exit_code", pending.get("after_exit")), "ended_at": time.time(), "error": why})
    return True


def wait_launched(job_dir: str, timeout: float) -> None:
    """Wait (bounded) until the attempt being launched has written its pid.json, or the job has ended."""
    pending = read_json(os.path.join(job_dir, PENDING)) or {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not os.path.exists(os.path.join(job_dir, "status.json")):
        if (read_json(os.path.join(job_dir, "pid.json")) or {}).get("attempt") == pending.get("attempt"):
            return
        time.sleep(0.05)


def slurm_requeued(job_dir: str, restart_count: str) -> int:
    """The attempt a Slurm batch run is: ``SLURM_RESTART_COUNT`` + 1. A run Slurm requeued (a node failure, a
    preemption, ``scontrol requeue``) first files the previous run's end in attempts.json (lost when its runner
    wrote none), removes that run's status.json (Slurm runs the job again: it is not over) and marks the log."""
    count = restart_count.strip()
    if not count.isdigit() or not 1 <= int(count) < 10**6:
        return 1
    n = int(count) + 1
    attempts = read_json(os.path.join(job_dir, ATTEMPTS))
    attempts = attempts if isinstance(attempts, list) else []
    if any(isinstance(a, dict) and a.get("attempt") == n - 1 for a in attempts):
        return n  # filed already (this run's runner started once before)
    status_path, log_path = os.path.join(job_dir, "status.json"), os.path.join(job_dir, "output.log")
    end = read_json(status_path)
    end = end if isinstance(end, dict) else {"lost": "the run ended with its node: no exit status"}
    pids = read_json(os.path.join(job_dir, "pid.json"))
    pids = pids if isinstance(pids, dict) else {}
    start = attempts[-1].get("log_end", 0) if attempts and isinstance(attempts[-1], dict) else 0
    start = start if isinstance(start, int) else 0
    _read_through(job_dir)  # (not through: the progress kept so far)
    hint, progress = log_hint(_tail(log_path, start)), attempt_progress(job_dir, start)
    attempts.append({
        "attempt": n - 1, "started_at": pids.get("started_at"), "ended_at": end.get("ended_at") or time.time(),
        "exit_code": end.get("exit_code"), "signal": end.get("signal"), "hint": end.get("lost") or hint,
        "progress": progress, "requeued_by": "slurm",
    })
    write_json(os.path.join(job_dir, ATTEMPTS), attempts[-MAX_ATTEMPTS:])
    try:
        os.unlink(status_path)
    except FileNotFoundError:
        pass
    attempts[-1]["log_end"] = Restarts._mark(job_dir, "── attempt %d, requeued by Slurm ──" % n)
    write_json(os.path.join(job_dir, ATTEMPTS), attempts[-MAX_ATTEMPTS:])
    return n


# --- the decision (in the watchdog) --------------------------------------------------------------------------
def _tail(path: str, start: int) -> bytes:
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(start, size - LOG_TAIL_BYTES, 0))
            return f.read(LOG_TAIL_BYTES)
    except OSError:
        return b""


def _clean(text: bytes) -> str:
    return _CONTROL.sub(" ", text.decode("utf-8", "replace")).strip()[:MAX_HINT]


def log_hint(tail: bytes) -> Optional[str]:
    """The hint of an attempt's log tail: the last error-like line (else the last line), None when none."""
    lines = [ln for ln in re.split(rb"[\r\n]+", tail) if ln.strip() and not ln.startswith("── ".encode())]
    errors = [ln for ln in lines if _ERROR.search(ln)]
    return (_clean((errors or lines)[-1]) or None) if lines else None


def _read_through(job_dir: str) -> bool:
    """Bring the job's series.json up to its log's end (CATCH_UP_READS at most); False when more is left. A
    series that cannot be kept (a full disk) is left as it is: the attempt is decided with what it holds."""
    try:
        return series.read_through(job_dir, CATCH_UP_READS) is not None
    except (OSError, ValueError):
        return True


def attempt_progress(job_dir: str, start: int) -> Optional[str]:
    """The last step/epoch (``"step 1200"``) printed by the attempt whose log starts at ``start``, as the job's
    series.json keeps it (the whole log read, however much followed); None when it printed none."""
    ex = series.Extractor.load(os.path.join(job_dir, series.SERIES_NAME))
    return ex.progress if ex.progress is not None and ex.progress_at >= start else None


def _crash_loop(attempts: List[Dict[str, Any]]) -> Optional[str]:
    """Why the last attempts are a crash loop (no progress between them), or None."""
    last = attempts[-CRASH_LOOP_ATTEMPTS:]
    if len(last) < CRASH_LOOP_ATTEMPTS or any(a.get("streak_reset") for a in last[1:]):
        return None
    hint = last[-1].get("hint") or "exit %s" % last[-1].get("exit_code")
    progress = {a.get("progress") for a in last}
    if len(progress) == 1 and None not in progress:
        return "crash loop: %d attempts at %s, last error: %s" % (len(last), progress.pop(), hint)
    if all(not a.get("log_bytes") for a in last):
        return "crash loop: %d attempts with no output, last error: %s" % (len(last), hint)
    return None


def backoff(policy: Dict[str, Any], streak: int) -> float:
    """Seconds before attempt ``streak + 1`` of a failing stretch: ``backoff_s`` doubling to ``backoff_max_s``."""
    return min(float(policy.get("backoff_s", 30.0)) * 2 ** max(0, streak - 1), float(policy.get("backoff_max_s", 600.0)))


_WHAT_LOST = {"lost when the instance stopped": "the instance's stop"}


class Restarts:
    """Decides and launches the restarts of one state dir's jobs (one pass per watchdog pass)."""

    def __init__(self, store: Any, log: Callable[[str], None], boot: Optional[str]) -> None:
        self.store = store
        self.log = log
        self.boot = boot

    def run_pass(self, released: bool = False) -> int:
        """Handle each job with a policy; how many still wait for a restart (they keep the watchdog running).
        It never raises: a failure is logged and counts as one waiting (the next pass tries again)."""
        try:
            jobs = self.store.list()
        except Exception as exc:  # (a full disk...): never the end of the watchdog
            self.log("restart: cannot list the jobs: %r (tried again next pass)" % exc)
            return 1
        waiting = 0
        for job in jobs:
            if policy_of(job) is None or job.get("ended_at") is not None or job.get("scheduler") == "slurm":
                continue
            try:
                waiting += self._job(str(job["id"]), job, released)
            except Exception as exc:  # this job's damaged files: the others go on
                self.log("restart: job %s: %r (tried again next pass)" % (job.get("id"), exc))
                waiting += 1
        return waiting

    def _job(self, jid: str, job: Dict[str, Any], released: bool) -> int:
        job_dir = self.store.job_dir(jid)
        attempt_over = os.path.exists(os.path.join(job_dir, ATTEMPT)) or job.get("state") == P.JOB_LOST
        if attempt_over and not _read_through(job_dir):
            return 1  # the ended attempt's progress is not read yet (much output, or another reader): next pass
        with self.store.queue_locked():  # a kill (its tombstone) and a restart never cross
            if os.path.exists(os.path.join(job_dir, "status.json")):
                return 0
            ended = read_json(os.path.join(job_dir, ATTEMPT))
            if isinstance(ended, dict):
                return self._ended(jid, job_dir, job, ended, released)
            if job.get("state") == P.JOB_LOST:
                return self._ended(jid, job_dir, job, self._lost(job_dir), released)
            pending = read_json(os.path.join(job_dir, PENDING))
            if not isinstance(pending, dict) or pending.get("due_at") is None:
                return 1  # running: the watchdog stays to decide when it ends
            if os.path.exists(os.path.join(job_dir, "kill.json")):
                self._final(jid, job_dir, None, "killed while waiting to restart")
                return 0
            if released:
                self._final(jid, job_dir, pending.get("after_exit"), "not restarted: the host was released")
                return 0
            return self._maybe_launch(jid, job_dir, pending)

    def _lost(self, job_dir: str) -> Dict[str, Any]:
        """The end of an attempt whose runner vanished without a word: a reboot, the instance's stop (a pod's
        container ends with every process in it; the machine's boot stays, PID 1 is new), a killed tmux server.
        After a reboot or a stop the job did nothing wrong: ``rebooted``, it resumes with no backoff."""
        from ..host.boot import life_start

        pids = read_json(os.path.join(job_dir, "pid.json")) or {}
        started, life = pids.get("started_at"), life_start()
        if pids.get("boot_id") not in (None, self.boot):
            why = "lost in a reboot"
        elif isinstance(started, (int, float)) and life is not None and started < life:
            why = "lost when the instance stopped"
        else:
            why = "lost: its runner died"
        return {"exit_code": None, "signal": None, "ended_at": time.time(), "lost": why,
                "rebooted": why != "lost: its runner died"}

    def _ended(self, jid: str, job_dir: str, job: Dict[str, Any], end: Dict[str, Any], released: bool) -> int:
        """Keep the attempt that ended and decide: restart after a backoff, or the job's end."""
        policy = policy_of(job) or {}
        pids = read_json(os.path.join(job_dir, "pid.json")) or {}
        pending = read_json(os.path.join(job_dir, PENDING)) or {}
        n = current_attempt(job_dir)
        attempts = read_json(os.path.join(job_dir, ATTEMPTS))
        attempts = attempts if isinstance(attempts, list) else []
        if not attempts or attempts[-1].get("attempt") != n:  # (idempotent: a crash may come between steps)
            log_path = os.path.join(job_dir, "output.log")
            start = int(pending.get("log_offset") or 0)
            try:
                size = os.lstat(log_path).st_size
            except OSError:
                size = start
            hint, progress = log_hint(_tail(log_path, start)), attempt_progress(job_dir, start)
            started = pids.get("started_at") if pids.get("attempt", 1) == n else None
            ended_at = float(end.get("ended_at") or time.time())
            healthy = isinstance(started, (int, float)) and ended_at - started >= float(policy.get("healthy_s", 600.0))
            attempts.append({
                "attempt": n, "started_at": started, "ended_at": ended_at, "exit_code": end.get("exit_code"),
                "signal": end.get("signal"), "hint": end.get("lost") or hint, "progress": progress,
                "log_bytes": max(0, size - start), "streak_reset": healthy, "rebooted": bool(end.get("rebooted")),
            })
            write_json(os.path.join(job_dir, ATTEMPTS), attempts[-MAX_ATTEMPTS:])
        last = attempts[-1]
        streak = int(pending.get("streak") or 0)
        streak = 1 if last.get("streak_reset") else streak + 1
        code, hint = last.get("exit_code"), last.get("hint")
        why = _crash_loop(attempts)
        if why is None and streak >= int(policy.get("max", DEFAULT_MAX)):
            why = "gave up after %d attempts in a row, last error: %s" % (streak, hint or "exit %s" % code)
        if why is None and released:
            why = "not restarted: the host was released"
        if why is not None:
            self._final(jid, job_dir, code, why, end)
            return 0
        wait = 0.0 if last.get("rebooted") else backoff(policy, streak)
        after = "%s lost the job" % _WHAT_LOST.get(str(hint), "a reboot") if last.get("rebooted") else (
            str(last.get("hint")) if end.get("lost") else "exit %s%s" % (code, " (%s)" % hint if hint else ""))
        total = int(policy.get("max", DEFAULT_MAX)) - streak + n
        marker = "── attempt %d of %d, after %s, %.0f s backoff ──" % (n + 1, total, after, wait)
        offset = self._mark(job_dir, marker)
        write_json(os.path.join(job_dir, PENDING), {
            "attempt": n + 1, "due_at": time.time() + wait, "streak": streak, "after_exit": code,
            "log_offset": offset, "launched_at": None,
        })
        self._unlink(os.path.join(job_dir, ATTEMPT))
        if last.get("rebooted"):
            self.log("restart: job %s was %s: resuming it (attempt %d) in %.0f s" % (jid, hint, n + 1, wait))
        else:
            self.log("restart: job %s attempt %d ended (%s): attempt %d in %.0f s" % (jid, n, after, n + 1, wait))
        return 1

    def _maybe_launch(self, jid: str, job_dir: str, pending: Dict[str, Any]) -> int:
        now = time.time()
        launched = pending.get("launched_at")
        if launched is not None:
            pids = read_json(os.path.join(job_dir, "pid.json")) or {}
            if pids.get("attempt") == pending.get("attempt"):
                write_json(os.path.join(job_dir, PENDING), dict(pending, due_at=None))  # it runs
                return 1  # the watchdog stays to decide when it ends (it left here: a long attempt's end was lost)
            if now - float(launched) < LAUNCH_GRACE_S:
                return 1
            self._final(jid, job_dir, pending.get("after_exit"), "restart failed: the runner of attempt %s did not "
                        "come up" % pending.get("attempt"))
            return 0
        if now < float(pending["due_at"]):
            return 1
        write_json(os.path.join(job_dir, PENDING), dict(pending, launched_at=now))
        self.log("restart: starting job %s attempt %s" % (jid, pending.get("attempt")))
        try:
            self.store.launch(jid)
        except Exception as exc:  # JobError: tmux refused; the store wrote status.json with its error
            self.log("restart: job %s could not start: %s" % (jid, exc))
            return 0
        return 1

    def _final(self, jid: str, job_dir: str, code: Any, why: str, end: Optional[Dict[str, Any]] = None) -> None:
        """End the job for good with ``why`` (the record's error; a crash loop notifies ``crash_loop``)."""
        final = dict(end or {}, exit_code=code, ended_at=time.time(), error=why)
        final.pop("lost", None)
        final.pop("rebooted", None)
        pending = read_json(os.path.join(job_dir, PENDING))
        if isinstance(pending, dict):
            write_json(os.path.join(job_dir, PENDING), dict(pending, due_at=None))
        end_job(job_dir, final)
        self._unlink(os.path.join(job_dir, ATTEMPT))
        self.log("restart: job %s ends for good: %s" % (jid, why))

    @staticmethod
    def _mark(job_dir: str, marker: str) -> int:
        """Append the marker line to the job's log; the log's size after it (the next attempt's start)."""
        path = os.path.join(job_dir, "output.log")
        try:
            fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, ("\n%s\n" % marker).encode("utf-8"))
                return os.fstat(fd).st_size
            finally:
                os.close(fd)
        except OSError:
            return 0

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def released(state_dir: str) -> bool:
    """Whether the watchdog released this host in this life of it (no job restarts on a host being given back;
    a stopped pod started again is a new life: its jobs resume)."""
    from ..host.boot import life_start

    state = read_json(os.path.join(state_dir, "watchdog_state.json"))
    if not isinstance(state, dict) or state.get("action") != "released":
        return False
    booted = life_start()
    try:
        return booted is None or float(state.get("t") or 0.0) >= booted
    except (TypeError, ValueError):
        return True


def waiting(jobs: List[Dict[str, Any]]) -> bool:
    """Whether a job has a restart to decide or to launch (the agent then makes sure the watchdog runs)."""
    return any(
        policy_of(j) and j.get("ended_at") is None and (j.get("state") == P.JOB_LOST or j.get("restart_at") is not None
                                                          or j.get("restart_pending"))
        for j in jobs
    )

"""Autostop and deadline watchdog: a detached process on the host that releases it with the laptop closed.

It reads ``watchdog.json`` (written by the agent from the client's config), applies the idle rule every
``interval`` seconds, and when the host has been idle for ``autostop_minutes`` (or ``release_at`` has come)
runs the optional ``pre_stop`` hook and then ``release_remote``, or, with no ``release_remote``, releases
through the provider's API with the instance's own key (RunPod, vast.ai: ``release_via``, found by the agent
when it armed the watchdog; ``remote_agent/host/provider.py``). A provider release is recorded on disk
(``RELEASE_REQUEST``) before it is asked for, as the container may end with the call, then read back until the
provider says stopped / terminated; a failed or unconfirmed one is never taken as released: it is logged,
notified (``release_failed``) and tried again with a growing wait. At every arming the release is checked
without side effects (``release_check``: the provider answers for this instance with this key, or the command
exists here); the verdict goes to ``RELEASE_CHECK``, and a failing one is notified (``release_check_failed``).
Every decision goes to ``watchdog.log``;
its view of the world goes to ``watchdog_state.json``. Any error while checking activity counts as
activity: it never releases on doubt. The config is keyed to the boot id, so a reboot disarms it.

The idle window starts no earlier than the moment autostop was armed (``armed_at``, renewed when the settings
change) nor than the end of a snooze, and it must also have been watched by this process for the whole window
on the monotonic clock, so a wall-clock jump or a watchdog restart never shortens it; a deadline, likewise, must
also have come on the monotonic clock. The config is read again just before acting, and config and activity
once more after ``pre_stop`` (which may run for minutes): a disarm, snooze, cancel or new job meanwhile wins.
"""

import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from .. import build_id
from ..fsutil import open_regular, read_json, write_json
from ..host import provider as pv
from ..host.boot import boot_id, boot_time
from ..metrics import faults
from ..metrics.ring import latest_sample
from . import notify
from .activity import ActivityLog, idle_status
from .rules import (
    CHECK_CALL_S,
    DEADLINE_GRACE_S,
    api_url,
    deadline_at,
    disarmed_because,
    is_armed,
    plan,
    release_check,
    releases,
    stalled_idle,
    stalled_jobs,
    view,
    window_start,
)
from .stall import StallTracker
from .state import (
    CONFIG,
    LOCK,
    LOG,
    MAX_LOG_BYTES,
    OWNER,
    RELEASE_CHECK,
    RELEASE_REQUEST,
    REVISION,
    STATE,
    STOP,
    log_line,
)
from .takeover import (
    ensure_running,
    hold,
    legacy_holder,
    lock_holder,
    owner,
    stop_requested,
)

#: The watchdog's face for the agent and the tests: the loop here, its rules, files and takeover beside it.
__all__ = [
    "CHECK_CALL_S", "CONFIG", "DEADLINE_GRACE_S", "LOCK", "LOG", "MAX_LOG_BYTES", "OWNER", "RELEASE_CHECK",
    "RELEASE_REQUEST", "REVISION", "STATE", "STOP", "Watchdog", "api_url", "deadline_at", "disarmed_because",
    "ensure_running", "is_armed", "legacy_holder", "lock_holder", "log_line", "owner", "plan", "provider_release",
    "release_check", "run", "stalled_idle", "stalled_jobs", "stop_requested", "view", "window_start",
]

RETRY_AFTER_FAILURE_S = 300.0
#: A release that failed again waits twice as long as before, up to this.
RETRY_MAX_S = 3600.0
#: Bound on each provider call from the watchdog (the API's own deadline).
PROVIDER_CALL_S = 20.0
#: The release is checked again this often while armed (its verdict and the provider's price stay fresh).
RECHECK_S = 1800.0
#: An agent's ring sample at most this old stands for a fresh reading of the GPUs.
RING_FRESH_S = 5.0


class Watchdog:
    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.activity = ActivityLog(state_dir)
        self.stalls = StallTracker()
        self.stalled: Dict[str, Dict[str, Any]] = {}  # job id -> {"since", "why"}, as last logged
        self.notifier = notify.Notifier(state_dir, self.log)
        self.jobs: List[Dict[str, Any]] = []  # as last sampled
        self.queue_held = False  # the queue kept the host busy in the last pass
        self.retry_at = 0.0
        self.failures = 0  # release attempts that failed in a row (the backoff)
        self.last_error = ""  # why the last one failed
        self.checked_for: Optional[Any] = None  # the arming (``armed_at``) the release was last checked for
        self.checked_at = 0.0  # when (wall clock)
        self.watched_since: Optional[float] = None  # monotonic time of this process' first idle sample
        self._deadline: Optional[Tuple[float, float]] = (
            None  # (release_at, when it comes on the monotonic clock)
        )

    def path(self, name: str) -> str:
        return os.path.join(self.state_dir, name)

    def log(self, message: str) -> None:
        log_line(self.state_dir, message)

    def _run_hook(self, what: str, argv: List[str], timeout: float) -> bool:
        self.log("%s: running %s" % (what, argv))
        try:
            res = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.log("%s: timed out after %.0f s" % (what, timeout))
            return False
        except OSError as exc:
            self.log("%s: cannot run: %s" % (what, exc))
            return False
        out = (res.stdout + res.stderr).decode("utf-8", "replace").strip()[-2000:]
        self.log("%s: exit %d%s" % (what, res.returncode, ": " + out if out else ""))
        return res.returncode == 0

    def read_config(self) -> Optional[Dict[str, Any]]:
        return read_json(self.path(CONFIG))

    def check(
        self, config: Dict[str, Any], facts: Dict[str, Any], sample_fn: Any,
        now: Optional[float] = None, mono: Optional[float] = None,
    ) -> Dict[str, Any]:
        """One pass: measure, decide, maybe act. Returns the state written to disk.

        ``now`` (wall clock) and ``mono`` (monotonic clock) default to the real clocks.
        """
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        state = self._decide(config, facts, sample_fn, now, mono)
        check = self._check_release(config, now)
        if state["due"] and now >= self.retry_at:
            self._release(config, facts, sample_fn, state, now, mono)
        elif state["due"] and self.failures:
            state.update(action="release failed", release_error=self.last_error, retry_at=self.retry_at)
        write_json(self.path(STATE), state)
        if notify.enabled(config.get("notify")):
            self._notify(config, state, now, check)
        return state

    def _check_release(self, config: Dict[str, Any], now: float) -> Optional[Dict[str, Any]]:
        """At each arming (a new ``armed_at``) of a release, and every RECHECK_S while armed: check it
        (``release_check``) and keep the verdict in ``RELEASE_CHECK``. The verdict of this pass when one was made, else None."""
        if not releases(config):
            return None
        if config.get("armed_at") == self.checked_for and now - self.checked_at < RECHECK_S:
            return None
        self.checked_for, self.checked_at = config.get("armed_at"), now
        verdict = release_check(config, now)
        write_json(self.path(RELEASE_CHECK), dict(verdict, armed_at=config.get("armed_at")))
        self.log("release check: %s: %s" % ("ok" if verdict["ok"] else "FAILED", verdict["detail"]))
        return verdict

    def _notify(
        self, config: Dict[str, Any], state: Dict[str, Any], now: float, check: Optional[Dict[str, Any]] = None
    ) -> None:
        """Owe a notification for each new event of this pass, then send what is owed."""
        settings = config["notify"]
        host = notify.clean(settings.get("host") or "host")
        events = notify.job_events(self.jobs, float(config.get("armed_at") or 0.0))
        for jid, verdict in sorted((state.get("stalled") or {}).items()):
            events.append({"key": "stalled:%s:%s" % (jid, verdict.get("since")), "event": "stalled",
                           "text": "job %s stalled: %s" % (jid, verdict.get("why"))})
        autostop_at = state.get("autostop_at")
        start = window_start(config, float(state.get("idle_since") or now))  # of this idle stretch
        if autostop_at is not None and state.get("action") is None and autostop_at - now <= notify.SOON_S:
            text = "autostop releases the host in %.0f min" % (max(0.0, autostop_at - now) / 60.0)
            key = "autostop_soon:%s:%s" % (config.get("boot_id"), start)  # once per idle stretch
            events.append({"key": key, "event": "autostop_soon", "text": text})
        events += notify.host_events(config, state, self.jobs, start, now)
        if state.get("action") == "released":
            how = "; " + state["released_how"] if not config.get("release_remote") else ""
            events.append({"key": "released:%s:%s" % (config.get("boot_id"), now), "event": "released",
                           "text": "released (%s%s)" % (state.get("due"), how)})
        events += self._release_events(config, state, check)
        for fault in faults.read(self.state_dir, float(config.get("armed_at") or 0.0))[-20:]:  # the GPUs' XIDs
            events.append({"key": "gpu_fault:%s:%s:%s" % (fault["gpu"], fault.get("xid"), fault["t"]),
                           "event": "gpu_fault", "text": "GPU %s: %s; %s" % (fault["gpu"], faults.label(fault),
                                                                          fault.get("fix"))})
        for e in events:
            e["text"] = "[%s] %s" % (host, e["text"])
        self.notifier.queue(settings, events, now)
        self.notifier.flush(settings, now)

    def _release_events(
        self, config: Dict[str, Any], state: Dict[str, Any], check: Optional[Dict[str, Any]]
    ) -> List[Dict[str, str]]:
        """``release_check_failed`` (once per arming) and ``release_failed`` (once per failed attempt)."""
        out = []
        if check is not None and not check["ok"]:
            out.append({"key": "release_check_failed:%s" % config.get("armed_at"), "event": "release_check_failed",
                        "text": "release check failed, the host would NOT be released: %s" % check["detail"]})
        if state.get("action") == "release failed" and state.get("attempt"):
            wait = max(0.0, float(state.get("retry_at") or 0.0) - float(state.get("t") or 0.0)) / 60.0
            out.append({"key": "release_failed:%s:%s:%s" % (config.get("boot_id"), config.get("armed_at"),
                                                            state["attempt"]),
                        "event": "release_failed",
                        "text": "release FAILED, the host still bills: %s (tried again in %.0f min)"
                                % (state.get("release_error"), wait)})
        return out

    def _decide(
        self, config: Dict[str, Any], facts: Dict[str, Any], sample_fn: Any, now: float, mono: float
    ) -> Dict[str, Any]:
        """Measure activity and plan: the state, with ``due`` set when a release is due now."""
        util_percent = float(config.get("idle_util_percent", 5.0))
        stalled: Dict[str, Dict[str, Any]] = {}
        try:
            sample, jobs = sample_fn()
            self.jobs = jobs
            if config.get("stall_minutes"):
                stalled = self.stalls.update(sample, jobs, util_percent, config["stall_minutes"], now, mono)
            as_idle = set(stalled) if config.get("stalled_counts_as_idle") else set()
            idle = idle_status(
                sample, jobs, self.activity, facts, util_percent, bool(config.get("count_sessions", True)), now,
                idle_jobs=as_idle,
            )
        except Exception as exc:  # never release on doubt
            idle = {"reasons": ["activity check failed: %r" % exc], "idle_since": now, "idle_seconds": 0.0}
        self._log_stalls(stalled, bool(config.get("stalled_counts_as_idle")))
        self._log_queue(idle["reasons"])
        if idle["reasons"]:
            self.watched_since = None
        elif self.watched_since is None:
            self.watched_since = mono
        watched = 0.0 if self.watched_since is None else mono - self.watched_since
        decision = plan(config, idle, now, watched, self._deadline_held(deadline_at(config), now, mono))
        state = dict(idle, **decision)
        state.update(t=now, pid=os.getpid(), action=None, stalled=stalled)
        return state

    def _log_stalls(self, stalled: Dict[str, Dict[str, Any]], as_idle: bool) -> None:
        """Log each job that became stalled (and whether autostop counts it as idle), and each that recovered."""
        for jid in sorted(set(stalled) - set(self.stalled)):
            rule = "counts as idle (stalled_counts_as_idle)" if as_idle else "still counts as busy"
            self.log("job %s stalled: %s; %s" % (jid, stalled[jid]["why"], rule))
        for jid in sorted(set(self.stalled) - set(stalled)):
            self.log("job %s no longer stalled" % jid)
        self.stalled = stalled

    def _log_queue(self, reasons: List[str]) -> None:
        """Log when the queue starts and stops holding the host busy (autostop waits for it)."""
        held = next((r for r in reasons if " queued (" in r), None)
        if bool(held) != self.queue_held:
            self.log("autostop waits: %s" % held if held else "the queue is empty: it no longer holds autostop")
            self.queue_held = bool(held)

    def _deadline_held(self, release_at: Optional[float], now: float, mono: float) -> bool:
        """A deadline must also have come on the monotonic clock, counted from when this process first saw it."""
        if release_at is None:
            return False
        if self._deadline is None or self._deadline[0] != release_at:
            self._deadline = (release_at, mono + max(0.0, float(release_at) - now))
        return mono < self._deadline[1]

    def _release(
        self, config: Dict[str, Any], facts: Dict[str, Any], sample_fn: Any, state: Dict[str, Any],
        now: float, mono: float,
    ) -> None:
        """Run ``pre_stop`` then ``release_remote``, unless the config or the host changed before each step."""
        if self.read_config() != config:
            self.log("not releasing: the config changed meanwhile (%s)" % state["due"])
            return
        counted = sorted(state.get("stalled") or {}) if config.get("stalled_counts_as_idle") else []
        why = "; stalled jobs counted as idle: %s" % ", ".join(counted) if counted else ""
        self.log("releasing: %s%s" % (state["due"], why))
        hook = config.get("pre_stop")
        if hook:
            started = time.monotonic()
            self._run_hook("pre_stop", hook, float(config.get("pre_stop_timeout", 300)))
            took = time.monotonic() - started  # the hook may run for minutes: look again before releasing
            again = self._decide(config, facts, sample_fn, now + took, mono + took)
            changed = self.read_config() != config
            if changed or not again["due"]:
                why = (
                    "the config changed" if changed else "not due any more (%s)" % "; ".join(again["reasons"])
                )
                self.log("not releasing: %s while pre_stop ran" % why)
                state.update(again)
                return
        if config.get("release_remote"):
            ok = self._run_hook("release_remote", config["release_remote"], float(config.get("release_timeout", 120)))
            error = None if ok else "release_remote failed (see watchdog.log)"
            how = "release_remote exited 0"
        else:
            how, error = self._provider_release(config, state, now)
        if error is None:
            self.failures = 0
            state.update(action="released", released_how=how)
        else:
            self._failed(state, error, now)

    def _failed(self, state: Dict[str, Any], error: str, now: float) -> None:
        """A release that did not stop the bill: never taken as released; tried again after a growing wait."""
        self.failures += 1
        self.last_error = error
        self.retry_at = now + min(RETRY_MAX_S, RETRY_AFTER_FAILURE_S * 2 ** (self.failures - 1))
        state.update(action="release failed", release_error=error, attempt=self.failures, retry_at=self.retry_at)
        self.log("release failed (attempt %d, next try in %.0f s): %s" % (self.failures, self.retry_at - now, error))

    def _provider_release(
        self, config: Dict[str, Any], state: Dict[str, Any], now: float
    ) -> Tuple[str, Optional[str]]:
        return provider_release(self.state_dir, config, state["due"], now, self.log)


def provider_release(
    state_dir: str, config: Dict[str, Any], due: str, now: float, log: Any
) -> Tuple[str, Optional[str]]:
    """Release through the provider's API: (how it was confirmed, None) or ("", why it failed). The request is
    on disk (``RELEASE_REQUEST``) before the call, as the container may end with it. Only the instance armed
    (``release_via``) and detected again now, under the ``provider`` setting, is ever released."""
    wanted = pv.detected_from(config.get("release_via"))
    detected = pv.detect_for(config.get("provider"))
    if wanted is None or detected != wanted:
        return "", "the provider detection changed since arming (now %s %s): not releasing through it" % (
            detected.provider, detected.instance_id)
    url, mode = api_url(config, detected.provider), config.get("release_mode")
    try:
        if not mode:
            mode = pv.mode_for(pv.instance(detected, url, deadline_s=PROVIDER_CALL_S), None)
        write_json(os.path.join(state_dir, RELEASE_REQUEST), {"t": now, "provider": detected.provider, "mode": mode,
                                                               "instance_id": detected.instance_id, "due": due})
        log("provider release: asking %s to %s instance %s" % (detected.provider, mode, detected.instance_id))
        pv.release(detected, mode, url, deadline_s=PROVIDER_CALL_S)
        done = pv.confirm(detected, mode, float(config.get("release_timeout", 120)),
                          min(5.0, float(config.get("interval", 15.0))), url, deadline_s=PROVIDER_CALL_S)
    except pv.ProviderError as exc:
        return "", "%s %s: %s" % (detected.provider, mode or "release", exc)
    log("provider release: confirmed, %s (%d reads)" % (done.how, done.polls))
    return "%s (%s)" % (done.how, done.state), None


def run(state_dir: str, launcher: Optional[List[str]] = None) -> int:
    """The watchdog's main loop; returns when disarmed (and no job is queued), after a release, when another
    one of this build (or a newer one) runs, or when a newer build asked it to exit. ``launcher``: the argv
    that runs this agent build (to launch the queue's jobs).

    One watchdog per state dir (the lock). One of an older build is asked to exit (``STOP``) at its next safe
    point, between passes (never during a release), and waited for, bounded; then this one takes over.
    """
    with os.fdopen(open_regular(os.path.join(state_dir, LOCK), os.O_WRONLY | os.O_CREAT), "w") as lock:
        if not hold(state_dir, lock):
            return 0
        return _loop(state_dir, launcher or [])


def _loop(state_dir: str, launcher: List[str]) -> int:
    from ..jobs import restart as restart_policy
    from ..jobs.queue import PASS_S, QUEUE, JobQueue, host_queued
    from ..jobs.store import JobStore
    from ..metrics.sampler import MetricsSampler

    dog = Watchdog(state_dir)
    jobs = JobStore(state_dir, launcher=launcher)
    queue = JobQueue(jobs, dog.log)
    first = dog.read_config() or {}
    smi = first.get("nvidia_smi") or queue.state().get("nvidia_smi")
    samplers: List[MetricsSampler] = []  # opened only while no agent samples into the metrics ring
    watcher = faults.FaultWatcher(state_dir)  # the GPUs' XIDs, heard with no client (when no agent holds them)
    facts = {"boot_id": boot_id(), "boot_time": boot_time()}
    queue_error: Optional[str] = None  # the last queue pass's failure, logged once
    dog.log("started (pid %d)" % os.getpid())
    restarts = restart_policy.Restarts(jobs, dog.log, facts["boot_id"])  # restart policies

    def sample_fn() -> Any:
        fresh = latest_sample(state_dir, RING_FRESH_S)  # an agent's reading: no NVML calls of our own
        if fresh is not None:
            return fresh, jobs.list()
        if not samplers:
            samplers.append(
                MetricsSampler(state_dir, nvidia_smi=smi if isinstance(smi, str) and smi else "nvidia-smi",
                               faults=watcher)
            )
        return samplers[0].sample(jobs.owner_lookup()), jobs.list()

    try:
        while True:
            newer = stop_requested(state_dir)  # a safe point: between passes
            if newer is not None:
                dog.log("exiting: build %s takes over from this build (%s)" % (newer, build_id()))
                return 0
            config = dog.read_config()
            why = disarmed_because(config, facts["boot_id"])
            watcher.poll(0)  # recorded for every reader; notified by dog.check (gpu_fault)
            try:
                taken: Any = sample_fn()
            except Exception as exc:  # the activity check counts this as activity; the queue waits
                taken = exc
            try:
                waiting = queue.run_pass(None if isinstance(taken, Exception) else taken[0],
                                         [] if isinstance(taken, Exception) else taken[1], facts["boot_id"])
                queue_error = None
            except Exception as exc:  # (a full disk...): never the end of autostop; the next pass tries again
                if repr(exc) != queue_error:
                    dog.log("queue pass failed (tried again every %g s): %r" % (PASS_S, exc))
                queue_error = repr(exc)
                waiting = 1 if isinstance(taken, Exception) else sum(map(host_queued, taken[1])) + queue.coming_up(taken[1])
            # Restart policies (remote_agent/jobs/restart.py): a pending restart keeps the watchdog running.
            waiting += restarts.run_pass(restart_policy.released(state_dir))
            if why is not None and not waiting:
                dog.log("disarmed: %s" % why)
                return 0
            if why is None:
                state = dog.check(config, facts, lambda taken=taken: _taken(taken, jobs))
                if state["action"] == "released":
                    restarts.run_pass(True)  # a job waiting to restart ends for good, saying why
                    return 0
            interval = float((config or {}).get("interval", 15.0)) if why is None else PASS_S
            _nap(min(interval, PASS_S) if waiting else interval, os.path.join(state_dir, QUEUE), state_dir)
    finally:
        dog.notifier.finish(2 * notify.TIMEOUT_S)  # e.g. the ``released`` message, sent as the host goes
        for sampler in samplers:
            sampler.close()
        watcher.close()


def _taken(taken: Any, jobs: Any) -> Any:
    """This pass's sample with the jobs as they are now (the queue may have started some); raises its error."""
    if isinstance(taken, Exception):
        raise taken
    return taken[0], jobs.list()


def _nap(seconds: float, queue_file: str, state_dir: str) -> None:
    """Sleep, waking early when the queue file changes (a submission) or a newer build asks this one to exit."""
    def mtime() -> float:
        try:
            return os.stat(queue_file).st_mtime
        except OSError:
            return 0.0

    seen, end = mtime(), time.monotonic() + seconds
    while time.monotonic() < end and mtime() == seen and stop_requested(state_dir) is None:
        time.sleep(min(0.25, max(0.0, end - time.monotonic())))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1]))

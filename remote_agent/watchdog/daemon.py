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

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from .. import build_id
from ..fsutil import open_regular, read_json, write_json
from ..host import provider as pv
from ..host.boot import boot_id, boot_time
from ..metrics import faults
from ..metrics.ring import latest_sample
from . import notify
from .activity import ActivityLog, idle_status
from .stall import StallTracker

CONFIG, STATE, LOG, LOCK = "watchdog.json", "watchdog_state.json", "watchdog.log", "watchdog.lock"
#: Who holds the lock (``{"pid", "build", "revision"}``), and a newer build's request that it exit (``{"pid",
#: "build", "by"}``: the watchdog to exit, the build asking, the pid of the one waiting): see ``run``.
OWNER, STOP = "watchdog_owner.json", "watchdog.stop"
#: The provider release asked for (written before the call) and the last release check's verdict.
RELEASE_REQUEST, RELEASE_CHECK = "release_request.json", "release_check.json"
TAKEOVER = "watchdog.takeover.lock"  # held by the one new watchdog waiting to take over
#: Bumped when the watchdog's behaviour changes: a build never replaces a running watchdog of a higher one (an
#: older client connecting must not bring old release logic back).
REVISION = 3  # 3: releases through the provider, release_failed, the release check at arming
MAX_LOG_BYTES = 1024 * 1024
RETRY_AFTER_FAILURE_S = 300.0
#: A release that failed again waits twice as long as before, up to this.
RETRY_MAX_S = 3600.0
#: Bound on each provider call from the watchdog (the API's own deadline), and on a release check's.
PROVIDER_CALL_S = 20.0
CHECK_CALL_S = 10.0
#: The release is checked again this often while armed (its verdict and the provider's price stay fresh).
RECHECK_S = 1800.0
#: An agent's ring sample at most this old stands for a fresh reading of the GPUs.
RING_FRESH_S = 5.0
#: A deadline comes no sooner than this after it was set (``armed_at``): one that had already passed when it
#: was armed (``release_after_hours`` on a host up longer, a ``release_at`` in the past) waits this long, and
#: its countdown and ``deadline_soon`` say so, instead of releasing the host the moment the setting arrives.
DEADLINE_GRACE_S = 600.0
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def log_line(state_dir: str, message: str) -> None:
    """Append one stamped line to the watchdog log (past MAX_LOG_BYTES it becomes ``watchdog.log.1`` first,
    replacing the one before: the log never takes more than about twice that)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    path = os.path.join(state_dir, LOG)
    try:
        if os.lstat(path).st_size > MAX_LOG_BYTES:
            os.replace(path, path + ".1")
    except OSError:
        pass
    try:
        with os.fdopen(open_regular(path, _APPEND), "a") as f:
            f.write("%s %s\n" % (stamp, message))
    except OSError:
        pass  # e.g. a planted symlink: never write outside the state dir


def disarmed_because(config: Optional[Dict[str, Any]], boot: Optional[str]) -> Optional[str]:
    """Why ``config`` asks for nothing on this boot, or None when it is armed."""
    releases = bool(config and (config.get("autostop_minutes") or config.get("release_at") is not None))
    if not config or not (releases or config.get("stall_minutes") or notify.enabled(config.get("notify"))):
        return "nothing to watch"
    if config.get("boot_id") != boot:
        return "config is from another boot"
    if releases and not config.get("release_remote") and pv.detected_from(config.get("release_via")) is None:
        return "no release_remote command configured"  # and no provider API was found on this host
    return None


def _releases(config: Dict[str, Any]) -> bool:
    return bool(config.get("autostop_minutes") or config.get("release_at") is not None)


def api_url(config: Dict[str, Any], provider: str) -> Optional[str]:
    """The ``[providers.NAME] api_url`` the client sent for ``provider`` (None: the provider's own)."""
    urls = config.get("api_urls")
    url = urls.get(provider) if isinstance(urls, dict) else None
    return url if isinstance(url, str) and url else None


def release_check(config: Dict[str, Any], now: Optional[float] = None) -> Dict[str, Any]:
    """Prove, without side effects, that the release ``config`` asks for would work: ``release_remote``'s
    program exists and is executable here, or the provider's API answers for this instance with this key
    (and can do the release mode). ``{"ok", "via", "detail", "t", ...}``; never raises."""
    now = time.time() if now is None else now
    remote = config.get("release_remote")
    if remote:
        found = shutil.which(str(remote[0]))
        if found is None:
            detail = "release_remote program %r is not found or not executable on the host" % (str(remote[0])[:200],)
        else:
            detail = "release_remote program %s is executable" % found
        return {"ok": found is not None, "via": "command", "detail": detail, "t": now}
    detected = pv.detected_from(config.get("release_via"))
    if detected is None:
        return {"ok": False, "via": "none", "t": now,
                "detail": "no release_remote command and no provider API found on this host"}  # fmt: skip
    verdict: Dict[str, Any] = {"via": detected.provider, "instance_id": detected.instance_id, "t": now}
    mode = config.get("release_mode")
    try:
        found = pv.check(detected, mode, api_url(config, detected.provider), deadline_s=CHECK_CALL_S)
    except pv.ProviderError as exc:
        return dict(verdict, ok=False, detail=str(exc), kind=exc.kind)
    mode = pv.mode_for(found, mode)
    detail = "%s answers for instance %s (%s); release would %s it" % (
        detected.provider, detected.instance_id, found.provider_state, mode)  # fmt: skip
    unusable = ["%s unknown (%s)" % (name.replace("_", " "), why) for name, why in found.unusable]
    if unusable:  # what the release does not need: shown, never deciding it
        detail += "; " + "; ".join(unusable)
    verdict.update(("%s_unknown" % name, why) for name, why in found.unusable if name == "price_per_hour")
    return dict(verdict, ok=True, detail=detail, mode=mode, state=found.state, price_per_hour=found.price_per_hour,
                started_at=found.started_at)  # fmt: skip


def is_armed(config: Optional[Dict[str, Any]], boot: Optional[str]) -> bool:
    return disarmed_because(config, boot) is None


def window_start(config: Dict[str, Any], idle_since: float) -> float:
    """The idle window starts at the idle stretch, but never before arming nor before a snooze ends."""
    return max(idle_since, float(config.get("armed_at") or 0.0), float(config.get("snoozed_until") or 0.0))


def deadline_at(config: Dict[str, Any]) -> Optional[float]:
    """When the deadline releases the host: ``release_at``, but never sooner than DEADLINE_GRACE_S after arming."""
    release_at = config.get("release_at")
    if release_at is None:
        return None
    return max(float(release_at), float(config.get("armed_at") or 0.0) + DEADLINE_GRACE_S)


def plan(
    config: Dict[str, Any], idle: Dict[str, Any], now: float, watched: Optional[float] = None,
    deadline_held: bool = False,
) -> Dict[str, Any]:  # fmt: skip
    """When the watchdog would act, and why: ``{"autostop_at", "release_at", "due"}``.

    ``watched``: for how long (monotonic seconds) the watchdog itself has seen the host idle; the window
    must be covered by that too. ``deadline_held``: the monotonic clock says the deadline has not come yet.
    """
    autostop_at = None
    minutes = config.get("autostop_minutes")
    if minutes and not config.get("cancelled") and not idle["reasons"]:
        window = float(minutes) * 60.0
        autostop_at = window_start(config, idle["idle_since"]) + window
        if watched is not None:
            autostop_at = max(autostop_at, now + window - watched)
    release_at = deadline_at(config)
    due = None
    if release_at is not None and now >= release_at and not deadline_held:
        due = "deadline reached"
    elif autostop_at is not None and now >= autostop_at:
        due = "idle for %.1f min" % ((now - idle["idle_since"]) / 60.0)
    return {"autostop_at": autostop_at, "release_at": release_at, "due": due}


def view(state_dir: str, idle: Dict[str, Any], boot: Optional[str]) -> Optional[Dict[str, Any]]:
    """The watchdog as the agent reports it: its last state, with the plan of the settings in force now
    (so a countdown shows as soon as autostop is armed, and never one from settings since removed)."""
    config = read_json(os.path.join(state_dir, CONFIG))
    if not is_armed(config, boot):
        return None
    now = time.time()
    state = read_json(os.path.join(state_dir, STATE)) or {}
    current = plan(config, dict(idle, idle_since=idle.get("idle_since", now)), now)
    try:
        fresh = float(state.get("t") or 0.0) >= os.path.getmtime(os.path.join(state_dir, CONFIG))
    except OSError:
        fresh = False
    if fresh and state.get("autostop_at") is not None and current["autostop_at"] is not None:
        current["autostop_at"] = max(current["autostop_at"], float(state["autostop_at"]))
    check = read_json(os.path.join(state_dir, RELEASE_CHECK))
    return dict(state, **current, release_check=check if isinstance(check, dict) else None)


def stalled_jobs(state_dir: str, boot: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """The watchdog's stall verdicts ``{id: {"since", "why"}}`` while they are fresh (its last pass is at most
    three intervals old) and stall detection is armed; else none."""
    config = read_json(os.path.join(state_dir, CONFIG))
    if not is_armed(config, boot) or not config or not config.get("stall_minutes"):
        return {}
    state = read_json(os.path.join(state_dir, STATE)) or {}
    try:
        age = time.time() - float(state.get("t") or 0.0)
        fresh = age <= 3.0 * float(config.get("interval", 15.0)) + 30.0
    except (TypeError, ValueError):
        return {}
    stalled = state.get("stalled")
    if not fresh or not isinstance(stalled, dict):
        return {}
    return {str(k): v for k, v in stalled.items() if isinstance(v, dict)}


def stalled_idle(state_dir: str, boot: Optional[str]) -> Set[str]:
    """The jobs the watchdog found stalled, when its settings count them as idle (else none)."""
    config = read_json(os.path.join(state_dir, CONFIG)) or {}
    return set(stalled_jobs(state_dir, boot)) if config.get("stalled_counts_as_idle") else set()


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
    ) -> Dict[str, Any]:  # fmt: skip
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
        if not _releases(config):
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
                           "text": "job %s stalled: %s" % (jid, verdict.get("why"))})  # fmt: skip
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
                           "text": "released (%s%s)" % (state.get("due"), how)})  # fmt: skip
        events += self._release_events(config, state, check)
        for fault in faults.read(self.state_dir, float(config.get("armed_at") or 0.0))[-20:]:  # the GPUs' XIDs
            events.append({"key": "gpu_fault:%s:%s:%s" % (fault["gpu"], fault.get("xid"), fault["t"]),
                           "event": "gpu_fault", "text": "GPU %s: %s; %s" % (fault["gpu"], faults.label(fault),
                                                                          fault.get("fix"))})  # fmt: skip
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
                        "text": "release check failed, the host would NOT be released: %s" % check["detail"]})  # fmt: skip
        if state.get("action") == "release failed" and state.get("attempt"):
            wait = max(0.0, float(state.get("retry_at") or 0.0) - float(state.get("t") or 0.0)) / 60.0
            out.append({"key": "release_failed:%s:%s:%s" % (config.get("boot_id"), config.get("armed_at"),
                                                            state["attempt"]),
                        "event": "release_failed",
                        "text": "release FAILED, the host still bills: %s (tried again in %.0f min)"
                                % (state.get("release_error"), wait)})  # fmt: skip
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
            )  # fmt: skip
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
    ) -> None:  # fmt: skip
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
            detected.provider, detected.instance_id)  # fmt: skip
    url, mode = api_url(config, detected.provider), config.get("release_mode")
    try:
        if not mode:
            mode = pv.mode_for(pv.instance(detected, url, deadline_s=PROVIDER_CALL_S), None)
        write_json(os.path.join(state_dir, RELEASE_REQUEST), {"t": now, "provider": detected.provider, "mode": mode,
                                                               "instance_id": detected.instance_id, "due": due})  # fmt: skip
        log("provider release: asking %s to %s instance %s" % (detected.provider, mode, detected.instance_id))
        pv.release(detected, mode, url, deadline_s=PROVIDER_CALL_S)
        done = pv.confirm(detected, mode, float(config.get("release_timeout", 120)),
                          min(5.0, float(config.get("interval", 15.0))), url, deadline_s=PROVIDER_CALL_S)  # fmt: skip
    except pv.ProviderError as exc:
        return "", "%s %s: %s" % (detected.provider, mode or "release", exc)
    log("provider release: confirmed, %s (%d reads)" % (done.how, done.polls))
    return "%s (%s)" % (done.how, done.state), None


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


def run(state_dir: str, launcher: Optional[List[str]] = None) -> int:
    """The watchdog's main loop; returns when disarmed (and no job is queued), after a release, when another
    one of this build (or a newer one) runs, or when a newer build asked it to exit. ``launcher``: the argv
    that runs this agent build (to launch the queue's jobs).

    One watchdog per state dir (the lock). One of an older build is asked to exit (``STOP``) at its next safe
    point, between passes (never during a release), and waited for, bounded; then this one takes over.
    """
    with os.fdopen(open_regular(os.path.join(state_dir, LOCK), os.O_WRONLY | os.O_CREAT), "w") as lock:
        if not _locked(lock) and not _take_over(state_dir, lock):
            return 0
        write_json(os.path.join(state_dir, OWNER), {"pid": os.getpid(), "build": build_id(), "revision": REVISION})
        _clear_stop(state_dir, None)
        return _loop(state_dir, launcher or [])


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
                        "up to %.0f s" % (build, old.get("build"), pid, wait))  # fmt: skip
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
                        % (old.get("build"), pid, wait))  # fmt: skip
    return False


def _take_from_legacy(state_dir: str, lock: Any, pid: int) -> bool:
    """Replace a watchdog that cannot be asked to exit: end it at a safe moment (``_end_legacy``), bounded."""
    wait = takeover_wait_s(read_json(os.path.join(state_dir, CONFIG)))
    log_line(state_dir, "build %s replaces the watchdog pid %d (a build from before build records) when it is "
                        "between passes; waiting up to %.0f s" % (build_id(), pid, wait))  # fmt: skip
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


def _loop(state_dir: str, launcher: List[str]) -> int:
    from ..jobs import restart as R
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
    restarts = R.Restarts(jobs, dog.log, facts["boot_id"])  # restart policies

    def sample_fn() -> Any:
        fresh = latest_sample(state_dir, RING_FRESH_S)  # an agent's reading: no NVML calls of our own
        if fresh is not None:
            return fresh, jobs.list()
        if not samplers:
            samplers.append(
                MetricsSampler(state_dir, nvidia_smi=smi if isinstance(smi, str) and smi else "nvidia-smi",
                               faults=watcher)  # fmt: skip
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
                                         [] if isinstance(taken, Exception) else taken[1], facts["boot_id"])  # fmt: skip
                queue_error = None
            except Exception as exc:  # (a full disk...): never the end of autostop; the next pass tries again
                if repr(exc) != queue_error:
                    dog.log("queue pass failed (tried again every %g s): %r" % (PASS_S, exc))
                queue_error = repr(exc)
                waiting = 1 if isinstance(taken, Exception) else sum(map(host_queued, taken[1])) + queue.coming_up(taken[1])
            # Restart policies (remote_agent/jobs/restart.py): a pending restart keeps the watchdog running.
            waiting += restarts.run_pass(R.released(state_dir))
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
    log_fd = open_regular(os.path.join(state_dir, LOG), _APPEND)
    with open(os.devnull, "rb") as null_in, os.fdopen(log_fd, "ab") as log:
        subprocess.Popen(
            launcher + ["watchdog", state_dir], stdin=null_in, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    return True


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1]))

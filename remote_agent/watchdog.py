"""Autostop and deadline watchdog: a detached process on the host that releases it with the laptop closed.

It reads ``watchdog.json`` (written by the agent from the client's config), applies the idle rule every
``interval`` seconds, and when the host has been idle for ``autostop_minutes`` (or ``release_at`` has come)
runs the optional ``pre_stop`` hook and then ``release_remote``. Every decision goes to ``watchdog.log``;
its view of the world goes to ``watchdog_state.json``. Any error while checking activity counts as
activity: it never releases on doubt. The config is keyed to the boot id, so a reboot disarms it.
"""

import fcntl
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from .activity import ActivityLog, idle_status
from .fsutil import open_regular, read_json, write_json

CONFIG, STATE, LOG, LOCK = "watchdog.json", "watchdog_state.json", "watchdog.log", "watchdog.lock"
RETRY_AFTER_FAILURE_S = 300.0
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def boot_id() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def plan(config: Dict[str, Any], idle: Dict[str, Any], now: float) -> Dict[str, Any]:
    """When the watchdog would act, and why: ``{"autostop_at", "release_at", "due"}``."""
    autostop_at = None
    minutes = config.get("autostop_minutes")
    if minutes and not config.get("cancelled") and not idle["reasons"]:
        autostop_at = max(
            idle["idle_since"] + float(minutes) * 60.0, float(config.get("snoozed_until") or 0.0)
        )
    release_at = config.get("release_at")
    due = None
    if release_at is not None and now >= float(release_at):
        due = "deadline reached"
    elif autostop_at is not None and now >= autostop_at:
        due = "idle for %.0f min" % ((now - idle["idle_since"]) / 60.0)
    return {"autostop_at": autostop_at, "release_at": release_at, "due": due}


class Watchdog:
    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.activity = ActivityLog(state_dir)
        self.retry_at = 0.0

    def path(self, name: str) -> str:
        return os.path.join(self.state_dir, name)

    def log(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with os.fdopen(open_regular(self.path(LOG), _APPEND), "a") as f:
                f.write("%s %s\n" % (stamp, message))
        except OSError:
            pass  # e.g. a planted symlink: never write outside the state dir

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

    def check(self, config: Dict[str, Any], facts: Dict[str, Any], sample_fn: Any) -> Dict[str, Any]:
        """One pass: measure, decide, maybe act. Returns the state written to disk."""
        now = time.time()
        try:
            sample, jobs = sample_fn()
            idle = idle_status(
                sample, jobs, self.activity, facts,
                float(config.get("idle_util_percent", 5.0)), bool(config.get("count_sessions", True)), now,
            )  # fmt: skip
        except Exception as exc:  # never release on doubt
            idle = {"reasons": ["activity check failed: %r" % exc], "idle_since": now, "idle_seconds": 0.0}
        decision = plan(config, idle, now)
        state = dict(idle, **decision)
        state.update(t=now, pid=os.getpid(), action=None)
        if decision["due"] and now >= self.retry_at:
            self.log("releasing: %s" % decision["due"])
            hook = config.get("pre_stop")
            if hook:
                self._run_hook("pre_stop", hook, float(config.get("pre_stop_timeout", 300)))
            if self._run_hook(
                "release_remote", config["release_remote"], float(config.get("release_timeout", 120))
            ):
                state["action"] = "released"
            else:
                state["action"] = "release failed"
                self.retry_at = now + RETRY_AFTER_FAILURE_S
        write_json(self.path(STATE), state)
        return state


def run(state_dir: str) -> int:
    """The watchdog's main loop; returns when disarmed, after a release, or when another one runs."""
    with os.fdopen(open_regular(os.path.join(state_dir, LOCK), os.O_WRONLY | os.O_CREAT), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # one watchdog per state dir
        return _loop(state_dir)


def _loop(state_dir: str) -> int:
    from .jobs import JobStore
    from .metrics import MetricsSampler
    from .server import _boot_time

    dog = Watchdog(state_dir)
    jobs = JobStore(state_dir, launcher=[])
    sampler = MetricsSampler(state_dir)
    facts = {"boot_id": boot_id(), "boot_time": _boot_time()}
    dog.log("started (pid %d)" % os.getpid())

    def sample_fn() -> Any:
        return sampler.sample(jobs.owner_lookup()), jobs.list()

    try:
        while True:
            config = read_json(dog.path(CONFIG))
            if not config or not (config.get("autostop_minutes") or config.get("release_at") is not None):
                dog.log("disarmed: nothing to watch")
                return 0
            if config.get("boot_id") != facts["boot_id"]:
                dog.log("disarmed: config is from another boot")
                return 0
            if not config.get("release_remote"):
                dog.log("disarmed: no release_remote command configured")
                return 0
            state = dog.check(config, facts, sample_fn)
            if state["action"] == "released":
                return 0
            time.sleep(float(config.get("interval", 15.0)))
    finally:
        sampler.close()


def ensure_running(state_dir: str, launcher: List[str]) -> bool:
    """Start the watchdog detached (own session, no stdio) unless one already holds the lock."""
    try:
        with os.fdopen(open_regular(os.path.join(state_dir, LOCK), os.O_WRONLY | os.O_CREAT), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
    except OSError:
        return False  # already running (or a lock file that is not ours to use)
    log_fd = open_regular(os.path.join(state_dir, LOG), _APPEND)
    with open(os.devnull, "rb") as null_in, os.fdopen(log_fd, "ab") as log:
        subprocess.Popen(
            launcher + ["watchdog", state_dir], stdin=null_in, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    return True


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1]))

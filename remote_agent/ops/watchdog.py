"""Watchdog ops: watchdog.configure (arm or disarm), watchdog.snooze, watchdog.cancel, notify.test."""

import os
import time
from typing import TYPE_CHECKING, Any, Dict

from .. import protocol as P
from ..fsutil import read_json, write_json
from ..host import provider
from ..jobs.store import JobError
from ..watchdog import autostart, daemon, notify

if TYPE_CHECKING:
    from ..server import Agent

_NUMBERS = {
    "autostop_minutes": (0.0, 1e9), "release_at": (-1e12, 1e12), "interval": (0.5, 3600.0),
    "idle_util_percent": (0.0, 100.0), "release_timeout": (0.0, 86400.0), "pre_stop_timeout": (0.0, 86400.0),
    "stall_minutes": (0.0, 1e9),
}


def configure(agent: "Agent", a: P.WatchdogConfigureArgs) -> P.WatchdogConfigureResult:
    """Arm the detached watchdog, or disarm it when the client's settings ask for nothing.

    The settings are the client's whole word: what they say now is what the watchdog does (it re-reads them
    every pass). Snooze, cancel and ``armed_at`` (the idle window's earliest start) are kept while the
    settings and the boot stay the same.
    """
    config = dict(a.get("config") or {})
    boot = _resume_on_boot(agent, bool(config.get("resume_on_boot")))
    for key, (low, high) in _NUMBERS.items():
        if config.get(key) is not None:
            config[key] = P.number_arg(config, key, 0.0, low, high)
    if config.get("notify") is not None:
        config["notify"] = notify.checked(config["notify"])
    config.pop("release_via", None)  # found here, never taken from the client
    if (config.get("autostop_minutes") or config.get("release_at") is not None) and not config.get("release_remote"):
        found = provider.detect_for(config.get("provider"))
        if found.provider != provider.NONE:
            config["release_via"] = {k: v for k, v in provider.describe(found).items() if k != "note"}
    config["boot_id"] = agent.facts()["boot_id"]
    config["nvidia_smi"] = agent.jobs.nvidia_smi  # the watchdog reads the GPUs as this agent does
    path = os.path.join(agent.jobs.state_dir, daemon.CONFIG)
    if not daemon.is_armed(config, config["boot_id"]):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return {"armed": False, "started": False, "config": None, "autostart": boot}
    old = read_json(path) or {}
    kept = ("snoozed_until", "cancelled", "armed_at")  # state of this boot, not settings
    settings = lambda c: {k: v for k, v in c.items() if k not in kept}  # noqa: E731
    config["armed_at"] = time.time()  # the idle window cannot start before autostop was armed
    if old.get("boot_id") == config["boot_id"] and settings(old) == settings(config):
        config.update({k: old.get(k) for k in kept if k in old})
    write_json(path, config)
    started = daemon.ensure_running(agent.jobs.state_dir, agent.launcher)
    return {"armed": True, "started": started, "config": config, "autostart": boot}


def _resume_on_boot(agent: "Agent", want: bool) -> Dict[str, Any]:
    """The crontab's ``@reboot`` line for this state dir, there exactly when the host's ``resume_on_boot`` asks
    (remote_agent/watchdog/autostart.py; found by its tag, so one left by a removed state dir goes too). A problem
    of this optional feature is its own answer (``ok: False``, shown by ``gputui doctor``), never the failure
    of the arming, and with it of every command on the host."""
    try:
        result = autostart.sync(want, agent.jobs.state_dir, agent.launcher)
    except Exception as exc:  # (sync never raises: this is the bound, not the plan)
        result = {"ok": False, "changed": False, "detail": "resume_on_boot failed: %s" % str(exc)[:200]}
    if result["changed"]:
        daemon.log_line(agent.jobs.state_dir, "resume_on_boot: %s" % result["detail"])
    return result


def _update(agent: "Agent", **changes: Any) -> Dict[str, Any]:
    path = os.path.join(agent.jobs.state_dir, daemon.CONFIG)
    config = read_json(path)
    if not config:
        raise JobError("no watchdog is configured on this host", P.E_NOT_FOUND)
    config.update(changes)
    write_json(path, config)
    return config


def snooze(agent: "Agent", a: P.SnoozeArgs) -> Dict[str, Any]:
    """Postpone autostop: the idle window restarts when the snooze ends."""
    minutes = P.number_arg(a, "minutes", 60.0, 0.0, P.MAX_SNOOZE_MIN)
    if minutes <= 0:
        raise ValueError("minutes must be above 0, not %g" % minutes)
    return _update(agent, snoozed_until=time.time() + 60.0 * minutes, cancelled=False)


def cancel(agent: "Agent", a: Dict[str, Any]) -> Dict[str, Any]:
    """No autostop until the host reboots or its settings change."""
    return _update(agent, cancelled=True)


def notify_test(agent: "Agent", a: P.NotifyTestArgs) -> P.NotifyTestResult:
    """Send a test message now with the given settings (once, no retry); the attempt goes to the log."""
    settings = notify.checked(a.get("notify"))
    text = "[%s] test message from gputui" % (settings.get("host") or "host")
    problem = notify.deliver(settings, "test", text)
    daemon.log_line(agent.jobs.state_dir, "notify test: %s" % ("sent" if problem is None else "failed: " + problem))
    return {"sent": problem is None, "error": problem}


HANDLERS = {
    P.OP_WATCHDOG_CONFIGURE: configure, P.OP_WATCHDOG_SNOOZE: snooze, P.OP_WATCHDOG_CANCEL: cancel,
    P.OP_NOTIFY_TEST: notify_test,
}

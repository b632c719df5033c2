"""The watchdog's rules, read from its settings and the host's readings: whether it is armed, when the host is
due for release and why (``plan``), whether the release would work (``release_check``: no side effects), and
what the agent reports of it (``view``, ``stalled_jobs``). The loop that applies them is ``daemon``."""

import os
import shutil
import time
from typing import Any, Dict, Optional, Set

from ..fsutil import read_json
from ..host import provider as pv
from . import notify
from .state import CONFIG, RELEASE_CHECK, STATE

#: Bound on a release check's provider call.
CHECK_CALL_S = 10.0
#: A deadline comes no sooner than this after it was set (``armed_at``): one that had already passed when it
#: was armed (``release_after_hours`` on a host up longer, a ``release_at`` in the past) waits this long, and
#: its countdown and ``deadline_soon`` say so, instead of releasing the host the moment the setting arrives.
DEADLINE_GRACE_S = 600.0


def disarmed_because(config: Optional[Dict[str, Any]], boot: Optional[str]) -> Optional[str]:
    """Why ``config`` asks for nothing on this boot, or None when it is armed."""
    if not config or not (releases(config) or config.get("stall_minutes") or notify.enabled(config.get("notify"))):
        return "nothing to watch"
    if config.get("boot_id") != boot:
        return "config is from another boot"
    if releases(config) and not config.get("release_remote") and pv.detected_from(config.get("release_via")) is None:
        return "no release_remote command configured"  # and no provider API was found on this host
    return None


def releases(config: Dict[str, Any]) -> bool:
    """Whether ``config`` asks for a release (autostop or a deadline)."""
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
                "detail": "no release_remote command and no provider API found on this host"}
    verdict: Dict[str, Any] = {"via": detected.provider, "instance_id": detected.instance_id, "t": now}
    mode = config.get("release_mode")
    try:
        found = pv.check(detected, mode, api_url(config, detected.provider), deadline_s=CHECK_CALL_S)
    except pv.ProviderError as exc:
        return dict(verdict, ok=False, detail=str(exc), kind=exc.kind)
    mode = pv.mode_for(found, mode)
    detail = "%s answers for instance %s (%s); release would %s it" % (
        detected.provider, detected.instance_id, found.provider_state, mode)
    unusable = ["%s unknown (%s)" % (name.replace("_", " "), why) for name, why in found.unusable]
    if unusable:  # what the release does not need: shown, never deciding it
        detail += "; " + "; ".join(unusable)
    verdict.update(("%s_unknown" % name, why) for name, why in found.unusable if name == "price_per_hour")
    return dict(verdict, ok=True, detail=detail, mode=mode, state=found.state, price_per_hour=found.price_per_hour,
                started_at=found.started_at)


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
) -> Dict[str, Any]:
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

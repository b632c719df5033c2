"""The client's side of the host's autostop and deadline watchdog (``remote_agent/watchdog/daemon.py``).

What the watchdog is told (the host's idle rule, ``autostop_minutes``, the deadline and the commands), arming it
after every connect, snoozing and cancelling it, and when it will act as the host reports it.
"""

from __future__ import annotations

from typing import Any

from gputui.core.config.file import Config, HostConfig
from gputui.core.errors import UsageError
from gputui.core.session.host import HostSession
from gputui.core.transport.link import AgentError
from remote_agent import protocol as P

MAX_SNOOZE_MIN = P.MAX_SNOOZE_MIN  # a snooze of at most a week


class NoAutostop(UsageError):
    """The host has no autostop or deadline armed: nothing to snooze or cancel."""


def deadline(host: HostConfig, boot_time: float | None) -> float | None:
    """When the host must be released: ``release_at``, or ``release_after_hours`` after billing start."""
    candidates = []
    if host.release_at is not None:
        candidates.append(host.release_at.timestamp())
    if host.release_after_hours is not None:
        start = host.billing_start.timestamp() if host.billing_start else boot_time
        if start is not None:
            candidates.append(start + host.release_after_hours * 3600.0)
    return min(candidates) if candidates else None


def notify_settings(host: HostConfig) -> dict[str, Any] | None:
    """The host's ``[notify]`` as the agent takes it (remote_agent/watchdog/notify.py), or None."""
    if host.notify is None:
        return None
    return {
        "webhook": host.notify.webhook,
        "command": list(host.notify.command) if host.notify.command else None,
        "ntfy": host.notify.ntfy,
        "ntfy_server": host.notify.ntfy_server,
        "idle_minutes": host.notify.idle_minutes,
        "events": list(host.notify.events),
        "host": host.name,
    }


def api_urls(config: Config | None) -> dict[str, str]:
    """The ``[providers.NAME] api_url`` settings, by provider (the host uses those of RunPod and vast.ai)."""
    if config is None:
        return {}
    return {name: p.api_url for name, p in config.providers.items() if p.api_url}


def release_settings(host: HostConfig, urls: dict[str, str]) -> dict[str, Any]:
    """How the host releases itself: the user's ``release_remote`` (wins where set), else the provider's API
    when the agent finds one there that ``provider`` allows (remote_agent/host/provider.py)."""
    return {
        "release_remote": list(host.release_remote or ()),
        "provider": "none" if host.release and not host.release_remote else host.provider,  # yours win
        "release_mode": host.release_mode,
        "api_urls": {k: v for k, v in urls.items() if k in ("runpod", "vastai")},
    }


def watchdog_config(host: HostConfig, boot_time: float | None, urls: dict[str, str] | None = None) -> dict[str, Any]:
    """What the host's watchdog is told (no autostop, deadline nor stall_minutes: disarmed). It checks every
    tenth of the shortest window, at most every 15 s. ``urls``: the providers' API bases (``api_urls``)."""
    return {
        **release_settings(host, urls or {}),
        "autostop_minutes": host.autostop_minutes,
        "release_at": deadline(host, boot_time),
        "idle_util_percent": host.idle_util_percent,
        "count_sessions": host.count_ssh_sessions,
        "release_timeout": host.release_timeout,
        "pre_stop": list(host.pre_stop) if host.pre_stop else None,
        "pre_stop_timeout": host.pre_stop_timeout,
        "notify": notify_settings(host),
        "stall_minutes": host.stall_minutes,
        "stalled_counts_as_idle": host.stalled_counts_as_idle,
        "resume_on_boot": host.resume_on_boot,
        "interval": max(0.5, min(15.0, min(host.autostop_minutes or 60.0, host.stall_minutes or 60.0) * 6.0)),
    }


async def arm(session: HostSession, host: HostConfig, urls: dict[str, str] | None = None) -> None:
    """Tell the host's watchdog the rules now in the config; with none, this disarms it (run on every connect).
    Arming makes the watchdog check the release (its verdict shows in ``status``; a failing one notifies)."""
    result = await session.configure_autostop(watchdog_config(host, session.snapshot.facts.get("boot_time"), urls))
    session.autostart = result.get("autostart") if isinstance(result, dict) else None


async def snooze(session: HostSession, minutes: float) -> None:
    """Postpone the autostop: the idle window restarts when the ``minutes`` are over."""
    try:
        await session.snooze_autostop(minutes)
    except AgentError as exc:
        _no_autostop(session.name, exc, "snooze")


async def cancel(session: HostSession) -> None:
    """No autostop until the host reboots or its settings change."""
    try:
        await session.cancel_autostop()
    except AgentError as exc:
        _no_autostop(session.name, exc, "cancel")


def _no_autostop(host: str, exc: AgentError, what: str) -> None:
    if exc.code != P.E_NOT_FOUND:
        raise exc
    raise NoAutostop(
        f"{host} has no autostop to {what}: set autostop_minutes or a deadline for it in the config (with "
        "release_remote where the host is not a RunPod pod or vast.ai instance)"
    ) from None


def deadline_in_s(activity: P.Activity, host: HostConfig, boot_time: float | None, now: float) -> float | None:
    """Seconds until the deadline releases the host: as the host's watchdog holds it (one already past when it
    was set waits a grace: remote_agent/watchdog/daemon.py DEADLINE_GRACE_S), else as the config says."""
    at = (activity.get("watchdog") or {}).get("release_at")
    if at is None:
        at = deadline(host, boot_time)
    return None if at is None else max(0.0, float(at) - now)


def autostop_in_s(activity: P.Activity, now: float) -> float | None:
    """Seconds until the host's watchdog releases it for idleness, as the host reports it (None: not armed)."""
    at = (activity.get("watchdog") or {}).get("autostop_at")
    return None if at is None else max(0.0, float(at) - now)

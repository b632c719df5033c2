"""Release ops: release.check (would the host's release work?), release.provider (release through the
provider's API from the host, confirmed) and release.instance (the instance as its provider says now: the
client's price where the config sets none)."""

import os
import time
from typing import TYPE_CHECKING, Any, Dict

from .. import protocol as P
from ..fsutil import read_json, write_json
from ..host import provider
from ..watchdog import daemon

if TYPE_CHECKING:
    from ..server import Agent


def release_check(agent: "Agent", a: P.ReleaseCheckArgs) -> P.ReleaseCheckResult:
    """Prove without side effects that the host's release would work (the watchdog's ``release_check``): with
    ``release_remote``, its program exists here; else the provider detected here answers for this instance
    (``provider``, ``release_mode``, ``api_urls`` as the client's config says). The verdict is kept where the
    watchdog keeps its own (``status`` shows it)."""
    config = _with_detection(a)
    verdict = daemon.release_check(config)
    if verdict["via"] == "none" and config.get("note"):
        verdict["detail"] += " (%s)" % config["note"]
    path = os.path.join(agent.jobs.state_dir, daemon.RELEASE_CHECK)
    old = read_json(path) or {}
    write_json(path, dict(verdict, armed_at=old.get("armed_at")))
    daemon.log_line(agent.jobs.state_dir, "release check (asked): %s: %s" % ("ok" if verdict["ok"] else "FAILED",
                                                                        verdict["detail"]))
    return verdict  # type: ignore[return-value]


def _with_detection(a: Any) -> Dict[str, Any]:
    """The client's release settings, with ``release_via`` found here (never taken from the client)."""
    config = {k: a.get(k) for k in ("release_remote", "provider", "release_mode", "api_urls", "release_timeout")}
    if not config.get("release_remote"):
        found = provider.detect_for(config.get("provider"))
        if found.provider != provider.NONE:
            config["release_via"] = {k: v for k, v in provider.describe(found).items() if k != "note"}
        elif found.note:
            config["note"] = found.note
    return config


def release_provider(agent: "Agent", a: P.ReleaseProviderArgs) -> P.ReleaseProviderResult:
    """``gputui release HOST`` on a RunPod pod / vast.ai instance with no user command: release it through the
    provider's API with the instance's own key, and read the state back until the provider confirms."""
    config = _with_detection(dict(a, release_remote=None))
    if config.get("release_timeout") is not None:
        config["release_timeout"] = P.number_arg(config, "release_timeout", 120.0, 1.0, 3600.0)
    if provider.detected_from(config.get("release_via")) is None:
        why = "no RunPod or vast.ai instance found on this host" + (" (%s)" % config["note"] if config.get("note") else "")
        return {"found": False, "released": False, "how": "", "error": why}
    log = lambda m: daemon.log_line(agent.jobs.state_dir, "release (asked): " + m)  # noqa: E731
    how, error = daemon.provider_release(agent.jobs.state_dir, config, "asked by gputui release", time.time(), log)
    return {"found": True, "released": error is None, "how": how, "error": error}


def release_instance(agent: "Agent", a: P.ReleaseInstanceArgs) -> P.ReleaseInstanceResult:
    """This host's instance as its provider says now (state, price, spot), read with the instance's own key;
    changes nothing. ``found`` is False on a host that is no RunPod / vast.ai instance."""
    config = _with_detection(dict(a, release_remote=None))
    detected = provider.detected_from(config.get("release_via"))
    if detected is None:
        return {"found": False}
    out: P.ReleaseInstanceResult = {"found": True, "provider": detected.provider,
                                    "instance_id": detected.instance_id, "t": time.time()}
    try:
        found = provider.instance(detected, daemon.api_url(config, detected.provider), deadline_s=daemon.CHECK_CALL_S)
    except provider.ProviderError as exc:
        out["error"] = str(exc)
        return out
    out.update(state=found.state, price_per_hour=found.price_per_hour, interruptible=found.interruptible)
    for name, why in found.unusable:
        if name == "price_per_hour":
            out["price_unknown"] = why
    return out


HANDLERS = {P.OP_RELEASE_CHECK: release_check, P.OP_RELEASE_PROVIDER: release_provider,
            P.OP_RELEASE_INSTANCE: release_instance}

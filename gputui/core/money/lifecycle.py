"""A RunPod pod's or vast.ai instance's life seen from this machine with the user's account key (the one the
release read-back uses, ``providers.account_key``): which instance a host is, what its provider says of it,
and ``gputui start``: start it again, follow it to the SSH endpoint the start gave it, wait until SSH answers.

Nothing here runs on the host (a stopped instance runs nothing); the HTTP rules, field checks and the
provider's words are ``remote_agent.host.provider``'s. Nothing is started that the user did not ask for:
``start`` is called by ``gputui start HOST`` only, and a running instance is not started again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from gputui.core.config.file import Config, HostConfig
from gputui.core.errors import UsageError
from gputui.core.money import providers as pv
from gputui.core.session.model import InstanceLook
from gputui.core.transport import instances
from gputui.core.transport.instances import Known, known
from gputui.core.transport.ssh import SSHTransport
from remote_agent.host import provider as agent_provider

Instance = agent_provider.Instance
START_TIMEOUT_S = 600.0  # a start: until the provider says running, then until SSH answers
POLL_S = 5.0
BANNER_TIMEOUT_S = 5.0


def require_known(host: HostConfig) -> Known:
    """``known``, or a UsageError saying how gputui learns it (Lambda: nothing to start)."""
    if host.provider == pv.LAMBDA:
        raise UsageError(f"{host.name}: Lambda cannot stop an instance (only terminate it), so there is nothing to start")
    found = known(host)
    if found is None:
        raise UsageError(
            f"{host.name}: gputui does not know which RunPod pod or vast.ai instance it is: connect once while it "
            f'runs (its agent says), or set provider = "runpod" or "vastai" and instance_id = "ID" in [hosts.{host.name}]'
        )
    return found


def account(provider: str) -> str:
    """The user's key for ``provider`` on this machine, or a UsageError saying where to put it."""
    found = pv.account_key(provider)
    if found is None:
        raise UsageError(f"no {provider} API key on this machine: set {pv.account_key_hint(provider)}")
    return found[0]


def _call(fn: Callable[..., object], k: Known, key: str, api_url: str | None, *args: object) -> Callable[[], object]:
    detected = agent_provider.Detected(k.provider, k.instance_id, agent_provider.ENVIRONMENT)
    id_name, key_name, _ = agent_provider.VARIABLES[k.provider]
    env = {id_name: k.instance_id, key_name: key}
    return lambda: fn(detected, *args, api_url, env)


async def read(k: Known, key: str, api_url: str | None) -> Instance:
    """The instance now (``ProviderError`` when the provider cannot say; ``not_found`` once it is gone)."""
    return cast(Instance, await _thread(_call(agent_provider.instance, k, key, api_url), k.provider))


async def _thread(call: Callable[[], object], what: str) -> object:
    bound = agent_provider.DEADLINE_S + 5
    try:
        return await asyncio.wait_for(asyncio.to_thread(call), bound)
    except asyncio.TimeoutError:
        raise pv.ProviderError("timeout", f"{what}: no answer within {bound:g} s") from None


def endpoint_of(found: Instance, configured_host: str) -> tuple[str, int] | None:
    """The SSH endpoint of ``found`` of the kind the config uses: vast.ai's relay where the config names an
    ``ssh*.vast.ai`` relay, else the direct one; whichever there is when only one is."""
    relay = configured_host.lower().endswith(".vast.ai")
    ranked = sorted(found.endpoints, key=lambda e: (e[0] == "proxy") != relay)
    return (ranked[0][1], ranked[0][2]) if ranked else None


def _api_url(config: Config, provider: str) -> str | None:
    settings = config.providers.get(provider)
    return settings.api_url if settings else None


async def look(config: Config, host: HostConfig, released: bool) -> InstanceLook | None:
    """What ``host``'s provider says of its instance (the host does not answer): None where gputui knows no
    instance for it. ``released``: gputui released it (a stopped spot instance it did not release was
    preempted). Never raises: what could not be asked is ``unknown``, saying why."""
    k = known(host)
    if k is None:
        return None
    now = time.time()

    def seen(state: str, detail: str, rate: float | None = None) -> InstanceLook:
        return InstanceLook(k.provider, k.instance_id, state, detail, rate, now)

    try:
        found = await read(k, account(k.provider), _api_url(config, k.provider))
    except UsageError as exc:  # no key here
        return seen("unknown", str(exc))
    except pv.ProviderError as exc:
        if exc.kind == "not_found":
            return seen(agent_provider.TERMINATED, f"{k.provider} no longer lists {k.instance_id}")
        return seen("unknown", f"could not ask {k.provider}: {exc}")
    said = f"{k.provider} says {found.provider_state}"
    if found.state == agent_provider.STOPPED:
        rate = found.stopped_per_hour
        disk = f"; its disk bills {rate:.4f}/h while stopped" if rate is not None else ""
        if found.interruptible and not released:
            return seen("preempted", f"{said}: a spot instance the provider took back{disk}; gputui start {host.name}", rate)
        return seen(agent_provider.STOPPED, f"{said}{disk}; gputui start {host.name} starts it", rate)
    if found.state in (agent_provider.RUNNING, agent_provider.STARTING):
        return seen(found.state, f"{said}: the instance runs, its SSH does not answer")
    return seen(found.state, said)


async def ssh_answers(address: str, port: int, timeout_s: float = BANNER_TIMEOUT_S) -> bool:
    """Whether an SSH server answers at ``address:port`` (its banner, ``SSH-``, arrives within ``timeout_s``)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        banner = await asyncio.wait_for(reader.readline(), timeout_s)
        return banner.startswith(b"SSH-")
    except (OSError, asyncio.TimeoutError, ValueError):
        return False
    finally:
        writer.close()


@dataclass(frozen=True)
class Started:
    """What ``start`` did: the instance as it came back, where its SSH answers and where it answered before
    (None when it did not move), whether it was already running, and warnings to show loudly."""

    instance: Instance
    endpoint: tuple[str, int] | None
    moved_from: tuple[str, int] | None
    already_running: bool
    warnings: tuple[str, ...]


async def start(
    config: Config, host: HostConfig, say: Callable[[str], None], timeout_s: float = START_TIMEOUT_S,
    poll_s: float = POLL_S,
) -> Started:
    """Start ``host``'s stopped instance, wait (at most ``timeout_s``, saying each change) until its provider
    says running and its SSH answers, and keep the endpoint it came back on. A running one is not started
    again (only followed); a terminated one, a refusal or the time running out is a ``ProviderError``."""
    k = require_known(host)
    key = account(k.provider)
    api_url = _api_url(config, k.provider)
    end = time.monotonic() + timeout_s
    found = await read(k, key, api_url)
    say(f"{k.provider} {k.instance_id} ({k.source}): {found.state} ({found.provider_state})")
    already = found.state == agent_provider.RUNNING
    if found.state == agent_provider.TERMINATED:
        raise pv.ProviderError("not_found", f"{k.provider}: instance {k.instance_id} was terminated; it cannot start")
    if not already:
        await _thread(_call(agent_provider.start, k, key, api_url), k.provider)
        say(f"{k.provider} accepted the start")
    last = found.provider_state
    while found.state != agent_provider.RUNNING:
        if time.monotonic() + poll_s > end:
            raise pv.ProviderError("unconfirmed", f"{k.provider}: {k.instance_id} not running after {timeout_s:g} s (last: {last})")
        await asyncio.sleep(poll_s)
        try:
            found = await read(k, key, api_url)
        except pv.ProviderError as exc:
            if not exc.retryable:
                raise
            continue
        if found.provider_state != last:
            last = found.provider_state
            say(f"{k.provider}: {found.state} ({last})")
    warnings = []
    if found.gpus == 0:
        warnings.append(
            f"{k.provider} brought {k.instance_id} back with 0 GPUs (the machine had none free): it bills, but no "
            "job can use a GPU; release it, or stop it and start it again later"
        )
    base = SSHTransport(host, config.ssh_config).configured()
    endpoint = endpoint_of(found, base.host)
    moved = endpoint is not None and endpoint != (base.host, base.port)
    before = instances.get(host.name)
    kept = instances.Record(k.provider, k.instance_id, endpoint if moved else None,
                            (base.host, base.port) if moved else None, time.time())
    instances.put(host.name, kept)
    old = before.endpoint if before is not None and before.endpoint is not None else (base.host, base.port)
    if endpoint is not None and endpoint != old:
        say(f"{host.name}'s SSH moved: {old[0]}:{old[1]} -> {endpoint[0]}:{endpoint[1]} (from {k.provider}'s API)")
    target = endpoint or (base.host, base.port)
    say(f"waiting for SSH at {target[0]}:{target[1]}")
    while not await ssh_answers(*target):
        if time.monotonic() + poll_s > end:
            raise pv.ProviderError("unconfirmed", f"{host.name}: SSH at {target[0]}:{target[1]} did not answer within {timeout_s:g} s")
        await asyncio.sleep(poll_s)
    return Started(found, endpoint, old if endpoint is not None and endpoint != old else None, already, tuple(warnings))

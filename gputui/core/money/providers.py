"""Provider-native price and release, the client's side: the Lambda client (Lambda puts no credentials on its
hosts, so it runs here with the user's key), and the provider settings' rules (``gputui.core.config.providers``)
re-exported for status and release.

RunPod and vast.ai are handled on the host by ``remote_agent.host.provider`` (the instance's own scoped key; the
same HTTP rules and ``ProviderError`` are used here).

Lambda Cloud API v1 (https://cloud.lambdalabs.com/api/v1, ``Authorization: Bearer KEY``; the reference is
docs-api.lambda.ai/api/cloud): ``GET /instances`` answers ``{"data": [Instance, ...]}``, an Instance holding
``id``, ``name``, ``ip``, ``private_ip``, ``hostname``, ``status`` (``booting``, ``active``, ``unhealthy``,
``terminating``, ``terminated``, ...) and ``instance_type`` with ``price_cents_per_hour`` (an integer);
``POST /instance-operations/terminate`` with ``{"instance_ids": [ID]}`` answers
``{"data": {"terminated_instances": [Instance, ...]}}``. Lambda cannot stop an instance, only terminate it
(its persistent file systems survive and bill on). The key: ``$LAMBDA_API_KEY``, else the file Lambda's
tooling (SkyPilot's Lambda support) reads, ``~/.lambda_cloud/lambda_keys``, with a line ``api_key = KEY``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.core.config import providers as settings
from gputui.core.config.providers import API_URLS, check_api_url
from remote_agent.host import provider as agent_provider

# The settings' rules that status and release use beside the clients.
LAMBDA, NONE, RUNPOD, VASTAI = settings.LAMBDA, settings.NONE, settings.RUNPOD, settings.VASTAI
ProviderError = settings.ProviderError

Confirmed = agent_provider.Confirmed
LAMBDA_KEY_ENV = "LAMBDA_API_KEY"
LAMBDA_KEY_FILE = "~/.lambda_cloud/lambda_keys"
MAX_KEY_FILE = 64 * 1024
MAX_INSTANCES = 1000  # entries of a listing looked at
DEADLINE_S = agent_provider.DEADLINE_S


@dataclass(frozen=True)
class LambdaInstance:
    """One Lambda instance, as ``GET /instances`` lists it."""

    id: str
    status: str
    ip: str | None
    private_ip: str | None
    hostname: str | None
    name: str | None
    type_name: str | None
    price_per_hour: float | None  # USD: the instance type's price_cents_per_hour / 100

    @property
    def billing(self) -> bool:
        """Whether it still bills (anything short of terminated)."""
        return self.status != "terminated"


def lambda_key(env: Mapping[str, str] | None = None, path: str | Path | None = None) -> str | None:
    """The user's Lambda key: ``$LAMBDA_API_KEY``, else ``api_key = KEY`` in ``~/.lambda_cloud/lambda_keys``;
    None when neither has one. A malformed key is a ``ProviderError("config")`` naming where it came from."""
    found = _user_key("Lambda", LAMBDA_KEY_ENV, (str(path or LAMBDA_KEY_FILE),), ("api_key",), env)
    return found[0] if found else None


def _user_key(
    label: str, variable: str, files: tuple[str, ...], names: tuple[str, ...], env: Mapping[str, str] | None
) -> tuple[str, str] | None:
    """The first key found in ``$variable``, then in ``files`` (``_key_from_file``), and where; None when none
    has one. A malformed key is a ``ProviderError("config")`` naming where it came from."""
    values = os.environ if env is None else env
    key, where = values.get(variable, "").strip(), f"${variable}"
    for file in files:
        if key:
            break
        key, where = _key_from_file(Path(os.path.expanduser(file)), names) or "", file
    if not key:
        return None
    return agent_provider.usable_key(key, f"the {label} API key", where), where


def require_lambda_key(env: Mapping[str, str] | None = None, path: str | Path | None = None) -> str:
    """``lambda_key``, or a ``ProviderError("config")`` that says where to put one."""
    key = lambda_key(env, path)
    if key is None:
        raise ProviderError(
            "config",
            f"no Lambda API key: set ${LAMBDA_KEY_ENV} or put 'api_key = KEY' in {path or LAMBDA_KEY_FILE}",
        )
    return key


def _key_from_file(file: Path, names: tuple[str, ...] = ("api_key",)) -> str | None:
    """The value of the first ``NAME = KEY`` line for one of ``names``; with no names, the file's first line
    (a file holding the key alone)."""
    try:
        with file.open("rb") as fh:
            text = fh.read(MAX_KEY_FILE).decode("utf-8", "replace")
    except OSError:
        return None
    if not names:
        return next(iter(text.split()), None)
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() in names:
            return value.strip().strip("'\"")
    return None


# The user's own account key for RunPod / vast.ai on this machine, used only to read a release back when the
# host could not (a stop takes the container, and the link, with it): the variable, then the files the
# providers' own tools write (runpodctl's ``apikey = "KEY"``, runpod-python's ``api_key = "KEY"``; the vastai
# CLI's file holding the key alone).
ACCOUNT_KEYS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    RUNPOD: ("RUNPOD_API_KEY", ("~/.runpod/config.toml",), ("apikey", "api_key")),
    VASTAI: ("VAST_API_KEY", ("~/.config/vastai/vast_api_key", "~/.vast_api_key"), ()),
}


def account_key(provider: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The user's key for ``provider`` on this machine and where it was found (``ACCOUNT_KEYS``); None when
    there is none. A malformed one is a ``ProviderError("config")`` naming where it came from."""
    if provider not in ACCOUNT_KEYS:
        return None
    return _user_key(provider, *ACCOUNT_KEYS[provider], env)


def account_key_hint(provider: str) -> str:
    """Where ``account_key`` looks, for an error message."""
    variable, files, _ = ACCOUNT_KEYS[provider]
    return f"${variable} or {' or '.join(files)}"


async def confirm_instance(
    provider: str, instance_id: str, mode: str, key: str, api_url: str | None, timeout_s: float,
    interval_s: float = 5.0,
) -> agent_provider.Confirmed:
    """Read a RunPod / vast.ai instance back from here with the user's ``key`` until it is stopped /
    terminated as ``mode`` asked (``remote_agent.host.provider.confirm``: same rules, same bound)."""
    id_name, key_name, _ = agent_provider.VARIABLES[provider]
    detected = agent_provider.Detected(provider, instance_id, agent_provider.ENVIRONMENT)
    env = {id_name: instance_id, key_name: key}
    result: agent_provider.Confirmed = await _bounded(
        timeout_s + DEADLINE_S + 5, agent_provider.confirm, detected, mode, timeout_s, interval_s, api_url, env,
        what=provider,
    )
    return result


LAMBDA_STRINGS = ("ip", "private_ip", "hostname", "name")  # read as unknown (None) where given unusably


def parse_instance(value: Any) -> LambdaInstance:
    """A Lambda Instance object: ``id`` and ``status`` (what matching, terminating and confirming need) must be
    strings (``ProviderError`` otherwise); any other field given unusably reads as unknown (None), so that a
    price or a name never blocks a release (``remote_agent.host.provider.Fields``)."""
    if not isinstance(value, dict):
        raise ProviderError("bad_answer", "lambda API: an instance must be a JSON object")
    kind: dict[str, Any] = value["instance_type"] if isinstance(value.get("instance_type"), dict) else {}
    price = agent_provider.Fields(kind, LAMBDA).get(agent_provider.field_price, "price_cents_per_hour", "", 0.01)
    if not isinstance(kind.get("price_cents_per_hour"), int):  # documented as whole cents: another figure is none
        price = None
    got = agent_provider.Fields(value, LAMBDA)
    ip, private_ip, hostname, name = (got.get(agent_provider.field_str, n, n, True) for n in LAMBDA_STRINGS)
    return LambdaInstance(
        id=agent_provider.field_str(value, "id", LAMBDA) or "", status=agent_provider.field_str(value, "status", LAMBDA) or "",
        ip=ip, private_ip=private_ip, hostname=hostname, name=name, price_per_hour=price,
        type_name=agent_provider.Fields(kind, LAMBDA).get(agent_provider.field_str, "name", "", True),
    )


def _base(api_url: str | None) -> str:
    return check_api_url(api_url or API_URLS[LAMBDA]).rstrip("/")


def list_instances_sync(
    key: str, api_url: str | None = None, deadline_s: float = DEADLINE_S
) -> list[LambdaInstance]:
    """``GET /instances``: the user's instances (at most ``MAX_INSTANCES``)."""
    status, data = agent_provider.http_json("GET", _base(api_url) + "/instances", key, None, deadline_s)
    if status != 200 or not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ProviderError("bad_answer", f"lambda API: GET /instances answered {status} without a data list")
    return [parse_instance(item) for item in data["data"][:MAX_INSTANCES]]


def match(instances: Iterable[LambdaInstance], addresses: Iterable[str]) -> LambdaInstance | None:
    """The one billing instance whose ip, private ip or hostname is one of ``addresses`` (a host's address and
    what it resolves to); None when none is. Two different ones are a ``ProviderError`` (never a guess)."""
    wanted = {a.strip().lower().rstrip(".") for a in addresses if a.strip()}
    hits = {
        inst.id: inst for inst in instances if inst.billing
        and wanted & {(v or "").lower().rstrip(".") for v in (inst.ip, inst.private_ip, inst.hostname)}
    }
    if len(hits) > 1:
        raise ProviderError(
            "config", f"lambda: the address matches several instances ({', '.join(sorted(hits))})"
        )
    return next(iter(hits.values()), None)


def terminate_sync(
    key: str, instance_id: str, api_url: str | None = None, deadline_s: float = DEADLINE_S
) -> None:
    """``POST /instance-operations/terminate`` for one instance; the answer must list it as terminated."""
    body = {"instance_ids": [instance_id]}
    url = _base(api_url) + "/instance-operations/terminate"
    status, data = agent_provider.http_json("POST", url, key, body, deadline_s)
    if status == 404:
        raise ProviderError("not_found", f"lambda: no instance {instance_id} to terminate")
    done = data.get("data") if isinstance(data, dict) else None
    listed = done.get("terminated_instances") if isinstance(done, dict) else None
    if status != 200 or not isinstance(listed, list):
        raise ProviderError("bad_answer", f"lambda: terminate answered {status} without terminated_instances")
    if instance_id not in {parse_instance(item).id for item in listed[:MAX_INSTANCES]}:
        raise ProviderError(
            "bad_answer", f"lambda: terminate did not list instance {instance_id} as terminated"
        )


def confirm_terminated_sync(
    key: str, instance_id: str, api_url: str | None = None, timeout_s: float = 300.0, interval_s: float = 5.0,
    deadline_s: float = DEADLINE_S, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> agent_provider.Confirmed:
    """Read the list back until the instance is terminated or gone, for at most ``timeout_s``; transient
    errors are retried within the bound, others end it; past the bound ``ProviderError("unconfirmed")``."""
    end, polls, last = clock() + timeout_s, 0, "no answer"
    while True:
        polls += 1
        try:
            listed = list_instances_sync(key, api_url, min(deadline_s, max(1.0, end - clock())))
        except ProviderError as exc:
            if not exc.retryable:
                raise
            last = str(exc)
        else:
            found = next((i for i in listed if i.id == instance_id), None)
            if found is None or not found.billing:
                how = "no longer listed" if found is None else "status terminated"
                return Confirmed("terminated", polls, f"lambda: {how}")
            last = found.status
        if clock() + interval_s > end:
            raise ProviderError(
                "unconfirmed", f"lambda: instance {instance_id} not terminated after {timeout_s:g} s "
                f"({polls} reads); last: {last}",
            )
        sleep(interval_s)


async def resolve(address: str, timeout_s: float = 5.0) -> set[str]:
    """``address`` and the IP addresses it resolves to (just ``address`` when it does not resolve in time)."""
    out = {address}
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(address, None), timeout_s)
    except (OSError, asyncio.TimeoutError, UnicodeError):
        return out
    out.update(str(info[4][0]) for info in infos)
    return out


async def _bounded(bound_s: float, fn: Callable[..., Any], *args: Any, what: str = LAMBDA) -> Any:
    """``fn(*args)`` in a thread, waited for at most ``bound_s`` (each call inside has its own deadline too)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), bound_s)
    except asyncio.TimeoutError:
        raise ProviderError("timeout", f"{what}: no answer within {bound_s:g} s") from None


async def list_instances(
    key: str, api_url: str | None = None, deadline_s: float = DEADLINE_S
) -> list[LambdaInstance]:
    """``list_instances_sync`` off the event loop."""
    result: list[LambdaInstance] = await _bounded(
        deadline_s + 5, list_instances_sync, key, api_url, deadline_s
    )
    return result


async def find(
    key: str, address: str, api_url: str | None = None, deadline_s: float = DEADLINE_S
) -> LambdaInstance | None:
    """The user's Lambda instance at ``address`` (an IP or a name that resolves to it), or None."""
    addresses = await resolve(address)
    return match(await list_instances(key, api_url, deadline_s), addresses)


async def check(
    key: str, address: str, api_url: str | None = None, deadline_s: float = DEADLINE_S
) -> LambdaInstance:
    """Prove, without side effects, that a release would work: the key is accepted and one billing instance
    of the user's has ``address``. That instance, or a ``ProviderError`` (``not_found`` when none has it)."""
    found = await find(key, address, api_url, deadline_s)
    if found is None:
        raise ProviderError(
            "not_found", f"lambda: none of your running instances has the address {address!r}"
        )
    return found


async def terminate(
    key: str, instance_id: str, api_url: str | None = None, deadline_s: float = DEADLINE_S
) -> None:
    """``terminate_sync`` off the event loop."""
    await _bounded(deadline_s + 5, terminate_sync, key, instance_id, api_url, deadline_s)


async def confirm_terminated(
    key: str, instance_id: str, api_url: str | None = None, timeout_s: float = 300.0, interval_s: float = 5.0,
    deadline_s: float = DEADLINE_S,
) -> agent_provider.Confirmed:
    """``confirm_terminated_sync`` off the event loop, bounded by ``timeout_s`` plus one call's deadline."""
    result: agent_provider.Confirmed = await _bounded(
        timeout_s + deadline_s + 5, confirm_terminated_sync, key, instance_id, api_url, timeout_s, interval_s,
        deadline_s,
    )
    return result

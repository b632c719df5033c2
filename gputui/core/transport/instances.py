"""What gputui last learnt of each host's provider instance (RunPod pod, vast.ai instance), kept on this machine
in ``instances.json`` in its state dir: which instance the host is (as its agent reported it), and where its
SSH answers now when the provider moved it (a RunPod start gives new port mappings).

A moved endpoint is used only while the config still says what it said when the move was learnt (``base``):
an address the user edits wins, and the config's address stays the fallback. The file is gputui's own (0600),
read bounded and field by field; an unreadable one reads as empty (it is a cache of what the providers say).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.core import paths
from gputui.core.config.file import HostConfig

NAME = "instances.json"
MAX_BYTES = 1024 * 1024
MAX_HOSTS = 1000
PROVIDERS = ("runpod", "vastai")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:-]{1,253}$")
_LEARNT: dict[tuple[str, str], tuple[str, str]] = {}  # (file, host): the instance already on record this run


@dataclass(frozen=True)
class Record:
    """One host's instance as last learnt: the provider, its id, and a moved SSH endpoint (address, port)
    with the config's (address, port) it replaces (``base``), when the provider moved it."""

    provider: str
    instance_id: str
    endpoint: tuple[str, int] | None = None
    base: tuple[str, int] | None = None
    learnt_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"provider": self.provider, "instance_id": self.instance_id, "learnt_at": self.learnt_at}
        if self.endpoint is not None and self.base is not None:
            out["endpoint"], out["base"] = list(self.endpoint), list(self.base)
        return out


def path() -> Path:
    return paths.state_dir() / NAME


def _pair(value: Any) -> tuple[str, int] | None:
    if (
        isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and _ADDRESS.match(value[0])
        and isinstance(value[1], int) and not isinstance(value[1], bool) and 0 < value[1] < 65536
    ):
        return value[0], value[1]
    return None


def _record(value: Any) -> Record | None:
    if not isinstance(value, dict):
        return None
    provider, instance_id, learnt = value.get("provider"), value.get("instance_id"), value.get("learnt_at")
    if provider not in PROVIDERS or not isinstance(instance_id, str) or not _ID.match(instance_id):
        return None
    endpoint, base = _pair(value.get("endpoint")), _pair(value.get("base"))
    return Record(
        provider, instance_id, endpoint if base else None, base if endpoint else None,
        float(learnt) if isinstance(learnt, (int, float)) and not isinstance(learnt, bool) else 0.0,
    )


def load(file: Path | None = None) -> dict[str, Record]:
    """Every host's record; {} when there is no file or it cannot be read."""
    try:
        with (file or path()).open("rb") as fh:
            data = json.loads(fh.read(MAX_BYTES + 1)[:MAX_BYTES].decode("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    out = {}
    for name, value in list(data.items())[:MAX_HOSTS]:
        found = _record(value)
        if isinstance(name, str) and found is not None:
            out[name] = found
    return out


def get(name: str, file: Path | None = None) -> Record | None:
    return load(file).get(name)


def put(name: str, record: Record, file: Path | None = None) -> None:
    """Keep ``record`` for host ``name`` (atomically; the oldest hosts' records go past ``MAX_HOSTS``)."""
    records = load(file)
    records.pop(name, None)
    records[name] = record
    kept = dict(list(records.items())[-MAX_HOSTS:])
    data = json.dumps({k: v.to_json() for k, v in kept.items()}, indent=1).encode()
    paths.write_atomic(file or path(), data)


def learnt(name: str, provider: str, instance_id: str, file: Path | None = None) -> None:
    """The host's agent named its instance: keep it (a moved endpoint stays while the instance is the same)."""
    if provider not in PROVIDERS or not _ID.match(instance_id):
        return
    memo = (str(file or path()), name)
    if _LEARNT.get(memo) == (provider, instance_id):  # said on every refresh: the file is read once
        return
    old = get(name, file)
    if old is None or (old.provider, old.instance_id) != (provider, instance_id):
        put(name, Record(provider, instance_id, learnt_at=time.time()), file)
    _LEARNT[memo] = (provider, instance_id)


@dataclass(frozen=True)
class Known:
    """The instance a host is: from its ``instance_id`` setting, or as its agent last reported it."""

    provider: str
    instance_id: str
    source: str  # "the config" / "its agent"


def known(host: HostConfig) -> Known | None:
    """The RunPod / vast.ai instance ``host`` is, where gputui knows it."""
    if host.instance_id and host.provider in PROVIDERS:
        return Known(host.provider, host.instance_id, "the config")
    found = get(host.name)
    if found is not None and host.provider in ("auto", found.provider):
        return Known(found.provider, found.instance_id, "its agent")
    return None


def endpoint_for(name: str, address: str, port: int, file: Path | None = None) -> tuple[str, int] | None:
    """Where host ``name`` answers SSH when its provider moved it from ``(address, port)``, what the config
    resolves to now; None when it did not move (or the config has changed since)."""
    found = get(name, file)
    if found is None or found.endpoint is None or found.base != (address, port):
        return None
    return found.endpoint

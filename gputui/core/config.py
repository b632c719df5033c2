"""The TOML config: where it is, what it may hold, and errors that name file, line and field.

Search order: ``--config PATH``, ``$GPUTUI_CONFIG``, ``$XDG_CONFIG_HOME/gputui/config.toml``
(``~/.config/gputui/config.toml``). Without a file the fleet is one host, ``local``.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCAL = "local"
TRANSPORTS = ("ssh", "local")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ConfigError(ValueError):
    """A config problem, worded as ``file:line: field: what is wrong``."""


@dataclass(frozen=True)
class HostConfig:
    """One host's settings; every field may also be set in ``[defaults]``."""

    name: str
    transport: str = "ssh"
    host: str | None = None  # hostname or ~/.ssh/config alias; defaults to the table name
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    remote_dir: str = "~/.gputui"
    python: str | None = None
    verify_host_key: bool = True
    connect_timeout: float = 10.0
    keepalive_interval: float = 1.0
    keepalive_count_max: int = 2

    @property
    def address(self) -> str:
        return self.host or self.name


@dataclass(frozen=True)
class Config:
    path: Path | None
    hosts: dict[str, HostConfig]
    ssh_config: str | None = None
    theme: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def host(self, name: str) -> HostConfig:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "none"
            where = f" in {self.path}" if self.path else " (no config file: only 'local')"
            raise ConfigError(f"unknown host {name!r}{where}; known hosts: {known}") from None


# Types each key accepts (int is accepted where float is).
HOST_FIELDS: dict[str, tuple[type, ...]] = {
    f.name: {
        "str | None": (str,),
        "int | None": (int,),
        "str": (str,),
        "bool": (bool,),
        "float": (float, int),
        "int": (int,),
    }[str(f.type)]
    for f in fields(HostConfig)
    if f.name != "name"
}
GLOBAL_FIELDS: dict[str, tuple[type, ...]] = {"ssh_config": (str,), "theme": (str,)}
GLOBAL_TABLES = ("hosts", "defaults")


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gputui" / "config.toml"


def resolve_path(explicit: str | None) -> tuple[Path | None, bool]:
    """(path, must_exist): an explicit path or $GPUTUI_CONFIG must exist; the default may be absent."""
    if explicit:
        return Path(explicit).expanduser(), True
    if os.environ.get("GPUTUI_CONFIG"):
        return Path(os.environ["GPUTUI_CONFIG"]).expanduser(), True
    return default_path(), False


def default_local() -> HostConfig:
    return HostConfig(
        name=LOCAL, transport="local", remote_dir=os.environ.get("GPUTUI_STATE_DIR", "~/.gputui")
    )


def load(explicit: str | None = None) -> Config:
    path, must_exist = resolve_path(explicit)
    if path is None or not path.exists():
        if must_exist:
            raise ConfigError(f"{path}: config file not found")
        return Config(path=None, hosts={LOCAL: default_local()})
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    return parse(text, path)


def _line_of(text: str, table: str | None, key: str) -> int | None:
    """Best-effort line number of ``key`` inside ``[table]`` (or at top level)."""
    current: str | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = re.match(r"^\[\s*([^\]]+?)\s*\]", line)
        if m:
            current = m.group(1).replace('"', "").replace("'", "").replace(" ", "")
            if table is not None and key == "" and current == table:
                return no
            continue
        if current == table and re.match(rf"^[\"']?{re.escape(key)}[\"']?\s*=", line):
            return no
    return None


def parse(text: str, path: Path) -> Config:
    def fail(table: str | None, key: str, message: str) -> ConfigError:
        line = _line_of(text, table, key)
        where = f"{path}:{line}" if line else str(path)
        name = f"{table}.{key}" if table and key else (table or key)
        return ConfigError(f"{where}: {name}: {message}")

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None

    for key, value in data.items():
        if key in GLOBAL_TABLES:
            if not isinstance(value, dict):
                raise fail(None, key, "must be a table")
        elif key in GLOBAL_FIELDS:
            if not isinstance(value, GLOBAL_FIELDS[key]) or isinstance(value, bool):
                raise fail(None, key, f"must be a {GLOBAL_FIELDS[key][0].__name__}")
        else:
            raise fail(
                None, key, f"unknown setting (known: {', '.join(sorted([*GLOBAL_FIELDS, *GLOBAL_TABLES]))})"
            )

    defaults = _check_fields(data.get("defaults", {}), "defaults", fail)
    hosts: dict[str, HostConfig] = {}
    for name, table in data.get("hosts", {}).items():
        if not isinstance(table, dict):
            raise fail("hosts", name, "must be a table like [hosts.NAME]")
        if not _NAME.match(name):
            raise fail(f"hosts.{name}", "", "host names may use letters, digits, '.', '_' and '-' (max 64)")
        values = {**defaults, **_check_fields(table, f"hosts.{name}", fail)}
        if values.get("transport", "ssh") not in TRANSPORTS:
            raise fail(f"hosts.{name}", "transport", f"must be one of {', '.join(TRANSPORTS)}")
        if "port" in values and not 0 < values["port"] < 65536:
            raise fail(f"hosts.{name}", "port", "must be between 1 and 65535")
        hosts[name] = HostConfig(name=name, **values)
    if not hosts:
        hosts = {LOCAL: default_local()}
    return Config(path=path, hosts=hosts, ssh_config=data.get("ssh_config"), theme=data.get("theme"))


def _check_fields(table: dict[str, Any], where: str, fail: Any) -> dict[str, Any]:
    for key, value in table.items():
        if key not in HOST_FIELDS:
            raise fail(where, key, f"unknown setting (known: {', '.join(sorted(HOST_FIELDS))})")
        types = HOST_FIELDS[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise fail(where, key, f"must be a {types[0].__name__}, not {type(value).__name__} {value!r}")
    return dict(table)

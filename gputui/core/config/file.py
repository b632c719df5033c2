"""The TOML config: where it is, what it may hold, and errors that name file, line and field.

Search order: ``--config PATH``, ``$GPUTUI_CONFIG``, ``$XDG_CONFIG_HOME/gputui/config.toml``
(``~/.config/gputui/config.toml``). Without a file the fleet is one host, ``local``.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shlex
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gputui.core import paths
from gputui.core.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCAL = "local"
TRANSPORTS = ("ssh", "local")
SCHEDULERS = ("slurm",)
CONTAINER_ENGINES = ("auto", "docker", "podman")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ConfigError(UsageError, ValueError):
    """A config problem, worded as ``file:line: field: what is wrong``."""


NOTIFY_EVENTS = ("job_succeeded", "job_failed", "job_killed", "job_lost", "stalled", "autostop_soon", "released",
                 "release_failed", "release_check_failed", "queue_empty", "idle", "deadline_soon", "job_restarted",
                 "crash_loop", "gpu_fault")
NOTIFY_FIELDS = ("command", "webhook", "ntfy", "ntfy_server", "idle_minutes", "events")


@dataclass(frozen=True)
class Notify:
    """``[notify]``: what the host's watchdog sends, and how (remote_agent/watchdog/notify.py)."""

    command: tuple[str, ...] | None = None  # argv run on the host; the text on stdin and in GPUTUI_NOTIFY_TEXT
    webhook: str | None = None  # http(s) URL: a JSON POST with the text in text / content / message
    ntfy: str | None = None  # an ntfy topic: the plain text is POSTed to ntfy_server/topic
    ntfy_server: str | None = None  # default https://ntfy.sh
    idle_minutes: float | None = None  # the "idle" event: the host has been idle this long
    events: tuple[str, ...] = ("job_succeeded", "job_failed", "job_lost", "stalled", "autostop_soon", "released",
                               "release_failed", "release_check_failed", "queue_empty", "idle", "deadline_soon",
                               "job_restarted", "crash_loop", "gpu_fault")


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
    # money (see gputui.core.money.cost)
    price_per_hour: float | None = None
    currency: str | None = None  # default: the global currency
    billing_start: dt.datetime | None = None  # default: the host's boot time
    idle_minutes: float = 30.0
    idle_util_percent: float = 5.0
    count_ssh_sessions: bool = True
    release: tuple[str, ...] | None = None  # argv run on this machine, e.g. a provider CLI
    release_remote: tuple[str, ...] | None = None  # argv run on the host, e.g. sudo shutdown -h now
    release_timeout: float = 120.0
    autostop_minutes: float | None = None
    pre_stop: tuple[str, ...] | None = None
    pre_stop_timeout: float = 300.0
    release_after_hours: float | None = None
    release_at: dt.datetime | None = None
    # stalled jobs (see remote_agent/watchdog/stall.py): GPUs below idle_util_percent and a silent log this long; None: off
    stall_minutes: float | None = None
    stalled_counts_as_idle: bool = False  # autostop may then release a host whose only jobs are stalled
    resume_on_boot: bool = False  # an @reboot crontab line resumes the host's work after a reboot (watchdog/autostart.py)
    notify: Notify | None = None  # [notify], with [hosts.NAME.notify] keys over it
    # files to bring back before release (gputui release): relative to each job's dir, or absolute on the host
    artifacts: tuple[str, ...] = ()
    # "slurm": the host is a Slurm login node; gputui run submits with sbatch (remote_agent/jobs/slurm.py)
    scheduler: str | None = None
    price_per_gpu_hour: float | None = None  # a Slurm job's price: this x its GPUs x nodes, while it runs
    # provider-native price and release (gputui.core.config.providers): "auto" finds RunPod / vast.ai on the host
    provider: str = "auto"  # or "runpod", "vastai", "lambda", "none"
    release_mode: str | None = None  # "stop" / "terminate"; None: stop where the provider can, else terminate
    # the RunPod pod / vast.ai instance this host is (gputui start; with provider = "runpod" or "vastai"); unset,
    # the one its agent last reported (gputui.core.transport.instances)
    instance_id: str | None = None
    # restart policy of jobs started here (remote_agent/jobs/restart.py): "no" or "on-failure[:N]"
    restart: str = "no"
    restart_backoff_s: float = 30.0  # first wait between attempts, doubling ...
    restart_backoff_max_s: float = 600.0  # ... up to this
    restart_healthy_minutes: float = 10.0  # an attempt that ran this long resets the attempt counter
    # the engine of jobs run in images (gputui run --image; remote_agent/jobs/image.py): docker, else podman
    container_engine: str = "auto"  # or "docker", "podman"
    # a job over several hosts (gputui run h1,h2): the address the other hosts reach this one on, where it is not
    # the one gputui finds (remote_agent/jobs/group.py)
    private_address: str | None = None

    @property
    def address(self) -> str:
        return self.host or self.name


@dataclass(frozen=True)
class Budget:
    """``[budget]``: the fleet's daily and monthly spend limits."""

    daily: float | None = None
    monthly: float | None = None
    warn_fraction: float = 0.8
    on_exceed: str = "warn"  # or "release-idle"


@dataclass(frozen=True)
class ProviderSettings:
    """``[providers.NAME]``: how to reach one provider's API."""

    api_url: str | None = None  # the API base (proxies, tests); None: the provider's own


@dataclass(frozen=True)
class Config:
    """The whole config: its file, its hosts and the tables beside them."""

    path: Path | None
    hosts: dict[str, HostConfig]
    ssh_config: str | None = None
    theme: str | None = None
    currency: str = "USD"
    prices: dict[str, float] = field(default_factory=dict)  # per GPU-hour, by GPU model name
    budget: Budget = field(default_factory=Budget)
    providers: dict[str, ProviderSettings] = field(default_factory=dict)  # by provider name
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # [groups.NAME] hosts: one job over them
    service_idle_minutes: float = 10.0  # the session service closes a host's connection after this idle time

    def host(self, name: str) -> HostConfig:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "none"
            where = f" in {self.path}" if self.path else " (no config file: only 'local')"
            raise ConfigError(f"unknown host {name!r}{where}; known hosts: {known}") from None


ARGV = "argv"  # a list of strings, or one string split like a shell would (never run through a shell)
PATHS = "paths"  # a list of path patterns
DATETIME = "datetime"
_TYPES: dict[str, Any] = {
    "str": (str,), "str | None": (str,), "int | None": (int,), "int": (int,), "bool": (bool,),
    "float": (float, int), "float | None": (float, int),
    "tuple[str, ...] | None": ARGV, "dt.datetime | None": DATETIME, "tuple[str, ...]": PATHS,
}
# What each key accepts (int is accepted where float is).
HOST_FIELDS: dict[str, Any] = {
    f.name: _TYPES[str(f.type)] for f in fields(HostConfig) if f.name not in ("name", "notify")
}
GLOBAL_FIELDS: dict[str, tuple[type, ...]] = {"ssh_config": (str,), "theme": (str,), "currency": (str,),
                                              "service_idle_minutes": (float, int)}
MAX_SERVICE_IDLE_MINUTES = 24 * 60
GLOBAL_TABLES = ("hosts", "defaults", "prices", "budget", "notify", "providers", "groups")
PROVIDERS = ("auto", "runpod", "vastai", "lambda", "none")  # gputui.core.config.providers has the rules behind them
PROVIDER_FIELDS = ("api_url",)
BUDGET_FIELDS = {
    "daily": (float, int),
    "monthly": (float, int),
    "warn_fraction": (float, int),
    "on_exceed": (str,),
}
ON_EXCEED = ("warn", "release-idle")
_CURRENCY = re.compile(r"^[A-Z]{3}$")
MAX_PATHS = 32
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9.:%_-]{1,255}$")  # a hostname, an IPv4 or IPv6 address
# Numbers: (lowest, highest or None, lowest allowed?); every number must also be finite (TOML allows nan, inf).
DAY_S = 86400.0
_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "price_per_hour": (0, None, True), "price_per_gpu_hour": (0, None, True), "idle_minutes": (0, 1e6, True), "idle_util_percent": (0, 100, True),
    "release_timeout": (0, DAY_S, False), "pre_stop_timeout": (0, DAY_S, False),
    "autostop_minutes": (0, 1e6, True), "release_after_hours": (0, 1e5, True), "stall_minutes": (0, 1e6, True),
    "connect_timeout": (0, 3600, False), "keepalive_interval": (0, 3600, True), "keepalive_count_max": (0, 1000, True),
    "restart_backoff_s": (0, DAY_S, True), "restart_backoff_max_s": (0, DAY_S, True),
    "restart_healthy_minutes": (0, 1440, True),
    "daily": (0, None, True), "monthly": (0, None, True), "warn_fraction": (0, 1, True),
}
_UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")  # C0/C1 controls, DEL, bidi and other format marks, separators


def _range_problem(key: str, value: float) -> str | None:
    """What is wrong with number ``value`` for setting ``key`` (None: nothing)."""
    if not math.isfinite(value):
        return f"must be a finite number, not {value!r}"
    low, high, low_ok = _RANGES.get(key, (-math.inf, None, True))
    if value < low:
        return (
            f"must not be negative, not {value!r}" if low == 0 else f"must be at least {low:g}, not {value!r}"
        )
    if value == low and not low_ok:
        return f"must be above {low:g}, not {value!r}"
    if high is not None and value > high:
        return f"must be at most {high:g}, not {value!r}"
    return None


def _unknown(key: str, known: Iterable[str]) -> str:
    """``unknown setting (did you mean 'port'? known: ...)``: the closest known name first, for typos."""
    import difflib  # only on this error path: the CLI's start pays nothing for it

    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown setting ({guess}known: {', '.join(names)})"


def _kind(types: tuple[type, ...]) -> str:
    """What a value of ``types`` is, in words: ``a whole number``, ``a number``, ``a string``, ..."""
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}.get(types[0], "valid")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (newline, ESC, DEL, C1, bidi override, ...)."""
    return any(unicodedata.category(ch) in _UNSAFE_CATEGORIES for ch in text)


def _text_problem(value: Any) -> str | None:
    """A string (or a command's strings) with control characters: what to say about it."""
    texts = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
    for text in texts:
        if isinstance(text, str) and has_control(text):
            return f"must not contain control characters (newline, tab, escape...), not {text!r}"
    return None


def decode(data: bytes) -> str:
    """A config file's text; bytes that are not UTF-8 become surrogates (``encode`` gives them back), which
    ``not_utf8`` refuses in anything but comments."""
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    """The bytes of a config's text read by ``decode``."""
    return text.encode("utf-8", "surrogateescape")


def not_utf8(data: Any, where: str = "") -> str | None:
    """The dotted name (printable) of the first key or value of parsed TOML holding bytes that are not UTF-8
    (as ``decode`` gives them), else None."""
    if isinstance(data, str):
        return where or "the file" if any("\udc80" <= ch <= "\udcff" for ch in data) else None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        shown = str(key) if str(key).isprintable() else repr(key)
        name = f"{where}.{shown}" if where else shown
        found = not_utf8(key, name) or not_utf8(value, name)
        if found:
            return found
    return None


def default_path() -> Path:
    return paths.config_dir() / "config.toml"


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
        text = decode(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    return parse(text, path)


def _line_of(text: str, table: str | None, key: str) -> int | None:
    """Best-effort line number of ``key`` inside ``[table]`` (or at top level)."""
    current: str | None = None
    for no, raw in enumerate(text.split("\n"), 1):  # TOML's lines (splitlines also cuts at U+2028, FF, ...)
        line = raw.strip()
        m = re.match(r"^\[\s*([^\]]+?)\s*\]", line)
        if m:
            current = m.group(1).replace('"', "").replace("'", "").replace(" ", "")
            if table is not None and key == "" and current == table:
                return no
            if table is None and current.split(".")[0] == key:  # an unknown table: [host.gpu1]
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
        if has_control(name):
            name = repr(name)  # never a raw control sequence on the terminal
        return ConfigError(f"{where}: {name}: {message}")

    text = text.removeprefix("\ufeff")  # a BOM some editors write is not part of the TOML
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    where = not_utf8(data)
    if where is not None:
        raise ConfigError(f"{path}: {where}: holds bytes that are not UTF-8 (only comments may)")

    for key, value in data.items():
        if key in GLOBAL_TABLES:
            if not isinstance(value, dict):
                raise fail(None, key, "must be a table")
        elif key in GLOBAL_FIELDS:
            if not isinstance(value, GLOBAL_FIELDS[key]) or isinstance(value, bool):
                raise fail(None, key, f"must be {_kind(GLOBAL_FIELDS[key])}, not {value!r}")
            problem = _text_problem(value) if isinstance(value, str) else None
            if isinstance(value, (int, float)) and not 0 < value <= MAX_SERVICE_IDLE_MINUTES:  # service_idle_minutes
                problem = f"must be between 0 and {MAX_SERVICE_IDLE_MINUTES} minutes, not {value!r}"
            if problem:
                raise fail(None, key, problem)
        else:
            hint = " (a host setting: it goes in a [hosts.NAME] table)" if key in HOST_FIELDS and not isinstance(value, dict) else ""
            raise fail(None, key, _unknown(key, [*GLOBAL_FIELDS, *GLOBAL_TABLES]) + hint)

    currency = data.get("currency", "USD")
    if not _CURRENCY.match(currency):
        raise fail(None, "currency", f"{currency!r} is not an ISO 4217 code like USD or EUR")
    prices = data.get("prices", {})
    for model, price in prices.items():
        if (
            not isinstance(price, (int, float))
            or isinstance(price, bool)
            or price < 0
            or not math.isfinite(price)
        ):
            raise fail("prices", model, f"must be a non-negative number (price per GPU-hour), not {price!r}")
        problem = _text_problem(model)
        if problem:
            raise fail("prices", model, "a GPU model name " + problem)
    budget = _check_budget(data.get("budget", {}), fail)
    defaults = _check_fields(data.get("defaults", {}), "defaults", fail)
    hosts: dict[str, HostConfig] = {}
    tables = data.get("hosts")
    if not tables:  # this machine, as with no file; [notify] applies to it, [defaults] (release commands!) not
        tables, defaults = {LOCAL: {"transport": "local", "remote_dir": default_local().remote_dir}}, {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise fail("hosts", name, "must be a table like [hosts.NAME]")
        if not _NAME.match(name):
            raise fail(f"hosts.{name}", "", "host names may use letters, digits, '.', '_' and '-' (max 64)")
        host_notify = table.get("notify", {})
        if not isinstance(host_notify, dict):
            raise fail(f"hosts.{name}", "notify", "must be a table like [hosts.NAME.notify]")
        table = {k: v for k, v in table.items() if k != "notify"}
        values = {**defaults, **_check_fields(table, f"hosts.{name}", fail)}
        values["notify"] = _check_notify(
            {**data.get("notify", {}), **host_notify}, f"hosts.{name}.notify" if host_notify else "notify", fail
        )
        if values.get("transport", "ssh") not in TRANSPORTS:
            raise fail(f"hosts.{name}", "transport", f"must be one of {', '.join(TRANSPORTS)}")
        _check_provider(values, f"hosts.{name}", fail)
        if values.get("scheduler") is not None and values["scheduler"] not in SCHEDULERS:
            raise fail(
                f"hosts.{name}", "scheduler",
                f"{values['scheduler']!r} is not a scheduler gputui drives (known: {', '.join(SCHEDULERS)})",
            )
        if values.get("container_engine", "auto") not in CONTAINER_ENGINES:
            raise fail(f"hosts.{name}", "container_engine",
                       f"{values['container_engine']!r}: use one of {', '.join(CONTAINER_ENGINES)}")
        if "restart" in values:  # (the policy's parser loads only for a config that sets one: the default is "no")
            from remote_agent.jobs.restart import parse_policy

            try:
                parse_policy(values["restart"])
            except ValueError as exc:
                raise fail(f"hosts.{name}", "restart", str(exc)) from None
        if "port" in values and not 0 < values["port"] < 65536:
            raise fail(f"hosts.{name}", "port", "must be between 1 and 65535")
        if values.get("currency") is not None and not _CURRENCY.match(values["currency"]):
            raise fail(
                f"hosts.{name}", "currency", f"{values['currency']!r} is not an ISO 4217 code like USD"
            )
        if values.get("autostop_minutes") and not values.get("release_remote") and (
            values.get("provider", "auto") not in ("auto", "runpod", "vastai") or values.get("release")
        ):  # the watchdog releases through RunPod / vast.ai from the host, unless the user's command is set
            why = ("release runs here, not on the host" if values.get("release")
                   else f"provider {values.get('provider')!r} cannot release from the host")
            raise fail(
                f"hosts.{name}", "autostop_minutes", f"needs release_remote: the command that stops the host ({why})"
            )
        instance_id = values.get("instance_id")
        if instance_id is not None and values.get("provider") not in ("runpod", "vastai"):
            raise fail(f"hosts.{name}", "instance_id", 'needs provider = "runpod" or "vastai" (whose instance it is)')
        if instance_id is not None and not _INSTANCE_ID.match(instance_id):
            raise fail(f"hosts.{name}", "instance_id", f"{instance_id!r}: a pod or instance id (letters, digits, '-', '_')")
        address = values.get("private_address")
        if address is not None and not _ADDRESS.match(address):
            raise fail(f"hosts.{name}", "private_address", f"{address!r}: a hostname or an IP address")
        if values.get("stalled_counts_as_idle") and not values.get("stall_minutes"):
            raise fail(
                f"hosts.{name}", "stalled_counts_as_idle", "needs stall_minutes: how long a job must be quiet"
            )
        hosts[name] = HostConfig(name=name, **values)
    return Config(
        path=path, hosts=hosts, ssh_config=data.get("ssh_config"), theme=data.get("theme"),
        currency=currency, prices={str(k): float(v) for k, v in prices.items()}, budget=budget,
        providers=_check_providers(data.get("providers", {}), fail), groups=_check_groups(data.get("groups", {}), hosts, fail),
        service_idle_minutes=float(data.get("service_idle_minutes", 10.0)),
    )


def _check_groups(table: dict[str, Any], hosts: dict[str, HostConfig], fail: Any) -> dict[str, tuple[str, ...]]:
    """``[groups.NAME] hosts = ["h1", "h2"]``: two or more configured hosts, each once, no Slurm host."""
    groups = {}
    for name, group in table.items():
        where = f"groups.{name}"
        if not isinstance(group, dict):
            raise fail("groups", name, f"must be a table like [groups.{name}] with hosts = [...]")
        if not _NAME.match(name) or name in hosts:
            raise fail(where, "", "a group name uses letters, digits, '.', '_' and '-' and is not a host's name")
        unknown = sorted(set(group) - {"hosts"})
        if unknown:
            raise fail(where, unknown[0], "unknown key (a group has only hosts)")
        names = group.get("hosts")
        if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) for n in names):
            raise fail(where, "hosts", "must list two or more host names")
        for n in names:
            if n not in hosts:
                raise fail(where, "hosts", f"{n!r} is not a configured host")
            if names.count(n) > 1:
                raise fail(where, "hosts", f"{n!r} is named twice")
            if hosts[n].scheduler is not None:
                raise fail(where, "hosts", f"{n!r} is a Slurm cluster: it runs many-node jobs itself (--nodes)")
        groups[name] = tuple(names)
    return groups


def _check_provider(values: dict[str, Any], where: str, fail: Any) -> None:
    """``provider`` and ``release_mode``: known names, and a mode the provider can do (when it is named)."""
    provider = values.get("provider", "auto")
    if provider not in PROVIDERS:
        raise fail(where, "provider", f"{provider!r} is not a provider gputui knows (known: {', '.join(PROVIDERS)})")
    mode = values.get("release_mode")
    if mode is None:
        return
    from gputui.core.config import providers  # only here: the CLI's start pays nothing for it

    problem = providers.release_mode_problem(provider, mode)
    if problem is None and provider == "none":
        problem = 'needs a provider: with provider = "none" a release runs only the release / release_remote commands'
    if problem:
        raise fail(where, "release_mode", problem)


def _check_providers(table: dict[str, Any], fail: Any) -> dict[str, ProviderSettings]:
    """``[providers.runpod]``, ``[providers.vastai]``, ``[providers.lambda]``: each provider's ``api_url``."""
    if not table:
        return {}
    from gputui.core.config import providers

    out = {}
    for name, settings in table.items():
        if name not in providers.API_PROVIDERS:
            known = ", ".join(providers.API_PROVIDERS)
            raise fail(f"providers.{name}", "", f"unknown provider (known: {known})")
        if not isinstance(settings, dict):
            raise fail("providers", name, f"must be a table like [providers.{name}]")
        for key, value in settings.items():
            if key not in PROVIDER_FIELDS:
                raise fail(f"providers.{name}", key, _unknown(key, PROVIDER_FIELDS))
            if not isinstance(value, str):
                raise fail(f"providers.{name}", key, f"must be a string, not {type(value).__name__} {value!r}")
            if _text_problem(value):
                raise fail(f"providers.{name}", key, _text_problem(value))
            try:
                providers.check_api_url(value)
            except providers.ProviderError as exc:
                raise fail(f"providers.{name}", key, str(exc).removeprefix("API URL ")) from None
        out[name] = ProviderSettings(api_url=settings.get("api_url"))
    return out


def _check_budget(table: dict[str, Any], fail: Any) -> Budget:
    for key, value in table.items():
        if key not in BUDGET_FIELDS:
            raise fail("budget", key, _unknown(key, BUDGET_FIELDS))
        if not isinstance(value, BUDGET_FIELDS[key]) or isinstance(value, bool):
            raise fail("budget", key, f"must be {_kind(BUDGET_FIELDS[key])}, not {value!r}")
        # on_exceed is the one text setting
        problem = _text_problem(value) if isinstance(value, str) else _range_problem(key, value)
        if problem:
            raise fail("budget", key, problem)
    if table.get("on_exceed", "warn") not in ON_EXCEED:
        raise fail("budget", "on_exceed", f"must be one of {', '.join(ON_EXCEED)}")
    return Budget(**table)


def _check_fields(table: dict[str, Any], where: str, fail: Any) -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        if key not in HOST_FIELDS:
            raise fail(where, key, _unknown(key, HOST_FIELDS))
        kind = HOST_FIELDS[key]
        if _text_problem(value):  # before a command string is split: a newline is not whitespace here
            raise fail(where, key, _text_problem(value))
        if kind == ARGV:
            value = _argv(value)
            if value is None:
                raise fail(where, key, "must be a command: a list of strings, or a string split like a shell")
        elif kind == PATHS:
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                raise fail(where, key, f'must be a list of paths like ["ckpt/", "runs/"], not {value!r}')
            if len(value) > MAX_PATHS or any(len(v) > 1024 for v in value):
                raise fail(where, key, f"at most {MAX_PATHS} paths of at most 1024 characters each")
            value = tuple(v.strip() for v in value)
        elif kind == DATETIME:
            if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
                value = dt.datetime.combine(value, dt.time())
            if not isinstance(value, dt.datetime):
                raise fail(where, key, f"must be a TOML date-time like 2026-12-01T18:00:00Z, not {value!r}")
            if value.tzinfo is None:
                value = value.astimezone()  # a local date-time means this machine's zone
        elif not isinstance(value, kind) or (isinstance(value, bool) and bool not in kind):
            raise fail(where, key, f"must be {_kind(kind)}, not {type(value).__name__} {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _range_problem(key, value):
            raise fail(where, key, _range_problem(key, value))
        out[key] = value
    return out


def _check_notify(table: dict[str, Any], where: str, fail: Any) -> Notify | None:
    """``[notify]`` settings (global keys with a host's over them); None when there is nothing to send with."""
    for key, value in table.items():
        if key not in NOTIFY_FIELDS:
            raise fail(where, key, _unknown(key, NOTIFY_FIELDS))
        if _text_problem(value):
            raise fail(where, key, _text_problem(value))
    command = None
    if table.get("command") is not None:
        command = _argv(table["command"])
        if command is None:
            raise fail(where, "command", "must be a command: a list of strings, or a string split like a shell")
    webhook = table.get("webhook")
    if webhook is not None and not (
        isinstance(webhook, str) and re.match(r"^https?://[^/\s]+", webhook, re.IGNORECASE)
    ):
        raise fail(where, "webhook", f"must be an http:// or https:// URL, not {webhook!r}")
    ntfy, server, idle = table.get("ntfy"), table.get("ntfy_server"), table.get("idle_minutes")
    if ntfy is not None and not (isinstance(ntfy, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", ntfy)):
        raise fail(where, "ntfy", f"must be an ntfy topic name (letters, digits, - and _), not {ntfy!r}")
    if server is not None and not (isinstance(server, str) and re.match(r"^https?://[^/\s]+", server, re.IGNORECASE)):
        raise fail(where, "ntfy_server", f"must be an http:// or https:// URL, not {server!r}")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or not 0 < idle <= 1e6):
        raise fail(where, "idle_minutes", f"must be a number of minutes above 0, not {idle!r}")
    events = table.get("events", Notify.events)
    if not isinstance(events, (list, tuple)) or not all(isinstance(e, str) for e in events):
        raise fail(where, "events", f"must be a list of event names ({', '.join(NOTIFY_EVENTS)})")
    for event in events:
        if event not in NOTIFY_EVENTS:
            raise fail(where, "events", f"unknown event {event!r} (known: {', '.join(NOTIFY_EVENTS)})")
    if command is None and webhook is None and ntfy is None:
        if table:
            raise fail(where, "", "needs a webhook, an ntfy topic or a command to send with")
        return None
    return Notify(command=command, webhook=webhook, ntfy=ntfy, ntfy_server=server,
                  idle_minutes=None if idle is None else float(idle), events=tuple(events))


def _argv(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None

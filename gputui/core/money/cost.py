"""Money: prices, the local ledger of billed intervals and idle cost. Pure, except Ledger.save().

The ledger holds, per host, intervals ``[start, end)`` billed at a price. An open interval (``end`` None)
starts at the host's boot time (or ``billing_start``) and is kept alive by observations; a reboot or a new
instance (another boot id) closes it at the last time the host was seen and opens a new one; a price change
closes it now; a release closes it for good. So totals survive client restarts and cover the time the client
was closed, bounded by what the host itself reports.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.core import paths
from gputui.core.config.file import Config, HostConfig
from gputui.core.money.autostop import autostop_in_s, deadline_in_s
from gputui.core.session import model as M
from gputui.core.transport import instances
from remote_agent import protocol as P

SAVE_EVERY_S = 60.0


def price_per_hour(host: HostConfig, gpus: tuple[M.GpuSample, ...], prices: dict[str, float]) -> float | None:
    """The host's explicit price, else the sum of its GPUs' per-GPU-hour prices (None if any is unknown)."""
    if host.price_per_hour is not None:
        return float(host.price_per_hour)
    if not prices or not gpus:
        return None
    total = 0.0
    for gpu in gpus:
        price = gpu_price(gpu.name or "", prices)
        if price is None:
            return None
        total += price
    return total


def gpu_price(name: str, prices: dict[str, float]) -> float | None:
    """Exact (case-insensitive) model match, else the longest key contained in the name ("H100" in "NVIDIA H100 ...")."""
    lowered = {k.lower(): v for k, v in prices.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    hits = [k for k in lowered if k and k in name.lower()]
    return lowered[max(hits, key=len)] if hits else None


RUNNING, STOPPED = "running", "stopped"  # Interval.kind: compute billed, or only the disk of a stopped instance


@dataclass
class Interval:
    """A stretch of rented time at one price (``end`` None: still running)."""

    start: float
    end: float | None
    price: float
    boot_id: str | None
    last_seen: float
    kind: str = RUNNING

    def until(self, now: float, live: bool) -> float:
        if self.end is not None:
            return self.end
        if self.kind == STOPPED:  # the disk bills on while the provider says stopped, link or none
            return now
        return now if live else max(self.last_seen, self.start)


class Ledger:
    """Billed intervals per host, persisted atomically as JSON. Several processes keep one (the app, a command,
    the session service): each save first takes in what the others saved since (``merge_saved``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.state_dir() / "ledger.json"
        self.hosts: dict[str, dict[str, Any]] = {}
        self._saved_at = 0.0
        self._dirty = False
        self._writable = True
        self.notice: str | None = None  # said once: a bad ledger was set aside
        self._file: tuple[int, int, int] | None = None  # the file as this process last read or wrote it
        self._synced: dict[str, Any] = {}  # each host's entry as the file had it then
        self._decided: set[str] = set()  # hosts this process closed, started or saw stopped since then
        try:
            self.hosts = self._read()
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            self._set_aside(exc)

    def _read(self) -> dict[str, dict[str, Any]]:
        """The file's hosts, remembered as this process's view of the file."""
        with open(self.path, "rb") as f:
            stamp, raw = _stamp(os.fstat(f.fileno())), json.loads(f.read())
        hosts = _parse_ledger(raw)
        self._file, self._synced = stamp, raw.get("hosts", {})
        return hosts

    def merge_saved(self) -> None:
        """Take in what another process saved since this one last read or wrote the file: a host whose entry it
        changed, and this process decided nothing about since (a release, a start, a stop), is taken as the
        file has it. So a release a command saved is never undone by the longer-lived view of the app or the
        session service; their own observations of a host are made again at its next sample."""
        try:
            if _stamp(os.stat(self.path)) == self._file:
                return
            synced = self._synced
            for name, entry in self._read().items():
                if synced.get(name) != self._synced.get(name) and name not in self._decided:
                    self.hosts[name] = entry
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass  # unreadable now: this process's view is saved over it (set aside only at the start)

    def _set_aside(self, why: Exception) -> None:
        """Keep a ledger we cannot read as ``ledger.json.bad-<time>`` and start a new one."""
        aside = self.path.with_name(f"{self.path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            self._writable = False  # never overwrite what we could not keep
            self.notice = f"{self.path}: unreadable ledger ({why}) and cannot move it aside ({exc}): costs are not saved"
            return
        self.notice = f"{self.path}: unreadable ledger ({why}); kept it as {aside.name} and started a new one"

    def _host(self, name: str) -> dict[str, Any]:
        return self.hosts.setdefault(name, {"intervals": [], "released_at": None, "released_boot_id": None})

    def released_since(self, name: str, since: float) -> bool:
        """Whether the host was marked released at ``since`` or later."""
        at = self._host(name)["released_at"]
        return at is not None and at >= since

    def intervals(self, name: str) -> list[Interval]:
        return list(self._host(name)["intervals"])

    def released(self, name: str) -> bool:
        return self._host(name)["released_at"] is not None

    def observe(
        self, name: str, now: float, price: float | None, boot_id: str | None, start: float | None
    ) -> None:
        """The host is up now, billed at ``price`` since ``start`` (boot time or billing_start)."""
        if price is None or not math.isfinite(price):
            return
        h = self._host(name)
        ivs: list[Interval] = h["intervals"]
        if ivs and ivs[-1].end is None and ivs[-1].kind == STOPPED:  # up after the provider said stopped:
            ivs[-1].end = start = now  # a new run (a started pod keeps its boot id), billed from now
            h["released_at"] = h["released_boot_id"] = None
        if h["released_at"] is not None:
            if boot_id == h["released_boot_id"]:
                return  # still shutting down after a release: not billed any more
            h["released_at"] = h["released_boot_id"] = None  # a new instance under the same name
        open_iv = ivs[-1] if ivs and ivs[-1].end is None else None
        floor = max((iv.end for iv in ivs if iv.end is not None), default=0.0)
        if open_iv is not None and open_iv.boot_id == boot_id and open_iv.price == price:
            open_iv.last_seen = now
        else:
            if open_iv is not None:
                # another boot: it ended when we last saw it; a new price: it changes now
                open_iv.end = open_iv.last_seen if open_iv.boot_id != boot_id else now
                floor = open_iv.end
                start = now if open_iv.boot_id == boot_id else start
            begin = max(start if start is not None else now, floor)
            ivs.append(Interval(min(begin, now), None, price, boot_id, now))
        self._dirty = True

    def stopped(self, name: str, now: float, rate: float | None) -> None:
        """The provider says the host's instance is stopped now, its disk billing ``rate`` per hour (None:
        unknown, counted as 0): the running interval ended when the host was last seen, a stopped one runs
        from there until the host is seen up again (``observe``) or started (``started``)."""
        price = rate if rate is not None and math.isfinite(rate) and rate >= 0 else 0.0
        self._decided.add(name)
        ivs: list[Interval] = self._host(name)["intervals"]
        last = ivs[-1] if ivs and ivs[-1].end is None else None
        if last is not None and last.kind == STOPPED and last.price == price:
            last.last_seen = now
            return
        self.gone(name, now)
        begin = max((iv.end for iv in ivs if iv.end is not None), default=now)
        ivs.append(Interval(min(begin, now), None, price, None, now, STOPPED))

    def gone(self, name: str, now: float) -> None:
        """The provider says the host's instance no longer bills (terminated): an open interval ends, a
        running one when the host was last seen."""
        self._decided.add(name)
        ivs: list[Interval] = self._host(name)["intervals"]
        last = ivs[-1] if ivs and ivs[-1].end is None else None
        if last is not None:
            last.end = max(last.last_seen, last.start) if last.kind == RUNNING else now
        self._dirty = True

    def started(self, name: str, now: float) -> None:
        """``gputui start`` started the host's instance: its stopped time ends, and a release it had is over (a
        pod started again keeps its boot id: without this its new run would never be billed)."""
        self._decided.add(name)
        h = self._host(name)
        ivs: list[Interval] = h["intervals"]
        if ivs and ivs[-1].end is None and ivs[-1].kind == STOPPED:
            ivs[-1].end = now
        h["released_at"] = h["released_boot_id"] = None
        self._dirty = True

    def close(self, name: str, now: float, boot_id: str | None = None, released: bool = True) -> None:
        self._decided.add(name)
        h = self._host(name)
        ivs: list[Interval] = h["intervals"]
        if ivs and ivs[-1].end is None:
            ivs[-1].end = now
            boot_id = boot_id or ivs[-1].boot_id
        if released:
            h["released_at"], h["released_boot_id"] = now, boot_id
        self._dirty = True

    def spent(
        self, name: str, now: float, live: bool, since: float = 0.0, until: float | None = None
    ) -> float:
        """Money billed for ``name`` within ``[since, until)`` (until defaults to now)."""
        until = now if until is None else until
        total = 0.0
        for iv in self._host(name)["intervals"]:
            a, b = max(iv.start, since), min(iv.until(now, live), until)
            if b > a:
                total += (b - a) / 3600.0 * iv.price
        return total

    def by_day(self, name: str, now: float, live: bool, since: float = 0.0) -> dict[str, float]:
        """Local calendar day (YYYY-MM-DD) -> money, from ``since`` on."""
        days: dict[str, float] = {}
        ivs = self._host(name)["intervals"]
        first = max(min((iv.start for iv in ivs), default=now), since)
        day = dt.datetime.fromtimestamp(first).replace(hour=0, minute=0, second=0, microsecond=0)
        while day.timestamp() < now:
            nxt = day + dt.timedelta(days=1)
            amount = self.spent(name, now, live, max(since, day.timestamp()), nxt.timestamp())
            if amount:
                days[day.date().isoformat()] = amount
            day = nxt
        return days

    def save(self, force: bool = False) -> None:
        """Write atomically, after taking in what others saved (``merge_saved``, under a lock that every saver
        takes); between forced saves at most once a minute."""
        now = time.time()
        if not self._dirty or (not force and now - self._saved_at < SAVE_EVERY_S) or not self._writable:
            return
        paths.make_dirs(self.path.parent)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.merge_saved()
            self._write(now)
        finally:
            os.close(lock)

    def _write(self, now: float) -> None:
        data = {
            "hosts": {
                name: {
                    "intervals": [iv.__dict__ for iv in h["intervals"]],
                    "released_at": h["released_at"],
                    "released_boot_id": h["released_boot_id"],
                }
                for name, h in self.hosts.items()
            }
        }
        encoded = json.dumps(data, indent=1, allow_nan=False)
        paths.write_atomic(self.path, encoded.encode())
        self._saved_at, self._dirty = now, False
        self._file, self._synced, self._decided = _stamp(os.stat(self.path)), json.loads(encoded)["hosts"], set()


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _parse_ledger(data: Any) -> dict[str, dict[str, Any]]:
    """The hosts of a ledger file; ValueError/TypeError on anything that is not what ``save`` writes."""

    def number(x: Any) -> float:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"not a finite number: {x!r}")
        return float(x)

    def optional(x: Any) -> float | None:
        return None if x is None else number(x)

    hosts = {}
    for name, h in data.get("hosts", {}).items():
        intervals = []
        for i in h.get("intervals", []):
            boot = i["boot_id"]
            if boot is not None and not isinstance(boot, str):
                raise ValueError(f"not a boot id: {boot!r}")
            kind = i.get("kind", RUNNING)
            if kind not in (RUNNING, STOPPED):
                raise ValueError(f"not an interval kind: {kind!r}")
            intervals.append(Interval(number(i["start"]), optional(i["end"]), number(i["price"]), boot,
                                      number(i["last_seen"]), kind))
        hosts[str(name)] = {
            "intervals": intervals,
            "released_at": optional(h.get("released_at")),
            "released_boot_id": h.get("released_boot_id"),
        }
    return hosts


def day_start(now: float) -> float:
    return dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_start(now: float) -> float:
    return (
        dt.datetime.fromtimestamp(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
    )


def release_info(activity: P.Activity) -> dict[str, Any]:
    """What the host's watchdog reports of its release (``remote_agent/watchdog/daemon.py``): the CostInfo
    fields ``provider``, ``instance_id``, ``release_check_*``, ``release_failed`` and the provider's price
    (``provider_price``), each checked by type (a host may send anything)."""
    found: Any = activity.get("watchdog")
    wd: dict[str, Any] = found if isinstance(found, dict) else {}
    check: dict[str, Any] = wd["release_check"] if isinstance(wd.get("release_check"), dict) else {}
    out: dict[str, Any] = {}
    via = check.get("via")
    if isinstance(via, str) and via in ("command", "runpod", "vastai", "none"):
        out["provider"] = via
        if isinstance(check.get("instance_id"), str):
            out["instance_id"] = check["instance_id"][:64]
        if isinstance(check.get("ok"), bool):
            out["release_check_ok"] = check["ok"]
        if _number(check.get("t")) is not None:
            out["release_check_at"] = float(check["t"])
        if isinstance(check.get("detail"), str):
            out["release_check_detail"] = check["detail"][:300]
        price = _number(check.get("price_per_hour"))
        if via in ("runpod", "vastai") and check.get("ok") is True and price is not None and price <= 10000:
            out["provider_price"] = (price, via)
        elif isinstance(check.get("price_per_hour_unknown"), str):
            out["price_unknown"] = check["price_per_hour_unknown"][:300]
    if wd.get("action") == "release failed":
        error = wd.get("release_error")
        out["release_failed"] = error[:300] if isinstance(error, str) else "the release failed"
    return out


@dataclass(frozen=True)
class ProviderPrice:
    """The provider's price of a host where the config sets none (``release.instance``, asked on connect and
    every ten minutes): the figure and whose it is, or why it is unknown."""

    price: float | None
    provider: str
    unknown: str | None = None


def provider_price(found: P.ReleaseInstanceResult) -> ProviderPrice | None:
    """A ``release.instance`` answer read field by field (a host may send anything); None where it found no
    instance."""
    via = found.get("provider")
    if found.get("found") is not True or via not in ("runpod", "vastai"):
        return None
    price = _number(found.get("price_per_hour"))
    if price is not None and price <= 10000:
        return ProviderPrice(price, str(via))
    why = found.get("price_unknown") or found.get("error") or "the provider gave no price"
    return ProviderPrice(None, str(via), str(why)[:300])


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def price_and_source(
    host: HostConfig, gpus: tuple[M.GpuSample, ...], prices: dict[str, float], provider: tuple[float, str] | None
) -> tuple[float | None, str | None]:
    """The price per hour and where it comes from: the config's ``price_per_hour`` always wins, then the
    provider's own figure, then the per-GPU ``[prices]`` table."""
    if host.price_per_hour is not None:
        return float(host.price_per_hour), "config"
    if provider is not None:
        return provider
    price = price_per_hour(host, gpus, prices)
    return price, None if price is None else "prices"


def idleness(activity: P.Activity, host: HostConfig) -> tuple[bool, float, tuple[str, ...]]:
    """(idle, idle seconds, why not idle) from the agent's activity report under the host's idle rule."""
    reasons = tuple(str(r) for r in activity.get("reasons") or ())
    idle_seconds = float(activity.get("idle_seconds") or 0.0) if not reasons else 0.0
    return not reasons and idle_seconds >= host.idle_minutes * 60.0, idle_seconds, reasons


def cost_info(
    snap: M.HostSnapshot, host: HostConfig, config: Config, ledger: Ledger, asked: ProviderPrice | None = None,
    now: float | None = None,
) -> M.CostInfo:
    """Observe the host in the ledger and compute what the UI and ``status --json`` show. ``asked``: the
    provider's price as the fleet last asked it (the watchdog's own reading wins where it has one)."""
    now = time.time() if now is None else now
    live = snap.state == M.CONNECTED and snap.error is None
    activity = snap.metrics.activity if snap.metrics is not None else {}
    release = release_info(activity)
    wants = host.autostop_minutes or host.release_at is not None or host.release_after_hours is not None
    if snap.metrics is not None and wants and not activity.get("watchdog"):
        release.update(release_check_ok=False, release_check_detail="autostop / deadline NOT armed on the host: no "
                       "release_remote, and no RunPod or vast.ai instance found there")
    if "provider_price" not in release and asked is not None:
        if asked.price is not None:
            release["provider_price"] = (asked.price, asked.provider)
        elif "price_unknown" not in release:
            release["price_unknown"] = asked.unknown
    price, source = price_and_source(host, snap.gpus, config.prices, release.pop("provider_price", None))
    boot_time = snap.facts.get("boot_time")
    found = snap.facts.get("instance")
    if live and isinstance(found, dict) and host.provider in ("auto", found.get("provider")):
        instances.learnt(host.name, str(found.get("provider")), str(found.get("instance_id")))  # for gputui start
    if live and snap.metrics is not None:
        start = host.billing_start.timestamp() if host.billing_start else boot_time
        ledger.observe(host.name, now, price, snap.facts.get("boot_id"), start)
    idle, idle_seconds, reasons = idleness(activity, host)
    idle = idle and bool(snap.metrics)
    return M.CostInfo(
        currency=host.currency or config.currency,
        price_per_hour=price,
        accrued=ledger.spent(host.name, now, live),
        today=ledger.spent(host.name, now, live, since=day_start(now)),
        month=ledger.spent(host.name, now, live, since=month_start(now)),
        idle=idle,
        idle_seconds=idle_seconds,
        idle_cost=(price or 0.0) * idle_seconds / 3600.0,
        reasons=reasons,
        released=ledger.released(host.name),
        autostop_in_s=autostop_in_s(activity, now),
        deadline_in_s=deadline_in_s(activity, host, boot_time, now),
        price_source=source,
        **release,
    )

"""The fleet's spend and budgets: one rule for the app, ``gputui cost`` and the fleet summary line.

Money in different currencies is never added up: totals are kept per currency. The ``[budget]`` limits are in
the config's ``currency``; only spend in that currency counts against them (the rest is shown on its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputui.core.config.file import Budget, Config
from gputui.core.session import model as M


@dataclass(frozen=True)
class BudgetAlert:
    """A budget period near or over its limit."""

    period: str  # "daily" or "monthly"
    level: str  # "warn" or "exceeded"
    spent: float
    limit: float
    currency: str

    @property
    def message(self) -> str:
        pct = 100.0 * self.spent / self.limit if self.limit else 100.0
        verb = "exceeded" if self.level == "exceeded" else "at"
        return f"{self.period} budget {verb} {pct:.0f}%: {self.spent:.2f} of {self.limit:.2f} {self.currency}"

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "message": self.message}


def budget_alerts(budget: Budget, today: float, month: float, currency: str) -> list[BudgetAlert]:
    """A warning from ``warn_fraction`` of a limit on, an alert from the limit on (daily and monthly)."""
    alerts = []
    for period, limit, spent in (("daily", budget.daily, today), ("monthly", budget.monthly, month)):
        if limit is None:
            continue
        if spent >= limit:
            alerts.append(BudgetAlert(period, "exceeded", spent, limit, currency))
        elif spent >= budget.warn_fraction * limit:
            alerts.append(BudgetAlert(period, "warn", spent, limit, currency))
    return alerts


@dataclass(frozen=True)
class Spend:
    """The fleet's money in one currency."""

    currency: str
    accrued: float = 0.0
    today: float = 0.0
    month: float = 0.0
    burn_per_hour: float = 0.0  # what the hosts that are up and not released cost per hour now
    burning: int = 0  # how many hosts that burn is made of

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class FleetSpend:
    """What the fleet spends, per currency, and the budget's alerts."""

    by_currency: tuple[Spend, ...]  # the budget's currency first, then the others by name
    alerts: tuple[BudgetAlert, ...]
    budget_currency: str

    @property
    def single(self) -> Spend | None:
        """The one currency's totals (zeros in the budget's currency for no hosts); None when mixed."""
        if not self.by_currency:
            return Spend(self.budget_currency)
        return self.by_currency[0] if len(self.by_currency) == 1 else None


_TOTALS = ("accrued", "today", "month", "burn_per_hour", "burning")


def burning(snap: M.HostSnapshot) -> bool:
    """The host costs money right now: up, priced, not released."""
    c = snap.cost
    return snap.state == M.CONNECTED and c is not None and c.price_per_hour is not None and not c.released


def fleet_spend(
    snaps: Sequence[M.HostSnapshot], config: Config, accrued: Mapping[str, float] | None = None
) -> FleetSpend:
    """Totals per currency and the budget alerts; ``accrued`` replaces hosts' accrued cost (e.g. ``--since``)."""
    sums: dict[str, dict[str, float]] = {}
    for s in snaps:
        c = s.cost
        if c is None:
            continue
        t = sums.setdefault(c.currency, dict.fromkeys(_TOTALS, 0.0))
        t["accrued"] += c.accrued if accrued is None else accrued.get(s.name, 0.0)
        t["today"] += c.today
        t["month"] += c.month
        if burning(s):
            t["burn_per_hour"] += c.price_per_hour or 0.0
            t["burning"] += 1
    home = config.currency
    order = sorted(sums, key=lambda cur: (cur != home, cur))
    by_currency = tuple(
        Spend(cur, sums[cur]["accrued"], sums[cur]["today"], sums[cur]["month"], sums[cur]["burn_per_hour"],
              int(sums[cur]["burning"]))
        for cur in order
    )
    mine = sums.get(home, {})
    alerts = budget_alerts(config.budget, mine.get("today", 0.0), mine.get("month", 0.0), home)
    return FleetSpend(by_currency, tuple(alerts), home)


def idle_release_candidates(
    snaps: Sequence[M.HostSnapshot], config: Config, alerts: Sequence[BudgetAlert]
) -> list[str]:
    """Hosts to release because a budget is exceeded and ``on_exceed = "release-idle"``: idle ones only,
    with a release command, nothing running, not released yet (the release checks all of it again)."""
    if config.budget.on_exceed != "release-idle" or not any(a.level == "exceeded" for a in alerts):
        return []
    out = []
    for s in snaps:
        host = config.hosts.get(s.name)
        if host is None or s.cost is None or not s.cost.idle or s.cost.released:
            continue
        if (host.release or host.release_remote) and not any(j.running for j in s.jobs):
            out.append(s.name)
    return out

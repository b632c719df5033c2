"""The fleet: one row per host, and the one-line summary above it."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from gputui.core import safetext
from gputui.core.money.spend import FleetSpend
from gputui.core.session import model as M

from .. import fmt
from ..palette import Palette
from .keyed_table import KeyedTable, Row


def state_text(snap: M.HostSnapshot, pal: Palette) -> Text:
    s = snap.state
    look = snap.instance  # it does not answer: what its provider says (stopped, preempted, ...)
    if s != M.CONNECTED and look is not None and look.state != "unknown":
        style = pal.muted if look.state in ("stopped", "terminated") else pal.hot
        return Text(f"○ {look.state}", style=style, no_wrap=True)
    if s == M.CONNECTED:
        idle = snap.cost is not None and snap.cost.idle
        return Text("● idle" if idle else "● up", style=pal.warm if idle else pal.ok)
    if s == M.RECONNECTING:
        detail = f" · {snap.detail}" if snap.detail else ""
        return Text(
            safetext.clean(f"◌ reconnecting{detail}", limit=500),
            style=pal.warm,
            no_wrap=True,
            overflow="ellipsis",
        )
    if s == M.CONNECTING:
        return Text("◌ connecting", style=pal.muted)
    if s == M.ERROR:
        return Text(
            safetext.clean(f"✖ {snap.error or 'error'}", limit=500),
            style=pal.hot,
            no_wrap=True,
            overflow="ellipsis",
        )
    return Text("○ closed", style=pal.muted)


def gpu_summary(snap: M.HostSnapshot) -> str:
    """``4× A100``; a host with a lost GPU says so first (the column may cut the end): ``⚠ 1 lost · 4× A100``."""
    gpus = snap.gpus
    if not gpus:
        return "none" if snap.metrics is not None else "-"
    names = {fmt.short_gpu_name(n) for n in {g.name for g in gpus if not g.lost}}
    summary = f"{len(gpus)}× {names.pop() if len(names) == 1 else 'mixed' if names else 'GPU'}"
    lost = sum(1 for g in gpus if g.lost)
    troubled = sum(1 for g in gpus if not g.lost and g.problems)  # throttled, a narrow PCIe link, ECC errors
    return f"⚠ {lost} lost · {summary}" if lost else f"⚠ {troubled} degraded · {summary}" if troubled else summary


def host_row(snap: M.HostSnapshot, pal: Palette) -> tuple[object, ...]:
    gpus = snap.gpus
    utils = [g.util_percent for g in gpus if g.util_percent is not None]
    util = sum(utils) / len(utils) if utils else None  # not fmean: one module less to load
    used = sum(g.mem_used_mib or 0 for g in gpus) if gpus else None
    total = sum(g.mem_total_mib or 0 for g in gpus) if gpus else None
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    hottest = max(temps) if temps else None
    running = sum(1 for j in snap.jobs if j.running)
    cost = snap.cost
    priced = cost is not None and (cost.price_per_hour is not None or cost.accrued > 0)
    stale = snap.state != M.CONNECTED
    dim = pal.muted if stale else None
    return (
        Text(safetext.clean(snap.name, limit=200), style="bold", no_wrap=True, overflow="ellipsis"),
        state_text(snap, pal),
        Text(
            safetext.clean(gpu_summary(snap), limit=200),
            style=dim or (f"bold {pal.hot}" if any(g.lost for g in gpus) else pal.warm if any(g.problems for g in gpus) else ""),
            no_wrap=True,
            overflow="ellipsis",
        ),
        Text(fmt.pct(util), style=dim or pal.util(util), justify="right"),
        Text(fmt.mem_pair(used, total), style=dim or pal.mem(fmt.ratio(used, total)), justify="right"),
        Text("-" if hottest is None else f"{hottest:.0f}°C", style=dim or pal.temp(hottest), justify="right"),
        Text(str(running) if snap.metrics or snap.jobs else "-", justify="right"),
        Text(fmt.money(cost.price_per_hour, cost.currency) if cost else "-", justify="right"),
        Text(fmt.money(cost.accrued, cost.currency) if priced else "-", justify="right"),
        Text(fmt.duration(cost.idle_seconds) if cost and cost.idle else "-", justify="right"),
    )


class FleetTable(KeyedTable):
    """Hosts in config order; the cursor row is the selected host."""

    RIGHT = frozenset({"util", "mem", "temp", "jobs", "price", "accrued", "idle"})

    COLUMNS = (
        ("host", "Host", 14),
        ("state", "State", 34),
        ("gpus", "GPUs", 18),
        ("util", "Util", 5),
        ("mem", "GPU mem", 15),
        ("temp", "Temp", 5),
        ("jobs", "Jobs", 4),
        ("price", "$/h", 8),
        ("accrued", "Accrued", 9),
        ("idle", "Idle", 7),
    )

    def show(self, rows: Sequence[Row]) -> None:
        self.sync(rows)


def fleet_summary(snaps: Sequence[M.HostSnapshot], spend: FleetSpend, pal: Palette) -> Text:
    """``4 hosts: 2 up · 1 idle · 1 down · 1 connecting   burn $4.20/h   accrued $31.10``; a host still
    making its first connection is "connecting", not down. Money in another currency follows after `` · ``,
    never added."""
    if not snaps:
        return Text("No hosts. Add [hosts.NAME] tables to ~/.config/gputui/config.toml.", style=pal.muted)
    up = [s for s in snaps if s.state == M.CONNECTED]
    idle = [s for s in up if s.cost is not None and s.cost.idle]
    connecting = sum(1 for s in snaps if s.state == M.CONNECTING)
    down = len(snaps) - len(up) - connecting
    out = Text()
    out.append(f"{len(snaps)} host{'s' if len(snaps) != 1 else ''}: ", style="bold")
    out.append(f"{len(up)} up", style=pal.ok if up else pal.muted)
    out.append(" · ")
    out.append(f"{len(idle)} idle", style=pal.warm if idle else pal.muted)
    out.append(" · ")
    out.append(f"{down} down", style=pal.hot if down else pal.muted)
    if connecting:
        out.append(f" · {connecting} connecting", style=pal.muted)
    burn = [fmt.money(t.burn_per_hour, t.currency, per_hour=True) for t in spend.by_currency if t.burning]
    out.append("   burn ")
    out.append(" · ".join(burn) or "-", style="bold")
    accrued = [fmt.money(t.accrued, t.currency) for t in spend.by_currency if t.accrued > 0]
    if accrued:
        out.append("   accrued ")
        out.append(" · ".join(accrued), style="bold")
    return out

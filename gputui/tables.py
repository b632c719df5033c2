"""Plain-text tables the CLI prints (the ``--json`` forms come from the model's ``to_json``).

Host names, job names, errors and GPU names are data: every line goes out through :func:`print`, which shows
their control characters (a newline too: it would fake a row) as visible escapes.
"""

from __future__ import annotations

import builtins
import time
from typing import Any

from .core import model as M
from .core.safetext import clean


def print(*parts: object) -> None:  # every table line, whatever function of this module prints it
    builtins.print(*(clean(p) for p in parts))


def fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def dur(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def ago(t: float | None) -> str:
    return "-" if t is None else dur(time.time() - t)


def print_jobs(jobs: list[M.Job]) -> None:
    print(f"{'HOST':<12} {'ID':>4} {'STATE':<10} {'EXIT':>4} {'AGE':>7}  NAME")
    for j in jobs:
        print(
            f"{j.host:<12} {j.id:>4} {j.state:<10} {fmt(j.exit_code):>4} {ago(j.started_at):>7}  {j.name[:60]}"
        )


def _idle_text(c: M.CostInfo) -> str:
    if c.idle:
        return f"idle {dur(c.idle_seconds)}"
    return "busy: " + "; ".join(c.reasons[:3]) if c.reasons else "not idle yet"


def print_status(snaps: list[M.HostSnapshot]) -> None:
    for s in snaps:
        print(f"{s.name}: {s.state}" + (f" ({s.error})" if s.error else ""))
        m = s.metrics
        if m is None:
            continue
        h = m.host
        mem = f"{fmt(h.mem_used_mib)}/{fmt(h.mem_total_mib, ' MiB')}"
        print(
            f"  host  cpu {fmt(h.cpu_percent, '%')}  mem {mem}  disk free {fmt(h.disk_free_gib, ' GiB', 1)}"
        )
        if not m.gpus:
            print(f"  gpus  none ({m.gpu_error or 'no GPU found'})")
        for g in m.gpus:
            gmem = f"{fmt(g.mem_used_mib)}/{fmt(g.mem_total_mib, ' MiB')}"
            print(
                f"  gpu{g.index} {g.name or '?'}  {fmt(g.util_percent, '%')}  {gmem}  {fmt(g.temp_c, 'C')}  {fmt(g.power_w, 'W')}"
            )
        running = [j for j in s.jobs if j.running]
        print(f"  jobs  {len(running)} running, {len(s.jobs)} total")
        c = s.cost
        if c is not None:
            price = "no price set" if c.price_per_hour is None else f"{c.price_per_hour:.2f} {c.currency}/h"
            print(f"  cost  {price}, accrued {c.accrued:.2f}; {_idle_text(c)}")


def print_cost(
    hosts: list[dict[str, Any]], currency: str, burn: float, today: float, month: float, total: float
) -> None:
    print(f"{'HOST':<14} {'$/H':>8} {'TODAY':>10} {'MONTH':>10} {'TOTAL':>10}  IDLE")
    for h in hosts:
        price = "-" if h["price_per_hour"] is None else f"{h['price_per_hour']:.2f}"
        idle = (
            "released"
            if h["released"]
            else (dur(h["idle_seconds"]) if h["idle"] else "busy" if h["reasons"] else "-")
        )
        print(
            f"{h['name']:<14} {price:>8} {h['today']:>10.2f} {h['month']:>10.2f} {h['accrued']:>10.2f}  {idle}"
        )
    print(f"{'total ' + currency:<14} {burn:>8.2f} {today:>10.2f} {month:>10.2f} {total:>10.2f}")


def print_history(records: list[dict[str, Any]]) -> None:
    print(f"{'HOST':<12} {'ID':>4} {'STATE':<10} {'EXIT':>4} {'TIME':>8} {'COST':>8}  {'METRICS':<32} NAME")
    for r in records:
        shown = " ".join(f"{k}={v['last']:.4g}" for k, v in list(r["metrics"].items())[:3])
        cost = "-" if r["cost"] is None else f"{r['cost']:.2f}"
        time_s = "-" if r["duration_s"] is None else dur(r["duration_s"])
        print(f"{r['host']:<12} {r['id']:>4} {r['state']:<10} {fmt(r['exit_code']):>4} {time_s:>8} {cost:>8}  "
              f"{shown[:32]:<32} {r['name'][:40]}")  # fmt: skip

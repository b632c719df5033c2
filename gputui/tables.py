"""Plain-text tables the CLI prints (the ``--json`` forms come from the model's ``to_json``).

Host names, job names, errors and GPU names are data: every line goes out through :func:`print`, which shows
their control characters (a newline too: it would fake a row) as visible escapes.
"""

from __future__ import annotations

import builtins
import math
import shutil
import time
from typing import TYPE_CHECKING, Any

from .core.durations import duration
from .core.hosts.cluster import cluster_text
from .core.jobs.headline import headline, ranked
from .core.money.spend import FleetSpend, Spend
from .core.safetext import clean
from .core.session import model as M

if TYPE_CHECKING:  # log parsing is loaded only by the commands that parse logs
    from .core.insights import JobInsights


def print(*parts: object) -> None:  # every table line, whatever function of this module prints it
    builtins.print(*(clean(p) for p in parts))


def fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def ago(t: float | None) -> str:
    return "-" if t is None else duration(time.time() - t)


def _fit(items: list[str], room: int) -> str:
    """As many whole ``items`` as fit in ``room`` characters (then "…"); a lone first item is clipped instead."""
    out = ""
    for i, item in enumerate(items):
        more = " …" if i + 1 < len(items) else ""
        candidate = f"{out} {item}" if out else item
        if len(candidate) + len(more) > room:
            if not out:
                return item[: max(room - 1, 0)] + "…"
            return out + " …"
        out = candidate
    return out


def _columns() -> int:
    """The terminal's width ($COLUMNS first; 80 when piped)."""
    return shutil.get_terminal_size().columns


def _table(header: list[str], rows: list[list[Any]], right: str, caps: dict[int, int] | None = None) -> None:
    """Print aligned columns; ``right`` marks right-aligned ones ("r"/"l" per column but the last).

    Each column is as wide as its widest cell (at most ``caps[i]``, clipped with …); the last column holds a
    list of items and gets what the terminal width leaves (at least 16), filled with whole items.
    """
    caps = caps or {}
    cells = [[_fit([clean(str(c))], caps.get(i, 1 << 30)) for i, c in enumerate(r[:-1])] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header[:-1], *cells, strict=False)]
    room = max(16, _columns() - sum(widths) - len(widths) - 1)

    def line(values: list[str], last: str) -> str:
        cols = [
            v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, right, strict=False)
        ]
        return " ".join([*cols, last]).rstrip()

    print(line(header[:-1], header[-1]))
    for r, c in zip(rows, cells, strict=False):
        print(line(c, _fit(r[-1], room)))


def _progress(ins: JobInsights | None) -> str:
    if ins is None:
        return "-"
    epoch = (
        "" if ins.epoch is None else f"ep {ins.epoch}" + (f"/{ins.total_epochs}" if ins.total_epochs else "")
    )
    pct = "" if ins.progress is None or not math.isfinite(ins.progress) else f"{ins.progress * 100:.0f}%"
    return f"{epoch} {pct}".strip() or "-"


def _headline(metrics: Any) -> str:
    best = headline(metrics or {})
    return "-" if best is None else f"{best[0]}={best[1]:.4g}"


def print_jobs(jobs: list[M.Job]) -> None:
    """One line per job: progress (epoch and percent), ETA and the headline metric parsed from its log; then a
    line for each job's error and log error (a log that stopped at a full disk)."""
    rows = []
    for j in jobs:
        ins = j.insights
        eta = ins.eta_s if ins is not None and j.running and math.isfinite(ins.eta_s or 0.0) else None
        group = j.record.get("group")  # a job over several hosts: every host (gputui/core/jobs/group.py)
        hosts = ",".join(map(str, group.get("hosts") or ())) if isinstance(group, dict) else j.host
        rows.append([
            hosts, j.id, _state(j), fmt(j.exit_code), ago(j.started_at), _progress(ins),
            "-" if eta is None else duration(eta), _headline(ins.metrics if ins else None), [j.name],
        ])
    header = ["HOST", "ID", "STATE", "EXIT", "AGE", "PROGRESS", "ETA", "METRIC", "NAME"]
    _table(header, rows, "lrlrrlrl", caps={0: 16, 7: 24})
    for j in jobs:  # what went wrong with a job's files ("disk full at offset N": its log stops there)
        for key, what in (("error", "error"), ("log_error", "log")):
            text = j.record.get(key)
            if isinstance(text, str) and text:
                print(f"  {j.host} {j.id} {what}: {_fit([clean(text)], max(16, _columns() - 20))}")
        group = j.record.get("group")
        if isinstance(group, dict) and isinstance(group.get("parts"), list):  # a job over several hosts: each part
            parts = group["parts"]
            each = [clean(f"{p.get('host')}:{p.get('id') or '-'} {p.get('state')}") + ("," if i + 1 < len(parts) else "")
                    for i, p in enumerate(parts)]
            print(f"  {j.host} {j.id} parts: {_fit(each, max(16, _columns() - 24))}")
        attempts = j.record.get("attempts") or []
        if attempts:  # restart policies and Slurm requeues: every attempt that ended
            ends = [clean(_attempt_end(a)) for a in attempts if isinstance(a, dict)]
            print(f"  {j.host} {j.id} attempts: {_fit(ends, max(16, _columns() - 24))}")


def _attempt_end(a: dict[str, Any]) -> str:
    """One ended attempt: ``exit 1 (its hint)``, ``requeued by Slurm`` where Slurm ran it again."""
    end = "requeued by Slurm" if a.get("requeued_by") == "slurm" else f"exit {a.get('exit_code')}"
    return end + (f" ({a['hint']})" if a.get("hint") else "")


def _state(job: M.Job) -> str:
    """The job's state, with ``stalled`` and ``restarting`` (waiting for its next attempt) told apart."""
    if job.running and job.stalled:
        return "stalled"
    if job.running and job.record.get("restart_at") is not None:
        return f"restarting ({job.record.get('attempt')})"
    return job.state


def queue_gpus(job: M.Job) -> str:
    """The GPUs a queued job asked for: a count, a list, none, or all."""
    request = job.record.get("queue") or {}
    count = request.get("gpu_count")
    return str(count) if count is not None else request.get("gpus") or "all"


def print_queue(jobs: list[M.Job]) -> None:
    """One line per queued job, in queue order: position, GPUs asked for, and what it waits for."""
    rows = [
        [str(j.queue_position or "-"), j.id, queue_gpus(j), j.name,
         [j.queue_reason or "-"]]
        for j in jobs
    ]
    if not rows:
        print("no queued jobs")
        return
    _table(["POS", "ID", "GPUS", "NAME", "WAITS FOR"], rows, "rrll", caps={3: 30})


def _idle_text(c: M.CostInfo) -> str:
    if c.idle:
        return f"idle {duration(c.idle_seconds)}"
    if c.reasons:
        return "busy: " + "; ".join(c.reasons[:3])
    return f"quiet for {duration(c.idle_seconds)}, idle once that reaches idle_minutes"  # was "not idle yet"


def status_line(s: M.HostSnapshot) -> str:
    """One short line for a host (``status --short``: a tmux status line, a shell prompt): state, GPUs and their
    mean utilisation, running jobs, price, idle time, and a GPU problem first when there is one."""
    if s.state != M.CONNECTED and s.instance is not None and s.instance.state != "unknown":
        return f"{s.name} {s.instance.state}"  # what its provider says: stopped, preempted, terminated
    if s.state != M.CONNECTED:
        return f"{s.name} {s.state}" + (f" ({clean(s.error, limit=60)})" if s.error else "")
    parts = [f"{s.name} up"]
    gpus = s.metrics.gpus if s.metrics is not None else ()
    lost = [g for g in gpus if g.lost]
    if lost:
        parts.append(f"GPU {','.join(str(g.index) for g in lost)} LOST")
    for kind in ("XID", "throttled", "PCIe", "NVLink", "memory", "ECC", "clocks"):  # the GPU you pay for, slowed or failing
        hit = [g for g in gpus if not g.lost and any(p.startswith(kind + ":") for p in g.problems)]
        if hit:
            parts.append(f"GPU {','.join(str(g.index) for g in hit)} {kind}")
    utils = [g.util_percent for g in gpus if g.util_percent is not None]
    parts.append(f"{len(gpus)} GPU {sum(utils) / len(utils):.0f}%" if utils else f"{len(gpus)} GPU" if gpus else "no GPU")
    parts.append(f"{sum(j.running for j in s.jobs)} running")
    c = s.cost
    if c is not None and c.price_per_hour is not None:
        parts.append(f"{c.price_per_hour:.2f} {c.currency}/h")
    if c is not None and c.idle:
        parts.append(f"idle {duration(c.idle_seconds)}")
    return " · ".join(parts)


def print_status(snaps: list[M.HostSnapshot]) -> None:
    for s in snaps:
        print(f"{s.name}: {s.state}" + (f" ({clean(s.error, limit=2000)})" if s.error else ""))
        if s.instance is not None:  # it does not answer: what its provider says
            print(f"  {s.instance.state}  {clean(s.instance.detail, limit=600)}")
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
            if g.lost:  # the health line: only for a GPU with a problem
                print(f"  gpu{g.index} LOST: {clean(g.error or '?', limit=600)} Fix: {clean(g.fix or '?', limit=600)}")
                continue
            gmem = f"{fmt(g.mem_used_mib)}/{fmt(g.mem_total_mib, ' MiB')}"
            print(
                f"  gpu{g.index} {clean(g.name or '?', limit=100)}  {fmt(g.util_percent, '%')}  {gmem}  {fmt(g.temp_c, 'C')}  {fmt(g.power_w, 'W')}"
            )
            for problem in g.problems:  # the health line: only for a GPU with a problem
                print(f"  gpu{g.index} {problem}")
        running = [j for j in s.jobs if j.running]
        print(f"  jobs  {len(running)} running, {len(s.jobs)} total")
        if s.cluster is not None:
            print(f"  {clean(cluster_text(s.cluster), limit=2000)}")
        c = s.cost
        if c is not None:
            price = f"{c.price_per_hour:.2f} {c.currency}/h" if c.price_per_hour is not None else (
                "price unknown" if c.price_unknown else "no price set")
            price += f" · {c.price_source}" if c.price_source not in (None, "config") else ""
            stops = [f"{what} in {duration(left)}" for what, left in
                     (("autostop", c.autostop_in_s), ("deadline release", c.deadline_in_s)) if left is not None]
            print(f"  cost  {price}, accrued {c.accrued:.2f}; {'; '.join([_idle_text(c), *stops])}")
            line = release_line(c, time.time())
            if line:
                print(f"  release  {clean(line, limit=600)}")


def release_line(c: M.CostInfo, now: float) -> str | None:
    """How the host is released and whether that was proved: ``runpod pod X · checked 3m ago: ok``; a failed
    release first, loud (the host still bills)."""
    parts = []
    if c.release_failed:
        billing = "" if c.price_per_hour is None else f" at {c.price_per_hour:.2f} {c.currency}/h"
        parts.append(f"RELEASE FAILED, still billing{billing}: {c.release_failed}")
    if c.provider:
        where = "release_remote" if c.provider == "command" else f"{c.provider} {c.instance_id or ''}".strip()
        if c.release_check_ok is None:
            parts.append(f"{where} · not checked")
        else:
            ago = "" if c.release_check_at is None else f" {duration(max(0.0, now - c.release_check_at))} ago"
            verdict = "ok" if c.release_check_ok else "FAILED"
            parts.append(f"{where} · release checked{ago}: {verdict} ({c.release_check_detail or ''})")
    elif c.release_check_ok is False:
        parts.append(c.release_check_detail or "no release armed")
    return "; ".join(parts) or None


def print_cost(hosts: list[dict[str, Any]], spend: FleetSpend) -> None:
    """One row per host, then a total row per currency (money in different currencies is never added)."""
    print(f"{'HOST':<14} {'$/H':>8} {'TODAY':>10} {'MONTH':>10} {'TOTAL':>10}  IDLE")
    for h in hosts:
        price = "-" if h["price_per_hour"] is None else f"{h['price_per_hour']:.2f}"
        idle = (
            "released"
            if h["released"]
            else (duration(h["idle_seconds"]) if h["idle"] else "busy" if h["reasons"] else "-")
        )
        print(
            f"{h['name']:<14} {price:>8} {h['today']:>10.2f} {h['month']:>10.2f} {h['accrued']:>10.2f}  {idle}"
        )
    for t in spend.by_currency or (Spend(spend.budget_currency),):
        print(
            f"{'total ' + t.currency:<14} {t.burn_per_hour:>8.2f} {t.today:>10.2f} {t.month:>10.2f} {t.accrued:>10.2f}"
        )


def code_cell(r: dict[str, Any]) -> str:
    """What code ran, short: the synced tree's hash (run --sync), then the git commit, ``*`` when dirty."""
    code = r.get("code") if isinstance(r.get("code"), dict) else {}
    git = code.get("git") or r.get("git")
    out = [str(code["tree_sha256"])[:8]] if code.get("tree_sha256") else []
    if isinstance(git, dict) and git.get("commit"):
        out.append(str(git["commit"])[:7] + ("*" if git.get("dirty") else ""))
    return " ".join(out) or "-"


def _cost_cell(r: dict[str, Any]) -> str:
    """The run's cost, what of it was paid while its GPUs idled or were throttled, and while they ran over a PCIe
    link with lanes missing (``11.40 (3.10 wasted, 2.00 on a narrow PCIe link)``)."""
    if r.get("cost") is None:
        return "-"
    parts = [f"{amount:.2f} {what}" for what, key in (("wasted", "cost_idle_or_throttled"),
                                                      ("on a narrow PCIe link", "cost_narrow_link"))
             if isinstance(amount := r.get(key), float) and amount >= 0.005]
    return f"{r['cost']:.2f}" + (f" ({', '.join(parts)})" if parts else "")


def _state_cell(r: dict[str, Any]) -> str:
    """The run's state, and the driver's XIDs on its GPUs while it ran (``failed XID 79``)."""
    xids = sorted({str(f.get("xid") or f.get("kind")) for f in r.get("gpu_faults") or []})
    return str(r["state"]) + (f" XID {','.join(xids)}" if xids else "")


def print_history(records: list[dict[str, Any]]) -> None:
    """One line per run; its final metrics, most important first (``core.headline``), as many as fit."""
    rows = []
    for r in records:
        metrics = [f"{k}={r['metrics'][k]['last']:.4g}" for k in ranked(r["metrics"])]
        rows.append([
            r["host"], r["id"], _state_cell(r), fmt(r["exit_code"]),
            "-" if r["duration_s"] is None else duration(r["duration_s"]),
            _cost_cell(r), code_cell(r), r["name"], metrics or ["-"],
        ])
    header = ["HOST", "ID", "STATE", "EXIT", "TIME", "COST", "CODE", "NAME", "METRICS"]
    _table(header, rows, "lrlrrrll", caps={0: 16, 6: 17, 7: max(16, _columns() // 4 - 4)})

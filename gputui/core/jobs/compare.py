"""Runs side by side: what differed between 2-8 jobs (any hosts), as rows of plain text.

``compare_rows`` takes each run's history record (``records.run_record``) with its job record and its metric
series, and answers one :class:`Row` per fact: the command (the arguments that differ from the first run's),
env keys (never values: they may be secrets), git commit and dirty flag, the synced tree's hash, GPU model
and count, duration, cost, and each metric's final and best value.
"""

from __future__ import annotations

import asyncio
import difflib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gputui.core import safetext
from gputui.core.config.file import Config
from gputui.core.durations import duration
from gputui.core.errors import ExitStatus, GputuiError
from gputui.core.session.gather import HOST_ERRORS, Fleetish
from gputui.core.session.model import Job
from gputui.core.session.series import JobSeries
from gputui.core.transport.link import AgentError

MIN_RUNS, MAX_RUNS = 2, 8
MAX_METRIC_ROWS = 24
CELL = 60  # characters of one cell at most


@dataclass(frozen=True)
class Run:
    """One run to compare: its history record, its job's raw record and its series (None: not loaded)."""

    record: dict[str, Any]
    job: dict[str, Any]
    series: JobSeries | None = None

    @property
    def label(self) -> str:
        return f"{self.record.get('host')}:{self.record.get('id')}"


@dataclass(frozen=True)
class Row:
    field: str
    cells: tuple[str, ...]  # one per run, plain text

    @property
    def differs(self) -> bool:
        return len(set(self.cells)) > 1

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "values": list(self.cells), "differs": self.differs}


def _cell(text: object) -> str:
    return safetext.clean(text, limit=CELL)


def _num(v: Any, fmt: str = ".4g") -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, fmt)


def argv_diffs(argvs: Sequence[Sequence[str]]) -> list[str]:
    """Each command's words that are not in the first one's, in place ("=" where it is the same command)."""
    base = list(argvs[0]) if argvs else []
    out = []
    for argv in argvs:
        if list(argv) == base:
            out.append("=")
            continue
        m = difflib.SequenceMatcher(a=base, b=list(argv), autojunk=False)
        changed = [shlex.join(argv[j1:j2]) or "(-" + shlex.join(base[i1:i2]) + ")"
                   for tag, i1, i2, j1, j2 in m.get_opcodes() if tag != "equal"]
        out.append(" ".join(changed))
    return out


def _git(r: Run) -> str:
    git = r.record.get("git") or ((r.record.get("code") or {}).get("git")) or {}
    commit = git.get("commit") if isinstance(git, dict) else None
    if not isinstance(commit, str):
        return "-"
    return commit[:10] + (" dirty" if git.get("dirty") else "")


def _tree(r: Run) -> str:
    code = r.record.get("code")
    sha = code.get("tree_sha256") if isinstance(code, dict) else None
    return sha[:12] if isinstance(sha, str) else "-"


def _gpus(r: Run) -> str:
    gpus = r.record.get("gpus") or {}
    models = gpus.get("models") or []
    count = len(gpus.get("indices") or [])
    return f"{count} x {', '.join(map(str, models))}" if models else f"{count} GPU" if count else "-"


def _image(r: Run) -> str:
    image = r.record.get("image")
    if not isinstance(image, dict):
        return "- (bare)"
    image_id = image.get("id")
    short = image_id.split(":")[-1][:12] if isinstance(image_id, str) else "id unknown"
    return f"{image.get('image')} ({short})"


def _env_keys(r: Run) -> str:
    keys = r.job.get("env_keys")
    return " ".join(sorted(str(k) for k in keys)) if isinstance(keys, list) and keys else "-"


def _metric_values(r: Run) -> dict[str, tuple[float, float]]:
    """name -> (final, best), from the series where loaded, else from the record's parsed metrics."""
    if r.series is not None and r.series.series:
        return {s.name: (s.last, s.best) for s in r.series.series}
    out = {}
    for name, m in (r.record.get("metrics") or {}).items():
        if (
            isinstance(m, dict)
            and isinstance(m.get("last"), (int, float))
            and isinstance(m.get("best"), (int, float))
        ):
            out[str(name)] = (float(m["last"]), float(m["best"]))
    return out


def compare_rows(runs: Sequence[Run]) -> list[Row]:
    """The comparison table: one row per fact, one cell per run (plain text)."""

    def row(name: str, cells: Sequence[str]) -> Row:
        return Row(name, tuple(_cell(c) for c in cells))

    recs = [r.record for r in runs]
    argvs = [[str(a) for a in (rec.get("command") or [])] for rec in recs]
    rows = [
        row("name", [str(rec.get("name") or "-") for rec in recs]),
        row("state", [f"{rec.get('state')} ({_num(rec.get('exit_code'), 'd')})" for rec in recs]),
        row("command", [shlex.join(argvs[0])] + argv_diffs(argvs)[1:]),
        row("env keys", [_env_keys(r) for r in runs]),
        *([row("image", [_image(r) for r in runs])] if any(r.record.get("image") for r in runs) else []),
        row("git", [_git(r) for r in runs]),
        row("tree", [_tree(r) for r in runs]),
        row("gpus", [_gpus(r) for r in runs]),
        row(
            "duration",
            ["-" if rec.get("duration_s") is None else duration(rec["duration_s"]) for rec in recs],
        ),
        row("cost", [_num(rec.get("cost"), ".2f") for rec in recs]),
        row("wasted", [_num(rec.get("cost_idle_or_throttled"), ".2f") for rec in recs]),
        *[row(name, [_num(rec.get(key), spec) for rec in recs])  # only where a run has it (newer records)
          for name, key, spec in (("narrow PCIe", "cost_narrow_link", ".2f"), ("GPU kWh", "energy_kwh", ".3f"))
          if any(isinstance(rec.get(key), (int, float)) for rec in recs)],
        *([row("heat slowdown", ["-" if not isinstance(v := rec.get("thermal_slowdown_s"), (int, float)) else duration(v)
                                 for rec in recs])] if any(rec.get("thermal_slowdown_s") for rec in recs) else []),
        *([row("XIDs", [", ".join(f"GPU {f['gpu']}: {f['xid'] or f['kind']}" for f in rec["gpu_faults"]) or "-"
                        for rec in recs])] if any(rec.get("gpu_faults") for rec in recs) else []),
    ]
    values = [_metric_values(r) for r in runs]
    names = sorted({n for v in values for n in v})[:MAX_METRIC_ROWS]
    for name in names:
        rows.append(row(f"{name} final", [_num(v[name][0]) if name in v else "-" for v in values]))
        rows.append(row(f"{name} best", [_num(v[name][1]) if name in v else "-" for v in values]))
    return rows


def parse_ref(text: str) -> tuple[str, str]:
    """(host, job id) of ``HOST:JOB``; ValueError naming the form otherwise."""
    host, sep, job = text.rpartition(":")
    if not sep or not host or not job.isdigit():
        raise ValueError(f"{text!r}: expected HOST:JOB, e.g. gpu1:12")
    return host, job


async def load_series(
    fleet: Fleetish, keys: Sequence[tuple[str, str]], per_host: int = 4
) -> dict[tuple[str, str], JobSeries]:
    """The series of each (host, job id), ``per_host`` requests at a time per host; a host or job that fails
    is left out (its error is the caller's to report where it matters)."""
    gates: dict[str, asyncio.Semaphore] = {}

    async def one(host: str, job: str) -> JobSeries | None:
        gate = gates.setdefault(host, asyncio.Semaphore(per_host))
        async with gate:
            try:
                return await fleet.session(host).job_series(job)
            except HOST_ERRORS:
                return None

    got = await asyncio.gather(*(one(h, j) for h, j in keys))
    return {k: s for k, s in zip(keys, got, strict=True) if s is not None}


class RunNotFound(GputuiError):
    """A run to compare that its host does not have."""

    status = ExitStatus.NOT_FOUND


async def _get_job(fleet: Fleetish, host: str, job: str) -> Job:
    try:
        return await fleet.session(host).get_job(job)
    except AgentError as exc:
        if exc.code != "not_found":
            raise
        raise RunNotFound(f"no job {job} on {host}; gputui jobs {host} lists its jobs") from None


async def load_runs(
    fleet: Fleetish, config: Config, refs: Sequence[tuple[str, str]], connect: bool = True
) -> list[Run]:
    """Each ``(host, job)``'s history record, job record and series, in the order given. With ``connect``
    (the CLI) each host's session is started once first (the app's are kept connected); an unknown host, an
    unreachable one or a job it lacks raises (the CLI's exit status)."""
    from gputui.core.jobs.records import run_record
    from gputui.core.jobs.usecases import host_currency

    for host in dict.fromkeys(h for h, _ in refs) if connect else ():
        config.host(host)  # an unknown host: its error, before any connect
        await fleet.session(host).start()
    jobs = [await _get_job(fleet, h, j) for h, j in refs]
    series = await load_series(fleet, list(refs))
    return [Run(run_record(job, None, host_currency(config, job.host)), dict(job.record), series.get(ref))
            for ref, job in zip(refs, jobs, strict=True)]

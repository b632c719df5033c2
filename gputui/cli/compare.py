"""``compare HOST:JOB HOST:JOB ...``: what differed between 2-8 runs, as a table or JSON."""

from __future__ import annotations

import argparse
import shutil
from typing import TYPE_CHECKING

from ..core import jsonout
from ..core.errors import ExitStatus
from .common import CliError, open_fleet

if TYPE_CHECKING:  # the comparison loads the log parser: only this command needs it
    from ..core.jobs.compare import Row


def _refs(items: list[str]) -> list[tuple[str, str]]:
    from ..core.jobs.compare import MAX_RUNS, MIN_RUNS, parse_ref

    if not MIN_RUNS <= len(items) <= MAX_RUNS:
        raise CliError(
            f"compare: give {MIN_RUNS} to {MAX_RUNS} runs as HOST:JOB, not {len(items)}", ExitStatus.USAGE
        )
    try:
        refs = [parse_ref(item) for item in items]
    except ValueError as exc:
        raise CliError(f"compare: {exc}", ExitStatus.USAGE) from None
    if len(set(refs)) != len(refs):
        raise CliError("compare: a run is named twice", ExitStatus.USAGE)
    return refs


def format_table(labels: list[str], rows: list[Row], columns: int) -> list[str]:
    """The table's lines: a field column, one column per run; ``*`` marks the rows that differ."""
    field_w = max(len(r.field) for r in rows) + 2
    room = max(8, (columns - field_w) // max(1, len(labels)) - 1)
    widths = [min(room, max([len(lab)] + [len(r.cells[i]) for r in rows])) for i, lab in enumerate(labels)]

    def fit(text: str, w: int) -> str:
        return (text if len(text) <= w else text[: w - 1] + "…").ljust(w)

    lines = [" " * field_w + " ".join(fit(lab, w) for lab, w in zip(labels, widths, strict=True))]
    for r in rows:
        mark = "* " if r.differs else "  "
        lines.append(
            (mark + r.field).ljust(field_w)
            + " ".join(fit(c, w) for c, w in zip(r.cells, widths, strict=True))
        )
    return [line.rstrip() for line in lines]


async def cmd_compare(args: argparse.Namespace) -> int:
    from ..core.jobs.compare import compare_rows, load_runs

    refs = _refs(args.runs)
    async with open_fleet(args) as fleet:
        runs = await load_runs(fleet, fleet.config, refs)
    rows = compare_rows(runs)
    labels = [r.label for r in runs]
    if args.json:
        out = {"runs": labels, "rows": [r.to_json() for r in rows],
               "series": {r.label: r.series.to_json() if r.series else None for r in runs}}
        print(jsonout.dumps(out))
    else:
        print("\n".join(format_table(labels, rows, shutil.get_terminal_size((100, 24)).columns)))
    return ExitStatus.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("compare", help="what differed between 2-8 runs (any hosts): command, env keys, code, GPUs, "
                       "duration, cost, final and best metrics")
    c.add_argument("runs", nargs="+", metavar="HOST:JOB", help="the runs, e.g. gpu1:12 gpu2:3")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compare)

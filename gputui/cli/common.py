"""What every command shares: its error, number arguments, the host runners (open, run, close), questions,
progress and the exit status of a multi-host report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

from ..core import safetext
from ..core.config import file as cfg
from ..core.errors import ExitStatus, GputuiError
from ..core.hosts.fleet import Fleet
from ..core.session.host import HostSession
from ..core.transport.link import AgentError


class CliError(GputuiError):
    """A command's own refusal or failure, with the exit status it ends with."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.FAILED) -> None:
        super().__init__(message)
        self.status = status


def exit_status(exc: BaseException) -> ExitStatus:
    """The documented exit status (docs/commands.md) for an error (the one rule for single- and multi-host commands)."""
    if isinstance(exc, GputuiError):
        return exc.status
    return ExitStatus.UNREACHABLE  # OSError: no answer


def hosts_status(results: Mapping[str, object]) -> int:
    """Report each host that gave an error on stderr; 0 when none did, else the highest of their statuses.

    The hosts that answered are still shown: a multi-host command is a report, its status says what is missing.
    """
    status = ExitStatus.OK
    for name, res in results.items():
        if isinstance(res, Exception):
            print(f"gputui: {name}: {res}", file=sys.stderr)
            status = max(status, exit_status(res))
    return status


def bounded(
    low: float, high: float, low_ok: bool = True, unit: str = "", integer: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number within [low, high] (or (low, high]), else a usage error (exit 2)."""

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = math.nan
        if not (low <= value <= high and (low_ok or value > low)):
            kind = "a whole number" if integer else "a number"
            show = (lambda x: f"{int(x):,}") if integer else (lambda x: f"{x:g}")  # noqa: E731
            span = (
                f"from {show(low)} to {show(high)}"
                if low_ok
                else f"above {show(low)} and at most {show(high)}"
            )
            raise argparse.ArgumentTypeError(f"must be {kind} {span}{unit}, not {text!r}")
        return value

    return parse


def host_names(config: cfg.Config, host: str | None) -> list[str]:
    """``[host]`` (checked against the config), or every configured host."""
    if host:
        config.host(host)
        return [host]
    return list(config.hosts)


@contextlib.asynccontextmanager
async def open_fleet(args: argparse.Namespace) -> AsyncIterator[Fleet]:
    """The configured hosts (``--config``), closed (and the ledger saved) whatever the command does."""
    fleet = Fleet(cfg.load(args.config))
    try:
        yield fleet
    finally:
        await fleet.close()


async def with_session(
    args: argparse.Namespace, host: str, body: Callable[[HostSession], Awaitable[int]]
) -> int:
    """Connect to ``host``, run ``body`` with its session, close it; a job id the host lacks is exit 5."""
    session = Fleet(cfg.load(args.config)).session(host)
    await session.start()
    try:
        with job_errors(host):
            return await body(session)
    finally:
        await session.close()


@contextlib.contextmanager
def job_errors(host: str) -> Iterator[None]:
    """A job id ``host`` lacks becomes a CliError of exit status 5 naming the host and where its job ids are."""
    try:
        yield
    except AgentError as exc:
        if exc.code != "not_found":
            raise
        said = str(exc).replace(" on this host", f" on {host}", 1)
        hint = f"; gputui jobs {host} lists its jobs" if said.startswith("no job ") else ""
        raise CliError(said + hint, ExitStatus.NOT_FOUND) from None


def add_direct(parser: argparse.ArgumentParser) -> None:
    """``--direct`` on a command the session service answers (gputui/launch.py reads the flag itself)."""
    parser.add_argument("--direct", action="store_true",
                        help="connect from this command, not through the session service (also: GPUTUI_DIRECT=1)")


def ask(question: str) -> bool:
    """A yes/no question on the terminal; only y or yes is a yes."""
    return input(question).strip().lower() in ("y", "yes")


async def ask_async(question: str) -> bool:
    """``ask`` while the event loop runs on (the host's link stays served while the user thinks)."""
    return await asyncio.to_thread(ask, question)


@contextlib.contextmanager
def progress_printer() -> Iterator[Callable[[str, int, int], None] | None]:
    """A Rich progress bar per file on stderr when it is a terminal (rate, ETA; redrawn at most ten times a
    second; a finished file leaves one line); else None. File names are a host's data: escaped, never markup.
    Leaving the block ends the bar, error or not: the cursor is shown again and nothing is drawn after."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich import progress as rp
    from rich.console import Console

    raw = getattr(sys.stderr, "stream", sys.stderr)  # past the terminal guard: Rich's own sequences only
    console = Console(file=raw, force_terminal=True, no_color=bool(os.environ.get("NO_COLOR")) or None)
    bar = rp.Progress(
        rp.TextColumn("{task.description}", markup=False), rp.BarColumn(), rp.DownloadColumn(),
        rp.TransferSpeedColumn(), rp.TimeRemainingColumn(), console=console, auto_refresh=False, transient=True,
    )
    tasks: dict[str, rp.TaskID] = {}
    last = [0.0]

    def show(name: str, done: int, total: int) -> None:
        task = tasks.get(name)
        if task is None:
            if not tasks:
                bar.start()
            task = tasks[name] = bar.add_task(safetext.clean(name)[-40:], total=total or None)
        bar.update(task, completed=done, total=total or None)
        if done >= total:
            finished = bar.tasks[bar.task_ids.index(task)]
            rate = finished.finished_speed or finished.speed
            said = f" at {rate / 1e6:,.1f} MB/s" if rate else ""
            bar.remove_task(task)
            del tasks[name]
            console.print(f"{finished.description}  {total / 1e6:,.1f} MB{said}", markup=False, highlight=False)
            if not tasks:
                bar.stop()
            return
        now = time.monotonic()
        if now - last[0] >= 0.1:
            last[0] = now
            bar.refresh()

    try:
        yield show
    finally:
        if tasks:  # a transfer ended early (an error, Ctrl-C): its bar goes, the cursor comes back
            tasks.clear()
            bar.stop()


def job_exit(info: dict[str, Any]) -> int:
    """The exit status of an ended job (``logs -f`` ends with it)."""
    code = info.get("exit_code")
    if isinstance(code, int):
        return code
    print(f"gputui: job ended as {info.get('job_state', 'unknown')} with no exit status", file=sys.stderr)
    return ExitStatus.FAILED


"""The ``gputui`` command. Bare ``gputui`` on a terminal opens the app without loading the CLI and the
modules of its commands (the first frame waits for neither); anything else is :func:`gputui.cli.main`."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (typing.TYPE_CHECKING: importing typing costs the served command a third of its start)
if TYPE_CHECKING:
    from typing import Any, NoReturn


def main() -> None:
    """Open the app for bare ``gputui`` on a terminal; answer ``status``, ``jobs``, ``history``, ``logs``,
    ``kill``, ``release`` from the session service where one runs (gputui/service/); else run the CLI."""
    if not sys.argv[1:] and sys.stdin.isatty() and sys.stdout.isatty():
        from .appstart import run_app

        sys.exit(run_app(None))
    served = through_service(sys.argv[1:])
    if served is not None:
        sys.exit(served)
    from .cli import main as cli_main

    cli_main()


def read_line(argv: list[str], flags: dict[str, tuple[str, object]], names: tuple[str, ...], least: int | None = None,
              again: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A command's line (``argv``, its word first) as {key: value}, or None where it holds anything else (the
    CLI reads it, and says what is wrong with it).

    ``flags``: each flag's key, and the value it sets, or a function that reads the next word as its value (a
    ValueError: None). A key is given once, or any number of times where ``again`` names it (the last wins).
    ``names``: the keys of the words that are no flag (none starts with "-"), in order: all of them, or at
    least ``least``."""
    read: dict[str, Any] = {}
    words, given = iter(argv[1:]), 0
    for word in words:
        if word in flags:
            key, value = flags[word]
            if key in read and key not in again:
                return None
            if callable(value):  # a flag with a value: the next word
                try:
                    value = value(next(words))
                except (StopIteration, ValueError):
                    return None
            read[key] = value
        elif word and not word.startswith("-") and given < len(names):
            read[names[given]], given = word, given + 1
        else:
            return None  # --direct, --help, --config=PATH, --, an extra word: anything else
    return read if given >= (len(names) if least is None else least) else None


def tail_lines(text: str) -> int:
    """``--tail``'s N: a whole number up to 10,000,000 (else a ValueError)."""
    if not text.isdigit() or int(text) > 10_000_000:
        raise ValueError(text)
    return int(text)


CONFIG: dict[str, tuple[str, object]] = {"--config": ("config", str)}
YES: dict[str, tuple[str, object]] = {"-y": ("yes", True), "--yes": ("yes", True)}
LOGS = {"-f": ("follow", True), "--follow": ("follow", True), "--tail": ("tail", tail_lines), **CONFIG}
KILL = {"--grace": ("grace", float), **YES, **CONFIG}
RELEASE = {"--force": ("force", True), "--no-pull": ("pull", False), **YES, **CONFIG}
STATUS = {"--json": ("form", "json"), "--short": ("form", "short"), "--now": ("now", True), **CONFIG}
JOBS = {"--json": ("form", "json"), **CONFIG}  # and history


def through_service(argv: list[str]) -> int | None:
    """``gputui ARGV`` answered by the session service (its exit status), or None: another command line,
    ``--direct`` / ``GPUTUI_DIRECT=1``, or no service to answer (one is then started for the next command,
    and this one goes on directly)."""
    import os

    command = COMMANDS.get(argv[0]) if argv and not os.environ.get("GPUTUI_DIRECT") else None
    return command(argv) if command is not None else None


def status_through_service(argv: list[str]) -> int | None:
    """``gputui status [--json | --short] [--now | --watch [S]]``, ``gputui jobs [HOST] [--json]`` or ``gputui
    history [HOST] [--json]``, each with ``--config PATH`` anywhere."""
    every = None
    if argv[0] == "status" and "--watch" in argv:
        argv, every = without_watch(argv)
    if argv[0] == "status":
        read = read_line(argv, STATUS, (), again=("now",))
    else:
        read = read_line(argv, JOBS, ("host",), least=0)
    if read is None or (every is not None and read.get("now")):
        return None  # (--watch with --now: the CLI says they do not go together)
    from .service import client

    form, config = read.get("form", "text"), read.get("config")
    request = {"op": argv[0], "form": form, "host": read.get("host"), "now": read.get("now", False)}
    if every is None:
        return client.answer(config, request)
    if form == "json" and not sys.stdout.isatty():
        request["form"] = "json-line"  # one line a round
    return client.watch(config, request, every, lambda: go_on(
        ["status", "--watch", repr(every), *([f"--{form}"] if form != "text" else [])], config))


def without_watch(argv: list[str]) -> tuple[list[str], float | None]:
    """``status``'s line without its ``--watch [S]``, and S (2 where none is given); the line as is where
    ``--watch`` is given twice or S is not a number of seconds from 0.2 to 86,400 (the CLI says so)."""
    at = argv.index("--watch")
    value = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("-") else None
    try:
        every = 2.0 if value is None else float(value)
    except ValueError:
        return argv, None
    rest = argv[:at] + argv[at + (1 if value is None else 2):]
    return (rest, every) if 0.2 <= every <= 86400 and "--watch" not in rest else (argv, None)


def logs_through_service(argv: list[str]) -> int | None:
    """``gputui logs [-f] [--tail N] HOST JOB`` (with ``--config PATH`` anywhere). Where the service goes
    away mid-stream, the command goes on directly from the first byte it has not written."""
    read = read_line(argv, LOGS, ("host", "job"))
    if read is None:
        return None
    host, job, follow, config = read["host"], read["job"], read.get("follow", False), read.get("config")

    from .service import client

    request = {"op": "logs", "host": host, "job": job, "tail": read.get("tail"), "follow": follow}
    return client.logs(config, request, lambda offset: go_on(
        ["logs", host, job, *(["-f"] if follow else [])], config, offset=offset))


def kill_through_service(argv: list[str]) -> int | None:
    """``gputui kill HOST JOB [--grace S]`` with ``--yes`` or no terminal to ask on (to confirm on the terminal:
    None). Where the service goes away once asked, the command goes on directly from what the host says of the
    job."""
    read = read_line(argv, KILL, ("host", "job"), again=("yes", "grace", "config"))
    if read is None or not (read.get("yes") or not sys.stdin.isatty()):
        return None
    host, job, grace, config = read["host"], read["job"], read.get("grace", 10.0), read.get("config")
    if not 0 <= grace <= 3600:  # (the agent's MAX_KILL_GRACE_S)
        return None
    from .service import client

    return client.act(config, {"op": "kill", "host": host, "job": job, "grace": grace}, lambda asked_at: go_on(
        ["kill", host, job, "--yes", "--grace", repr(grace)], config, after_service=asked_at))


def release_through_service(argv: list[str]) -> int | None:
    """``gputui release HOST --yes [--force] [--no-pull]`` (to confirm on the terminal, or one that pulls
    artifacts: None). Where the service goes away once asked, the command says what the ledger shows of it and
    never asks again."""
    read = read_line(argv, RELEASE, ("host",), again=("yes", "force", "pull"))
    if read is None or not read.get("yes"):
        return None
    host, config = read["host"], read.get("config")
    from .service import client

    request = {"op": "release", "host": host, "force": read.get("force", False), "pull": read.get("pull")}
    return client.act(config, request, lambda asked_at: go_on(
        ["release", host, "--yes"], config, after_service=asked_at))


def go_on(argv: list[str], config: str | None, **preset: float) -> NoReturn:
    """The full CLI, running ``argv`` (with ``--config``) directly where the service left off (``preset``)."""
    from .cli import main as cli_main

    cli_main([*argv, *(["--config", config] if config else [])], **preset)


COMMANDS = {"status": status_through_service, "jobs": status_through_service, "history": status_through_service,
            "logs": logs_through_service, "kill": kill_through_service, "release": release_through_service}

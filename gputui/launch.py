"""The ``gputui`` command. Bare ``gputui`` on a terminal opens the app without loading the CLI and the
modules of its commands (the first frame waits for neither); anything else is :func:`gputui.cli.main`."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (typing.TYPE_CHECKING: importing typing costs the served command a third of its start)
if TYPE_CHECKING:
    from typing import NoReturn


def main() -> None:
    """Open the app for bare ``gputui`` on a terminal; answer ``status`` from the session service where one
    runs (gputui/service/); else run the CLI."""
    if not sys.argv[1:] and sys.stdin.isatty() and sys.stdout.isatty():
        from .appstart import run_app

        sys.exit(run_app(None))
    served = status_through_service(sys.argv[1:])
    if served is not None:
        sys.exit(served)
    from .cli import main as cli_main

    cli_main()


def logs_through_service(argv: list[str]) -> int | None:
    """``gputui logs [-f] [--tail N] HOST JOB`` (with ``--config PATH`` anywhere) answered by the session
    service, or None (another command line: the CLI reads it). Where the service goes away mid-stream, the
    command goes on directly from the first byte it has not written."""
    follow, tail, config, words = False, None, None, iter(argv[1:])
    names: list[str] = []
    for word in words:
        if word in ("-f", "--follow") and not follow:
            follow = True
        elif word == "--tail" and tail is None:
            value = next(words, "")
            if not value.isdigit() or int(value) > 10_000_000:
                return None  # the CLI says what is wrong with it
            tail = int(value)
        elif word == "--config" and config is None:
            config = next(words, None)
            if config is None:
                return None
        elif word and not word.startswith("-") and len(names) < 2:
            names.append(word)
        else:
            return None  # --direct, --rank, --help, anything else
    if len(names) != 2:
        return None
    host, job = names

    def go_on(offset: int) -> NoReturn:
        from .cli import main as cli_main

        cli_main(["logs", host, job, *(["-f"] if follow else []), *(["--config", config] if config else [])],
                 offset=offset)

    from .service import client

    return client.logs(config, {"op": "logs", "host": host, "job": job, "tail": tail, "follow": follow}, go_on)


def kill_through_service(argv: list[str]) -> int | None:
    """``gputui kill HOST JOB [--grace S]`` with ``--yes`` (or no terminal to ask on) answered by the session
    service, or None: a kill to confirm on the terminal, or another command line (the CLI reads it). Where the
    service goes away once asked, the command goes on directly from what the host says of the job."""
    yes, grace, config, words = not sys.stdin.isatty(), 10.0, None, iter(argv[1:])
    names: list[str] = []
    for word in words:
        if word in ("-y", "--yes"):
            yes = True
        elif word in ("--grace", "--config"):
            value = next(words, None)
            if value is None:
                return None
            if word == "--config":
                config = value
                continue
            try:
                grace = float(value)
            except ValueError:
                return None  # the CLI says what is wrong with it
        elif word and not word.startswith("-") and len(names) < 2:
            names.append(word)
        else:
            return None  # --direct, --help, anything else
    if len(names) != 2 or not yes or not 0 <= grace <= 3600:  # (the agent's MAX_KILL_GRACE_S)
        return None
    host, job = names

    def go_on(asked_at: float) -> NoReturn:
        from .cli import main as cli_main

        cli_main(["kill", host, job, "--yes", "--grace", repr(grace), *(["--config", config] if config else [])],
                 after_service=asked_at)

    from .service import client

    return client.act(config, {"op": "kill", "host": host, "job": job, "grace": grace}, go_on)


def release_through_service(argv: list[str]) -> int | None:
    """``gputui release HOST --yes [--force] [--no-pull]`` answered by the session service, or None: a release
    to confirm on the terminal, one that pulls artifacts, or another command line (the CLI reads it). Where the
    service goes away once asked, the command says what the ledger shows of it and never asks again."""
    yes, force, pull, config, words = False, False, None, None, iter(argv[1:])
    names: list[str] = []
    for word in words:
        if word in ("-y", "--yes"):
            yes = True
        elif word == "--force":
            force = True
        elif word == "--no-pull":
            pull = False
        elif word == "--config" and config is None:
            config = next(words, None)
            if config is None:
                return None
        elif word and not word.startswith("-") and not names:
            names.append(word)
        else:
            return None  # --pull, --check, --direct, --help, anything else
    if len(names) != 1 or not yes:
        return None
    host = names[0]

    def go_on(asked_at: float) -> NoReturn:
        from .cli import main as cli_main

        cli_main(["release", host, "--yes", *(["--config", config] if config else [])], after_service=asked_at)

    from .service import client

    return client.act(config, {"op": "release", "host": host, "force": force, "pull": pull}, go_on)


def status_through_service(argv: list[str]) -> int | None:
    """``gputui status [--json | --short]``, ``gputui jobs [HOST] [--json]`` or ``gputui history [HOST] [--json]``
    (each with ``--config PATH`` anywhere; ``logs``, ``kill``, ``release``: above) answered by the session
    service (its exit status), or None: another command line, ``--direct`` / ``GPUTUI_DIRECT=1``, or no
    service to answer (one is then started for the next command, and this one goes on directly)."""
    import os

    if os.environ.get("GPUTUI_DIRECT") or not argv or argv[0] not in ("status", "jobs", "history", *ACTIONS):
        return None
    if argv[0] in ACTIONS:
        return ACTIONS[argv[0]](argv)
    form, config, host, now, words = "text", None, None, False, iter(argv[1:])
    flags = ("--json", "--short") if argv[0] == "status" else ("--json",)
    for word in words:
        if word in flags and form == "text":
            form = word[2:]
        elif word == "--now" and argv[0] == "status":
            now = True
        elif word == "--config" and config is None:
            config = next(words, None)
            if config is None:
                return None
        elif argv[0] != "status" and host is None and word and not word.startswith("-"):
            host = word
        else:
            return None  # --direct, --help, --series, anything else: the CLI reads it
    from .service import client

    return client.answer(config, {"op": argv[0], "form": form, "host": host, "now": now})


ACTIONS = {"logs": logs_through_service, "kill": kill_through_service, "release": release_through_service}

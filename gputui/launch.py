"""The ``gputui`` command. Bare ``gputui`` on a terminal opens the app without loading the CLI and the
modules of its commands (the first frame waits for neither); anything else is :func:`gputui.cli.main`."""

from __future__ import annotations

import sys


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


def status_through_service(argv: list[str]) -> int | None:
    """``gputui status [--json | --short]``, ``gputui jobs [HOST] [--json]`` or ``gputui history [HOST]
    [--json]`` (each with ``--config PATH`` anywhere) answered by the session service (its exit status), or None: another command line, ``--direct`` /
    ``GPUTUI_DIRECT=1``, or no service to answer (one is then started for the next command, and this one goes
    on directly)."""
    import os

    if os.environ.get("GPUTUI_DIRECT") or not argv or argv[0] not in ("status", "jobs", "history"):
        return None
    form, config, host, words = "text", None, None, iter(argv[1:])
    flags = ("--json", "--short") if argv[0] == "status" else ("--json",)
    for word in words:
        if word in flags and form == "text":
            form = word[2:]
        elif word == "--config" and config is None:
            config = next(words, None)
            if config is None:
                return None
        elif argv[0] != "status" and host is None and word and not word.startswith("-"):
            host = word
        else:
            return None  # --direct, --help, --series, anything else: the CLI reads it
    from .service import client

    return client.answer(config, {"op": argv[0], "form": form, "host": host})

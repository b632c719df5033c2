"""The ``gputui`` command. Bare ``gputui`` on a terminal opens the app without loading the CLI and the
modules of its commands (the first frame waits for neither); anything else is :func:`gputui.cli.main`."""

from __future__ import annotations

import sys


def main() -> None:
    """Open the app for bare ``gputui`` on a terminal; else run the CLI."""
    if not sys.argv[1:] and sys.stdin.isatty() and sys.stdout.isatty():
        from .appstart import run_app

        sys.exit(run_app(None))
    from .cli import main as cli_main

    cli_main()

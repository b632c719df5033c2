"""The ``gputui`` command. Bare ``gputui`` on a terminal opens the app without loading the CLI and the
modules of its commands (the first frame waits for neither); anything else is :func:`gputui.cli.main`."""

from __future__ import annotations

import gc
import sys

EXIT_USAGE = 2  # a broken config: the CLI's usage error (gputui.cli.EXIT_USAGE)


def main() -> None:
    """Open the app for bare ``gputui`` on a terminal; else run the CLI."""
    if not sys.argv[1:] and sys.stdin.isatty() and sys.stdout.isatty():
        sys.exit(run_app(None))
    from .cli import main as cli_main

    cli_main()


def run_app(config_path: str | None) -> int:
    """The Textual app over the config at ``config_path`` (None: the default one) until the user quits.

    Garbage collection pauses until the first frame is out, when the app's ``on_ready`` freezes what the
    start-up built and resumes it: collections during the start-up scan the modules and widgets it builds,
    which live as long as the app, and only delay the first frame."""
    gc.disable()
    from .core import config as cfg

    try:
        config = cfg.load(config_path)
    except cfg.ConfigError as exc:
        gc.enable()
        print(f"gputui: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from .ui import run

    return run(config)

"""The Textual app. Only ``gputui`` with no subcommand imports this package (the core never does)."""

from __future__ import annotations

from typing import Any

from gputui.core.config.file import Config


def run(config: Config, seeds: list[Any] | None = None) -> int:
    """Run the app over ``config``'s hosts until the user quits; returns the exit status. ``seeds``: the hosts
    as a running session service has them (``gputui status --json``'s), shown until the app's own links are up."""
    from .app import GpuTuiApp

    GpuTuiApp(config, seeds=seeds or ()).run()
    return 0

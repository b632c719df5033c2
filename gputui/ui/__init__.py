"""The Textual app. Only ``gputui`` with no subcommand imports this package (the core never does)."""

from __future__ import annotations

from gputui.core.config.file import Config


def run(config: Config) -> int:
    """Run the app over ``config``'s hosts until the user quits; returns the exit status."""
    from .app import GpuTuiApp

    GpuTuiApp(config).run()
    return 0

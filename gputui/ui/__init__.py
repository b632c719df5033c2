"""The Textual app. Only ``gputui`` with no subcommand imports this package (the core never does)."""

from __future__ import annotations

from gputui.core.config import Config


def run(config: Config) -> int:
    """Run the app over ``config``'s hosts until the user quits; returns the exit status."""
    import gc

    from .app import GpuTuiApp

    gc.freeze()  # the modules just imported live as long as the app: later collections need not scan them
    GpuTuiApp(config).run()
    return 0

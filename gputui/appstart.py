"""Starting the app, for bare ``gputui`` (gputui.launch) and for the CLI without a command (gputui.cli)."""

from __future__ import annotations

import gc
import sys

from .core.errors import ExitStatus


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
        return ExitStatus.USAGE
    from .ui import run

    return run(config)

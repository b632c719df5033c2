"""The gputui command line: the same core as the TUI, without the UI.

One module per family of commands, each command's parser beside its handler (``register``): ``jobs`` (run,
queue, jobs, history, logs, kill), ``fleet`` (status, cost, doctor, trust), ``release`` (release, autostop,
notify), ``files`` (sync, pull, forward), ``hosts`` (add, remove, hosts), ``compare``; ``common`` holds what they share,
``main`` parses and runs one.
"""

from ..core.deploy import earlystart  # noqa: F401 - first: the local agent starts while the imports below load

# isort: split
from .main import build_parser, main

__all__ = ["build_parser", "main"]

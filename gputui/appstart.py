"""Starting the app, for bare ``gputui`` (gputui.launch) and for the CLI without a command (gputui.cli)."""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

from .core.errors import ExitStatus

if TYPE_CHECKING:
    from .core.config.file import HostConfig


def run_app(config_path: str | None) -> int:
    """The Textual app over the config at ``config_path`` (None: the default one) until the user quits.

    Garbage collection pauses until the first frame is out, when the app's ``on_ready`` freezes what the
    start-up built and resumes it: collections during the start-up scan the modules and widgets it builds,
    which live as long as the app, and only delay the first frame. The local hosts' agents start before the
    app's modules load (:func:`start_local_agents`)."""
    gc.disable()
    from .core.config import file as cfg

    try:
        config = cfg.load(config_path)
    except cfg.ConfigError as exc:
        gc.enable()
        print(f"gputui: {exc}", file=sys.stderr)
        return ExitStatus.USAGE
    seeds = []
    if any(h.transport != "local" for h in config.hosts.values()):  # (local hosts are up in milliseconds anyway)
        from .service import client

        seeds = client.seed(config_path)
    up = {h.get("name") for h in seeds if isinstance(h, dict) and h.get("state") == "connected"}
    start_local_agents([h for h in config.hosts.values() if h.name not in up])  # a seeded one's: after the first frame
    from .ui import run

    return run(config, seeds)


def start_local_agents(hosts: list[HostConfig]) -> None:
    """Start the agent of each local host of ``hosts`` now, in a thread, for the app's fleet to take when its
    links start: the agent's own start-up (python, imports, host facts: ~120 ms) and the check of its build
    run beside the app's imports and first frame instead of after them. A host the session service's seed
    shows up needs no such haste: the first frame has it, and its agent's start would only share the CPU with
    that frame. Whatever goes wrong here, the fleet starts its agents itself."""
    from .core.deploy import agentproc

    agentproc.start_local_soon(hosts)

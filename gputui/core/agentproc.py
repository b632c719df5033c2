"""How the local agent process starts: its argv, and an early start while the CLI is still importing.

Light on purpose (no asyncio): ``gputui/cli.py`` calls ``start_early`` before its heavy imports, so a command
that talks to the local host finds its agent already past its own start-up (python, imports, host facts),
which otherwise comes after the CLI's. ``LocalTransport`` takes such a process by its argv (``take``); one
nobody takes reads EOF when the CLI exits, and exits too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import HostConfig

#: The agent is stdlib-only (pynvml comes in its build): ``-S`` skips site-packages and every ``.pth`` file in
#: them, which can cost more than the rest of the interpreter's start.
AGENT_PYTHON_FLAGS = ["-S"]
#: Commands that connect to the configured hosts (all of them, or the ones named) as they start.
EARLY_COMMANDS = frozenset({"status", "jobs", "history", "cost"})
IDLE_TIMEOUT_S = 30.0
NVIDIA_SMI = "nvidia-smi"

_started: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}


def serve_argv(
    python: str,
    cache_dir: Path,
    state_dir: str,
    idle_timeout: float = IDLE_TIMEOUT_S,
    nvidia_smi: str = NVIDIA_SMI,
) -> list[str]:
    """The local agent's ``serve`` command line (its build unpacked in ``cache_dir`` first if need be)."""
    return build_argv(python, cache_dir) + [
        "serve", "--state-dir", state_dir, "--idle-timeout", str(idle_timeout), "--nvidia-smi", nvidia_smi,
    ]  # fmt: skip


def build_argv(python: str, cache_dir: Path) -> list[str]:
    """``python`` running this client's agent build (unpacked in ``cache_dir`` when missing or damaged)."""
    from .bundle import ensure_local_build

    return [python, *AGENT_PYTHON_FLAGS, str(ensure_local_build(cache_dir))]


def private_env() -> dict[str, str]:
    """The environment for an agent started with umask 077 (its state, logs and ``__pycache__`` private):
    ``GPUTUI_USER_UMASK`` keeps this process's umask for the jobs it starts."""
    mask = os.umask(0o077)
    os.umask(mask)
    return {**os.environ, "GPUTUI_USER_UMASK": f"{mask:03o}"}


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # Ctrl-C in the client's terminal is the client's, not the agent's
        umask=0o077, env=private_env(),
    )  # fmt: skip


def take(argv: list[str]) -> subprocess.Popen[bytes] | None:
    """The agent started early with exactly ``argv``, still running, if any (each is taken once)."""
    proc = _started.pop(tuple(argv), None)
    return proc if proc is not None and proc.poll() is None else None


def start_early(args: list[str]) -> None:
    """For a command in EARLY_COMMANDS (``args`` as after the program name): start the agent of each local
    host it will use. Never raises: whatever goes wrong here, the command starts its agents itself."""
    config_path, words, it = None, [], iter(args)
    for arg in it:
        if arg == "--config":
            config_path = next(it, None)
        elif arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        elif not arg.startswith("-"):
            words.append(arg)
    if not words or words[0] not in EARLY_COMMANDS:
        return
    try:
        from . import config as cfg

        config = cfg.load(config_path)
        named = [config.hosts[w] for w in words[1:] if w in config.hosts]
        start_local(named or config.hosts.values())
    except Exception:  # noqa: BLE001 - an early start is only a head start
        return


def start_local(hosts: Iterable[HostConfig]) -> None:
    """Start the agent of each local host among ``hosts`` now, for its LocalTransport to take (``take``).
    Raises what starting one raises (the callers' early starts ignore it: the transport starts its own)."""
    from . import paths

    for host in hosts:
        if host.transport == "local":
            argv = serve_argv(host.python or sys.executable, paths.cache_dir(), os.path.expanduser(host.remote_dir))
            if tuple(argv) not in _started:
                _started[tuple(argv)] = spawn(argv)

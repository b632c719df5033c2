"""How the local agent process starts: its argv, and an early start while the CLI is still importing.

Light on purpose (no asyncio): ``gputui/cli.py`` calls ``start_early`` before its heavy imports, so a command
that talks to the local host finds its agent already past its own start-up (python, imports, host facts),
which otherwise comes after the CLI's. ``LocalTransport`` takes such a process by its argv (``take``); one
nobody takes reads EOF when the CLI exits, and exits too.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gputui.core.config.file import HostConfig

#: The agent is stdlib-only (pynvml comes in its build): ``-S`` skips site-packages and every ``.pth`` file in
#: them, which can cost more than the rest of the interpreter's start.
AGENT_PYTHON_FLAGS = ["-S"]
#: Commands that connect to the configured hosts (all of them, or the ones named) as they start.
EARLY_COMMANDS = frozenset({"status", "jobs", "history", "cost"})
IDLE_TIMEOUT_S = 30.0
NVIDIA_SMI = "nvidia-smi"

#: How long taking an agent waits for an early start still under way in its thread (it takes milliseconds).
START_WAIT_S = 10.0

_started: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}
_checked: dict[Path, Path] = {}  # cache dir -> the build an early start just checked there (until a take)
_starting: list[threading.Thread] = []  # early starts under way (start_local_soon)


def serve_argv(
    python: str,
    cache_dir: Path,
    state_dir: str,
    idle_timeout: float = IDLE_TIMEOUT_S,
    nvidia_smi: str = NVIDIA_SMI,
) -> list[str]:
    """The local agent's ``serve`` command line (its build unpacked in ``cache_dir`` first if need be)."""
    return build_argv(python, cache_dir) + _serve_args(state_dir, idle_timeout, nvidia_smi)


def _serve_args(state_dir: str, idle_timeout: float = IDLE_TIMEOUT_S, nvidia_smi: str = NVIDIA_SMI) -> list[str]:
    return ["serve", "--state-dir", state_dir, "--idle-timeout", str(idle_timeout), "--nvidia-smi", nvidia_smi]


def build_argv(python: str, cache_dir: Path) -> list[str]:
    """``python`` running this client's agent build (unpacked in ``cache_dir`` when missing or damaged; the
    build an early start checked is not checked again before its agent is taken)."""
    _settle()
    build = _checked.get(cache_dir)
    if build is None:
        from gputui.core.deploy.bundle import ensure_local_build

        build = ensure_local_build(cache_dir)
    return [python, *AGENT_PYTHON_FLAGS, str(build)]


def private_env() -> dict[str, str]:
    """The environment for an agent started with umask 077 (its state, logs and ``__pycache__`` private):
    ``GPUTUI_USER_UMASK`` keeps this process's umask for the jobs it starts."""
    mask = os.umask(0o077)
    os.umask(mask)
    return {**os.environ, "GPUTUI_USER_UMASK": f"{mask:03o}"}


def spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # Ctrl-C in the client's terminal is the client's, not the agent's
        umask=0o077, env=env or private_env(),
    )


def take(argv: list[str]) -> subprocess.Popen[bytes] | None:
    """The agent started early with exactly ``argv``, still running, if any (each is taken once)."""
    _settle()
    _checked.clear()  # later starts check the build again
    proc = _started.pop(tuple(argv), None)
    return proc if proc is not None and proc.poll() is None else None


def _settle() -> None:
    """Wait (bounded) for the early starts under way in their threads."""
    while _starting:
        thread = _starting.pop()
        if thread is not threading.current_thread():
            thread.join(START_WAIT_S)


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
        from gputui.core.config import file as cfg

        config = cfg.load(config_path)
        named = [config.hosts[w] for w in words[1:] if w in config.hosts]
        start_local(named or config.hosts.values())
    except Exception:  # noqa: BLE001 - an early start is only a head start
        return


def start_local(hosts: Iterable[HostConfig]) -> None:
    """Start the agent of each local host among ``hosts`` now, for its LocalTransport to take (``take``).
    Raises what starting one raises (the callers' early starts ignore it: the transport starts its own)."""
    for python, cache_dir, state_dir in _local_starts(hosts):
        _start(python, cache_dir, state_dir, private_env())


def start_local_soon(hosts: Iterable[HostConfig]) -> None:
    """``start_local`` in a thread, beside what this process does meanwhile (the app's imports): the check of
    the build and the spawn run there (what they depend on, paths and umask, is read here); the first ``take``
    or ``build_argv`` waits for it. Never raises: whatever goes wrong, the transport starts its own."""
    starts, env = _local_starts(hosts), private_env()

    def run() -> None:
        with contextlib.suppress(Exception):
            for python, cache_dir, state_dir in starts:
                _start(python, cache_dir, state_dir, env)

    if starts:
        thread = threading.Thread(target=run, name="gputui-agent-start", daemon=True)
        _starting.append(thread)
        thread.start()


def _local_starts(hosts: Iterable[HostConfig]) -> list[tuple[str, Path, str]]:
    """(python, cache dir, state dir) of each local host's agent."""
    from gputui.core import paths

    return [(h.python or sys.executable, paths.cache_dir(), os.path.expanduser(h.remote_dir))
            for h in hosts if h.transport == "local"]


def _start(python: str, cache_dir: Path, state_dir: str, env: dict[str, str]) -> None:
    """Check the build in ``cache_dir`` (kept for the take that follows: ``_checked``) and start its agent."""
    from gputui.core.deploy.bundle import ensure_local_build

    build = _checked[cache_dir] = ensure_local_build(cache_dir)
    argv = [python, *AGENT_PYTHON_FLAGS, str(build), *_serve_args(state_dir)]
    if tuple(argv) not in _started:
        _started[tuple(argv)] = spawn(argv, env)

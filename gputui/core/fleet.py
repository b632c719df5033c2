"""Fleet: the HostSessions of every configured host."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from . import model as M
from .config import Config, HostConfig
from .session import HostSession
from .transport import LocalTransport, Transport


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gputui"


def make_transport(host: HostConfig, config: Config) -> Transport:
    if host.transport == "local":
        return LocalTransport(os.path.expanduser(host.remote_dir), cache_dir(), python=host.python)
    from .ssh_transport import SSHTransport  # asyncssh is only imported when an SSH host is used

    return SSHTransport(host, ssh_config=config.ssh_config)


class Fleet:
    """All hosts of a config, each with its own session."""

    def __init__(
        self,
        config: Config,
        on_change: Callable[[M.HostSnapshot], None] | None = None,
        metrics_interval: float | None = None,
        transport_factory: Callable[[HostConfig, Config], Transport] = make_transport,
    ) -> None:
        self.config = config
        self.sessions: dict[str, HostSession] = {
            name: HostSession(name, transport_factory(host, config), on_change, metrics_interval)
            for name, host in config.hosts.items()
        }

    def session(self, name: str) -> HostSession:
        self.config.host(name)  # raises a ConfigError naming the known hosts
        return self.sessions[name]

    def snapshots(self) -> list[M.HostSnapshot]:
        return [s.snapshot for s in self.sessions.values()]

    def run_in_background(self) -> None:
        for session in self.sessions.values():
            session.run_in_background()

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)

"""Fleet: the HostSessions of every configured host, with money and autostop wired in."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import replace

from . import autostop, paths
from . import model as M
from .config import Config, HostConfig
from .cost import Ledger, cost_info
from .session import HostSession
from .transport import LocalTransport, Transport


def say(message: str) -> None:
    print(f"gputui: {message}", file=sys.stderr)


def make_transport(host: HostConfig, config: Config) -> Transport:
    if host.transport == "local":
        return LocalTransport(os.path.expanduser(host.remote_dir), paths.cache_dir(), python=host.python)
    from .ssh_transport import SSHTransport  # asyncssh is only imported when an SSH host is used

    return SSHTransport(host, ssh_config=config.ssh_config)


class Fleet:
    """All hosts of a config, each with its own session; snapshots come out with their CostInfo."""

    def __init__(
        self,
        config: Config,
        on_change: Callable[[M.HostSnapshot], None] | None = None,
        metrics_interval: float | None = None,
        transport_factory: Callable[[HostConfig, Config], Transport] = make_transport,
        ledger: Ledger | None = None,
        warn: Callable[[str], None] = say,
    ) -> None:
        self.config = config
        self.ledger = ledger if ledger is not None else Ledger()
        if self.ledger.notice:
            warn(self.ledger.notice)  # once: the bad file is set aside
        self._on_change = on_change
        self._metrics_interval, self._transport_factory = metrics_interval, transport_factory
        self.sessions: dict[str, HostSession] = {
            name: self.new_session(name, host) for name, host in config.hosts.items()
        }

    def new_session(self, name: str, host: HostConfig) -> HostSession:
        """The session of one host of ``self.config``: its transport, idle rule and autostop arming."""
        return HostSession(
            name,
            self._transport_factory(host, self.config),
            self._changed,
            self._metrics_interval,
            sample_args={"idle_util_percent": host.idle_util_percent, "count_sessions": host.count_ssh_sessions},
            # every host, every connect: settings removed must disarm
            on_connect=functools.partial(autostop.arm, host=host, urls=autostop.api_urls(self.config)),
            scheduler=host.scheduler,
        )

    def _changed(self, snap: M.HostSnapshot) -> None:
        enriched = self.with_cost(snap)
        self.ledger.save()
        if self._on_change is not None:
            self._on_change(enriched)

    def with_cost(self, snap: M.HostSnapshot) -> M.HostSnapshot:
        host = self.config.hosts[snap.name]
        return replace(snap, cost=cost_info(snap, host, self.config, self.ledger))

    def session(self, name: str) -> HostSession:
        self.config.host(name)  # raises a ConfigError naming the known hosts
        return self.sessions[name]

    def snapshots(self) -> list[M.HostSnapshot]:
        return [self.with_cost(s.snapshot) for s in self.sessions.values()]

    def run_in_background(self) -> None:
        for session in self.sessions.values():
            session.run_in_background()

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)
        self.ledger.save(force=True)

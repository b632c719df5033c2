"""Fleet: the HostSessions of every configured host, with money and autostop wired in."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from gputui.core import paths
from gputui.core.config.file import Config, HostConfig
from gputui.core.money import autostop
from gputui.core.money.cost import Ledger, ProviderPrice, cost_info, provider_price
from gputui.core.session import model as M
from gputui.core.session.host import HostSession
from gputui.core.transport import instances
from gputui.core.transport.base import AgentChannel, HostError, LocalTransport, Transport
from gputui.core.transport.link import AgentError


def say(message: str) -> None:
    print(f"gputui: {message}", file=sys.stderr)


def make_transport(host: HostConfig, config: Config) -> Transport:
    if host.transport == "local":
        return LocalTransport(os.path.expanduser(host.remote_dir), paths.cache_dir(), python=host.python)
    from gputui.core.transport.ssh import SSHTransport  # asyncssh is only imported when an SSH host is used

    return SSHTransport(host, ssh_config=config.ssh_config)


SSH_STACK = "gputui.core.transport.ssh"  # with asyncssh and its crypto: ~120 ms to import
LOCAL_FIRST_S = 0.5  # the SSH stack's load waits at most this long for the local hosts' connect
LOOK_EVERY_S = 120.0  # a host that does not answer: its provider is asked at most this often
PRICE_EVERY_S = 600.0  # the provider's price of a host (where the config sets none) is asked again this often


class Unloadable(Transport):
    """The transport of an SSH host when the SSH stack failed to load: every connect says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def terminal_prefix(self) -> list[str]:
        raise HostError(self.reason, "config")

    async def open_agent(self) -> AgentChannel:
        raise HostError(self.reason, "config")


class Fleet:
    """All hosts of a config, each with its own session; snapshots come out with their CostInfo.

    With ``defer_ssh`` (the app), the sessions of SSH hosts are built when the fleet starts, once the SSH stack
    (``ssh_transport``: asyncssh and its crypto) has loaded in a worker thread, so that neither the app's first
    frame nor the local host waits for it; until then such a host's snapshot is the initial ``connecting`` one.
    """

    def __init__(
        self,
        config: Config,
        on_change: Callable[[M.HostSnapshot], None] | None = None,
        metrics_interval: float | None = None,
        transport_factory: Callable[[HostConfig, Config], Transport] = make_transport,
        ledger: Ledger | None = None,
        warn: Callable[[str], None] = say,
        defer_ssh: bool = False,
    ) -> None:
        self.config = config
        self.ledger = ledger if ledger is not None else Ledger()
        if self.ledger.notice:
            warn(self.ledger.notice)  # once: the bad file is set aside
        self._on_change = on_change
        self._metrics_interval, self._transport_factory = metrics_interval, transport_factory
        self.sessions: dict[str, HostSession] = {}
        self._deferred: dict[str, HostConfig] = {}  # SSH hosts whose session waits for the SSH stack
        self._loader: asyncio.Task[None] | None = None
        self._looker: asyncio.Task[None] | None = None
        self._closed = False
        self.looks: dict[str, M.InstanceLook] = {}  # hosts that do not answer: what their provider says
        self._looked: dict[str, float] = {}
        self.provider_prices: dict[str, ProviderPrice] = {}  # the provider's price where the config sets none
        self._priced: dict[str, float] = {}
        for name, host in config.hosts.items():
            if defer_ssh and host.transport != "local":
                self._deferred[name] = host
            else:
                self.sessions[name] = self.new_session(name, host)

    def new_session(self, name: str, host: HostConfig) -> HostSession:
        """The session of one host of ``self.config``: its transport, idle rule and autostop arming."""
        return HostSession(
            name,
            self._transport_factory(host, self.config),
            self._changed,
            self._metrics_interval,
            sample_args={"idle_util_percent": host.idle_util_percent, "count_sessions": host.count_ssh_sessions},
            on_connect=functools.partial(self._on_connect, host=host),
            scheduler=host.scheduler,
        )

    async def _on_connect(self, session: HostSession, host: HostConfig) -> None:
        """Every host, every connect: arm its autostop (settings removed must disarm) and ask its price."""
        await autostop.arm(session, host=host, urls=autostop.api_urls(self.config))
        await self.ask_price(session, host)

    async def ask_price(self, session: HostSession, host: HostConfig) -> None:
        """The provider's price now, where the config sets none and the host's agent names its RunPod / vast.ai
        instance (its own key reads it there); kept for ``with_cost``, asked again every ``PRICE_EVERY_S``."""
        if host.price_per_hour is not None or host.provider not in ("auto", "runpod", "vastai"):
            return
        if not session.snapshot.facts.get("instance"):
            return
        self._priced[host.name] = time.time()
        with contextlib.suppress(HostError, AgentError, OSError, asyncio.TimeoutError):
            found = await session.release_instance(provider=host.provider, api_urls=autostop.api_urls(self.config))
            price = provider_price(found)
            if price is not None:
                self.provider_prices[host.name] = price

    def _changed(self, snap: M.HostSnapshot) -> None:
        if snap.name not in self.config.hosts or snap.name not in self.sessions:
            return  # the last word of a host the config no longer has (``reconfigure``): dropped
        enriched = self.with_cost(snap)
        self.ledger.save()
        if self._on_change is not None:
            self._on_change(enriched)

    def with_cost(self, snap: M.HostSnapshot) -> M.HostSnapshot:
        host = self.config.hosts[snap.name]
        if snap.state == M.CONNECTED:
            self.looks.pop(snap.name, None)
        look = self.looks.get(snap.name)
        cost = cost_info(snap, host, self.config, self.ledger, self.provider_prices.get(snap.name))
        return replace(snap, cost=cost, instance=look)

    def _down(self, name: str) -> bool:
        session = self.sessions.get(name)
        return session is not None and session.snapshot.state in (M.ERROR, M.RECONNECTING)

    async def look_down(self, every_s: float = 0.0) -> list[str]:
        """Ask the providers of the hosts that do not answer, and whose instance gputui knows, what became of
        them (``lifecycle.look``: stopped, preempted, terminated, running), each at most every ``every_s``;
        a stopped one's disk goes into the ledger. The hosts asked."""
        now = time.time()
        names = [n for n in self.sessions if self._down(n) and now - self._looked.get(n, 0.0) >= every_s
                 and instances.known(self.config.hosts[n]) is not None]
        if not names:
            return []
        from gputui.core.money import lifecycle  # the provider client (and the SSH stack): only when needed

        found = await asyncio.gather(
            *(lifecycle.look(self.config, self.config.hosts[n], self.ledger.released(n)) for n in names)
        )
        for name, look in zip(names, found, strict=True):
            self._looked[name] = now
            if look is None or not self._down(name):
                continue
            self.looks[name] = look
            if look.state in ("stopped", "preempted"):
                self.ledger.stopped(name, look.at, look.stopped_per_hour)
            elif look.state == "terminated":
                self.ledger.gone(name, look.at)
            self._changed(self.sessions[name].snapshot)
        return names

    async def _look_loop(self) -> None:
        """Now and then: the providers of the hosts that do not answer, and the prices of those that do."""
        while not self._closed:
            await asyncio.sleep(LOOK_EVERY_S / 4)
            with contextlib.suppress(Exception):  # each look says its own failure (state unknown)
                await self.look_down(LOOK_EVERY_S)
            now = time.time()
            for name in [n for n, t in self._priced.items() if now - t >= PRICE_EVERY_S and n in self.sessions]:
                session = self.sessions[name]
                if session.snapshot.state == M.CONNECTED:
                    await self.ask_price(session, self.config.hosts[name])

    def session(self, name: str) -> HostSession:
        self.config.host(name)  # raises a ConfigError naming the known hosts
        if name in self._deferred:  # asked for before the SSH stack loaded: built (and loaded) now
            self._build_deferred(name)
        return self.sessions[name]

    def snapshots(self) -> list[M.HostSnapshot]:
        """Every host's snapshot, in the config's order (a deferred SSH host's: the initial one)."""
        return [
            self.with_cost(self.sessions[n].snapshot if n in self.sessions else M.HostSnapshot(name=n))
            for n in self.config.hosts
            if n in self.sessions or n in self._deferred
        ]

    def start_local(self) -> None:
        """Start the local hosts' sessions now (the app does before its first frame: their agents started
        with the app, so this is only pipes and a hello); ``run_in_background`` starts the rest."""
        for session in self._local_sessions():
            session.run_in_background()

    def _local_sessions(self) -> list[HostSession]:
        return [s for n, s in self.sessions.items() if self.config.hosts[n].transport == "local"]

    def run_in_background(self) -> None:
        """Start every host's session; the deferred SSH hosts' once the SSH stack has loaded in a thread."""
        for session in self.sessions.values():
            session.run_in_background()
        if self._looker is None:
            self._looker = asyncio.get_running_loop().create_task(self._look_loop())
        if self._deferred and self._loader is None:
            self._loader = asyncio.get_running_loop().create_task(self._start_deferred())

    async def _start_deferred(self) -> None:
        """Load the SSH stack, then build and start the deferred hosts. The load holds the GIL most of the time,
        so it begins once the local hosts are connected (their agents started with the app: milliseconds),
        or after ``LOCAL_FIRST_S``, whichever comes first."""
        local = self._local_sessions()
        if local:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(s.wait_connected() for s in local)), LOCAL_FIRST_S)
        with contextlib.suppress(Exception):  # a failure to load is said by each host's session (Unloadable)
            await asyncio.to_thread(importlib.import_module, SSH_STACK)
        for name in list(self._deferred):
            self._build_deferred(name)

    def _build_deferred(self, name: str) -> None:
        """The session of a deferred SSH host, started when the fleet runs; one whose transport cannot be
        built (the SSH stack does not load) fails its connect with the reason."""
        host = self._deferred.pop(name)
        try:
            session = self.new_session(name, host)
        except ImportError as exc:
            session = HostSession(name, Unloadable(f"cannot load the SSH support: {exc}"), self._changed)
        self.sessions[name] = session
        if self._loader is not None and not self._closed:
            session.run_in_background()

    async def reconfigure(self, config: Config) -> tuple[list[str], list[str]]:
        """Follow ``config`` without touching the hosts it did not change: a host added gets a session (started
        where the fleet runs), a host removed is closed (its link only: nothing on the host is touched), a host
        whose settings changed (every SSH host, where the ssh_config file to read changed) restarts with the new
        ones. Returns (hosts added or restarted, hosts removed or restarted)."""
        old = self.config

        def changed(name: str) -> bool:
            host = config.hosts[name]
            return old.hosts[name] != host or (host.transport != "local" and old.ssh_config != config.ssh_config)

        gone = [n for n in old.hosts if n not in config.hosts or changed(n)]
        new = [n for n in config.hosts if n not in old.hosts or changed(n)]
        closing = [s for s in map(self.forget, gone) if s is not None]
        self.config = config
        await asyncio.gather(*(s.close() for s in closing), return_exceptions=True)
        for name in new:
            session = self.sessions[name] = self.new_session(name, config.hosts[name])
            if self._looker is not None and not self._closed:  # the fleet runs: so does the new session
                session.run_in_background()
        return new, gone

    def forget(self, name: str) -> HostSession | None:
        """Take ``name`` out of the fleet: its session (to close), None when it had none yet."""
        self._deferred.pop(name, None)
        return self.sessions.pop(name, None)

    async def close(self) -> None:
        self._closed = True  # a deferred host built from now on is not started
        for task in (self._loader, self._looker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)
        self.ledger.save(force=True)

"""Run one action on many hosts at once; a host that fails gives its error, never the others'."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias, TypeVar

from gputui.core.session.host import HostSession
from gputui.core.transport.base import HostError, HostUnavailable
from gputui.core.transport.link import AgentError, LinkClosed

T = TypeVar("T")
Outcome: TypeAlias = T | BaseException  # what one host gave: the action's value or the error that stopped it

#: What a host can fail with; the error is that host's answer (anything else is a bug and propagates).
HOST_ERRORS = (HostError, HostUnavailable, LinkClosed, AgentError, OSError, asyncio.TimeoutError)


class Fleetish(Protocol):
    """What gathering needs from a fleet: the session of each named host."""

    def session(self, name: str) -> HostSession: ...


async def gather_hosts(
    fleet: Fleetish,
    names: list[str],
    action: Callable[[HostSession], Awaitable[T]],
    *,
    connect: bool = True,
    limit: int | None = None,
) -> dict[str, Outcome[T]]:
    """``action`` on each named host, concurrently; {name: value or error}, in the order of ``names``.

    ``connect`` connects each session first where it is not (the CLI, the session service); the app's sessions
    are already kept connected.
    Connects are gated by the transport itself; ``limit`` caps how many actions run at once (e.g. probes that
    load each host).
    """
    gate = asyncio.Semaphore(limit) if limit else None

    async def run(session: HostSession) -> T:
        if connect:
            await session.ensure_connected()  # a long-lived fleet's link that is up is kept (the session service)
        return await action(session)

    async def one(name: str) -> Outcome[T]:
        session = fleet.session(name)
        try:
            if gate is None:
                return await run(session)
            async with gate:
                return await run(session)
        except HOST_ERRORS as exc:
            return exc

    values = await asyncio.gather(*(one(n) for n in names))
    return dict(zip(names, values, strict=True))

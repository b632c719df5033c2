"""Gathering one action over many hosts: each host's error is its own answer; a cap on actions at once."""

from __future__ import annotations

import asyncio
from typing import Any

from gputui.core.hosts.doctor import HOSTS_AT_ONCE
from gputui.core.session.gather import gather_hosts
from gputui.core.transport.base import HostUnavailable


class Hosts:
    """Stand-in sessions by name (gather_hosts only asks the fleet for them and hands them to the action)."""

    def session(self, name: str) -> Any:
        return name


async def test_errors_stay_with_their_host_and_the_order_is_kept() -> None:
    async def action(name: str) -> str:
        if name == "b":
            raise HostUnavailable("no route to b")
        return name.upper()

    results = await gather_hosts(Hosts(), ["a", "b", "c"], action, connect=False)  # type: ignore[arg-type]
    assert list(results) == ["a", "b", "c"]
    assert results["a"] == "A" and results["c"] == "C" and isinstance(results["b"], HostUnavailable)


async def test_a_limit_caps_the_actions_running_at_once() -> None:
    running, peak = 0, 0
    release = asyncio.Event()

    async def probe(_name: str) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running >= HOSTS_AT_ONCE:
            release.set()
        await release.wait()
        running -= 1

    names = [f"h{i}" for i in range(3 * HOSTS_AT_ONCE)]
    await gather_hosts(Hosts(), names, probe, connect=False, limit=HOSTS_AT_ONCE)  # type: ignore[arg-type]
    assert HOSTS_AT_ONCE == 8 and peak == 8

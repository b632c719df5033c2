"""What the app reads hosts from: a Fleet, or anything shaped like one (tests, the bench)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gputui.core import model as M
from gputui.core.config import Config
from gputui.core.fleet import Fleet

OnChange = Callable[[M.HostSnapshot], None]

METRICS_INTERVAL_S = 1.0


class FleetSource(Protocol):
    """The part of :class:`~gputui.core.fleet.Fleet` the app uses."""

    def snapshots(self) -> list[M.HostSnapshot]: ...

    def run_in_background(self) -> None: ...

    async def close(self) -> None: ...

    def session(self, name: str) -> Any: ...  # a HostSession: start_job, kill_job, follow_log, transport


SourceFactory = Callable[[OnChange], FleetSource]


def fleet_factory(config: Config, metrics_interval: float = METRICS_INTERVAL_S) -> SourceFactory:
    """A factory that builds the real Fleet, publishing snapshots to the app's callback."""

    def make(on_change: OnChange) -> FleetSource:
        return Fleet(config, on_change=on_change, metrics_interval=metrics_interval)

    return make

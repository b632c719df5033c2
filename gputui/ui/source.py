"""What the app reads hosts from: a Fleet, or anything shaped like one (tests, the bench)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gputui.core.config.file import Config, ConfigError, parse
from gputui.core.hosts.fleet import Fleet
from gputui.core.session import model as M

OnChange = Callable[[M.HostSnapshot], None]

METRICS_INTERVAL_S = 1.0


class FleetSource(Protocol):
    """The part of :class:`~gputui.core.hosts.fleet.Fleet` the app uses."""

    def snapshots(self) -> list[M.HostSnapshot]: ...

    def run_in_background(self) -> None: ...

    async def close(self) -> None: ...

    def session(self, name: str) -> Any: ...  # a HostSession: start_job, kill_job, follow_log, transport


@runtime_checkable
class Reconfigurable(Protocol):
    """A source whose hosts follow a new config (the app's ``+`` and a config edited while it runs)."""

    async def reconfigure(self, config: Config) -> tuple[list[str], list[str]]: ...


@runtime_checkable
class LocalFirst(Protocol):
    """A source whose local hosts can start before the rest (before the app's first frame)."""

    def start_local(self) -> None: ...


SourceFactory = Callable[[OnChange], FleetSource]


def fleet_factory(config: Config, metrics_interval: float = METRICS_INTERVAL_S) -> SourceFactory:
    """A factory that builds the real Fleet, publishing snapshots to the app's callback."""

    def make(on_change: OnChange) -> FleetSource:
        return Fleet(config, on_change=on_change, metrics_interval=metrics_interval, defer_ssh=True)

    return make


CONFIG_POLL_S = 2.0
RACY_NS = 3_000_000_000
CONFIG_MAX_BYTES = 4 << 20  # a config larger than this is an error, never read whole


class ConfigWatch:
    """The config file, looked at now and then: a new :class:`Config` when its text changed and parses, the
    error when it changed and does not (said once per text), None when nothing changed. Blocking: run it in a
    worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stat: tuple[int, int] | None = None
        self._digest: bytes | None = None
        self._unreadable: str | None = None

    def _read(self) -> tuple[tuple[int, int], bytes] | None:
        try:
            st = self.path.stat()
            sig = (st.st_mtime_ns, st.st_size)
            if sig == self._stat and time.time_ns() - st.st_mtime_ns > RACY_NS:
                return None  # unchanged (an edit within RACY_NS of the last may share its mtime: read again)
            with self.path.open("rb") as f:
                data = f.read(CONFIG_MAX_BYTES + 1)
        except FileNotFoundError:
            sig, data = (0, -1), b""
        except OSError as exc:  # unreadable now (permissions, a dir): said, and looked at again next time
            raise ConfigError(f"{self.path}: cannot read config: {exc.strerror or exc}") from None
        return sig, data

    def poll(self) -> Config | Exception | None:
        """What changed since the last poll (the first poll only takes note of the file)."""
        try:
            read = self._read()
        except ConfigError as exc:
            said, self._unreadable = self._unreadable, str(exc)
            return exc if said != str(exc) else None  # said once, not every poll
        self._unreadable = None
        if read is None:
            return None
        sig, data = read
        first, self._stat = self._stat is None, sig
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return None
        self._digest = digest
        if first:
            return None
        if len(data) > CONFIG_MAX_BYTES:
            return ConfigError(f"{self.path}: larger than {CONFIG_MAX_BYTES >> 20} MiB; not read")
        if sig == (0, -1):
            return ConfigError(f"{self.path}: the config file is gone; the hosts stay as they were")
        try:
            return parse(data.decode("utf-8"), self.path)
        except (ConfigError, UnicodeDecodeError) as exc:
            return exc

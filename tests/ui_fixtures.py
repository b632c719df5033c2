"""Builders shared by the UI tests (no tests here): recorded GPUs as HostSnapshots, a fleet-shaped source
that publishes them through the app's normal snapshot path, a session that replays log bytes, and a
plain-text dump of the screen."""

from __future__ import annotations

import io
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from gputui.core.session import model as M
from gputui.core.session.host import LogTail
from gputui.core.session.metrics_history import MetricsHistory

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_760_000_000.0  # the fixed "now" of the snapshot tests


def recorded_gpus(which: str) -> tuple[M.GpuSample, ...]:
    """GPU readings the real NVML sampler makes from a recording: ``a100x8`` (idle) or ``h100`` (loaded)."""
    sys.path.insert(0, str(FIXTURES / "gpu"))
    from fake_nvidia_smi import sections
    from nvml_double import NvmlDouble

    from remote_agent.metrics.nvml import NvmlSource

    if which == "a100x8":
        text = (FIXTURES / "gpu" / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt").read_text()
    else:
        capture = (FIXTURES / "gpu" / "h100-80gb-hbm3_590.48.01_capture.txt").read_text()
        text = sections(capture)["load :: query (-q)"]
    return tuple(M.GpuSample.from_wire(g) for g in NvmlSource(NvmlDouble(text)).sample())


def four_gpus_one_lost(words: str) -> tuple[M.GpuSample, ...]:
    """The real NVML sampler's reading of 4 recorded A100s whose GPU 2 fails its handle with ``words``."""
    sys.path.insert(0, str(FIXTURES / "gpu"))
    import pynvml
    from nvml_double import NvmlDouble

    from remote_agent.metrics.nvml import NvmlSource

    class Failing(pynvml.NVMLError):
        def __str__(self) -> str:
            return words

    class Double(NvmlDouble):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
            if index == 2:
                raise Failing(pynvml.NVML_ERROR_UNKNOWN)
            return super().nvmlDeviceGetHandleByIndex(index)

    text = (FIXTURES / "gpu" / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt").read_text()
    return tuple(M.GpuSample.from_wire(g) for g in NvmlSource(Double(text, gpus=4)).sample())


def with_load(gpus: Sequence[M.GpuSample], step: int, job: str | None = None) -> tuple[M.GpuSample, ...]:
    """The recorded GPUs with a deterministic training-like load (for history and busy cards)."""
    out = []
    for g in gpus:
        phase = (step + 3 * g.index) % 20
        util = 55 + 2 * phase if g.index % 3 else 8 + phase
        total = g.mem_total_mib or 40960
        used = total * (0.3 + 0.03 * (g.index % 5)) + 20 * phase
        procs = g.processes or (
            M.GpuProcess(pid=41000 + g.index, mem_mib=used - 500, job=job, name="python3",
                         cpu_percent=float(96 + phase % 5), rss_mib=11_500.0 + 40 * g.index),
        )
        out.append(
            replace(
                g,
                util_percent=float(util),
                mem_used_mib=used,
                temp_c=float(55 + phase + 4 * (g.index % 4)),
                power_w=(g.power_limit_w or 400) * util / 110,
                processes=tuple(replace(p, job=p.job or job) for p in procs) if job else g.processes,
            )
        )
    return tuple(out)


def host_stats() -> M.HostStats:
    return M.HostStats(
        cpu_percent=37.0, cpu_count=96, load1=12.4, mem_used_mib=412_000, mem_total_mib=1_031_000,
        disk_free_gib=1650.0, disk_total_gib=2000.0, uptime_s=3 * 86400 + 4 * 3600,
    )


def job(
    host: str,
    id: str,
    name: str,
    state: str = M.JOB_RUNNING,
    started: float = 3600,
    exit_code: int | None = None,
) -> M.Job:
    ended = T0 - 60 if state != M.JOB_RUNNING else None
    return M.Job(
        host=host, id=id, name=name, state=state, command=("python", "train.py"), gpus="all",
        exit_code=exit_code, started_at=T0 - started, ended_at=ended, tmux_session=f"gputui-{id}",
    )


def snapshot(
    name: str,
    gpus: Sequence[M.GpuSample] = (),
    *,
    state: str = M.CONNECTED,
    jobs: Sequence[M.Job] = (),
    cost: M.CostInfo | None = None,
    error: str | None = None,
    detail: str | None = None,
    gpu_error: str | None = None,
    history: int = 120,
    loaded_job: str | None = None,
) -> M.HostSnapshot:
    """A host as the core would publish it, with ``history`` samples of deterministic load."""
    samples = []
    for i in range(history if gpus else 1):
        g = with_load(gpus, i, loaded_job) if loaded_job is not None else tuple(gpus)
        samples.append(M.MetricsSample(seq=i, t=T0 - history + i, host=host_stats(), gpus=g, gpu_source="nvml" if gpus else None, gpu_error=gpu_error))
    facts = {"hostname": f"{name}.example", "tmux_socket": "gputui-test"}
    if state == M.ERROR and not gpus:  # never connected: nothing known but the error
        samples, facts = [], {}
    return M.HostSnapshot(
        name=name, state=state, error=error, detail=detail, facts=facts, metrics=samples[-1] if samples else None,
        jobs=tuple(jobs), updated_at=T0, history=MetricsHistory.of(samples), cost=cost,
    )


def price(per_hour: float, hours: float = 5.0, idle_s: float = 0.0) -> M.CostInfo:
    return M.CostInfo(
        price_per_hour=per_hour, accrued=per_hour * hours, today=per_hour * min(hours, 9), idle=idle_s > 0,
        idle_seconds=idle_s, idle_cost=per_hour * idle_s / 3600,
    )


class ReplaySession:
    """A host session for the log pane: ``follow_log`` hands over the given bytes, then the end."""

    class transport:  # noqa: N801 - mirrors HostSession.transport
        @staticmethod
        def terminal_prefix() -> list[str]:
            return ["ssh", "-t", "gpu-box"]

    def __init__(self, logs: dict[str, bytes] | None = None, end: bool = True) -> None:
        self.logs, self.end = logs or {}, end
        self.follows: list[tuple[str, int]] = []
        self.name, self.snapshot = "gpu-box", M.HostSnapshot(name="gpu-box")  # as HostSession has them

    async def follow_log(
        self, job: str, offset: int, on_data: Callable, on_end: Callable, on_gap: Callable
    ) -> Any:
        self.follows.append((job, offset))
        data = self.logs.get(job, b"")
        if data:
            on_data(data)
        if self.end:
            on_end({"job": job, "offset": len(data), "job_state": "failed", "exit_code": 1})
        return None

    async def unfollow_log(self, job: str) -> None:
        pass

    async def list_jobs(self) -> list[M.Job]:
        return []

    async def read_log(self, job_id: str, offset: int = 0, **_kw: Any) -> tuple[int, bytes, int]:
        data = self.logs.get(job_id, b"")
        return offset, data[offset:], len(data)

    async def log_tails(self, jobs: Sequence[str], max_bytes: int) -> AsyncIterator[dict[str, LogTail]]:
        """Each job's log end as ``HostSession.log_tails`` pages them (one page; no time index: no rates)."""
        tails = {}
        for job in jobs:
            _, data, size = await self.read_log(job, 0)
            tails[job] = LogTail(max(0, size - max_bytes), data[-max_bytes:], size, [])
        yield tails


class StaticSource:
    """A fleet-shaped source: hosts start as "connecting" and get ``snaps`` through the app's on_change."""

    def __init__(
        self,
        snaps: Sequence[M.HostSnapshot],
        on_change: Callable[[M.HostSnapshot], None],
        session: Any = None,
    ) -> None:
        self.snaps, self.on_change = list(snaps), on_change
        self._session = session or ReplaySession()

    def snapshots(self) -> list[M.HostSnapshot]:
        return [M.HostSnapshot(name=s.name) for s in self.snaps]

    def run_in_background(self) -> None:
        for s in self.snaps:
            self.on_change(s)

    def publish(self, snap: M.HostSnapshot) -> None:
        self.on_change(snap)

    async def close(self) -> None:
        pass

    def session(self, name: str) -> Any:
        return self._session


def static_factory(snaps: Sequence[M.HostSnapshot], session: Any = None) -> Callable[..., StaticSource]:
    holder: dict[str, StaticSource] = {}

    def make(on_change: Callable[[M.HostSnapshot], None]) -> StaticSource:
        holder["source"] = StaticSource(snaps, on_change, session)
        return holder["source"]

    make.holder = holder  # type: ignore[attr-defined]
    return make


def screen_text(app: Any) -> str:
    """What the terminal shows, as plain text (screens stacked like the real terminal)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None, record=True)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()

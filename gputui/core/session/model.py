"""Immutable snapshots of what the client knows about its hosts.

A HostSession turns agent frames into these frozen dataclasses; the CLI prints them and the UI swaps
them in. Nothing here does I/O.
"""

from __future__ import annotations

import contextlib
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from gputui.core.session.metrics_history import EMPTY as EMPTY_HISTORY
from gputui.core.session.metrics_history import MetricsHistory
from remote_agent import protocol as P
from remote_agent.protocol import JOB_ENDED_STATES as JOB_ENDED_STATES
from remote_agent.protocol import JOB_FAILED as JOB_FAILED
from remote_agent.protocol import JOB_KILLED as JOB_KILLED
from remote_agent.protocol import JOB_LOST as JOB_LOST
from remote_agent.protocol import JOB_QUEUED as JOB_QUEUED
from remote_agent.protocol import JOB_RUNNING as JOB_RUNNING
from remote_agent.protocol import JOB_SUCCEEDED as JOB_SUCCEEDED

if TYPE_CHECKING:
    from gputui.core.insights import JobInsights

# Connection states of a host.
CONNECTING = "connecting"
CONNECTED = "connected"
RECONNECTING = "reconnecting"
ERROR = "error"
CLOSED = "closed"


@dataclass(frozen=True)
class GpuProcess:
    """A process on a GPU, and the gputui job it belongs to if any."""

    pid: int
    mem_mib: float | None = None
    job: str | None = None  # id of the gputui job owning the pid, if any
    name: str | None = None
    hidden: bool = False  # the pid is from another PID namespace (a pod): not in the agent's /proc
    inferred: bool = False  # job matched by its GPUs, not by /proc (a pid from another PID namespace)
    cpu_percent: float | None = None  # of one core, since the agent's previous reading
    rss_mib: float | None = None  # resident memory (host RAM)
    children: int | None = None  # the processes it started (DataLoader workers), and their CPU % together
    children_cpu_percent: float | None = None


def _finite(value: Any) -> float | None:
    """A number from the wire, or None for anything else (a string, a bool, NaN, infinity)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


#: A lost GPU's ``error`` and ``fix`` from the agent are kept to this many characters.
MAX_GPU_TEXT = 500


@dataclass(frozen=True)
class GpuFault:
    """An XID (or another critical NVML event) the driver reported for a GPU (``protocol.GpuFault``)."""

    t: float
    kind: str
    xid: int | None = None
    meaning: str | None = None
    fix: str | None = None

    @classmethod
    def from_wire(cls, d: Any) -> GpuFault | None:
        """One fault as a host sent it, each field checked (None when it is no fault)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("kind"), str):
            return None
        t, xid = d.get("t"), d.get("xid")
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            return None
        text = [v[:MAX_GPU_TEXT] if isinstance(v, str) else None for v in (d.get("meaning"), d.get("fix"))]
        number = xid if isinstance(xid, int) and not isinstance(xid, bool) else None
        return cls(float(t), d["kind"][:60], number, *text)

    @property
    def label(self) -> str:
        """``XID 79 (GPU has fallen off the bus)``."""
        what = f"XID {self.xid}" if self.kind == "xid" and self.xid is not None else self.kind
        return what + (f" ({self.meaning})" if self.meaning and self.kind == "xid" else "")


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading (``protocol.Gpu``); the GPU lists of host facts fill the first fields only."""

    index: int
    name: str | None = None
    uuid: str | None = None
    util_percent: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_percent: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pstate: str | None = None
    ecc_errors_uncorrected: int | None = None
    ecc_errors_uncorrected_aggregate: int | None = None  # over the GPU's life
    throttle_reasons: tuple[str, ...] | None = None
    thermal_violation_ms: float | None = None  # NVML's thermal violation counter, since the driver loaded
    thermal_slowdown_percent: float | None = None  # of the last thermal_window_s, clocks slowed for heat (NVML)
    thermal_window_s: float | None = None  # 10 min, or less when the agent has read for less
    persistence_mode: bool | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    app_clock_mhz: float | None = None  # the application (graphics) clock set now, and its default
    app_clock_default_mhz: float | None = None
    pcie_gen: int | None = None  # the PCIe link now and at most (its generation drops when the GPU idles)
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlink_links: int | None = None  # NVLink: the GPU's links and how many are up (None: no NVLink)
    nvlink_active: int | None = None
    remap_pending: bool | None = None  # memory rows: a remap waits for a GPU reset; one failed (no spare left)
    remap_failed: bool | None = None
    retired_pages_single: int | None = None  # memory pages retired after ECC errors (before Ampere)
    retired_pages_double: int | None = None
    retired_pages_pending: bool | None = None  # a retirement waits for a reboot
    processes: tuple[GpuProcess, ...] = ()
    state: str = P.GPU_OK  # "lost": the driver cannot reach this GPU; ``error`` has its words, ``fix`` what to do
    error: str | None = None
    fix: str | None = None
    faults: tuple[GpuFault, ...] = ()  # the driver's XIDs of the last day for this GPU, newest last

    @property
    def lost(self) -> bool:
        return self.state == P.GPU_LOST

    @property
    def problems(self) -> list[str]:
        """What is wrong with this GPU now (lost, throttled by heat or hardware, ECC errors); empty when all is
        well as far as its readings say (gputui/core/insights/gpu_hints.py)."""
        from gputui.core.insights.gpu_hints import gpu_problems

        return gpu_problems(self)

    @classmethod
    def from_wire(cls, gpu: P.Gpu | P.GpuFact) -> GpuSample:
        d: Mapping[str, Any] = gpu  # a reading, or a GPU of the host's facts (the first fields only)
        fields = [k for k in P.GPU_FIELDS if k not in ("processes", "throttle_reasons", "state", "error", "fix", "faults")]
        known: dict[str, Any] = {k: d.get(k) for k in fields}
        if d.get("state") == P.GPU_LOST:  # anything else is a GPU without a known problem
            known["state"] = P.GPU_LOST
            for k in ("error", "fix"):
                v = d.get(k)
                known[k] = v[:MAX_GPU_TEXT] if isinstance(v, str) else None
        procs = tuple(
            GpuProcess(
                pid=int(p["pid"]),
                mem_mib=p.get("mem_mib"),
                job=p.get("job"),
                name=p.get("name"),
                inferred=bool(p.get("inferred")),
                cpu_percent=_finite(p.get("cpu_percent")),
                rss_mib=_finite(p.get("rss_mib")),
                children=kids if isinstance(kids := p.get("children"), int) and not isinstance(kids, bool) else None,
                children_cpu_percent=_finite(p.get("children_cpu_percent")),
            )
            for p in d.get("processes") or ()
        )
        reasons = d.get("throttle_reasons")
        known["index"] = int(d.get("index", 0))
        wire = d.get("faults")
        faults = tuple(f for f in map(GpuFault.from_wire, wire[:5] if isinstance(wire, list) else ()) if f)
        return cls(**known, processes=procs, throttle_reasons=None if reasons is None else tuple(reasons),
                   faults=faults)


@dataclass(frozen=True)
class HostStats:
    """The host's own readings: CPU, load, memory, disk, uptime."""

    cpu_percent: float | None = None
    cpu_count: float | None = None  # the container's CPU quota when it has one
    load1: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    disk_free_gib: float | None = None
    disk_total_gib: float | None = None
    uptime_s: float | None = None
    mem_scope: str | None = None  # "cgroup": memory is the container's limit, not the machine's RAM
    cpu_scope: str | None = None

    @classmethod
    def from_wire(cls, d: P.HostReading | None) -> HostStats:
        reading: dict[str, Any] = dict(d or {})
        return cls(**{k: reading.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class MetricsSample:
    """One metrics sample of a host: ``seq`` increases by one per sample on the agent."""

    seq: int
    t: float
    host: HostStats
    gpus: tuple[GpuSample, ...]
    gpu_source: str | None = None  # "nvml", "nvidia-smi" or None
    gpu_error: str | None = None  # why there are no GPU readings, e.g. "no NVIDIA driver"
    # idleness as the agent sees it: reasons (why not idle), idle_seconds, watchdog state
    activity: P.Activity = field(default_factory=lambda: P.Activity(), compare=False, hash=False)

    @classmethod
    def from_wire(cls, d: P.MetricsSample) -> MetricsSample:
        return cls(
            seq=int(d.get("seq", 0)),
            t=float(d.get("t", 0.0)),
            host=HostStats.from_wire(d.get("host")),
            gpus=tuple(GpuSample.from_wire(g) for g in d.get("gpus") or ()),
            gpu_source=d.get("gpu_source"),
            gpu_error=d.get("gpu_error"),
            activity=d.get("activity") or {},
        )


#: Optional parts of a host's job record that a Job keeps as they came.
_KEPT_IF_SET = (
    "error", "log_error", "code", "queue", "artifacts", "slurm", "env_keys", "restart", "attempts", "attempt",
    "restart_at", "container", "image_id", "group",
)


def _slurm_reason(d: P.JobRecord) -> str | None:
    """Why a queued Slurm job waits, in Slurm's word (Resources, Priority, ...)."""
    return (d.get("slurm") or {}).get("reason") if d.get("state") == JOB_QUEUED else None


@dataclass(frozen=True)
class Job:
    """A job on a host, as its agent lists it."""

    host: str
    id: str
    name: str
    state: P.JobState
    command: tuple[str, ...]
    cwd: str | None = None
    gpus: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    log_size: int = 0
    tmux_session: str | None = None
    stalled: bool = False  # the host's watchdog found it stalled (GPUs idle, log silent): see stall_minutes
    stalled_since: float | None = None  # when it was last seen active
    stalled_reason: str | None = None
    queue_position: int | None = None  # while queued on the host: 1 = next
    queue_reason: str | None = None  # while queued: what it waits for (GPUs busy, another job)
    insights: JobInsights | None = field(default=None, compare=False)  # progress, metrics, hints from the log
    # the rest of the host's run record: git, gpu_inventory, price_per_hour, usage (peak memory, mean util)
    record: P.JobRecord = field(default_factory=lambda: P.JobRecord(), compare=False, hash=False)

    @property
    def running(self) -> bool:
        return self.state == JOB_RUNNING

    @property
    def image(self) -> dict[str, Any] | None:
        """A job run in a container image: ``{"image": as asked, "id": the engine's image ID or None}``."""
        container = self.record.get("container")
        if not isinstance(container, dict) or not isinstance(container.get("image"), str):
            return None
        image_id = self.record.get("image_id")
        return {"image": container["image"], "id": image_id if isinstance(image_id, str) else None}

    @classmethod
    def from_wire(cls, host: str, d: P.JobRecord) -> Job:
        record = P.JobRecord(
            git=d.get("git"), gpu_inventory=d.get("gpu_inventory") or [], price_per_hour=d.get("price_per_hour"),
            usage=d.get("usage"),
        )
        for key in _KEPT_IF_SET:  # the record's optional parts, only where the host set them
            if key in d:
                record[key] = d[key]  # type: ignore[literal-required]
        return cls(
            host=host,
            id=str(d["id"]),
            name=str(d.get("name") or d["id"]),
            state=d.get("state", JOB_LOST),
            command=tuple(d.get("argv") or ()),
            cwd=d.get("cwd"),
            gpus=d.get("gpus"),
            exit_code=d.get("exit_code"),
            started_at=d.get("started_at"),
            ended_at=d.get("ended_at"),
            log_size=int(d.get("log_size") or 0),
            tmux_session=d.get("tmux_session"),
            stalled=d.get("stalled") is True,
            stalled_since=d.get("stalled_since"),
            stalled_reason=d.get("stalled_reason"),
            queue_position=d.get("queue_position"),
            queue_reason=d.get("queue_reason") or _slurm_reason(d),
            record=record,
        )

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("insights", "record")}
        d["command"] = list(self.command)
        d["insights"] = self.insights.to_json() if self.insights is not None else None
        d["error"] = self.record.get("error")  # this job's own problem (unreadable files), never the host's
        d["log_error"] = self.record.get("log_error")  # e.g. "disk full at offset N": the log stops there
        d["slurm"] = self.record.get("slurm")  # a Slurm job: job_id, state, reason, nodes (None otherwise)
        d["restart"] = self.record.get("restart")  # its restart policy (None: "no")
        d["attempt"] = self.record.get("attempt")  # the attempt that runs or waits (with a policy)
        d["attempts"] = self.record.get("attempts") or []  # each ended attempt: exit, start/end, hint, progress
        d["restart_at"] = self.record.get("restart_at")  # when the next attempt starts, while it waits
        d["image"] = self.image  # run in a container: the image as asked and its resolved ID (None: bare)
        d["group"] = self.record.get("group")  # a job over several hosts: its hosts, this part's rank, every part
        return d


@dataclass(frozen=True)
class CostInfo:
    """Money and idleness of one host (see gputui.core.money.cost)."""

    currency: str = "USD"
    price_per_hour: float | None = None  # None: no price configured or derivable
    accrued: float = 0.0  # since billing start
    today: float = 0.0
    month: float = 0.0
    idle: bool = False
    idle_seconds: float = 0.0
    idle_cost: float = 0.0
    reasons: tuple[str, ...] = ()  # why the host is NOT idle, e.g. "job 7 running", "GPU 2 at 43%"
    released: bool = False
    autostop_in_s: float | None = None  # watchdog countdown, when autostop is armed
    deadline_in_s: float | None = None  # hard release deadline, when set
    # provider-native price and release (gputui.core.money.cost.release_info; remote_agent/host/provider.py)
    price_source: str | None = None  # "config", "prices" (per-GPU table) or the provider's name
    price_unknown: str | None = None  # why the provider's own price could not be used (display: "price unknown")
    provider: str | None = None  # where the host's watchdog releases through: "runpod", "vastai", "command"
    instance_id: str | None = None
    release_check_ok: bool | None = None  # the last release check's verdict (None: never checked)
    release_check_at: float | None = None  # when it was made (epoch seconds)
    release_check_detail: str | None = None
    release_failed: str | None = None  # why the last release failed: the host still bills

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d


@dataclass(frozen=True)
class InstanceLook:
    """What a host's provider says of its instance while the host does not answer (``gputui.core.money.lifecycle.
    look``): ``stopped``, ``preempted`` (a spot instance stopped by the provider, not by the user), ``terminated``,
    ``running`` / ``starting`` (the instance runs: the link is what fails), or ``unknown`` (could not ask)."""

    provider: str
    instance_id: str
    state: str
    detail: str  # in words, for the hosts row and status
    stopped_per_hour: float | None = None  # what its disk bills while stopped (USD per hour), where known
    at: float = 0.0  # when the provider was asked

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HostSnapshot:
    """Everything the client knows about one host at one moment."""

    name: str
    state: str = CONNECTING
    error: str | None = None
    detail: str | None = None  # e.g. "attempt 3, next try in 2.0 s"
    # from the agent's hello
    facts: P.HostFacts = field(default_factory=lambda: cast(P.HostFacts, {}), compare=False, hash=False)
    metrics: MetricsSample | None = None
    jobs: tuple[Job, ...] = ()
    updated_at: float = 0.0
    history: MetricsHistory = field(default=EMPTY_HISTORY, compare=False, repr=False)  # recent samples, compact
    cost: CostInfo | None = None
    # a Slurm login node (scheduler = "slurm"): partitions and nodes from its last sinfo
    cluster: P.ClusterInfo | None = field(default=None, compare=False, hash=False)
    # while it does not answer: what its provider says of its instance (RunPod / vast.ai, with the user's key)
    instance: InstanceLook | None = None

    @property
    def gpus(self) -> tuple[GpuSample, ...]:
        return self.metrics.gpus if self.metrics else ()

    @classmethod
    def from_status_json(cls, d: Any, now: float) -> HostSnapshot | None:
        """A connected host of ``gputui status --json`` (``to_json``'s form, as the session service prints it)
        as a snapshot to show until the app's own link is up: its GPUs, host readings, jobs and cost; None for
        anything else. A part of the wrong shape is left out, never an error."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or d.get("state") != CONNECTED:
            return None

        def parts(key: str, make: Callable[[Any], Any]) -> tuple[Any, ...]:
            found = d.get(key)
            out = []
            for item in found if isinstance(found, list) else ():
                with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
                    out.append(make(item))
            return tuple(out)

        gpus = parts("gpus", GpuSample.from_wire)
        jobs = parts("jobs", lambda j: Job.from_wire(d["name"], cast(P.JobRecord, {**j, "argv": j.get("command")})))
        host = d.get("host") if isinstance(d.get("host"), dict) else {}
        cost = None
        with contextlib.suppress(TypeError, ValueError):
            raw = d.get("cost")
            if isinstance(raw, dict):
                known = {k: raw[k] for k in CostInfo.__dataclass_fields__ if k in raw}
                cost = CostInfo(**{**known, "reasons": tuple(known.get("reasons") or ())})
        with contextlib.suppress(TypeError, ValueError):
            metrics = MetricsSample(0, now, HostStats.from_wire(cast(P.HostReading, host)), gpus,
                                    gpu_source=d.get("gpu_source"), gpu_error=d.get("gpu_error"))
            facts = {k: d[k] for k in ("hostname", "tmux_socket", "container") if d.get(k) is not None}
            return cls(d["name"], CONNECTED, facts=cast(P.HostFacts, facts), metrics=metrics, jobs=jobs,
                       updated_at=now, cost=cost)
        return None

    def to_json(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "name": self.name,
            "state": self.state,
            "error": self.error,
            "detail": self.detail,
            "hostname": self.facts.get("hostname"),
            "tmux_socket": self.facts.get("tmux_socket"),  # tmux -L SOCKET attach -t =gputui-ID
            "container": self.facts.get("container"),
            "gpu_source": m.gpu_source if m else None,
            "gpu_error": m.gpu_error if m else None,
            "gpus": [_gpu_json(g) for g in self.gpus],
            "host": asdict(m.host) if m else {},
            "jobs": [j.to_json() for j in self.jobs],
            "cost": self.cost.to_json() if self.cost is not None else None,
            "cluster": self.cluster,
            "instance": self.instance.to_json() if self.instance is not None else None,
        }


def _gpu_json(g: GpuSample) -> dict[str, Any]:
    d = asdict(g)
    d["throttle_reasons"] = None if g.throttle_reasons is None else list(g.throttle_reasons)
    d["problems"] = g.problems  # what is wrong with it now, in words (empty: nothing known)
    return d


_AGENT_NAME_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def job_name(name: str, command: Sequence[str]) -> str:
    """The job's name as shown: a default name (the agent joins the argv with spaces, losing its quoting)
    becomes the shell-quoted command, e.g. ``python3 -c 'import time; print(1)'``."""
    if command:
        default = _AGENT_NAME_CONTROL.sub(" ", " ".join(command))[: P.MAX_JOB_NAME].strip()
        if name == default:
            return shlex.join(command)
    return name

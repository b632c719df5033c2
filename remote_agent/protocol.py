"""The wire protocol between the gputui client and the remote agent (one source of truth for both sides).

Frames are single lines of JSON (UTF-8, ``\\n`` terminated) over the agent's stdin/stdout:

* request  ``{"id": 7, "op": "jobs.start", "args": {...}}``   (client -> agent)
* reply    ``{"id": 7, "ok": true, "result": ...}`` or ``{"id": 7, "ok": false, "error": {"code", "message"}}``
* event    ``{"event": "metrics", "data": {...}}``             (agent -> client, unsolicited)

The first frame the agent sends is the ``hello`` event. Raw log bytes travel base64-encoded so that
non-UTF-8 output survives byte for byte. The schema of what travels (job states, doctor statuses, GPU fields,
each op's args and result, each event's data) is typed below, once, for the agent and the client. This module
must stay stdlib-only and Python 3.8 compatible.
"""

import base64
import json
import math
import re
from typing import (
    Any,
    Dict,
    List,
    Literal,
    NamedTuple,
    Optional,
    Tuple,
    TypedDict,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

# --- limits and names ---------------------------------------------------------------------------------------------
PROTOCOL_VERSION = 1

#: Longest frame either side accepts; longer input is rejected as malformed, never buffered unbounded.
MAX_FRAME_BYTES = 4 * 1024 * 1024
#: Largest raw log chunk the agent puts in one reply to logs.read (base64 grows it by 4/3).
LOG_CHUNK_BYTES = 256 * 1024
#: Bounds of numbers in requests (the CLI refuses others as usage errors, the agent as bad arguments).
MAX_KILL_GRACE_S = 3600.0
MAX_SNOOZE_MIN = 7 * 24 * 60
#: Most jobs, and most bytes of JSON, one jobs.list page carries; the client asks for pages until none remain.
#: Job ids one queued job may wait for, per key (``after``, ``after_ok``).
MAX_QUEUE_DEPS = 50
#: Longest job name (a longer one is cut; a default name is the argv joined with spaces).
MAX_JOB_NAME = 200
LIST_PAGE_JOBS = 2000
LIST_PAGE_BYTES = 1024 * 1024
#: logs.tails: most jobs one request names, most raw bytes of one job's tail, most raw bytes (tails and time
#: entries) one reply carries; the client asks again for the jobs a reply did not reach.
TAILS_JOBS = 1000
TAIL_MAX_BYTES = 512 * 1024
TAILS_PAGE_BYTES = 2 * 1024 * 1024
#: Largest raw log chunk in one followed-log event: a frame cut by a lost link is sent again whole.
LOG_FRAME_BYTES = 48 * 1024
#: Largest raw file chunk in one files.read/files.write frame.
FILE_CHUNK_BYTES = 512 * 1024

# Flow control. Log events (the bulk) may only go out while the agent has sent fewer bytes after its hello
# frame than the client allowed; every other frame goes out at once and counts too. The client allows more
# with ``flow.credit`` frames as it consumes, so at most a window is ever queued between the two and a reply
# or heartbeat never waits behind more than that, whatever the link's rate.
OP_CREDIT = "flow.credit"  # client -> agent, no id, never answered: {"upto": bytes allowed since hello}
FLOW_WINDOW = 64 * 1024  # what the client allows before its first credit frame
FLOW_MIN_ROOM = 8 * 1024  # a log event waits until at least this much is allowed (client windows are >= 2x)

# Operations the agent answers (each one's args and result are typed in the schema below).
OP_PING = "ping"
OP_JOBS_START = "jobs.start"
OP_JOBS_LIST = "jobs.list"  # args: after (job id), limit; result: {"jobs": [listing records], "more": bool}
OP_JOBS_GET = "jobs.get"  # one job's full record (listings cut long commands)
OP_JOBS_KILL = "jobs.kill"
OP_JOBS_GROUP_CHECK = "jobs.group_check"  # a job over several hosts: can this host's part run (jobs/group.py)
OP_QUEUE_LIST = "queue.list"  # the queued jobs in order, with position and what each waits for
OP_QUEUE_MOVE = "queue.move"  # args: job, to (1 = next); result as queue.list
OP_LOGS_READ = "logs.read"
OP_LOGS_FOLLOW = "logs.follow"
OP_LOGS_UNFOLLOW = "logs.unfollow"
OP_LOGS_TIMES = "logs.times"  # when the log's bytes were written (remote_agent/jobs/logclock.py)
OP_LOGS_TAILS = "logs.tails"  # args: jobs, max_bytes; the last bytes of many logs with their times, paged
OP_LOGS_SERIES = "logs.series"  # args: job; its metric series, kept beside its log (remote_agent/jobs/series.py)
OP_METRICS_SUBSCRIBE = "metrics.subscribe"
OP_METRICS_SAMPLE = "metrics.sample"
OP_SHUTDOWN = "shutdown"
OP_EXEC = "host.exec"  # run an argv on the host with a timeout (release_remote)
OP_WATCHDOG_CONFIGURE = "watchdog.configure"
OP_WATCHDOG_SNOOZE = "watchdog.snooze"
OP_WATCHDOG_CANCEL = "watchdog.cancel"
OP_NOTIFY_TEST = "notify.test"  # send a test notification now with the given [notify] settings
OP_RELEASE_CHECK = "release.check"  # prove without side effects that the host's release would work
OP_RELEASE_PROVIDER = "release.provider"  # release this instance through its provider's API, confirmed
OP_RELEASE_INSTANCE = "release.instance"  # this instance as its provider says now: price, state, spot (no change)
OP_DOCTOR = "doctor"  # host checks, each ok/warn/fail/skip with a fix (remote_agent/host/doctor.py)
# Files carried to and from the host (remote_agent/files/: pull.py reads, sync.py writes).
OP_FILES_LIST = "files.list"  # args: base, patterns; result: {base, files: [{path, rel, size, mtime, mode}]}
OP_FILES_READ = "files.read"  # args: path, offset, max_bytes; result: {offset, size, mtime, b64}
OP_FILES_HASH = "files.hash"  # args: path; result: {sha256, size, mtime}
OP_FILES_WRITE = "files.write"  # args: target, rel, part, offset, b64, truncate, commit {sha256, mode, mtime_ns}
OP_FILES_MANIFEST = "files.manifest"  # args: target, after[, expect]; result: {target, entries, more[, same]}
OP_FILES_DELETE = "files.delete"  # args: target, rels (only files sync wrote and nobody changed since)
OP_SLURM_INFO = "slurm.info"  # a Slurm login node: partitions and nodes with their GPUs (one sinfo)

# Events the agent pushes.
EV_HELLO = "hello"
EV_HEARTBEAT = "heartbeat"
EV_METRICS = "metrics"
EV_LOG = "log"  # data: {"job", "offset", "b64"}
EV_LOG_END = "log_end"  # data: {"job", "offset", "job_state"}; the follow is over
EV_JOB = "job"  # data: a job record whose state changed

# Error codes in replies.
E_MALFORMED = "malformed"
E_UNKNOWN_OP = "unknown_op"
E_BAD_ARGS = "bad_args"
E_NOT_FOUND = "not_found"
E_FAILED = "failed"


# --- the schema ---------------------------------------------------------------------------------------------------
#: A job's state: running, or how it ended (lost: gone without an exit status, or its record is unreadable).
JobState = Literal["queued", "running", "succeeded", "failed", "killed", "lost"]
JOB_QUEUED: JobState = "queued"
JOB_RUNNING: JobState = "running"
JOB_SUCCEEDED: JobState = "succeeded"
JOB_FAILED: JobState = "failed"
JOB_KILLED: JobState = "killed"
JOB_LOST: JobState = "lost"
JOB_ENDED_STATES = frozenset({JOB_SUCCEEDED, JOB_FAILED, JOB_KILLED, JOB_LOST})

#: A doctor check's verdict (op ``doctor``).
DoctorStatus = Literal["ok", "warn", "fail", "skip"]
DOCTOR_OK: DoctorStatus = "ok"
DOCTOR_WARN: DoctorStatus = "warn"
DOCTOR_FAIL: DoctorStatus = "fail"
DOCTOR_SKIP: DoctorStatus = "skip"
DOCTOR_STATUSES: Tuple[DoctorStatus, ...] = (DOCTOR_OK, DOCTOR_WARN, DOCTOR_FAIL, DOCTOR_SKIP)


#: A GPU's health in a metrics sample (``Gpu.state``).
GpuState = Literal["ok", "lost"]
GPU_OK: GpuState = "ok"
GPU_LOST: GpuState = "lost"


class GpuProcess(TypedDict):
    """A compute process on a GPU; ``job`` is the gputui job owning the pid, if any.

    ``hidden``: the pid is not in the agent's /proc (another PID namespace: a pod); ``inferred``: its job was
    then matched by the GPUs the job was given (remote_agent/host/container.py), not proven by pid.
    """

    pid: int
    mem_mib: Optional[float]
    job: Optional[str]
    name: Optional[str]
    hidden: bool
    inferred: bool
    # from the agent's /proc (None for a pid not there: gone, or hidden): CPU % since the previous reading (100 =
    # one core; its first reading: its average since it started), resident memory
    cpu_percent: Optional[float]
    rss_mib: Optional[float]
    # the processes its main thread started (PyTorch's DataLoader workers) and their CPU % together
    children: Optional[int]
    children_cpu_percent: Optional[float]


class Container(TypedDict):
    """Whether the agent runs in a container, which runtime, and what gave it away."""

    in_container: bool
    runtime: Optional[str]
    signs: List[str]


class Gpu(TypedDict):
    """One GPU's reading in a metrics sample. Every reading may be None (not supported, or an error)."""

    index: int
    uuid: Optional[str]
    name: Optional[str]
    util_percent: Optional[float]
    mem_used_mib: Optional[float]
    mem_total_mib: Optional[float]
    temp_c: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    # read every few seconds only (slow to query: remote_agent/metrics/nvml.py's _read_slow)
    fan_percent: Optional[float]
    sm_clock_mhz: Optional[float]
    mem_clock_mhz: Optional[float]
    pstate: Optional[str]  # "P0" .. "P15"
    ecc_errors_uncorrected: Optional[int]  # volatile, since the driver loaded
    ecc_errors_uncorrected_aggregate: Optional[int]  # over the GPU's life (read with the settings)
    throttle_reasons: Optional[List[str]]  # short names: gpu_idle, sw_power_cap, hw_thermal, ...
    # NVML only: how long the driver has slowed the clocks for heat since it loaded (its thermal violation
    # counter), and the share of the last ``thermal_window_s`` so slowed: THROTTLE_WINDOW_S, or the span of the
    # agent's readings when shorter (None until they span a minute)
    thermal_violation_ms: Optional[float]
    thermal_slowdown_percent: Optional[float]
    thermal_window_s: Optional[float]
    persistence_mode: Optional[bool]
    # clocks at most, and the application clock (graphics) set now and by default: one set below its default
    # caps the GPU (``nvidia-smi -rac`` resets it), read once a minute with the settings
    sm_clock_max_mhz: Optional[float]
    mem_clock_max_mhz: Optional[float]
    app_clock_mhz: Optional[float]
    app_clock_default_mhz: Optional[float]
    # the PCIe link, read once a minute with the settings: its generation drops when the GPU idles, by design
    pcie_gen: Optional[int]
    pcie_gen_max: Optional[int]
    pcie_width: Optional[int]
    pcie_width_max: Optional[int]
    # NVML only: the NVLink links the GPU has and how many are up (None: no NVLink), read with the settings
    nvlink_links: Optional[int]
    nvlink_active: Optional[int]
    # memory rows remapped after uncorrectable errors (Ampere and newer), read with the settings: a remap pending
    # (applied at the next GPU reset) or one that failed (no spare row left)
    remap_pending: Optional[bool]
    remap_failed: Optional[bool]
    # memory pages retired after ECC errors (GPUs before Ampere), single- and double-bit, and whether a
    # retirement waits for the next reboot or driver reload
    retired_pages_single: Optional[int]
    retired_pages_double: Optional[int]
    retired_pages_pending: Optional[bool]
    processes: List[GpuProcess]
    # "ok", or "lost": the driver cannot reach this GPU (its handle or a read failed with "GPU is lost",
    # "Unknown Error", ...); the other GPUs keep reporting. ``error``: the driver's words; ``fix``: what to do.
    state: GpuState
    error: Optional[str]
    fix: Optional[str]
    # XID events and NVML's other critical events of the last day on this GPU, newest last (at most 5; the
    # sampler adds them from gpu_faults.jsonl: remote_agent/metrics/faults.py)
    faults: List["GpuFault"]


class GpuFault(TypedDict):
    """One fault the driver reported for a GPU."""

    t: float
    kind: str  # "xid", "memory page retired", "memory page retirement failed", "fatal poison error", ...
    xid: Optional[int]
    meaning: Optional[str]
    fix: Optional[str]


#: Clock-event reasons that slow the GPU you pay for (heat, hardware); ``sw_power_cap`` at full load is normal.
HW_THROTTLE = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
#: ``thermal_slowdown_percent`` is the share of this many seconds (a GPU card's "14 % of the last 10 min").
THROTTLE_WINDOW_S = 600.0
#: A GPU slowed for heat this share of that window (its driver's counter) is throttled, even when it is not at the
#: instant of the reading.
THERMAL_SHARE_PCT = 5.0
#: Retired memory pages (GPUs before Ampere): the driver retires at most 64; this many leaves little to spare.
RETIRED_PAGES_LIMIT = 60
#: Below this utilisation a GPU counts as idle in a run's record (the hosts' default ``idle_util_percent``).
IDLE_UTIL_PERCENT = 5.0

#: Every field of a GPU reading, in order; the samplers produce exactly these.
GPU_FIELDS: Tuple[str, ...] = tuple(Gpu.__annotations__)


class GpuFact(TypedDict):
    """A GPU as the host's facts list it."""

    index: int
    uuid: Optional[str]
    name: Optional[str]
    mem_total_mib: Optional[float]


class GpuFacts(TypedDict):
    """What a GPU source knows for good: the driver and the GPUs."""

    driver_version: Optional[str]
    cuda_version: Optional[str]
    nvml_version: Optional[str]
    gpus: List[GpuFact]


class HostFacts(GpuFacts, total=False):
    """The ``host`` of the hello event (empty until the client has them)."""

    hostname: str
    boot_id: Optional[str]
    boot_time: Optional[float]
    cpu_count: Optional[int]
    python: str
    python_executable: str
    tmux_version: Optional[str]
    tmux_socket: str
    state_dir: str
    user: str
    agent_pid: int
    gpu_source: Optional[str]  # "nvml", "nvidia-smi" or None
    gpu_error: Optional[str]  # why there are no GPU readings, or why a lesser source is used
    container: Container
    instance: Optional["InstanceFact"]  # the RunPod pod / vast.ai instance this host is (None: neither)


class InstanceFact(TypedDict):
    """Which provider instance the host is, as ``remote_agent.host.provider.detect`` finds it (never its key)."""

    provider: str  # "runpod" / "vastai"
    instance_id: str


class HostReading(TypedDict, total=False):
    """The host's own readings in a metrics sample (remote_agent/host/stats.py)."""

    cpu_percent: Optional[float]
    cpu_count: Optional[float]  # a container's CPU quota may be fractional
    cpu_scope: Literal["cgroup", "host"]  # "cgroup": of the container's limit, not the machine's
    mem_scope: Literal["cgroup", "host"]
    load1: Optional[float]
    load5: Optional[float]
    load15: Optional[float]
    mem_used_mib: Optional[float]
    mem_total_mib: Optional[float]
    disk_free_gib: Optional[float]
    disk_total_gib: Optional[float]
    uptime_s: Optional[float]


class Activity(TypedDict, total=False):
    """Idleness as the agent sees it; ``watchdog``: the autostop state (remote_agent/watchdog/daemon.py)."""

    reasons: List[str]  # why the host is not idle
    idle_since: float
    idle_seconds: float
    watchdog: Dict[str, Any]


class MetricsSample(TypedDict, total=False):
    """Result of ``metrics.sample`` and the data of a ``metrics`` event."""

    seq: int
    t: float
    host: HostReading
    gpus: List[Gpu]
    gpu_source: Optional[str]
    gpu_error: Optional[str]
    activity: Activity


class QueueRequest(TypedDict, total=False):
    """What a queued job waits for (``jobs.start`` args ``queue``; remote_agent/jobs/queue.py)."""

    gpus: Optional[str]  # None: every GPU; "0,1": those GPUs; "none": no GPU
    gpu_count: Optional[int]  # instead of gpus: any this many free GPUs
    after: List[str]  # job ids that must end first
    after_ok: List[str]  # job ids that must succeed first
    idle_util_percent: float  # a GPU at or above this utilisation is busy
    queued_at: float  # set by the agent
class SlurmJob(TypedDict, total=False):
    """A Slurm job's request and Slurm's word on it (remote_agent/jobs/slurm.py)."""

    job_id: str  # Slurm's job id
    state: Optional[str]  # Slurm's state: PENDING, RUNNING, COMPLETED, TIMEOUT, ...
    reason: Optional[str]  # why it waits (Resources, Priority, ...) or how it ended
    nodes: Optional[str]  # the allocated node list
    error: str  # Slurm could not be asked (squeue failed): the state is the last one known
    gpus: int  # what was asked: GPUs per node, nodes, partition, time limit, extra sbatch options
    nodes_count: int
    partition: str
    time: str
    sbatch_args: List[str]
    launcher: str  # "torchrun": gputui writes the torchrun line (one srun step over the nodes)


class SlurmRequest(TypedDict, total=False):
    """The ``slurm`` args of ``jobs.start``: submit with sbatch instead of starting in tmux. More than one node
    (or a launcher): the command runs once per node in one ``srun --label`` step."""

    gpus: int
    nodes: int
    partition: str
    time: str
    sbatch_args: List[str]
    launcher: str  # "torchrun": rendezvous from the allocation, --nproc_per_node from gpus


class ContainerRequest(TypedDict, total=False):
    """The ``container`` args of ``jobs.start``: run the command in a container of ``image``
    (remote_agent/jobs/image.py); the record's ``container`` adds the engine found and the state dir's tag."""

    image: str  # as asked (a name:tag, name@digest or an image ID); or ``build``:
    build: Dict[str, str]  # {"dockerfile": path in the job's dir}: built on the host first, tagged by the tree
    args: List[str]  # extra engine options, each one option with its value joined by "="
    engine: str  # "auto" (docker, else podman), "docker" or "podman"


class Partition(TypedDict):
    """A Slurm partition as ``slurm.info`` lists it; GPUs summed over its nodes."""

    name: str
    default: bool
    available: str  # up, down, drain, inact
    time_limit: str
    nodes: int
    gpus: int
    gpus_used: int


class SlurmNode(TypedDict):
    name: str
    partitions: List[str]
    state: str  # idle, mixed, allocated, down, drained, ...
    gpus: Optional[int]  # None: no GPU GRES
    gpus_used: Optional[int]
    cpus_alloc: Optional[int]
    cpus: Optional[int]
    reason: Optional[str]  # why it is down or drained


class ClusterInfo(TypedDict):
    """Result of ``slurm.info``: one sinfo call. ``partitions`` and ``nodes`` hold the first ones (at most
    slurm.MAX_PARTITIONS, slurm.MAX_NODES and MAX_NODE_BYTES); ``partitions_total`` and ``nodes_total`` count all."""

    partitions: List[Partition]
    partitions_total: int
    nodes: List[SlurmNode]
    nodes_total: int
    error: Optional[str]  # sinfo failed: why (the lists are empty)
    t: float


class JobRecord(TypedDict, total=False):
    """A job as ``jobs.*`` replies and ``job`` events carry it (remote_agent/jobs/store.py)."""

    id: str
    name: str
    state: JobState
    argv: List[str]
    argv_truncated: Dict[str, int]  # listings cut long commands: {"args", "chars"} of the whole
    cwd: Optional[str]
    gpus: Optional[str]
    env: Dict[str, str]
    created_at: float
    started_at: Optional[float]
    ended_at: Optional[float]
    exit_code: Optional[int]
    pid: Optional[int]
    log_size: int
    tmux_session: str
    tmux_socket: str
    nvidia_smi: str
    git: Optional[Dict[str, Any]]  # {"commit", "branch", "dirty"}
    code: Dict[str, Any]  # what code ran (gputui run --sync): tree hash, files, dir, git commit, dirty
    artifacts: List[str]  # files to bring back before release (gputui run --artifacts), relative to cwd
    container: ContainerRequest  # set on a job run in an image
    group: "GroupRequest"  # set on a part of a job over several hosts (no key)
    image_id: Optional[str]  # the image the container ran, resolved by the engine (None until it is known)
    env_keys: List[str]  # the names of the env the job was given (its values never travel: they may be secrets)
    secrets: List[str]  # the names of its secrets (gputui run --secret): the values are never in a record
    gpu_inventory: List[GpuFact]
    price_per_hour: Optional[float]
    usage: Optional[Dict[str, Any]]  # peak GPU memory, mean utilisation (remote_agent/jobs/usage.py)
    error: str  # this job's own problem (unreadable files)
    log_error: str  # e.g. "disk full at offset N": the log stops there
    restart: Dict[str, Any]  # its restart policy: {"policy", "max", "backoff_s", ...} (remote_agent/jobs/restart.py)
    attempts: List[Dict[str, Any]]  # each ended attempt: attempt, started_at, ended_at, exit_code, hint, progress
    attempt: Optional[int]  # the attempt that runs (or waits to)
    restart_at: float  # when the next attempt starts (set while it waits)
    restart_pending: bool  # between attempts: no runner, not over
    stalled: bool  # set only on a running job the watchdog found stalled (remote_agent/watchdog/stall.py)
    stalled_since: float  # when it was last seen active (a busy GPU, a growing log)
    stalled_reason: str
    queue: QueueRequest  # set on a job submitted to the queue (remote_agent/jobs/queue.py)
    dequeued_at: float  # when the scheduler picked it
    start_attempts: int
    queue_position: int  # set only while queued: 1 = next
    queue_reason: str  # set only while queued: what it waits for
    scheduler: str  # "slurm" for a job Slurm runs (absent: tmux on the host)
    slurm: SlurmJob


class DoctorCheck(TypedDict):
    id: str
    title: str
    status: DoctorStatus
    detail: str
    fix: str  # empty when ok


# Each op's args (all optional on the wire unless said) and result.
class StartArgs(TypedDict, total=False):
    argv: List[str]  # required
    cwd: Optional[str]
    env: Dict[str, str]
    name: Optional[str]
    gpus: Optional[str]  # CUDA_VISIBLE_DEVICES
    price_per_hour: Optional[float]
    code: Dict[str, Any]  # see JobRecord.code
    queue: QueueRequest  # wait on the host for GPUs and other jobs instead of starting now
    artifacts: List[str]  # see JobRecord.artifacts
    slurm: SlurmRequest  # submit to Slurm (the host is a Slurm login node)
    restart: Dict[str, Any]  # restart policy: {"policy": "on-failure", "max", "resume_from", "backoff_s", ...}
    secrets: Dict[str, str]  # variables whose values never rest in the record (remote_agent/jobs/secrets.py)
    container: ContainerRequest  # run the command in a container image (not with slurm)
    group: "GroupRequest"  # one part of a job over several hosts (remote_agent/jobs/group.py)


class GroupRequest(TypedDict, total=False):
    """A part of a job over several hosts: every host's name (rank order), this part's rank, the rendezvous;
    ``key`` (the hub's HMAC key) only in the start request, never in a record."""

    id: str
    hosts: List[str]
    rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    hub_port: int
    lost_s: float
    launcher: Optional[str]
    key: str


class GroupCheckArgs(TypedDict, total=False):
    argv: List[str]
    cwd: Optional[str]
    path: Optional[str]  # the job's PATH (--env PATH=...), else the agent's
    launcher: Optional[str]
    ports: bool  # rank 0: pick the rendezvous and hub ports, and the routes to ``peers``
    peers: List[str]


class GroupCheckResult(TypedDict, total=False):
    address: Optional[str]  # this host's address as the SSH client reached it
    gpu_count: int
    problems: List[str]  # why this host's part cannot run (empty: it can)
    ports: List[int]
    routes: Dict[str, Optional[str]]  # peer address -> the address this host sends from to reach it


class JobArgs(TypedDict):
    """Args of ``jobs.get`` and ``logs.unfollow``."""

    job: str


class ListArgs(TypedDict, total=False):
    after: int  # job id: the page starts after it
    limit: int


class ListResult(TypedDict):
    jobs: List[JobRecord]
    more: bool


class QueueMoveArgs(TypedDict):
    job: str
    to: int  # the new position, 1 = next


class QueueListResult(TypedDict):
    jobs: List[JobRecord]  # queued jobs in order, each with queue_position and queue_reason
    more: int  # queued jobs after these, left out to keep the reply bounded (LIST_PAGE_BYTES)
    resumed_at: Optional[float]  # when the queue resumed after a reboot, if it did
    scheduler_t: Optional[float]  # the scheduler's last pass


class KillArgs(JobArgs, total=False):
    grace_s: float
    queued_only: bool  # only take it out of the host's queue: refused (nothing killed) when it left the queue


class ReadArgs(JobArgs, total=False):
    offset: int
    tail_lines: int  # start this many lines before the end instead
    max_bytes: int


class ReadResult(TypedDict):
    offset: int
    b64: str
    size: int
    path: str  # the log on the host: what the agent's ``cat`` streams a catch-up from


class FollowArgs(JobArgs, total=False):
    offset: int


class FollowResult(TypedDict):
    job: str
    offset: int


class TimesArgs(JobArgs, total=False):
    start: int
    end: int


class TimesResult(TypedDict):
    times: List[List[float]]  # [[offset, unix time], ...]


class TailsArgs(TypedDict, total=False):
    jobs: List[str]  # at most TAILS_JOBS
    max_bytes: int  # of each tail, at most TAIL_MAX_BYTES


class SeriesData(TypedDict):
    points: List[List[Optional[float]]]  # [[line, step or None, epoch or None, value], ...], bounded
    count: int  # values seen (the points are a downsampled part of them)
    last: float
    low: float
    high: float


class SeriesResult(TypedDict):
    job: str
    series: Dict[str, SeriesData]  # by metric name (text from the log)
    offset: int  # how far the log is read; below ``size``: ask again for the rest
    size: int
    done: bool  # the job ended and its whole log is read: the series are final
    lines: int


class _TailBase(TypedDict):
    job: str


class Tail(_TailBase, total=False):
    offset: int  # where b64 starts in the log (required unless error)
    size: int  # the log's size when read
    b64: str
    times: List[List[float]]  # as TimesResult, for offset..offset+len(bytes)
    error: str  # this job's log cannot be read (the other fields are missing)


class TailsResult(TypedDict):
    tails: List[Tail]  # for the first jobs asked, in order; ask again for the rest


class IdleRule(TypedDict, total=False):
    idle_util_percent: float
    count_sessions: bool


class SubscribeArgs(IdleRule, total=False):
    interval: Optional[float]  # None: stop pushing
    since_seq: Optional[int]


class SubscribeResult(TypedDict):
    interval: Optional[float]
    backlog: List[MetricsSample]


class ExecArgs(TypedDict, total=False):
    argv: List[str]  # required
    timeout_s: float


class ExecResult(TypedDict):
    exit_code: int
    stdout: str
    stderr: str


class WatchdogConfigureArgs(TypedDict):
    config: Dict[str, Any]  # the client's autostop settings (gputui/core/money/release.py)


class WatchdogConfigureResult(TypedDict):
    armed: bool
    started: bool
    config: Optional[Dict[str, Any]]
    autostart: Dict[str, Any]  # resume_on_boot's crontab line: {"ok", "changed", "detail"}


class NotifyTestArgs(TypedDict):
    notify: Dict[str, Any]  # {"webhook", "command", "events", "host"} (remote_agent/watchdog/notify.py)


class NotifyTestResult(TypedDict):
    sent: bool
    error: Optional[str]  # what failed, when not sent


class ReleaseCheckArgs(TypedDict, total=False):
    release_remote: Optional[List[str]]  # the user's command (wins where set)
    provider: str  # the host's provider setting: auto, runpod, vastai, lambda, none
    release_mode: Optional[str]  # stop / terminate; None: stop where the provider can
    api_urls: Dict[str, str]  # [providers.NAME] api_url by provider


class ReleaseCheckResult(TypedDict, total=False):
    ok: bool
    via: str  # "command", "runpod", "vastai" or "none"
    detail: str  # what was proved, or why it failed
    t: float  # when
    instance_id: str
    mode: str
    state: str
    price_per_hour: Optional[float]
    price_per_hour_unknown: str  # why the provider's price was unusable (it is display-only: "price unknown")
    started_at: Optional[float]
    kind: str  # the ProviderError kind, when it failed


class ReleaseProviderArgs(TypedDict, total=False):
    provider: str
    release_mode: Optional[str]
    api_urls: Dict[str, str]
    release_timeout: float  # how long the state is read back for


class ReleaseInstanceArgs(TypedDict, total=False):
    provider: str  # the host's provider setting
    api_urls: Dict[str, str]


class ReleaseInstanceResult(TypedDict, total=False):
    found: bool  # a RunPod / vast.ai instance was found on the host (the provider setting allowing it)
    provider: str
    instance_id: str
    state: str
    price_per_hour: Optional[float]  # the provider's figure now (None: it gave none usable)
    price_unknown: str  # why not
    interruptible: Optional[bool]  # a spot / interruptible instance
    error: str  # why the provider could not be read
    t: float


class ReleaseProviderResult(TypedDict):
    found: bool  # a RunPod / vast.ai instance was found on the host (the provider setting allowing it)
    released: bool  # the provider confirmed it stopped / terminated
    how: str  # how it was confirmed
    error: Optional[str]  # why not


class SnoozeArgs(TypedDict, total=False):
    minutes: float


class DoctorArgs(TypedDict, total=False):
    python: Optional[str]  # the interpreter the jobs use
    timeout_s: float




class DoctorResult(TypedDict):
    checks: List[DoctorCheck]
    python: Optional[str]  # the interpreter the torch probe ran
    state_dir: str
    agent_python: str
    t: float


class FilesListArgs(TypedDict, total=False):
    """``files.list``: the files under ``base`` (default ``~``) matching the glob ``patterns``."""

    base: str
    patterns: List[str]


class FilesReadArgs(TypedDict, total=False):
    """``files.read``: at most ``max_bytes`` (default and most ``FILE_CHUNK_BYTES``) of ``path`` from ``offset``."""

    path: str
    offset: int
    max_bytes: int


class FilesHashArgs(TypedDict):
    """``files.hash``: the sha256 of ``path``."""

    path: str


class FilesCommit(TypedDict, total=False):
    """The last chunk of a ``files.write``: the whole file's sha256, its mode and mtime."""

    sha256: str
    mode: int
    mtime_ns: int


class FilesWriteArgs(TypedDict, total=False):
    """``files.write``: one chunk of the file ``rel`` in the sync ``target``, into its part file ``part``
    (``truncate``: the first chunk, which creates it); ``commit`` with the last chunk puts it in place."""

    target: str
    rel: str
    part: str
    b64: str
    offset: int
    truncate: bool
    commit: FilesCommit


class FilesManifestArgs(TypedDict, total=False):
    """``files.manifest``: the target's entries after ``after``; ``expect``: the client's tree hash."""

    target: str
    after: str
    expect: str


class FilesDeleteArgs(TypedDict, total=False):
    """``files.delete``: the files ``rels`` that sync wrote into ``target`` (and nothing else)."""

    target: str
    rels: List[str]


class PingResult(TypedDict):
    t: float


# Each event's data.
class Hello(TypedDict):
    protocol: int
    build: str
    host: HostFacts


class _LogBase(TypedDict):
    job: str
    offset: int


class LogData(_LogBase, total=False):
    b64: str  # required: the bytes from offset on
    reset: str  # "truncated", "replaced" or "deleted": the log starts again at offset 0 ...
    lost_from: int  # ... and what was past this offset is gone
    error: str  # the log cannot be read now (b64 is empty)


class LogEndData(_LogBase, total=False):
    job_state: Optional[JobState]  # required: None when the follow failed (error says why)
    exit_code: Optional[int]
    error: str


# --- the op table -------------------------------------------------------------------------------------------------
class Op(NamedTuple):
    """What one op takes and answers: its args' TypedDict (None: no args) and its result's type."""

    args: Any
    result: Any


#: Every op the agent answers, the one table both sides are checked against: the agent dispatches exactly these
#: (remote_agent/ops/), HostSession is the only client of them (gputui/core/session/host.py), the tests check each
#: op's args and result against it, and ``check_args`` refuses a field of the wrong type before an op runs.
#: (``flow.credit`` is no op: it has no id and is never answered.)
OPS: Dict[str, Op] = {
    OP_PING: Op(None, PingResult),
    OP_EXEC: Op(ExecArgs, ExecResult),
    OP_SHUTDOWN: Op(None, None),
    OP_DOCTOR: Op(DoctorArgs, DoctorResult),
    OP_SLURM_INFO: Op(None, ClusterInfo),
    OP_JOBS_GROUP_CHECK: Op(GroupCheckArgs, GroupCheckResult),
    OP_JOBS_START: Op(StartArgs, JobRecord),
    OP_JOBS_LIST: Op(ListArgs, ListResult),
    OP_JOBS_GET: Op(JobArgs, JobRecord),
    OP_JOBS_KILL: Op(KillArgs, JobRecord),
    OP_QUEUE_LIST: Op(None, QueueListResult),
    OP_QUEUE_MOVE: Op(QueueMoveArgs, QueueListResult),
    OP_LOGS_READ: Op(ReadArgs, ReadResult),
    OP_LOGS_FOLLOW: Op(FollowArgs, FollowResult),
    OP_LOGS_UNFOLLOW: Op(JobArgs, None),
    OP_LOGS_TIMES: Op(TimesArgs, TimesResult),
    OP_LOGS_TAILS: Op(TailsArgs, TailsResult),
    OP_LOGS_SERIES: Op(JobArgs, SeriesResult),
    OP_METRICS_SUBSCRIBE: Op(SubscribeArgs, SubscribeResult),
    OP_METRICS_SAMPLE: Op(IdleRule, MetricsSample),
    OP_WATCHDOG_CONFIGURE: Op(WatchdogConfigureArgs, WatchdogConfigureResult),
    OP_WATCHDOG_SNOOZE: Op(SnoozeArgs, Dict[str, Any]),
    OP_WATCHDOG_CANCEL: Op(None, Dict[str, Any]),
    OP_NOTIFY_TEST: Op(NotifyTestArgs, NotifyTestResult),
    OP_RELEASE_CHECK: Op(ReleaseCheckArgs, ReleaseCheckResult),
    OP_RELEASE_PROVIDER: Op(ReleaseProviderArgs, ReleaseProviderResult),
    OP_RELEASE_INSTANCE: Op(ReleaseInstanceArgs, ReleaseInstanceResult),
    # files.*: the answers are checked field by field by the client (gputui/core/files/wire.py)
    OP_FILES_LIST: Op(FilesListArgs, Dict[str, Any]),
    OP_FILES_READ: Op(FilesReadArgs, Dict[str, Any]),
    OP_FILES_HASH: Op(FilesHashArgs, Dict[str, Any]),
    OP_FILES_WRITE: Op(FilesWriteArgs, Dict[str, Any]),
    OP_FILES_MANIFEST: Op(FilesManifestArgs, Dict[str, Any]),
    OP_FILES_DELETE: Op(FilesDeleteArgs, Dict[str, Any]),
}
#: Each op's args schema (the ops that have one).
OP_ARGS: Dict[str, Any] = {name: op.args for name, op in OPS.items() if op.args is not None}


# --- the codec ----------------------------------------------------------------------------------------------------
class ProtocolError(ValueError):
    """A frame that does not follow the protocol."""


class Raw(str):
    """A reply result that is JSON text already (ASCII): ``encode`` splices it in as it is."""


def encode(frame: Dict[str, Any]) -> bytes:
    """Serialise one frame to a newline-terminated line."""
    if isinstance(frame.get("result"), Raw):
        head = json.dumps({k: v for k, v in frame.items() if k != "result"}, separators=(",", ":"))
        line: str = head[:-1] + ',"result":' + frame["result"] + "}\n"
        return line.encode("ascii")
    data = frame.get("data")
    if frame.get("event") == EV_LOG and isinstance(data, dict) and len(data.get("b64") or "") > 4096:
        # Fast path for big log chunks: base64 needs no JSON escaping, so splice it in unscanned.
        rest = {k: v for k, v in data.items() if k != "b64"}
        head = json.dumps({"event": EV_LOG, "data": rest}, separators=(",", ":"), ensure_ascii=True)
        line = head[:-2] + ',"b64":"' + data["b64"] + '"}}\n'
        return line.encode("ascii")
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"


def decode(line: bytes, finite: bool = False) -> Dict[str, Any]:
    """Parse one line into a frame dict, raising ProtocolError with a readable reason.

    ``finite`` (the agent reading requests) refuses NaN, Infinity and numbers beyond a float's range.
    """
    if len(line) > MAX_FRAME_BYTES:
        raise ProtocolError("frame of %d bytes exceeds the %d byte limit" % (len(line), MAX_FRAME_BYTES))
    hooks: Dict[str, Any] = {"parse_constant": _no_constant, "parse_float": _finite_float} if finite else {}
    try:
        frame = json.loads(line.decode("utf-8"), **hooks)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("not a JSON line: %s" % exc) from None
    except RecursionError:
        raise ProtocolError("JSON nested too deeply") from None
    if not isinstance(frame, dict):
        raise ProtocolError("frame is %s, not an object" % type(frame).__name__)
    return frame


_FRAME_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(-?\d{1,18})\s*[,}]')


def frame_id(head: bytes) -> Optional[int]:
    """The request id at the start of a frame that cannot be parsed (oversized or malformed), if it has one.

    Requests are encoded with ``id`` first, so an error reply can still go to the request it answers.
    """
    match = _FRAME_ID.match(head[:64])
    return int(match.group(1)) if match else None


def _no_constant(name: str) -> float:
    raise ValueError("%s is not a number JSON allows" % name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number %s is out of range" % text[:40])
    return value


def request(req_id: int, op: str, args: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"id": req_id, "op": op, "args": args or {}}


def reply_ok(req_id: Any, result: Any = None) -> Dict[str, Any]:
    return {"id": req_id, "ok": True, "result": result}


def reply_error(req_id: Any, code: str, message: str) -> Dict[str, Any]:
    return {"id": req_id, "ok": False, "error": {"code": code, "message": message}}


def event(name: str, data: Any = None) -> Dict[str, Any]:
    return {"event": name, "data": data}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


# --- argument checks ----------------------------------------------------------------------------------------------
def number_arg(args: Dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    """``args[key]`` as a finite number within [lo, hi] (``default`` when absent); ValueError otherwise."""
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("%s must be a number, not %s" % (key, type(value).__name__))
    try:
        number = float(value)
    except ValueError:
        raise ValueError("%s must be a number, not %r" % (key, str(value)[:40])) from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise ValueError("%s must be between %g and %g, not %s" % (key, lo, hi, str(value)[:40]))
    return number


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
          dict: "an object", type(None): "null"}
_KINDS_OF: Dict[Any, Tuple[type, ...]] = {list: (list,), dict: (dict,), str: (str,)}
_HINTS: Dict[Any, Dict[str, Any]] = {}  # a TypedDict's field types, looked up once


def check_args(op: str, args: Dict[str, Any]) -> None:
    """ValueError naming the first field of ``args`` whose type is not the one ``OP_ARGS`` gives it (a field that
    is null or not in the schema is left to the op's handler)."""
    schema = OP_ARGS.get(op)
    why = None if schema is None else _wrong(args, schema, "")
    if why:
        raise ValueError(why)


def _kind(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Union:
        return " or ".join(_kind(a) for a in get_args(tp))
    if origin is Literal:
        return "one of %s" % ", ".join(map(repr, get_args(tp)))
    return _KINDS.get(origin or tp, "an object")


def _wrong(value: Any, tp: Any, where: str) -> Optional[str]:
    """Why ``value`` (parsed JSON) is not of schema type ``tp``, naming the field (``where``); None when it is."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return None
    if origin is Union:
        if any(_wrong(value, a, where) is None for a in args):
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and isinstance(value, _KINDS_OF.get(get_origin(inner[0]) or inner[0], ())):
            return _wrong(value, inner[0], where)  # the right kind with a wrong part: name that part
    elif origin is Literal:
        if value in args:
            return None
    elif origin is list and isinstance(value, list):
        return next((w for i, v in enumerate(value) for w in [_wrong(v, args[0], "%s[%d]" % (where, i))] if w), None)
    elif origin is dict and isinstance(value, dict):
        return next((w for k, v in value.items() for w in [_wrong(v, args[1], _field(where, k))] if w), None)
    elif isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__") and isinstance(value, dict):
        hints = _HINTS.get(tp)
        if hints is None:
            hints = _HINTS[tp] = get_type_hints(tp)
        fields = ((k, v) for k, v in value.items() if k in hints and v is not None)  # null: not given
        return next((w for k, v in fields for w in [_wrong(v, hints[k], _field(where, k))] if w), None)
    elif tp in (int, float):
        if isinstance(value, int if tp is int else (int, float)) and not isinstance(value, bool):
            return None
    elif isinstance(tp, type) and origin is None and not issubclass(tp, dict) and isinstance(value, tp):
        return None
    return "%s must be %s, not %s" % (where or "args", _kind(tp), _KINDS.get(type(value), type(value).__name__))


def _field(where: str, key: str) -> str:
    return "%s.%s" % (where, key[:100]) if where else key[:100]


def int_arg(args: Dict[str, Any], key: str, default: int, lo: int = 0, hi: int = 2**62) -> int:
    """``args[key]`` as a whole number within [lo, hi] (``default`` when absent); ValueError otherwise."""
    number = number_arg(args, key, default, lo, hi)
    if number != int(number):
        raise ValueError("%s must be a whole number, not %s" % (key, str(args.get(key))[:40]))
    return int(number)

"""The agent's serve loop: JSON lines on stdin/stdout, requests answered, events pushed.

The agent opens no port. It exits when stdin closes or the client stays silent for ``idle_timeout`` seconds;
jobs keep running in tmux either way.
"""

import getpass
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from . import container, notify
from . import files as F
from . import protocol as P
from . import slurm as S
from . import watchdog as W
from .activity import ActivityLog, idle_status
from .boot import boot_id, boot_time
from .doctor import run_doctor
from .flow import Credit
from .fsutil import read_json, write_json
from .jobs import JobError, JobStore
from .logclock import TIMES_NAME, read_times
from .logs import Follow, read_chunk, tail_offset
from .mring import MetricsRing
from .queue import JobQueue, never_fits, parse_request

#: Longest wait an argument may ask for (kill grace, exec timeout): a day.
MAX_WAIT_S = 86400.0
#: Shortest metrics interval a client may ask for.
MIN_INTERVAL_S = 0.1


def _tmux_version() -> Optional[str]:
    try:
        out = subprocess.run(["tmux", "-V"], capture_output=True, timeout=5).stdout.decode().strip()
        return out.split(" ", 1)[1] if " " in out else out or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_id() -> str:
    """The content hash carried in the build's name (``gputui-agent-<hash>``, unpacked, or the zipapp
    ``gputui-agent-<hash>.pyz``), or ``dev`` from source."""
    name = os.path.basename((sys.argv[0] if sys.argv else "").rstrip("/"))
    if name.endswith(".pyz"):
        name = name[: -len(".pyz")]
    return name[len("gputui-agent-") :] if name.startswith("gputui-agent-") else "dev"


_WATCHDOG_NUMBERS = {
    "autostop_minutes": (0.0, 1e9), "release_at": (-1e12, 1e12), "interval": (0.5, 3600.0),
    "idle_util_percent": (0.0, 100.0), "release_timeout": (0.0, 86400.0), "pre_stop_timeout": (0.0, 86400.0),
    "stall_minutes": (0.0, 1e9),
}  # fmt: skip


class Agent:
    def __init__(
        self,
        state_dir: str,
        launcher: List[str],
        inp: BinaryIO,
        out: BinaryIO,
        idle_timeout: float = 30.0,
        heartbeat_s: float = 2.0,
        nvidia_smi: str = "nvidia-smi",
        linger_s: float = 60.0,
    ) -> None:
        from .metrics import MetricsSampler

        self.jobs = JobStore(state_dir, launcher, nvidia_smi)
        self.queue = JobQueue(self.jobs, lambda message: W.log_line(self.jobs.state_dir, message))
        self.launcher = launcher
        self.activity = ActivityLog(self.jobs.state_dir)
        self.idle_rule: Dict[str, Any] = {"idle_util_percent": 5.0, "count_sessions": True}
        self.inp, self.out = inp, out
        self.idle_timeout, self.heartbeat_s = idle_timeout, heartbeat_s
        self.sampler = MetricsSampler(self.jobs.state_dir, nvidia_smi=nvidia_smi)
        self.node_gpus = S.NodeGpus(launcher, self.jobs.state_dir, nvidia_smi)  # running Slurm jobs' nodes
        self._out_lock = threading.Lock()
        self.credit = Credit()
        self._last_rx = time.monotonic()
        self._follows: Dict[str, Follow] = {}
        # Metrics: one agent per state dir samples into the on-disk ring; each agent pushes its client what
        # the ring holds past the client's last seq. That keeps history whole across agent restarts.
        self.ring = MetricsRing(self.jobs.state_dir)
        self.linger_s = linger_s
        self._pushed_seq: Optional[int] = None  # newest seq sent to this client; None: not subscribed
        self._push_lock = threading.Lock()
        self._ring_lock = threading.Lock()
        self._push_wake = threading.Event()
        self._client_gone = threading.Event()  # stdin closed, output broken, or the client went silent
        self._metrics_interval: Optional[float] = None
        self._metrics_wake = threading.Event()
        self._stopping = threading.Event()
        self.handlers: Dict[str, Callable[[Dict[str, Any]], Any]] = {
            P.OP_PING: lambda a: {"t": time.time()},
            P.OP_HOST_INFO: lambda a: self.facts(),
            P.OP_JOBS_START: self.op_start,
            P.OP_JOBS_LIST: lambda a: self._mark_page(
                self.jobs.page(
                    P.int_arg(a, "after", 0),
                    P.int_arg(a, "limit", P.LIST_PAGE_JOBS, 1, P.LIST_PAGE_JOBS),
                    P.LIST_PAGE_BYTES,
                )
            ),
            P.OP_JOBS_GET: lambda a: self._mark(self.jobs.full_record(str(a.get("job")))),
            P.OP_JOBS_KILL: self.op_kill,
            P.OP_QUEUE_LIST: lambda a: self.queue_listing(),
            P.OP_QUEUE_MOVE: self.op_queue_move,
            P.OP_LOGS_READ: self.op_read,
            P.OP_LOGS_FOLLOW: self.op_follow,
            P.OP_LOGS_UNFOLLOW: self.op_unfollow,
            P.OP_LOGS_TIMES: self.op_times,
            P.OP_LOGS_TAILS: self.op_tails,
            P.OP_METRICS_SUBSCRIBE: self.op_subscribe,
            P.OP_METRICS_SAMPLE: self.op_sample,
            P.OP_SHUTDOWN: self.op_shutdown,
            P.OP_EXEC: self.op_exec,
            P.OP_WATCHDOG_CONFIGURE: self.op_watchdog_configure,
            P.OP_WATCHDOG_SNOOZE: self.op_watchdog_snooze,
            P.OP_WATCHDOG_CANCEL: self.op_watchdog_cancel,
            P.OP_NOTIFY_TEST: self.op_notify_test,
            P.OP_DOCTOR: lambda a: run_doctor(self.sampler, self.jobs.state_dir, a),
            P.OP_FILES_LIST: lambda a: F.list_files(str(a.get("base") or "~"), a.get("patterns")),
            P.OP_FILES_READ: lambda a: F.read_range(
                str(a.get("path")),
                P.int_arg(a, "offset", 0),
                P.int_arg(a, "max_bytes", P.FILE_CHUNK_BYTES, 0, P.FILE_CHUNK_BYTES),
            ),
            P.OP_FILES_HASH: lambda a: F.file_hash(str(a.get("path"))),
            P.OP_FILES_WRITE: lambda a: F.write_file(self.jobs.state_dir, a),
            P.OP_FILES_MANIFEST: lambda a: F.manifest_page(self.jobs.state_dir, a),
            P.OP_FILES_DELETE: lambda a: F.delete_files(self.jobs.state_dir, a),
            P.OP_SLURM_INFO: lambda a: S.cluster_info(),
        }
        self._facts: Optional[P.HostFacts] = None

    # --- output -----------------------------------------------------------------------------------------------
    def send(self, frame: Dict[str, Any]) -> None:
        if self._client_gone.is_set():
            return
        data = P.encode(frame)
        if len(data) > P.MAX_FRAME_BYTES:  # the client would refuse it: say why instead
            if "id" not in frame:
                return
            data = P.encode(P.reply_error(frame["id"], P.E_FAILED, "reply of %d bytes exceeds the %d byte "
                                          "frame limit" % (len(data), P.MAX_FRAME_BYTES)))  # fmt: skip
        with self._out_lock:
            try:
                self.out.write(data)
                self.out.flush()
                self.credit.sent_bytes(len(data))
            except (OSError, ValueError):
                self._client_gone.set()

    def emit(self, name: str, data: Any = None) -> None:
        self.send(P.event(name, data))

    def facts(self) -> P.HostFacts:
        if self._facts is not None:
            return self._facts
        facts: P.HostFacts = {
            "hostname": socket.gethostname(),
            "boot_id": boot_id(),
            "boot_time": boot_time(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "python_executable": sys.executable,
            "tmux_version": _tmux_version(),
            "tmux_socket": self.jobs.socket,
            "state_dir": self.jobs.state_dir,
            "user": getpass.getuser(),
            "agent_pid": os.getpid(),
            "container": container.detect(),
        }
        facts.update(self.sampler.facts())
        self._facts = facts
        return facts

    # --- handlers ---------------------------------------------------------------------------------------------
    def op_start(self, a: P.StartArgs) -> P.JobRecord:
        price = None if a.get("price_per_hour") is None else P.number_arg(a, "price_per_hour", 0.0, 0.0, 1e9)
        extra = {"gpu_inventory": self.facts().get("gpus") or [], "price_per_hour": price}
        code = a.get("code")  # what code ran (gputui run --sync): tree hash, git commit and dirty flag
        if isinstance(code, dict) and len(P.encode(code)) <= 4096:
            extra["code"] = code
        arts = a.get("artifacts")  # what to bring back before release (gputui run --artifacts)
        if isinstance(arts, list) and all(isinstance(x, str) for x in arts) and len(json.dumps(arts)) <= 4096:
            extra["artifacts"] = arts
        if a.get("queue") is not None and a.get("slurm") is not None:
            raise JobError("a Slurm job waits in Slurm's queue, not the host's: drop --queue", "bad_args")
        if a.get("queue") is not None:  # wait on the host for its GPUs (remote_agent/queue.py)
            request = parse_request(a.get("queue"))
            never = never_fits(request, self.facts().get("gpus") or [])
            if never:
                raise JobError(never, "bad_args")
            job_id = self.queue.submit(
                request, a.get("argv"), a.get("cwd"), a.get("env"), a.get("name"), extra, self.facts()["boot_id"]
            )
            W.ensure_running(self.jobs.state_dir, self.launcher)
            job = self._mark(self.jobs.describe(job_id))
        else:
            job = self.jobs.start(a.get("argv"), a.get("cwd"), a.get("env"), a.get("name"), a.get("gpus"), extra,
                                  a.get("slurm"))  # fmt: skip
        self.emit(P.EV_JOB, job)
        return job

    def op_kill(self, a: P.KillArgs) -> P.JobRecord:
        """Kill a running job; a queued one is removed from the queue (it never starts)."""
        job_id, grace = str(a.get("job")), P.number_arg(a, "grace_s", 10.0, 0.0, P.MAX_KILL_GRACE_S)
        job = self.queue.remove(job_id, "removed from the queue before it started")
        if job is None and a.get("queued_only"):  # what was confirmed was a removal: never a kill of a running job
            state = self.jobs.describe(job_id)["state"]
            more = ": it started meanwhile; kill it again to stop it" if state == P.JOB_RUNNING else ""
            raise JobError("job %s is no longer queued (%s), not killed%s" % (job_id, state, more), "bad_args")
        if job is None:  # not queued (any more): it runs, or it ended
            job = self.jobs.kill(job_id, grace)
        self.emit(P.EV_JOB, job)
        return job

    def queue_listing(self) -> P.QueueListResult:
        """The queued jobs in order, each with its position and what it waits for: as many as LIST_PAGE_BYTES of
        records hold (the first always), ``more`` counting the rest."""
        state = self.queue.state()
        queued = self.queue.marks(self.queue.queued())
        jobs: List[Dict[str, Any]] = []
        size = 0
        for job in queued:
            size += len(P.encode(job))
            if jobs and size > P.LIST_PAGE_BYTES:
                break
            jobs.append(job)
        return {"jobs": jobs, "more": len(queued) - len(jobs), "resumed_at": state.get("resumed_at"),
                "scheduler_t": state.get("t")}  # fmt: skip

    def op_queue_move(self, a: P.QueueMoveArgs) -> P.QueueListResult:
        self.queue.move(str(a.get("job")), P.int_arg(a, "to", 1, 1, 1 << 30))
        listing = self.queue_listing()
        for job in listing["jobs"]:
            self.emit(P.EV_JOB, job)  # positions changed: the app learns them live
        return listing

    def op_read(self, a: P.ReadArgs) -> P.ReadResult:
        path = self.jobs.log_path(str(a.get("job")))
        offset = P.int_arg(a, "offset", 0)
        if a.get("tail_lines") is not None:
            offset = tail_offset(path, P.int_arg(a, "tail_lines", 0))
        data, size = read_chunk(
            path, offset, P.int_arg(a, "max_bytes", P.LOG_CHUNK_BYTES, 0, P.LOG_CHUNK_BYTES)
        )
        # The path lets the client fetch a long stretch as a raw stream instead (the agent's ``cat``).
        return {"offset": offset, "b64": P.b64(data), "size": size, "path": path}

    def op_times(self, a: P.TimesArgs) -> P.TimesResult:
        """When the bytes start..end of the job's log were written: [[offset, unix time], ...]."""
        path = os.path.join(self.jobs.job_dir(str(a.get("job"))), TIMES_NAME)
        return {"times": read_times(path, int(a.get("start", 0)), int(a.get("end", 0)))}

    def op_tails(self, a: P.TailsArgs) -> P.TailsResult:
        """The last ``max_bytes`` of each job's log with when they were written, for the first jobs named
        that fit in TAILS_PAGE_BYTES (always at least one)."""
        jobs = a.get("jobs")
        if not isinstance(jobs, list) or len(jobs) > P.TAILS_JOBS:
            raise ValueError("jobs must be a list of at most %d job ids" % P.TAILS_JOBS)
        max_bytes = P.int_arg(a, "max_bytes", P.TAIL_MAX_BYTES, 0, P.TAIL_MAX_BYTES)
        tails: List[P.Tail] = []
        room = P.TAILS_PAGE_BYTES
        for job_id in map(str, jobs):
            try:
                path = self.jobs.log_path(job_id)
                _, size = read_chunk(path, 0, 0)
                start = max(0, size - max_bytes)
                data, size = read_chunk(path, start, max_bytes)
                times_path = os.path.join(self.jobs.job_dir(job_id), TIMES_NAME)
                times = read_times(times_path, start, start + len(data))
            except JobError as exc:
                tails.append({"job": job_id, "error": str(exc)})
                continue
            cost = len(data) + 32 * len(times)
            if tails and cost > room:
                break
            room -= cost
            tails.append({"job": job_id, "offset": start, "size": size, "b64": P.b64(data), "times": times})
        return {"tails": tails}

    def _ended(self, job_id: str) -> Optional[Dict[str, Any]]:
        job = self.jobs.describe(job_id)
        if job["state"] not in P.JOB_ENDED_STATES:
            return None
        return {"job_state": job["state"], "exit_code": job["exit_code"]}

    def op_follow(self, a: P.FollowArgs) -> P.FollowResult:
        job_id = str(a.get("job"))
        path = self.jobs.log_path(job_id)
        self.op_unfollow({"job": job_id})
        offset, ended = P.int_arg(a, "offset", 0), lambda: self._ended(job_id)
        follow = Follow(job_id, path, offset, self.emit, ended, room=self.credit.log_room)
        self._follows[job_id] = follow
        follow.start()
        return {"job": job_id, "offset": follow.offset}

    def op_unfollow(self, a: P.JobArgs) -> None:
        follow = self._follows.pop(str(a.get("job")), None)
        if follow is not None:
            follow.stop()

    def _set_idle_rule(self, a: P.IdleRule) -> None:
        if a.get("count_sessions") is not None:
            self.idle_rule["count_sessions"] = bool(a["count_sessions"])
        percent = P.number_arg(a, "idle_util_percent", self.idle_rule["idle_util_percent"], 0.0, 100.0)
        self.idle_rule["idle_util_percent"] = percent

    def op_sample(self, a: P.IdleRule) -> P.MetricsSample:
        """A fresh sample; it joins the ring only if this agent is the sampler (else it carries the ring's seq)."""
        self._set_idle_rule(a)
        sample = self._sample()
        with self._ring_lock:
            if self.ring.owner:
                return self.ring.append(sample)
        with self._push_lock:
            sample["seq"] = self.ring.last_seq()
        return sample

    def op_subscribe(self, a: P.SubscribeArgs) -> P.SubscribeResult:
        """Start (or retune) pushed metrics; samples newer than ``since_seq`` still in the ring are resent."""
        unsubscribe = "interval" in a and a["interval"] is None
        interval = None if unsubscribe else P.number_arg(a, "interval", 1.0, MIN_INTERVAL_S, 3600.0)
        since = None if a.get("since_seq") is None else P.int_arg(a, "since_seq", 0)
        self._set_idle_rule(a)
        self._metrics_interval = interval
        with self._push_lock:
            if self._metrics_interval is None:
                self._pushed_seq = None
            else:
                last = self.ring.last_seq()
                start = last if since is None or int(since) > last else int(since)
                # The backlog goes out as events, in order and before anything newer can be pushed.
                for sample in self.ring.since(start):
                    self.emit(P.EV_METRICS, sample)
                    start = sample["seq"]
                self._pushed_seq = start
        self._metrics_wake.set()
        return {"interval": self._metrics_interval, "backlog": []}

    def op_shutdown(self, a: Dict[str, Any]) -> None:
        threading.Timer(0.05, self._stop).start()

    def op_exec(self, a: P.ExecArgs) -> P.ExecResult:
        """Run an argv (never a shell string) with a timeout; output is capped, exit status reported."""
        argv = a.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(x, str) for x in argv):
            raise ValueError("argv must be a non-empty list of strings")
        timeout = P.number_arg(a, "timeout_s", 60.0, 0.0, MAX_WAIT_S)
        try:
            res = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise JobError("%s did not finish within %.0f s" % (argv[0], timeout)) from None
        except OSError as exc:
            raise JobError("cannot run %s: %s" % (argv[0], exc.strerror or exc)) from None
        cap = lambda b: b[-65536:].decode("utf-8", "replace")  # noqa: E731
        return {"exit_code": res.returncode, "stdout": cap(res.stdout), "stderr": cap(res.stderr)}

    def _watchdog_path(self, name: str) -> str:
        return os.path.join(self.jobs.state_dir, name)

    def op_watchdog_configure(self, a: P.WatchdogConfigureArgs) -> P.WatchdogConfigureResult:
        """Arm the detached watchdog, or disarm it when the client's settings ask for nothing.

        The settings are the client's whole word: what they say now is what the watchdog does (it re-reads them
        every pass). Snooze, cancel and ``armed_at`` (the idle window's earliest start) are kept while the
        settings and the boot stay the same.
        """
        config = dict(a.get("config") or {})
        for key, (low, high) in _WATCHDOG_NUMBERS.items():
            if config.get(key) is not None:
                config[key] = P.number_arg(config, key, 0.0, low, high)
        if config.get("notify") is not None:
            config["notify"] = notify.checked(config["notify"])
        config["boot_id"] = self.facts()["boot_id"]
        config["nvidia_smi"] = self.jobs.nvidia_smi  # the watchdog reads the GPUs as this agent does
        path = self._watchdog_path(W.CONFIG)
        if not W.is_armed(config, config["boot_id"]):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return {"armed": False, "started": False, "config": None}
        old = read_json(path) or {}
        kept = ("snoozed_until", "cancelled", "armed_at")  # state of this boot, not settings
        settings = lambda c: {k: v for k, v in c.items() if k not in kept}  # noqa: E731
        config["armed_at"] = time.time()  # the idle window cannot start before autostop was armed
        if old.get("boot_id") == config["boot_id"] and settings(old) == settings(config):
            config.update({k: old.get(k) for k in kept if k in old})
        write_json(path, config)
        return {
            "armed": True,
            "started": W.ensure_running(self.jobs.state_dir, self.launcher),
            "config": config,
        }

    def op_notify_test(self, a: P.NotifyTestArgs) -> P.NotifyTestResult:
        """Send a test message now with the given settings (once, no retry); the attempt goes to the log."""
        settings = notify.checked(a.get("notify"))
        text = "[%s] test message from gputui" % (settings.get("host") or "host")
        problem = notify.deliver(settings, "test", text)
        W.log_line(
            self.jobs.state_dir, "notify test: %s" % ("sent" if problem is None else "failed: " + problem)
        )
        return {"sent": problem is None, "error": problem}

    def _mark(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """One record with its stalled and queue marks."""
        stalled = W.stalled_jobs(self.jobs.state_dir, self.facts()["boot_id"])
        return self.queue.marks([self._mark_stalled(record, stalled)])[0]

    def _mark_stalled(self, record: Dict[str, Any], stalled: Dict[str, Any]) -> Dict[str, Any]:
        """Add ``stalled``, ``stalled_since`` and ``stalled_reason`` to a running job the watchdog found stalled."""
        verdict = stalled.get(str(record.get("id")))
        if verdict is not None and record.get("state") == P.JOB_RUNNING:
            return dict(
                record, stalled=True, stalled_since=verdict.get("since"), stalled_reason=verdict.get("why")
            )
        return record

    def _mark_page(self, page: P.Raw) -> P.Raw:
        """A listing page with stalled and queued jobs marked (re-encoded only when some job is either)."""
        stalled = W.stalled_jobs(self.jobs.state_dir, self.facts()["boot_id"])
        if not stalled and '"state":"queued"' not in page:
            return page
        reply = json.loads(page)
        reply["jobs"] = self.queue.marks([self._mark_stalled(job, stalled) for job in reply["jobs"]])
        return P.Raw(json.dumps(reply, separators=(",", ":")))

    def _update_watchdog(self, **changes: Any) -> Dict[str, Any]:
        config = read_json(self._watchdog_path(W.CONFIG))
        if not config:
            raise JobError("no watchdog is configured on this host", P.E_NOT_FOUND)
        config.update(changes)
        write_json(self._watchdog_path(W.CONFIG), config)
        return config

    def op_watchdog_snooze(self, a: P.SnoozeArgs) -> Dict[str, Any]:
        """Postpone autostop: the idle window restarts when the snooze ends."""
        minutes = P.number_arg(a, "minutes", 60.0, 0.0, P.MAX_SNOOZE_MIN)
        if minutes <= 0:
            raise ValueError("minutes must be above 0, not %g" % minutes)
        return self._update_watchdog(snoozed_until=time.time() + 60.0 * minutes, cancelled=False)

    def op_watchdog_cancel(self, a: Dict[str, Any]) -> Dict[str, Any]:
        return self._update_watchdog(cancelled=True)

    # --- loops ------------------------------------------------------------------------------------------------
    def _sample(self, nodes: bool = False) -> P.MetricsSample:
        """A sample; ``nodes`` (the sampling loop only): with the GPUs of running Slurm jobs' nodes."""
        sample = self.sampler.sample(self.jobs.owner_lookup())
        try:
            jobs = self.jobs.list()
            if nodes:
                self.node_gpus.add_to(sample, jobs)
            sample["activity"] = idle_status(
                sample, jobs, self.activity, self.facts(),
                self.idle_rule["idle_util_percent"], self.idle_rule["count_sessions"],
                idle_jobs=W.stalled_idle(self.jobs.state_dir, self.facts()["boot_id"]),  # as the watchdog counts
            )  # fmt: skip
        except Exception as exc:  # doubt counts as activity
            sample["activity"] = {"reasons": ["activity check failed: %r" % exc], "idle_seconds": 0.0}
        watchdog = W.view(self.jobs.state_dir, sample["activity"], self.facts()["boot_id"])
        if watchdog is not None:
            sample["activity"]["watchdog"] = watchdog
        return sample

    def _sample_loop(self) -> None:
        """Sample into the ring while a client wants metrics and this agent holds the sampler lock.

        It never writes to the client: output may be stuck on a dead link, sampling must go on regardless.
        """
        while not self._stopping.is_set():
            interval = self._metrics_interval
            start = time.monotonic()
            if interval is not None and self.ring.try_own():
                try:
                    sample = self._sample(nodes=True)
                    with self._ring_lock:
                        self.ring.append(sample)
                    self._push_wake.set()
                except Exception:  # a sampling bug must not kill the agent; metrics.py reports its errors
                    pass
            self._metrics_wake.wait(max(0.0, (interval or 1.0) - (time.monotonic() - start)))
            self._metrics_wake.clear()

    def _push_loop(self) -> None:
        """Send this client every ring sample past the last one it got, whichever agent sampled it."""
        while not self._stopping.is_set():
            self._push_wake.wait(self._metrics_interval or 1.0)
            self._push_wake.clear()
            with self._push_lock:
                if self._pushed_seq is None or self._client_gone.is_set():
                    continue
                for sample in self.ring.since(self._pushed_seq):
                    self.emit(P.EV_METRICS, sample)
                    self._pushed_seq = sample["seq"]

    def _watch_loop(self) -> None:
        """Heartbeats, job state changes, and the silence timeout."""

        # Jobs that exist now are in the client's first jobs.list; any job seen later (started by us or by
        # another client, even one that already ended) or whose state changed is pushed.
        def seen(jobs: List[Dict[str, Any]]) -> Dict[str, Any]:  # a stalled or queue mark changing is a change
            stalled = W.stalled_jobs(self.jobs.state_dir, self.facts()["boot_id"])
            marked = self.queue.marks(jobs, jobs)
            return {job["id"]: (job["state"], job["id"] in stalled, job.get("queue_position"),
                                job.get("queue_reason")) for job in marked}  # fmt: skip

        try:
            states = seen(self.jobs.list())
        except OSError:
            states = {}
        next_jobs = 0.0
        while not self._stopping.wait(min(self.heartbeat_s, 1.0)):
            now = time.monotonic()
            self.emit(P.EV_HEARTBEAT, {"t": time.time()})
            if now >= next_jobs:
                next_jobs = now + 1.0
                try:
                    jobs = self.jobs.list()
                except OSError:  # the jobs dir went unreadable: heartbeats go on, the next pass retries
                    continue
                now_seen = seen(jobs)
                for job in jobs:
                    if states.get(job["id"]) != now_seen[job["id"]]:
                        self.emit(P.EV_JOB, self._mark(job))
                    states[job["id"]] = now_seen[job["id"]]

    def _handle(self, frame: Dict[str, Any]) -> None:
        req_id = frame.get("id")
        op = frame.get("op")
        args = frame.get("args") or {}
        handler = self.handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            self.send(P.reply_error(req_id, P.E_UNKNOWN_OP, "unknown operation %r" % (str(op)[:100],)))
            return
        if not isinstance(args, dict):
            self.send(P.reply_error(req_id, P.E_BAD_ARGS, "args must be an object"))
            return
        try:
            P.check_args(op, args)  # a field of the wrong type is bad_args naming it, never a handler's crash
            self.send(P.reply_ok(req_id, handler(args)))
        except JobError as exc:
            self.send(P.reply_error(req_id, exc.code, str(exc)))
        except (TypeError, ValueError, KeyError) as exc:
            self.send(P.reply_error(req_id, P.E_BAD_ARGS, "bad arguments for %s: %s" % (op, exc)))
        except Exception as exc:  # the agent must answer, not die
            self.send(P.reply_error(req_id, P.E_FAILED, "%s failed: %r" % (op, exc)))

    def _read_frames(self) -> None:
        while not self._stopping.is_set():
            line = self.inp.readline(P.MAX_FRAME_BYTES + 1)
            if not line:
                return  # stdin closed: the client is gone
            self._last_rx = time.monotonic()
            if not line.endswith(b"\n") and len(line) > P.MAX_FRAME_BYTES:
                req_id, size = P.frame_id(line), len(line)
                while line and not line.endswith(b"\n"):  # skip the rest of the oversized frame
                    line = self.inp.readline(P.MAX_FRAME_BYTES)
                    size += len(line)
                message = "request of %d bytes exceeds the %d byte frame limit" % (size, P.MAX_FRAME_BYTES)
                self.send(P.reply_error(req_id, P.E_MALFORMED, message))
                continue
            if not line.strip():
                continue
            try:
                frame = P.decode(line, finite=True)
            except P.ProtocolError as exc:
                self.send(P.reply_error(P.frame_id(line), P.E_MALFORMED, str(exc)))
                continue
            if frame.get("op") == P.OP_CREDIT:
                self._grant(frame.get("args"))
            elif frame.get("op") == P.OP_PING:
                self._handle(frame)
            else:
                threading.Thread(target=self._handle, args=(frame,), daemon=True).start()

    def _grant(self, args: Any) -> None:
        """A ``flow.credit`` frame: more room for log events. Never answered (it has no id)."""
        try:
            self.credit.grant(int(args["upto"]))
        except (TypeError, KeyError, ValueError, OverflowError) as exc:
            self.send(P.reply_error(None, P.E_BAD_ARGS, "bad %s frame: %r" % (P.OP_CREDIT, exc)))

    def _linger(self) -> None:
        """If this agent is the metrics sampler, keep sampling a while after its client went: the agent the
        client starts after reconnecting then finds the ring without a hole (it takes over the lock later)."""
        if self._stopping.is_set() or self._metrics_interval is None or not self.ring.owner:
            return
        for follow in list(self._follows.values()):
            follow.stop()
        self._stopping.wait(self.linger_s)

    def _stop(self) -> None:
        self._stopping.set()
        self.node_gpus.close()
        for follow in list(self._follows.values()):
            follow.stop()

    def _resume_queue(self) -> None:
        """Jobs wait in the queue (kept on disk across reboots): make sure the scheduler runs."""
        try:
            if self.queue.queued():
                W.ensure_running(self.jobs.state_dir, self.launcher)
        except OSError:
            pass  # the next submission or connect tries again

    def serve(self) -> int:
        self.emit(P.EV_HELLO, {"protocol": P.PROTOCOL_VERSION, "build": build_id(), "host": self.facts()})
        self._resume_queue()
        self.credit.restart()  # flow control counts the bytes after the hello frame
        for target in (self._sample_loop, self._push_loop, self._watch_loop):
            threading.Thread(target=target, daemon=True).start()
        reader = threading.Thread(target=self._read_frames, daemon=True)
        reader.start()
        # This thread never writes to the client, so the silence check works even when a write hangs on a
        # dead link (a blackholed connection fills every buffer and blocks the writer for good).
        while reader.is_alive() and not self._stopping.is_set() and not self._client_gone.is_set():
            if time.monotonic() - self._last_rx > self.idle_timeout:
                break
            reader.join(0.2)
        self._client_gone.set()
        self._linger()
        self._stop()
        try:
            self.sampler.close()
        except Exception:
            pass
        return 0

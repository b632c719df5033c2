"""The agent's serve loop: JSON lines on stdin/stdout, requests answered, events pushed.

This module frames, dispatches (each op's function is in ``remote_agent/ops/``), grants flow credit, runs the
loops (sampling, pushing, heartbeats and job changes) and answers every error. What the ops share lives on
:class:`Agent`: the job store, the queue, the host's facts, follows and the metrics subscription.

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
from typing import Any, BinaryIO, Dict, List, Optional

from . import build_id
from . import protocol as P
from .flow import Credit
from .host import container, provider
from .host.boot import boot_id, boot_time
from .jobs.logs import Follow
from .jobs.queue import JobQueue
from .jobs.restart import waiting as restart_waiting
from .jobs.store import JobError, JobStore
from .metrics.ring import MetricsRing
from .metrics.slurm_gpus import NodeGpus
from .ops import HANDLERS
from .watchdog import daemon
from .watchdog.activity import ActivityLog, idle_status


def _instance() -> Optional[P.InstanceFact]:
    """The RunPod pod / vast.ai instance this host is, by its id (the client's ``gputui start`` needs it once
    the host is stopped and can say nothing); None when it is neither."""
    found = provider.detect()
    if found.provider == provider.NONE:
        return None
    return {"provider": found.provider, "instance_id": found.instance_id}


def _tmux_version() -> Optional[str]:
    try:
        out = subprocess.run(["tmux", "-V"], capture_output=True, timeout=5).stdout.decode().strip()
        return out.split(" ", 1)[1] if " " in out else out or None
    except (OSError, subprocess.SubprocessError):
        return None


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
        from .metrics.sampler import MetricsSampler

        self.jobs = JobStore(state_dir, launcher, nvidia_smi)
        self.queue = JobQueue(self.jobs, lambda message: daemon.log_line(self.jobs.state_dir, message))
        self.launcher = launcher
        self.activity = ActivityLog(self.jobs.state_dir)
        self.idle_rule: Dict[str, Any] = {"idle_util_percent": 5.0, "count_sessions": True}
        self.inp, self.out = inp, out
        self.idle_timeout, self.heartbeat_s = idle_timeout, heartbeat_s
        self.sampler = MetricsSampler(self.jobs.state_dir, nvidia_smi=nvidia_smi)
        self.node_gpus = NodeGpus(launcher, self.jobs.state_dir, nvidia_smi)  # running Slurm jobs' nodes
        self._out_lock = threading.Lock()
        self.credit = Credit()
        self._last_rx = time.monotonic()
        self.follows: Dict[str, Follow] = {}
        # Metrics: one agent per state dir samples into the on-disk ring; each agent pushes its client what
        # the ring holds past the client's last seq. That keeps history whole across agent restarts.
        self.ring = MetricsRing(self.jobs.state_dir)
        self.linger_s = linger_s
        self.pushed_seq: Optional[int] = None  # newest seq sent to this client; None: not subscribed
        self.push_lock = threading.Lock()
        self.ring_lock = threading.Lock()
        self._push_wake = threading.Event()
        self._client_gone = threading.Event()  # stdin closed, output broken, or the client went silent
        self.metrics_interval: Optional[float] = None
        self.metrics_wake = threading.Event()
        self._stopping = threading.Event()
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
                                          "frame limit" % (len(data), P.MAX_FRAME_BYTES)))
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
            "instance": _instance(),
        }
        facts.update(self.sampler.facts())
        self._facts = facts
        return facts

    # --- what the ops share ---------------------------------------------------------------------------------------------
    def set_idle_rule(self, a: P.IdleRule) -> None:
        if a.get("count_sessions") is not None:
            self.idle_rule["count_sessions"] = bool(a["count_sessions"])
        percent = P.number_arg(a, "idle_util_percent", self.idle_rule["idle_util_percent"], 0.0, 100.0)
        self.idle_rule["idle_util_percent"] = percent

    def mark(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """One record with its stalled and queue marks."""
        stalled = daemon.stalled_jobs(self.jobs.state_dir, self.facts()["boot_id"])
        return self.queue.marks([self._mark_stalled(record, stalled)])[0]

    def _mark_stalled(self, record: Dict[str, Any], stalled: Dict[str, Any]) -> Dict[str, Any]:
        """Add ``stalled``, ``stalled_since`` and ``stalled_reason`` to a running job the watchdog found stalled."""
        verdict = stalled.get(str(record.get("id")))
        if verdict is not None and record.get("state") == P.JOB_RUNNING:
            return dict(
                record, stalled=True, stalled_since=verdict.get("since"), stalled_reason=verdict.get("why")
            )
        return record

    def mark_page(self, page: P.Raw) -> P.Raw:
        """A listing page with stalled and queued jobs marked (re-encoded only when some job is either)."""
        stalled = daemon.stalled_jobs(self.jobs.state_dir, self.facts()["boot_id"])
        if not stalled and '"state":"queued"' not in page:
            return page
        reply = json.loads(page)
        reply["jobs"] = self.queue.marks([self._mark_stalled(job, stalled) for job in reply["jobs"]])
        return P.Raw(json.dumps(reply, separators=(",", ":")))

    # --- loops ------------------------------------------------------------------------------------------------
    def take_sample(self, nodes: bool = False) -> P.MetricsSample:
        """A sample; ``nodes`` (the sampling loop only): with the GPUs of running Slurm jobs' nodes."""
        sample = self.sampler.sample(self.jobs.owner_lookup())
        try:
            jobs = self.jobs.list()
            if nodes:
                self.node_gpus.add_to(sample, jobs)
            sample["activity"] = idle_status(
                sample, jobs, self.activity, self.facts(),
                self.idle_rule["idle_util_percent"], self.idle_rule["count_sessions"],
                idle_jobs=daemon.stalled_idle(self.jobs.state_dir, self.facts()["boot_id"]),  # as the watchdog counts
            )
        except Exception as exc:  # doubt counts as activity
            sample["activity"] = {"reasons": ["activity check failed: %r" % exc], "idle_seconds": 0.0}
        watchdog = daemon.view(self.jobs.state_dir, sample["activity"], self.facts()["boot_id"])
        if watchdog is not None:
            sample["activity"]["watchdog"] = watchdog
        return sample

    def _sample_loop(self) -> None:
        """Sample into the ring while a client wants metrics and this agent holds the sampler lock.

        It never writes to the client: output may be stuck on a dead link, sampling must go on regardless.
        """
        while not self._stopping.is_set():
            interval = self.metrics_interval
            start = time.monotonic()
            if interval is not None and self.ring.try_own():
                try:
                    sample = self.take_sample(nodes=True)
                    with self.ring_lock:
                        self.ring.append(sample)
                    self._push_wake.set()
                except Exception:  # a sampling bug must not kill the agent; metrics.py reports its errors
                    pass
            self.metrics_wake.wait(max(0.0, (interval or 1.0) - (time.monotonic() - start)))
            self.metrics_wake.clear()

    def _push_loop(self) -> None:
        """Send this client every ring sample past the last one it got, whichever agent sampled it."""
        while not self._stopping.is_set():
            self._push_wake.wait(self.metrics_interval or 1.0)
            self._push_wake.clear()
            with self.push_lock:
                if self.pushed_seq is None or self._client_gone.is_set():
                    continue
                for sample in self.ring.since(self.pushed_seq):
                    self.emit(P.EV_METRICS, sample)
                    self.pushed_seq = sample["seq"]

    def _watch_loop(self) -> None:
        """Heartbeats, job state changes, and the silence timeout."""

        # Jobs that exist now are in the client's first jobs.list; any job seen later (started by us or by
        # another client, even one that already ended) or whose state changed is pushed.
        def seen(jobs: List[Dict[str, Any]]) -> Dict[str, Any]:  # a stalled or queue mark changing is a change
            stalled = daemon.stalled_jobs(self.jobs.state_dir, self.facts()["boot_id"])
            marked = self.queue.marks(jobs, jobs)
            return {job["id"]: (job["state"], job["id"] in stalled, job.get("queue_position"),
                                job.get("queue_reason")) for job in marked}

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
                        self.emit(P.EV_JOB, self.mark(job))
                    states[job["id"]] = now_seen[job["id"]]

    def _handle(self, frame: Dict[str, Any]) -> None:
        req_id = frame.get("id")
        op = frame.get("op")
        args = frame.get("args") or {}
        handler = HANDLERS.get(op) if isinstance(op, str) else None
        if handler is None:
            self.send(P.reply_error(req_id, P.E_UNKNOWN_OP, "unknown operation %r" % (str(op)[:100],)))
            return
        if not isinstance(args, dict):
            self.send(P.reply_error(req_id, P.E_BAD_ARGS, "args must be an object"))
            return
        try:
            P.check_args(op, args)  # a field of the wrong type is bad_args naming it, never a handler's crash
            self.send(P.reply_ok(req_id, handler(self, args)))
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
        if self._stopping.is_set() or self.metrics_interval is None or not self.ring.owner:
            return
        for follow in list(self.follows.values()):
            follow.stop()
        self._stopping.wait(self.linger_s)

    def stop(self) -> None:
        self._stopping.set()
        self.node_gpus.close()
        for follow in list(self.follows.values()):
            follow.stop()

    def _resume_queue(self) -> None:
        """Jobs wait in the queue (kept on disk across reboots): make sure the scheduler runs."""
        try:
            if self.queue.queued() or restart_waiting(self.jobs.list()):  # restarts: after a reboot too
                daemon.ensure_running(self.jobs.state_dir, self.launcher)
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
        self.stop()
        try:
            self.sampler.close()
        except Exception:
            pass
        return 0

"""Slurm as a job's scheduler: ``sbatch`` submits, one ``squeue`` per refresh gives every job's state, ``scancel``
signals and ends. gputui never schedules anything itself.

The batch script is this agent's own runner (``slurm-batch.sh`` just ``exec``s its arguments), so a Slurm job
writes the same files as a tmux job, in its job dir on the shared state dir: ``output.log`` (byte offsets,
times), ``pid.json``, ``status.json``. ``slurm.json`` holds the Slurm job id. Slurm's own view decides the state:

    PENDING (any not yet running)  -> queued, with Slurm's reason (Resources, Priority, ...)
    RUNNING, COMPLETING, ...       -> running
    COMPLETED -> succeeded; FAILED, OUT_OF_MEMORY, TIMEOUT, DEADLINE -> failed; CANCELLED -> killed;
    NODE_FAIL, BOOT_FAIL, PREEMPTED -> lost; a kill asked through gputui -> killed
    a run Slurm requeued (a node failure or preemption with requeue on, Slurm's default for batch jobs) is the
    job's next attempt: queued again, then running, its runner marking the log (restart.slurm_requeued)

A record is final once Slurm says the job ended (or forgot it: then ``status.json``, else ``sacct`` if
accounting is on, else lost). This module must stay stdlib-only and Python 3.8 compatible.
"""

import os
import re
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import protocol as P
from ..fsutil import read_json, write_json

#: How long one squeue/sacct answer serves every listing (one refresh); a submit or kill forgets it at once.
VIEW_MAX_AGE_S = 1.0
#: A job whose submission has not written slurm.json yet is still being submitted for this long.
SUBMIT_GRACE_S = 30.0
#: Longest Slurm text (a reason, a node list) a record carries.
MAX_TEXT = 500
#: Most extra sbatch options, and longest one, a job may carry.
MAX_SBATCH_ARGS, MAX_SBATCH_ARG = 64, 1000
#: A job squeue does not list is taken as forgotten by Slurm only when squeue was asked this long after sbatch
#: returned (a listing that asked squeue while sbatch ran must not end a job that is just being born).
FORGOTTEN_AFTER_S = 5.0
COMMAND_TIMEOUT_S = 30.0
BATCH_SCRIPT = "slurm-batch.sh"
_BATCH_TEXT = b'#!/bin/sh\n# gputui: a Slurm batch job runs the gputui runner given as arguments\nexec "$@"\n'
_PARTITION = re.compile(r"^[A-Za-z0-9_.,-]{1,200}$")
_TIME = re.compile(r"^(UNLIMITED|INFINITE|[0-9]{1,7}(-[0-9]{1,2})?(:[0-9]{1,2}){0,2})$", re.IGNORECASE)
#: sbatch options gputui sets itself (the log, the working dir, the batch script): not allowed in sbatch_args.
_OWN_OPTIONS = ("--output", "-o", "--error", "-e", "--chdir", "-D", "--wrap", "--parsable", "--open-mode")

_ENDED: Dict[str, Tuple[str, str]] = {  # Slurm state -> (gputui state, what to say when there is no reason)
    "COMPLETED": (P.JOB_SUCCEEDED, ""),
    "FAILED": (P.JOB_FAILED, "the job exited non-zero"),
    "OUT_OF_MEMORY": (P.JOB_FAILED, "out of memory"),
    "TIMEOUT": (P.JOB_FAILED, "time limit reached"),
    "DEADLINE": (P.JOB_FAILED, "deadline reached"),
    "CANCELLED": (P.JOB_KILLED, "cancelled"),
    "NODE_FAIL": (P.JOB_LOST, "node failure"),
    "BOOT_FAIL": (P.JOB_LOST, "node boot failure"),
    "PREEMPTED": (P.JOB_LOST, "preempted"),
    "REVOKED": (P.JOB_LOST, "revoked (federation)"),
}
_QUEUED = (
    "PENDING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
    "CONFIGURING",
)


class SlurmError(Exception):
    """A Slurm command failed or is missing; the message says which and why."""


def _run(argv: List[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    """stdout of a Slurm command (argv list, never a shell); SlurmError with its stderr when it fails."""
    try:
        res = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError("%s is not installed on this host: is it a Slurm login node?" % argv[0]) from None
    except subprocess.TimeoutExpired:
        raise SlurmError("%s did not answer within %.0f s: is the Slurm controller (slurmctld) up and reachable?"
                         % (argv[0], timeout)) from None
    except OSError as exc:
        raise SlurmError("cannot run %s: %s" % (argv[0], exc.strerror or exc)) from None
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip()[-MAX_TEXT:]
        raise SlurmError("%s failed: %s" % (argv[0], err or "exit status %d" % res.returncode))
    return res.stdout.decode("utf-8", "replace")


def _text(value: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", " ", value)[:MAX_TEXT].strip()


def check_request(req: Any) -> Dict[str, Any]:
    """The ``slurm`` args of jobs.start, checked: gpus, nodes, partition, time, sbatch_args."""
    if not isinstance(req, dict):
        raise ValueError("slurm must be an object")
    unknown = set(req) - {"gpus", "nodes", "partition", "time", "sbatch_args", "launcher"}
    if unknown:
        raise ValueError("unknown slurm settings: %s" % ", ".join(sorted(map(str, unknown)))[:200])
    out: Dict[str, Any] = {}
    for key, hi in (("gpus", 1024), ("nodes", 100000)):
        if req.get(key) is not None:
            out[key] = P.int_arg(req, key, 0, 0 if key == "gpus" else 1, hi)
    partition = req.get("partition")
    if partition is not None:
        if not isinstance(partition, str) or not _PARTITION.match(partition):
            raise ValueError(
                "partition %r: letters, digits, '_', '.', '-' (a comma list)" % str(partition)[:100]
            )
        out["partition"] = partition
    limit = req.get("time")
    if limit is not None:
        if not isinstance(limit, str) or not _TIME.match(limit):
            raise ValueError(
                "time %r: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS or UNLIMITED, as sbatch --time takes"
                % str(limit)[:100]
            )
        out["time"] = limit
    extra = req.get("sbatch_args") or []
    if (
        not isinstance(extra, list)
        or len(extra) > MAX_SBATCH_ARGS
        or not all(isinstance(a, str) and a.startswith("-") and len(a) <= MAX_SBATCH_ARG for a in extra)
    ):
        raise ValueError("sbatch_args must be a list of at most %d options, each starting with '-' (e.g. "
                         "--qos=high), at most %d characters" % (MAX_SBATCH_ARGS, MAX_SBATCH_ARG))
    for arg in extra:
        if (
            "\x00" in arg
            or arg.split("=", 1)[0] in _OWN_OPTIONS
            or (len(arg) > 2 and arg[:2] in ("-o", "-e", "-D"))
        ):
            raise ValueError("sbatch argument %r: gputui sets the log, the working dir and the script itself"
                             % arg[:100])
    out["sbatch_args"] = list(extra)
    launcher = req.get("launcher")
    if launcher is not None:
        if launcher not in LAUNCHERS:
            raise ValueError("launcher %r: one of %s" % (str(launcher)[:100], ", ".join(LAUNCHERS)))
        out["launcher"] = launcher
    return out


# --- many nodes: one srun step ----------------------------------------------------------------------------------
#: What ``launcher`` may be: torchrun (gputui writes the torchrun line, rendezvous from the allocation).
LAUNCHERS = ("torchrun",)
#: srun's own line naming a task that failed (``--label`` does not prefix srun's own messages).
_TASK_FAILED = re.compile(rb"srun: error: ([^:\s]{1,200}): tasks? ([0-9,-]{1,200}): ([^\r\n]{1,200})")
#: Bytes at the end of a stepped job's log searched for srun's word on a failed task.
TASK_ERROR_TAIL = 64 * 1024


def stepped(request: Dict[str, Any]) -> bool:
    """Whether a job runs as one srun step over its nodes (more than one node, or a launcher): then the batch
    step runs ``slurm-step``, which starts the step; otherwise the job's command runs in the batch step itself."""
    return (request.get("nodes") or 1) > 1 or bool(request.get("launcher"))


def launch_fields(request: Dict[str, Any], launcher: List[str], job_dir: str) -> Dict[str, Any]:
    """Extra fields of a Slurm job's job.json: ``run_argv``, what the runner runs instead of the job's argv
    (the agent's ``slurm-step`` for a stepped job)."""
    return {"run_argv": launcher + ["slurm-step", job_dir]} if stepped(request) else {}


def failed_task(log_path: str) -> Optional[str]:
    """srun's word on the first task that failed (``task 1 on n2: Exited with exit code 1``), from the end of
    the log; None when it said nothing."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - TASK_ERROR_TAIL))
            tail = f.read(TASK_ERROR_TAIL)
    except OSError:
        return None
    for node, tasks, what in _TASK_FAILED.findall(tail):
        if b"exit code 0" in what:
            continue
        word = "tasks" if re.search(rb"[,-]", tasks) else "task"
        return _text("%s %s on %s: %s" % (word, tasks.decode(), node.decode("utf-8", "replace"),
                                          what.decode("utf-8", "replace")))
    return None


def batch_script(state_dir: str) -> str:
    """The tiny batch script (written once, 0700): Slurm copies it and runs it with the runner's argv."""
    path = os.path.join(state_dir, BATCH_SCRIPT)
    try:
        with open(path, "rb") as f:
            if f.read() == _BATCH_TEXT:
                return path
    except OSError:
        pass
    tmp = path + ".tmp%d" % os.getpid()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    try:
        os.write(fd, _BATCH_TEXT)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def sbatch_argv(
    req: Dict[str, Any], job_id: str, job_dir: str, cwd: str, script: str, runner: List[str]
) -> List[str]:
    """The sbatch command for one job: the runner (argv, never a shell string) is the batch script's payload."""
    out = os.path.join(job_dir, "slurm.out").replace("%", "%%")  # sbatch expands %j, %u, ... in the name
    argv = ["sbatch", "--parsable", "--job-name=gputui-%s" % job_id, "--chdir=" + cwd, "--output=" + out]
    if req.get("partition"):
        argv.append("--partition=" + req["partition"])
    if req.get("nodes"):
        argv.append("--nodes=%d" % req["nodes"])
    if req.get("time"):
        argv.append("--time=" + req["time"])
    if req.get("gpus"):
        argv.append("--gres=gpu:%d" % req["gpus"])  # per node, as torchrun's --nproc-per-node counts them
    return argv + list(req.get("sbatch_args") or []) + [script] + runner


def submit(argv: List[str], job_dir: str) -> str:
    """Run sbatch; write and return the Slurm job id (``--parsable`` prints ``id`` or ``id;cluster``)."""
    out = _run(argv).strip()
    slurm_id = out.split(";", 1)[0].strip()
    if not slurm_id.isdigit():
        raise SlurmError("sbatch printed no job id: %r" % out[:200])
    write_json(os.path.join(job_dir, "slurm.json"), {"job_id": slurm_id, "submitted_at": time.time()})
    return slurm_id


class SlurmView:
    """Slurm's word on this user's jobs: one ``squeue`` for all of them per refresh (and one ``sacct`` for the
    jobs squeue no longer lists, when accounting is on). ``commands`` counts the Slurm commands run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -1e9
        self._jobs: Dict[str, Tuple[str, str, str]] = {}  # Slurm id -> (state, reason, nodes)
        self._error: Optional[str] = None
        self._asked_at = 0.0  # wall time when the squeue now held was started
        self._sacct: Optional[Dict[str, Tuple[str, str, str]]] = None
        self._sacct_off = False  # sacct said accounting is disabled: never ask again
        self.commands = 0

    def forget(self) -> None:
        with self._lock:
            self._at = -1e9

    def _fresh(self) -> None:
        if time.monotonic() - self._at < VIEW_MAX_AGE_S:
            return
        self._sacct = None
        self.commands += 1
        self._asked_at = time.time()
        try:
            out = _run(
                ["squeue", "--noheader", "--states=all", "--user=%d" % os.getuid(), "--format=%i|%T|%N|%r"]
            )
            self._jobs = dict(_parse_line(line) for line in out.splitlines() if line.count("|") >= 3)
            self._error = None
        except SlurmError as exc:
            self._error = str(exc)
        self._at = time.monotonic()

    def queue(self, slurm_id: str) -> "tuple[Optional[Tuple[str, str, str]], Optional[str], float]":
        """(state, reason, nodes) of a job squeue lists, or None; squeue's error, if it failed; and when that
        squeue was asked (wall time)."""
        with self._lock:
            self._fresh()
            return self._jobs.get(slurm_id), self._error, self._asked_at

    def accounting(self, slurm_id: str) -> Optional[Tuple[str, str, str]]:
        """A finished job squeue forgot, from sacct (one call per refresh for all jobs); None without accounting."""
        with self._lock:
            if self._sacct_off:
                return None
            if self._sacct is None:
                self.commands += 1
                try:
                    out = _run(["sacct", "--noheader", "--parsable2", "--allocations", "--user=%d" % os.getuid(),
                                "--starttime=now-30days", "--format=JobID,State,NodeList,Reason"])
                except SlurmError as exc:
                    self._sacct_off = "disabled" in str(exc) or "not installed" in str(exc)
                    return None
                self._sacct = dict(_parse_line(line) for line in out.splitlines() if line.count("|") >= 3)
            return self._sacct.get(slurm_id)


def _parse_line(line: str) -> Tuple[str, Tuple[str, str, str]]:
    slurm_id, state, nodes, reason = line.split("|", 3)
    # sacct says "CANCELLED by 0"; a reason may come as "(Resources)"
    return slurm_id.strip(), (
        state.split()[0] if state.strip() else "",
        _text(reason.strip("() \n")),
        _text(nodes),
    )


def fill_record(
    record: Dict[str, Any], job_dir: str, status: Any, killed: bool, view: SlurmView
) -> Dict[str, Any]:
    """Set state, exit_code, ended_at and ``slurm`` (job id, Slurm state, reason, nodes) of a Slurm job's record."""
    info: Dict[str, Any] = dict(record.get("slurm") or {})
    submitted = read_json(os.path.join(job_dir, "slurm.json"))
    record["exit_code"] = status.get("exit_code") if isinstance(status, dict) else None
    record["ended_at"] = None
    for key in ("error", "log_error"):  # sbatch's refusal; the runner's "disk full at offset N"
        if isinstance(status, dict) and status.get(key):
            record[key] = str(status[key])
    if not isinstance(submitted, dict) or not submitted.get("job_id"):
        created = record.get("created_at")
        if isinstance(status, dict) or not (
            isinstance(created, (int, float)) and time.time() - created < SUBMIT_GRACE_S
        ):
            record["state"] = P.JOB_FAILED if isinstance(status, dict) else P.JOB_LOST
            record["ended_at"] = (status or {}).get("ended_at") or time.time()
            record.setdefault("error", "never submitted to Slurm")
        else:
            record["state"] = P.JOB_QUEUED  # sbatch is still running
        record["slurm"] = info
        return record
    slurm_id = str(submitted["job_id"])
    info["job_id"] = slurm_id
    seen, error, asked_at = view.queue(slurm_id)
    if seen is None and error is None:
        seen = view.accounting(slurm_id)
    submitted_at = submitted.get("submitted_at")
    born = isinstance(submitted_at, (int, float)) and asked_at < submitted_at + FORGOTTEN_AFTER_S
    if seen is None and (error is not None or born):
        if error is not None:
            info["error"] = error  # Slurm cannot be asked now: the job is where it was, as far as we know
        record["state"] = P.JOB_RUNNING if record.get("pid") else P.JOB_QUEUED
        record["slurm"] = info
        return record
    state, reason, nodes = seen if seen is not None else ("", "", "")
    info.update(state=state or None, reason=reason or None, nodes=nodes or None)
    if record.get("pid") is None:
        record["started_at"] = None  # the runner never started: queue time is not run time (nor billed)
    if state not in _ENDED and seen is not None:  # a status.json left by a run Slurm requeued is not the end
        record["exit_code"] = None
        if isinstance(status, dict) and status.get("error"):
            record.pop("error", None)
    if state in _QUEUED or state.startswith("REQUEUE"):
        record["state"], record["started_at"] = P.JOB_QUEUED, None
    elif state in _ENDED or seen is None:
        mapped, why = _ENDED.get(
            state, (P.JOB_LOST, "Slurm no longer knows the job and it left no exit status")
        )
        if seen is None and isinstance(status, dict):
            mapped, why = (P.JOB_SUCCEEDED if record["exit_code"] == 0 else P.JOB_FAILED), ""
        record["state"] = P.JOB_KILLED if killed else mapped
        if why and (not info["reason"] or info["reason"] == "None"):
            info["reason"] = why
        failed = not killed and record["exit_code"] != 0
        if failed and (info.get("launcher") or (info.get("nodes_count") or 1) > 1):
            # which task (= node rank) on which node failed, as srun said it
            info["reason"] = failed_task(os.path.join(job_dir, "output.log")) or info["reason"]
        record["ended_at"] = (status or {}).get("ended_at") if isinstance(status, dict) else None
        record["ended_at"] = record["ended_at"] or time.time()
    else:  # RUNNING, COMPLETING, SUSPENDED, STOPPED, RESIZING, SIGNALING, STAGE_OUT
        record["state"] = P.JOB_RUNNING
    record["slurm"] = info
    return record


#: One scancel or squeue of a kill: short, so that the whole kill (four scancels, three graces, the wait for Slurm's
#: word: 4 x 4 + 3 x grace + 8 s at most) stays well inside the client's request timeout (3 x grace + 30 s). A controller that is down makes them
#: retry for 9 s (scancel) and 18 s (squeue) before they fail.
KILL_COMMAND_S = 4.0
#: How long a kill waits for Slurm to say the job ended after scancel was accepted.
KILL_CONFIRM_S = 8.0
#: What scancel says when the job (or its batch step) is gone: it ended, which is what a kill wants.
_GONE = ("Invalid job id specified", "already completing or completed")


def _scancel(*args: str) -> bool:
    """Run ``scancel`` (bounded); False when Slurm says the job already ended, SlurmError on any other failure."""
    try:
        _run(["scancel"] + list(args), KILL_COMMAND_S)
    except SlurmError as exc:
        if any(gone in str(exc) for gone in _GONE):
            return False
        raise
    return True


def kill(
    slurm_id: str, queued: bool, grace_s: float, ended: Callable[[float], bool], steps: bool = False
) -> None:
    """SIGINT, then SIGTERM to the batch step (the runner passes them to the job's process group), then SIGKILL
    to every step, ``grace_s`` apart; then ``scancel`` ends the allocation, and Slurm must say the job ended.
    ``steps`` (a job run as one srun step over its nodes): INT and TERM go to the steps' tasks on every node.
    ``ended(timeout)`` waits for the runner's status.json. A queued job is just cancelled.

    SlurmError says what failed (scancel's error, a controller that does not answer) and what was sent before:
    a kill Slurm did not confirm is never taken as done."""
    sent: List[str] = []
    try:
        if not queued:
            # without a scope scancel signals every step but the batch one: the tasks on every node
            scope = () if steps else ("--batch",)
            for sig, where in (("INT", scope), ("TERM", scope), ("KILL", ("--full",))):
                if not _scancel(*where, "--signal=" + sig, slurm_id):
                    break  # the job ended meanwhile: the scancel below settles its allocation
                sent.append("SIG" + sig)
                if ended(grace_s):
                    break
        _scancel(slurm_id)  # (exit 0 for a job Slurm does not know, too: its word comes from squeue below)
        _confirm_ended(slurm_id, ended)
    except SlurmError as exc:
        done = " (%s sent before)" % ", ".join(sent) if sent else ""
        raise SlurmError("Slurm job %s not killed%s: %s" % (slurm_id, done, exc)) from None


def _confirm_ended(slurm_id: str, ended: Callable[[float], bool]) -> None:
    """Wait (KILL_CONFIRM_S at most) until squeue says the job ended or no longer lists it (or, squeue failing,
    the runner wrote its status); SlurmError saying what Slurm last said otherwise."""
    deadline = time.monotonic() + KILL_CONFIRM_S
    while True:
        try:
            left = min(KILL_COMMAND_S, max(0.5, deadline - time.monotonic()))  # never past the deadline
            out = _run(["squeue", "--noheader", "--states=all", "--jobs=" + slurm_id, "--format=%T"], left)
            state: Optional[str] = out.split()[0] if out.split() else ""
            last = "squeue says %s" % _text(state or "nothing")
        except SlurmError as exc:
            state = "" if "Invalid job id" in str(exc) else None  # Slurm forgot it: it ended
            last = str(exc)
        if (state is not None and (state in _ENDED or not state)) or (state is None and ended(0.0)):
            return
        if time.monotonic() > deadline:
            raise SlurmError("scancel was accepted, but after %.0f s the job has not ended (%s)"
                             % (KILL_CONFIRM_S, last))
        time.sleep(0.2)


def env_file(env: Dict[str, str]) -> Dict[str, str]:
    """What env.json holds for a Slurm job: defaults and the user's variables only. The runner puts them over the
    allocation's own environment (SLURM_*, CUDA_VISIBLE_DEVICES), which only exists on the compute node."""
    out = {"PYTHONUNBUFFERED": "1", "TERM": "xterm-256color"}
    out.update(env)
    return out


#: Most nodes and partitions one slurm.info reply lists (a cluster may have tens of thousands of nodes) and most
#: bytes of node records in it; ``nodes_total`` and ``partitions_total`` count them all. Most partitions a node
#: lists as its own.
MAX_NODES, MAX_PARTITIONS, MAX_NODE_BYTES, MAX_NODE_PARTITIONS = 2000, 200, 1024 * 1024, 32
_SINFO_FIELDS = "NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|,CPUsState:|,Available:|,Time:|,Reason:"
_GPU_COUNT = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:([0-9]+)")


def _gpus(gres: str) -> Optional[int]:
    """GPUs in a GRES text like ``gpu:a100:4(S:0-1),mps:100`` (None: no GPU GRES at all)."""
    counts = [int(n) for n in _GPU_COUNT.findall(re.sub(r"\([^)]*\)", "", gres))]
    return sum(counts) if counts else None


def cluster_info() -> P.ClusterInfo:
    """Partitions and nodes with their state and GPUs, from ONE ``sinfo`` call (op ``slurm.info``)."""
    info: P.ClusterInfo = {"partitions": [], "partitions_total": 0, "nodes": [], "nodes_total": 0, "error": None,
                           "t": time.time()}
    try:
        out = _run(["sinfo", "--noheader", "--Node", "--Format=" + _SINFO_FIELDS])
    except SlurmError as exc:
        info["error"] = str(exc)
        return info
    nodes: Dict[str, P.SlurmNode] = {}
    parts: Dict[str, P.Partition] = {}
    for line in out.splitlines():
        fields = line.split("|", 8)
        if len(fields) < 9:
            continue
        name, part, state, gres, used, cpus, avail, limit, reason = (_text(f) for f in fields)
        default = part.endswith("*")
        part = part.rstrip("*")
        gpus, gpus_used = _gpus(gres), _gpus(used)
        p = parts.setdefault(part, {"name": part, "default": default, "available": avail, "time_limit": limit,
                                    "nodes": 0, "gpus": 0, "gpus_used": 0})
        p["nodes"] += 1
        p["gpus"] += gpus or 0
        p["gpus_used"] += gpus_used or 0
        node = nodes.get(name)
        if node is not None:
            if len(node["partitions"]) < MAX_NODE_PARTITIONS:
                node["partitions"].append(part)
            continue
        cpu = cpus.split("/")
        nodes[name] = {
            "name": name, "partitions": [part], "state": state, "gpus": gpus, "gpus_used": gpus_used,
            "cpus_alloc": int(cpu[0]) if len(cpu) == 4 and cpu[0].isdigit() else None,
            "cpus": int(cpu[3]) if len(cpu) == 4 and cpu[3].isdigit() else None,
            "reason": None if reason in ("", "none") else reason,
        }
    info["partitions"] = list(parts.values())[:MAX_PARTITIONS]
    info["partitions_total"] = len(parts)
    size = 0
    for node in list(nodes.values())[:MAX_NODES]:
        size += len(P.encode(node))
        if size > MAX_NODE_BYTES:
            break
        info["nodes"].append(node)
    info["nodes_total"] = len(nodes)
    return info

"""Jobs on the host: each one a tmux session on a private socket, with its record in a private job dir.

Layout under the state dir (all 0700 / 0600)::

    jobs/<id>/job.json     what was asked: argv, cwd, name, gpus, created_at
    jobs/<id>/env.json     the exact environment the job gets (a tmux pane would get the server's)
    jobs/<id>/secrets/     its secrets' values, until it can no longer start again (remote_agent/jobs/secrets.py)
    jobs/<id>/pid.json     written by the runner: job pid (= its process group), runner pid
    jobs/<id>/output.log   every byte the job printed, append-only
    jobs/<id>/status.json  written by the runner when the job ends: exit_code, signal, ended_at
    jobs/<id>/kill.json    written when a kill was asked for (so the end state is "killed")

A queued job (remote_agent/jobs/queue.py) has job.json (with its ``queue`` request) and env.json but no runner until
the scheduler picks it (``dequeued_at``, its GPUs) and launches it.
"""

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from .. import protocol as P
from ..fsutil import ensure_private_dir, open_regular, read_json, write_json
from ..host.container import Owners
from . import group as job_group
from . import image as job_image
from . import restart as restart_policy
from . import secrets as job_secrets
from . import slurm as slurm_jobs
from .index import EndedIndex, Entry, Key, job_key, to_json

RUNNING, SUCCEEDED, FAILED, KILLED, LOST = P.JOB_RUNNING, P.JOB_SUCCEEDED, P.JOB_FAILED, P.JOB_KILLED, P.JOB_LOST
QUEUED = P.JOB_QUEUED
#: A job whose runner has not yet written pid.json is still "starting" for this long.
START_GRACE_S = 10.0
#: The queue's lock file in the state dir (see ``JobStore.queue_locked``).
QUEUE_LOCK = "queue.lock"
MAX_NAME = P.MAX_JOB_NAME
_GPU_SPEC = re.compile(r"^(all|none|[A-Za-z0-9-]+(,[A-Za-z0-9-]+)*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_JOB_DIR_NAME = re.compile(r"^[0-9]{1,18}$")
#: Listing records carry at most this many characters of a job's command (jobs.get has all of it).
LIST_ARGV_CHARS = 4096
#: What a job's damaged files (garbage JSON, wrong types, EIO) can raise while its record is read.
_UNREADABLE = (OSError, ValueError, TypeError, AttributeError, OverflowError)
#: Largest listing record (after cutting the command): anything bigger is shown by its essentials.
MAX_RECORD_BYTES = 64 * 1024
#: Longest error text a record carries.
MAX_ERROR_CHARS = 2000


def listing(record: Dict[str, Any]) -> Dict[str, Any]:
    """The record as lists and events carry it: a long command is cut, its full length noted."""
    argv = record.get("argv")
    if isinstance(argv, list) and sum(len(a) + 1 for a in argv) > LIST_ARGV_CHARS:
        total = sum(len(a) for a in argv)
        kept, room = [], LIST_ARGV_CHARS
        for arg in argv:
            if room <= 0:
                break
            kept.append(arg[:room])
            room -= len(arg) + 1
        kept.append("... [command cut for listing: %d arguments, %d characters in all]" % (len(argv), total))
        record = dict(record, argv=kept, argv_truncated={"args": len(argv), "chars": total})
    error = record.get("error")
    if isinstance(error, str) and len(error) > MAX_ERROR_CHARS:
        record = dict(record, error=error[:MAX_ERROR_CHARS] + "... [%d characters in all]" % len(error))
    return record


def _log_facts(path: str) -> "tuple[int, Optional[str]]":
    """(size, problem) of a job's output.log: a missing log is empty; a dir, FIFO or link is a problem."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0, None
    except OSError as exc:
        return 0, "cannot read output.log: %s" % (exc.strerror or exc)
    if not stat.S_ISREG(st.st_mode):
        try:
            os.close(open_regular(path))
        except OSError as exc:
            return 0, "cannot read output.log: %s" % (exc.strerror or exc)
    return st.st_size, None


class JobError(Exception):
    """A job request that cannot be carried out; the message tells the user why."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code


def _pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def git_info(cwd: str) -> Optional[Dict[str, Any]]:
    """Commit, branch and dirty flag when ``cwd`` is inside a git work tree (None otherwise)."""

    def git(*args: str) -> Optional[str]:
        try:
            res = subprocess.run(["git", "-C", cwd] + list(args), capture_output=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout.decode("utf-8", "replace").strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "branch": git("rev-parse", "--abbrev-ref", "HEAD"), "dirty": bool(status)}


class JobStore:
    """Starts, lists and kills jobs under ``state_dir``; ``launcher`` is the argv prefix that runs this agent."""

    def __init__(self, state_dir: str, launcher: List[str], nvidia_smi: str = "nvidia-smi") -> None:
        self.nvidia_smi = nvidia_smi
        self.state_dir = ensure_private_dir(state_dir, top=True)
        self.jobs_dir = ensure_private_dir(os.path.join(self.state_dir, "jobs"))
        self.ended = EndedIndex(self.jobs_dir)  # records of jobs with a status.json: they never change
        self._checked_mtime: Optional[int] = None  # jobs dir mtime when every cached entry was last checked
        self.launcher = launcher
        self.slurm = slurm_jobs.SlurmView()  # Slurm's word on this user's jobs, asked once per refresh
        # One private tmux server per state dir, never the user's default server.
        self.socket = "gputui-" + hashlib.sha1(self.state_dir.encode("utf-8")).hexdigest()[:10]

    @contextlib.contextmanager
    def queue_locked(self) -> Iterator[None]:
        """The queue's lock (remote_agent/jobs/queue.py): every submit, move, removal, pick and relaunch holds it, and
        so does a kill's record (the tombstone), so a job killed before its runner came up is never started."""
        fd = open_regular(os.path.join(self.state_dir, QUEUE_LOCK), os.O_WRONLY | os.O_CREAT)
        with os.fdopen(fd, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    # --- tmux -------------------------------------------------------------------------------------------------
    def tmux_argv(self, *args: str) -> List[str]:
        return ["tmux", "-L", self.socket, "-f", "/dev/null"] + list(args)

    def _tmux(self, *args: str) -> "subprocess.CompletedProcess[bytes]":
        env = dict(os.environ)
        env.pop("TMUX", None)
        env.pop("TMUX_PANE", None)
        return subprocess.run(
            self.tmux_argv(*args), env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=15
        )

    def tmux_sessions(self) -> Optional[set]:
        """Names of live sessions on our server, or None when tmux is missing."""
        if shutil.which("tmux") is None:
            return None
        res = self._tmux("list-sessions", "-F", "#{session_name}")
        if res.returncode != 0:
            return set()  # no server running: no sessions
        return set(res.stdout.decode("utf-8", "replace").split())

    @staticmethod
    def session_name(job_id: str) -> str:
        return "gputui-" + job_id

    # --- start -------------------------------------------------------------------------------------------------
    def job_ids(self) -> List[str]:
        """Names of the job dirs, in job order."""
        return sorted((n for n in os.listdir(self.jobs_dir) if _JOB_DIR_NAME.match(n)), key=int)

    def _new_job_dir(self) -> "tuple[str, str]":
        existing = self.job_ids()
        n = int(existing[-1]) + 1 if existing else 1
        while True:
            path = os.path.join(self.jobs_dir, str(n))
            try:
                os.mkdir(path, 0o700)
                return str(n), path
            except FileExistsError:  # another agent took it: try the next one
                n += 1

    def start(
        self,
        argv: List[str],
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        name: Optional[str] = None,
        gpus: Optional[str] = None,
        extra: Optional[Dict[str, Any]] = None,
        slurm: Optional[Dict[str, Any]] = None,
        restart: Optional[Dict[str, Any]] = None,
        secrets: Optional[Dict[str, str]] = None,
    ) -> Dict[str, Any]:
        """Start a job; ``extra`` goes into its record (GPU models, price: what history wants to show).
        ``slurm``: submit it with sbatch instead (remote_agent/jobs/slurm.py); ``gpus`` is then not used.
        ``restart``: its restart policy (remote_agent/jobs/restart.py); ``secrets``: see ``create``."""
        request = None if slurm is None else slurm_jobs.check_request(slurm)
        policy = checked_restart(restart, request is not None)
        if policy is not None:
            extra = dict(extra or {}, restart=policy)
        job_id = self.create(argv, cwd, env, name, gpus, extra, request, secrets)
        if request is None:
            return self.launch(job_id)
        job_dir = self.job_dir(job_id)
        return self._submit(job_id, job_dir, read_json(os.path.join(job_dir, "job.json"))["cwd"], request)

    def create(
        self,
        argv: List[str],
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        name: Optional[str] = None,
        gpus: Optional[str] = None,
        extra: Optional[Dict[str, Any]] = None,
        request: Optional[Dict[str, Any]] = None,
        secrets: Optional[Dict[str, str]] = None,
    ) -> str:
        """Check a job request and write its job dir (record and environment); its id. Nothing runs yet.
        ``request``: a checked Slurm request (the job is then submitted with sbatch, not run in tmux).
        ``secrets``: variables kept apart from the record, only until the job can no longer start again
        (remote_agent/jobs/secrets.py); job.json lists their names."""
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise JobError("command must be a non-empty list of strings", "bad_args")
        if any("\x00" in a for a in argv):
            raise JobError("command arguments must not contain NUL bytes", "bad_args")
        cwd = os.path.abspath(os.path.expanduser(cwd or "~"))
        if not os.path.isdir(cwd):
            raise JobError("working directory %s does not exist on the host" % cwd, "bad_args")
        problem = job_image.dir_problem(extra["container"], cwd) if (extra or {}).get("container") else None
        if problem:
            raise JobError(problem, "bad_args")
        env = env or {}
        if not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k for k, v in env.items()):
            raise JobError("env must map variable names (without '=') to strings", "bad_args")
        try:
            secrets = job_secrets.check(secrets)
        except ValueError as exc:
            raise JobError(str(exc), "bad_args") from None
        both = sorted(set(secrets) & set(env))
        if both:
            raise JobError("%s: given both as env and as a secret; give each variable once" % ", ".join(both),
                           "bad_args")
        if gpus is not None and (
            not isinstance(gpus, str) or len(gpus) > MAX_NAME or not _GPU_SPEC.match(gpus)
        ):
            raise JobError(
                "GPU selection %r: use 'all', 'none' or a comma list like 0,1" % str(gpus)[:100], "bad_args"
            )
        if request is None and shutil.which("tmux") is None:
            raise JobError("tmux is not installed on the host: install it (e.g. apt install tmux)", "failed")

        job_env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        job_env.setdefault("PYTHONUNBUFFERED", "1")
        job_env.setdefault("TERM", "xterm-256color")
        if gpus == "none":
            job_env["CUDA_VISIBLE_DEVICES"] = ""
        elif gpus and gpus != "all":
            job_env["CUDA_VISIBLE_DEVICES"] = gpus
        job_env.update(env)  # the user's explicit env wins over every default
        group = (extra or {}).get("group")
        if group:  # a part of a job over several hosts: the rendezvous (jobs/group.py)
            job_env.update(job_group.env(group))
        if request is not None:
            job_env, gpus = slurm_jobs.env_file(env), None
        for secret in secrets:  # (an agent run locally inherits the user's variables): the runner adds its own
            job_env.pop(secret, None)

        job_id, job_dir = self._new_job_dir()
        display = _CONTROL.sub(" ", name if name else " ".join(argv))[:MAX_NAME].strip() or job_id
        record = {
            "id": job_id,
            "name": display,
            "argv": argv,
            "cwd": cwd,
            "gpus": gpus,
            "env": env,
            "env_keys": sorted(env)[:100],  # the names only travel (gputui compare); values may be secrets
            "created_at": time.time(),
            "tmux_session": self.session_name(job_id),
            "tmux_socket": self.socket,
            "git": git_info(cwd),
            "nvidia_smi": self.nvidia_smi,
        }
        if secrets:
            record["secrets"] = sorted(secrets)  # the names: the values are kept apart (secrets.keep)
        if request is not None:
            del record["tmux_session"], record["tmux_socket"]
            asked = {("nodes_count" if k == "nodes" else k): v for k, v in request.items()}
            record.update(scheduler="slurm", slurm=asked, **slurm_jobs.launch_fields(request, self.launcher, job_dir))
        record.update(extra or {})
        if group:
            record["group"] = job_group.keep(job_dir, group)  # its key rests apart, in the job's dir only
        write_json(os.path.join(job_dir, "env.json"), job_env)
        write_json(os.path.join(job_dir, "job.json"), record)
        try:
            job_secrets.keep(job_dir, secrets)
        except OSError as exc:  # (a full disk): the job never starts, and says why
            job_secrets.end_job(job_dir, {"exit_code": None, "error": "cannot keep its secrets: %s" % (exc.strerror or exc),
                                  "ended_at": time.time()})
            raise JobError("cannot keep the job's secrets on the host: %s" % (exc.strerror or exc)) from None
        return job_id

    def launch(self, job_id: str) -> Dict[str, Any]:
        """Run a created job's runner in its tmux session; a failed start ends the job with tmux's error."""
        job_dir = self.job_dir(job_id)
        for _ in range(3):  # a server that is exiting as its last session ends refuses a new one: try again
            res = self._tmux(
                "new-session", "-d", "-s", self.session_name(job_id), "-x", "200", "-y", "50", "--",
                *self.launcher, "runner", job_dir,
            )
            if res.returncode == 0 or self.session_name(job_id) in (self.tmux_sessions() or set()):
                break
        else:
            err = res.stderr.decode("utf-8", "replace").strip()
            job_secrets.end_job(job_dir, {"exit_code": None, "error": err, "ended_at": time.time()})
            raise JobError("tmux could not start the job: %s" % err)
        return self.describe(job_id)

    def _submit(self, job_id: str, job_dir: str, cwd: str, request: Dict[str, Any]) -> Dict[str, Any]:
        """Submit a job to Slurm: the batch job is this agent's runner, writing the same files as in tmux."""
        script = slurm_jobs.batch_script(self.state_dir)
        argv = slurm_jobs.sbatch_argv(request, job_id, job_dir, cwd, script, self.launcher + ["runner", job_dir])
        try:
            slurm_jobs.submit(argv, job_dir)
        except slurm_jobs.SlurmError as exc:
            job_secrets.end_job(job_dir, {"exit_code": None, "error": str(exc), "ended_at": time.time()})
            raise JobError(str(exc)) from None
        finally:
            self.slurm.forget()
        return self.describe(job_id)

    # --- inspect ----------------------------------------------------------------------------------------------
    def job_dir(self, job_id: str) -> str:
        return self._located(str(job_id))[0]

    def _located(self, job_id: str) -> "tuple[str, Key]":
        """(job dir, key) of an existing job; JobError not_found otherwise."""
        path = os.path.join(self.jobs_dir, job_id)
        try:
            if not _JOB_DIR_NAME.match(job_id):
                raise FileNotFoundError(job_id)
            return path, job_key(path)
        except OSError:
            raise JobError("no job %r on this host" % job_id[:100], "not_found") from None

    def log_path(self, job_id: str) -> str:
        return os.path.join(self.job_dir(job_id), "output.log")

    def describe(self, job_id: str, sessions: Optional[Callable[[], set]] = None) -> Dict[str, Any]:
        """The job's listing record (see ``listing``) plus its current state, exit code and log size.

        A job whose files cannot be read gets a record with its ``error``; it never fails the whole list.
        """
        entry = self._entry(str(job_id), sessions or self._sessions_once())
        self.ended.flush()
        return entry.record()

    def _entry(self, job_id: str, sessions: Callable[[], set], same_dirs: bool = False) -> Entry:
        """The job's record, as JSON text and dict; ended jobs' records come from the index.

        ``same_dirs``: no job dir was created or removed since every cached entry was checked against its
        job.json, so cached entries need no check (the check is one lstat per job: 10,000 every second).
        """
        cached = self.ended.get(job_id, None) if same_dirs else None
        if cached is not None:
            return cached
        path, key = self._located(job_id)
        cached = self.ended.get(job_id, key)
        if cached is not None:
            return cached
        try:
            record = listing(self._read_record(job_id, path, sessions))
        except _UNREADABLE as exc:  # a problem of this job's files: this job's error, not the list's
            record = {"id": job_id, "name": job_id, "state": LOST, "exit_code": None, "ended_at": None,
                      "argv": [], "log_size": 0, "error": "cannot read job %s: %s" % (job_id, exc)}
            return Entry(key, to_json(record), record)
        text = to_json(record)
        if len(text) > MAX_RECORD_BYTES:  # a field no listing needs grew huge: keep what identifies the job
            keep = ("id", "name", "state", "exit_code", "started_at", "ended_at", "log_size", "created_at")
            record = {k: record.get(k) for k in keep}
            record["error"] = "record too large to list (%d bytes); jobs.get has it" % len(text)
            text = to_json(record)
        if record["ended_at"] is not None:  # final: the runner wrote its last bytes before the status
            job_secrets.forget(path)  # it never starts again (on Slurm: Slurm's word; elsewhere gone already, as a rule)
            self.ended.add(job_id, key, record, text)
        return Entry(key, text, record)

    def full_record(self, job_id: str) -> Dict[str, Any]:
        """The job's record with all of job.json (listings cut a long command or a huge record)."""
        record = self.describe(job_id)
        full = read_json(os.path.join(self.job_dir(job_id), "job.json"))
        if isinstance(full, dict):
            full.pop("env", None)
            if record.pop("argv_truncated", None) or str(record.get("error")).startswith("record too large"):
                record.pop("error", None)
                record = dict(full, **record)
                record["argv"] = full.get("argv", record.get("argv"))
        return record

    def _sessions_once(self) -> Callable[[], set]:
        """Live tmux sessions, asked for at most once per call to ``list``/``describe``."""
        memo: List[set] = []

        def get() -> set:
            if not memo:
                memo.append(self.tmux_sessions() or set())
            return memo[0]

        return get

    def _read_record(self, job_id: str, path: str, sessions: Callable[[], set]) -> Dict[str, Any]:
        record = read_json(os.path.join(path, "job.json"))
        if not isinstance(record, dict):
            record = {"error": "job.json of job %s cannot be read" % job_id}
        record["id"] = job_id
        record.pop("env", None)
        record.pop("run_argv", None)  # the runner's (slurm.launch_fields), not the job's command
        record["usage"] = read_json(os.path.join(path, "usage.json"))
        status = read_json(os.path.join(path, "status.json"))
        pids = read_json(os.path.join(path, "pid.json"))
        pids = pids if isinstance(pids, dict) else {}
        killed = os.path.exists(os.path.join(path, "kill.json"))
        queued = isinstance(record.get("queue"), dict)  # a queued job starts when it is picked, if ever
        record["started_at"] = pids.get("started_at", record.get("dequeued_at" if queued else "created_at"))
        record["pid"] = pids.get("pid")
        on_slurm = record.get("scheduler") == "slurm"
        restarting = restart_policy.fill_record(record, path) and not on_slurm  # between attempts (remote_agent/jobs/restart.py)
        ended = isinstance(status, dict) or on_slurm or restarting
        live = self._live_state(record, pids, sessions) if not ended else None
        if live == LOST:  # the runner may have written its status and exited since we looked
            status = read_json(os.path.join(path, "status.json"))
            if status is None and isinstance(record.get("container"), dict):
                end_lost_container(path, job_id, record["container"])
        if isinstance(record.get("container"), dict):  # the image it runs (one --build made: its tag) and its ID
            ran = read_json(os.path.join(path, job_image.FILE)) or {}
            record["image_id"] = ran.get("image_id")
            if isinstance(ran.get("image"), str):
                record["container"] = dict(record["container"], image=ran["image"])
        if on_slurm:  # Slurm's word decides the state (remote_agent/jobs/slurm.py)
            slurm_jobs.fill_record(record, path, status, killed, self.slurm)
        elif isinstance(status, dict):
            code = status.get("exit_code")
            record["exit_code"] = code
            record["ended_at"] = status.get("ended_at") or time.time()
            record["state"] = KILLED if killed else (SUCCEEDED if code == 0 else FAILED)
            for key in ("error", "log_error"):
                if status.get(key):
                    record[key] = str(status[key])
        elif restarting:  # its runner is gone, the next attempt not yet up: not over
            record.update(exit_code=None, ended_at=None, state=RUNNING, restart_pending=True)
        else:
            record["exit_code"] = None
            record["ended_at"] = None
            record["state"] = live
        record["log_size"], log_problem = _log_facts(os.path.join(path, "output.log"))
        if log_problem and not record.get("log_error"):
            record["log_error"] = log_problem
        return record

    def _live_state(self, record: Dict[str, Any], pids: Dict[str, Any], sessions: Callable[[], set]) -> str:
        if _pid_alive(pids.get("runner_pid")):
            return RUNNING
        if pids:
            return LOST  # the runner is gone without writing a status
        queued = isinstance(record.get("queue"), dict)  # a job of the queue (remote_agent/jobs/queue.py)
        created = record.get("dequeued_at") if queued else record.get("created_at")
        if queued and created is None:
            return QUEUED  # still waiting
        if isinstance(created, (int, float)) and time.time() - created < START_GRACE_S:
            return RUNNING  # the runner has not written its pid yet
        if record.get("tmux_session") in sessions():
            return RUNNING
        return QUEUED if queued else LOST  # picked but never started (a crash): the scheduler starts it again

    def list(self) -> List[Dict[str, Any]]:
        """Every job's listing record, in job order."""
        return [entry.record() for entry in self._entries(0, 1 << 62, 1 << 62)[0]]

    def page(self, after: int, limit: int, max_bytes: int) -> P.Raw:
        """Listing records of the jobs after id ``after``, as reply JSON: ``{"jobs": [...], "more": bool}``,
        at most ``limit`` jobs and (beyond the first) ``max_bytes`` of records; when ``more``, ask again
        after the last id. Records are spliced in as stored: ten thousand ended jobs are never re-encoded."""
        entries, more = self._entries(after, limit, max_bytes)
        jobs = ",".join(entry.text for entry in entries)
        return P.Raw('{"jobs":[%s],"more":%s}' % (jobs, "true" if more else "false"))

    def _entries(self, after: int, limit: int, max_bytes: int) -> "tuple[List[Entry], bool]":
        sessions = self._sessions_once()
        out: List[Entry] = []
        size = 0
        # A job dir removed and its id reused changes the jobs dir's mtime: while that stays the same (and
        # is old enough that a change within the same clock tick cannot hide), cached entries hold.
        mtime = os.stat(self.jobs_dir).st_mtime_ns
        same_dirs = mtime == self._checked_mtime
        try:
            for job_id in self.job_ids():
                if int(job_id) <= after:
                    continue
                try:
                    entry = self._entry(job_id, sessions, same_dirs)
                except JobError:
                    continue  # a half-created dir from a crashed start, or a job deleted meanwhile
                if out and (len(out) >= limit or size + len(entry.text) > max_bytes):
                    return out, True
                out.append(entry)
                size += len(entry.text)
            if after == 0 and time.time_ns() - mtime > 2 * 10**9:
                self._checked_mtime = mtime  # every job was checked in this pass
            return out, False
        finally:
            self.ended.flush()

    def owner_lookup(self) -> Owners:
        """pid -> id of the running job whose process tree holds it (walking up the parents), or None; it also
        carries each running job's GPU grant, to infer the job of GPU processes from another PID namespace."""
        return Owners(running_jobs(self.jobs_dir))

    # --- kill -------------------------------------------------------------------------------------------------
    def kill(
        self, job_id: str, grace_s: float = 10.0, on_done: Optional[Callable[[Dict], None]] = None
    ) -> Dict:
        """SIGINT the job's process group, then SIGTERM, then SIGKILL, each after ``grace_s``. A kill asked
        again while the job still runs (another client's kill under way, or one whose client went away mid-way)
        goes on from SIGTERM: the job is never sent a second SIGINT.

        Blocks until the job is gone (call it from a worker thread); returns the final record.
        """
        path = self.job_dir(job_id)
        info = self.describe(job_id)
        if info.get("scheduler") == "slurm":
            return self._kill_slurm(job_id, path, info, grace_s)
        if info["state"] != RUNNING:
            raise JobError("job %s is not running (%s)" % (job_id, info["state"]), "bad_args")
        again = os.path.exists(os.path.join(path, "kill.json"))
        with self.queue_locked():  # from now on no pick or relaunch of the queue starts it
            if not again:
                write_json(os.path.join(path, "kill.json"), {"asked_at": time.time(), "grace_s": grace_s})
            if info.get("restart_pending") and restart_policy.end_pending(path, "killed while waiting to restart"):
                return self.describe(job_id)
        if info.get("restart_pending"):  # its next attempt is being launched: its pid.json is the old one's
            restart_policy.wait_launched(path, grace_s + restart_policy.LAUNCH_GRACE_S)
        pgid = (read_json(os.path.join(path, "pid.json")) or {}).get("pid")
        if pgid:
            # a job in an image: each signal to its container (the engine's CLI on a terminal passes none on),
            # to the CLI only while no container exists yet (its image being pulled or built)
            container = (read_json(os.path.join(path, "job.json")) or {}).get("container")
            for sig in (signal.SIGTERM, signal.SIGKILL) if again else (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                if not (container and self._signal_container(job_id, path, container, sig)):
                    try:
                        os.killpg(pgid, sig)
                    except ProcessLookupError:
                        break
                if self._wait_ended(path, grace_s):
                    break
            self._wait_ended(path, 5.0)
            name = job_image.running_name(path) if container else None
            if name is not None:
                job_image.end(container, name, job_id)  # one created as its CLI was being killed
        else:
            self._end_unstarted(job_id, path)
        return self.describe(job_id)

    @staticmethod
    def _signal_container(job_id: str, path: str, spec: Dict[str, Any], sig: signal.Signals) -> bool:
        """Send ``sig`` to the job's container; whether there was one of ours to send it to."""
        name = job_image.running_name(path)
        return name is not None and job_image.send_signal(spec, name, job_id, sig.name[3:])

    def _end_unstarted(self, job_id: str, path: str) -> None:
        """Kill a job whose runner has not written its pid yet: end its tmux session (the runner with it, and a
        job it spawned that very moment), then write the status no runner is left to write."""
        self._tmux("kill-session", "-t", "=" + self.session_name(job_id))
        pids = read_json(os.path.join(path, "pid.json"))
        if isinstance(pids, dict) and isinstance(pids.get("pid"), int) and pids["pid"] > 1:
            try:
                os.killpg(pids["pid"], signal.SIGKILL)  # it started as the session was ending
            except (ProcessLookupError, PermissionError):
                pass
            if _pid_alive(pids.get("runner_pid")) and self._wait_ended(path, 5.0):
                return
        if not os.path.exists(os.path.join(path, "status.json")):
            job_secrets.end_job(path, {"exit_code": None, "error": "killed before it started", "ended_at": time.time()})

    def _kill_slurm(self, job_id: str, path: str, info: Dict[str, Any], grace_s: float) -> Dict[str, Any]:
        """Kill a Slurm job (escalating as ``kill`` does, with scancel) and wait until Slurm says it ended."""
        slurm_id = (info.get("slurm") or {}).get("job_id")
        if info["state"] not in (RUNNING, P.JOB_QUEUED) or not slurm_id:
            raise JobError("job %s is not running or queued (%s)" % (job_id, info["state"]), "bad_args")
        kill_file = os.path.join(path, "kill.json")
        write_json(kill_file, {"asked_at": time.time(), "grace_s": grace_s})
        try:
            slurm_jobs.kill(slurm_id, info["state"] == P.JOB_QUEUED, grace_s, lambda t: self._wait_ended(path, t),
                   steps=bool(read_json(os.path.join(path, "job.json")).get("run_argv")))
        except slurm_jobs.SlurmError as exc:
            if not os.path.exists(os.path.join(path, "status.json")):
                os.unlink(kill_file)  # not killed: how the job ends is Slurm's word, not "killed"
            raise JobError(str(exc)) from None
        finally:
            self.slurm.forget()
        return self.describe(job_id)

    def _wait_ended(self, path: str, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(os.path.join(path, "status.json")):
                return True
            time.sleep(0.05)
        return os.path.exists(os.path.join(path, "status.json"))


def end_lost_container(path: str, job_id: str, spec: Dict[str, Any]) -> None:
    """End the container of a job whose runner died, once (its pty's hangup usually ended it already; one that
    ignores SIGHUP would hold its GPUs unwatched). The engine's answers are bounded (remote_agent/jobs/image.py)."""
    marker = os.path.join(path, "container-ended.json")
    name = job_image.running_name(path)
    if name is None or os.path.exists(marker):
        return
    ended = job_image.end(spec, name, job_id)
    write_json(marker, {"name": name, "ended": ended, "at": time.time()})


def checked_restart(restart: Any, on_slurm: bool) -> Optional[Dict[str, Any]]:
    """A start request's restart policy, checked (None: none); JobError bad_args with the reason."""
    try:
        policy = restart_policy.check_request(restart)
    except ValueError as exc:
        raise JobError(str(exc), "bad_args") from None
    if policy is not None and on_slurm:
        raise JobError("restart policies on Slurm hosts are not supported yet: drop --restart", "bad_args")
    return policy


def running_jobs(jobs_dir: str) -> List[Dict[str, Any]]:
    """Each running job (a pid.json, a live runner, no status.json): id, pid, started_at, gpus (its
    CUDA_VISIBLE_DEVICES, None when unset)."""
    out = []
    for job_id in sorted((n for n in os.listdir(jobs_dir) if _JOB_DIR_NAME.match(n)), key=int):
        path = os.path.join(jobs_dir, job_id)
        if os.path.exists(os.path.join(path, "status.json")):
            continue
        if os.path.exists(os.path.join(path, "slurm.json")):
            continue  # a Slurm job: its pids are a compute node's, not this host's
        pids = read_json(os.path.join(path, "pid.json"))
        if not isinstance(pids, dict) or not isinstance(pids.get("pid"), int):
            continue
        if pids.get("runner_pid") and not _pid_alive(pids["runner_pid"]):
            continue  # lost: its runner died without a status
        env = read_json(os.path.join(path, "env.json"))
        gpus = env.get("CUDA_VISIBLE_DEVICES") if isinstance(env, dict) else None
        ran = read_json(os.path.join(path, job_image.FILE))  # a job in an image: its container (jobs/image.py)
        out.append(
            {
                "id": job_id,
                "pid": pids["pid"],
                "started_at": pids.get("started_at"),
                "gpus": gpus if isinstance(gpus, str) else None,
                "container_id": ran.get("id") if isinstance(ran, dict) else None,
            }
        )
    return out

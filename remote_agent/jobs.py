"""Jobs on the host: each one a tmux session on a private socket, with its record in a private job dir.

Layout under the state dir (all 0700 / 0600)::

    jobs/<id>/job.json     what was asked: argv, cwd, name, gpus, created_at
    jobs/<id>/env.json     the exact environment the job gets (a tmux pane would get the server's)
    jobs/<id>/pid.json     written by the runner: job pid (= its process group), runner pid
    jobs/<id>/output.log   every byte the job printed, append-only
    jobs/<id>/status.json  written by the runner when the job ends: exit_code, signal, ended_at
    jobs/<id>/kill.json    written when a kill was asked for (so the end state is "killed")
"""

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

from .fsutil import ensure_private_dir, read_json, write_json
from .hoststats import ancestors

RUNNING, SUCCEEDED, FAILED, KILLED, LOST = "running", "succeeded", "failed", "killed", "lost"
#: A job whose runner has not yet written pid.json is still "starting" for this long.
START_GRACE_S = 10.0
MAX_NAME = 200
_GPU_SPEC = re.compile(r"^(all|none|[A-Za-z0-9-]+(,[A-Za-z0-9-]+)*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
        self._ended: Dict[str, Dict[str, Any]] = {}  # records of jobs with a status.json: they never change
        self.state_dir = ensure_private_dir(state_dir)
        self.jobs_dir = ensure_private_dir(os.path.join(self.state_dir, "jobs"))
        self.launcher = launcher
        # One private tmux server per state dir, never the user's default server.
        self.socket = "gputui-" + hashlib.sha1(self.state_dir.encode("utf-8")).hexdigest()[:10]

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
    def _new_job_dir(self) -> "tuple[str, str]":
        existing = [int(n) for n in os.listdir(self.jobs_dir) if n.isdigit()]
        n = max(existing, default=0) + 1
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
    ) -> Dict[str, Any]:
        """Start a job; ``extra`` goes into its record (GPU models, price: what history wants to show)."""
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise JobError("command must be a non-empty list of strings", "bad_args")
        if any("\x00" in a for a in argv):
            raise JobError("command arguments must not contain NUL bytes", "bad_args")
        cwd = os.path.abspath(os.path.expanduser(cwd or "~"))
        if not os.path.isdir(cwd):
            raise JobError("working directory %s does not exist on the host" % cwd, "bad_args")
        env = env or {}
        if not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k for k, v in env.items()):
            raise JobError("env must map variable names (without '=') to strings", "bad_args")
        if gpus is not None and not _GPU_SPEC.match(gpus):
            raise JobError("GPU selection %r: use 'all', 'none' or a comma list like 0,1" % gpus, "bad_args")
        if shutil.which("tmux") is None:
            raise JobError("tmux is not installed on the host: install it (e.g. apt install tmux)", "failed")

        job_env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        job_env.setdefault("PYTHONUNBUFFERED", "1")
        job_env.setdefault("TERM", "xterm-256color")
        if gpus == "none":
            job_env["CUDA_VISIBLE_DEVICES"] = ""
        elif gpus and gpus != "all":
            job_env["CUDA_VISIBLE_DEVICES"] = gpus
        job_env.update(env)  # the user's explicit env wins over every default

        job_id, job_dir = self._new_job_dir()
        display = _CONTROL.sub(" ", name if name else " ".join(argv))[:MAX_NAME].strip() or job_id
        record = {
            "id": job_id,
            "name": display,
            "argv": argv,
            "cwd": cwd,
            "gpus": gpus,
            "env": env,
            "created_at": time.time(),
            "tmux_session": self.session_name(job_id),
            "tmux_socket": self.socket,
            "git": git_info(cwd),
            "nvidia_smi": self.nvidia_smi,
        }
        record.update(extra or {})
        write_json(os.path.join(job_dir, "env.json"), job_env)
        write_json(os.path.join(job_dir, "job.json"), record)
        res = self._tmux(
            "new-session", "-d", "-s", self.session_name(job_id), "-x", "200", "-y", "50", "--",
            *self.launcher, "runner", job_dir,
        )  # fmt: skip
        if res.returncode != 0:
            err = res.stderr.decode("utf-8", "replace").strip()
            write_json(
                os.path.join(job_dir, "status.json"),
                {"exit_code": None, "error": err, "ended_at": time.time()},
            )
            raise JobError("tmux could not start the job: %s" % err)
        return self.describe(job_id)

    # --- inspect ----------------------------------------------------------------------------------------------
    def job_dir(self, job_id: str) -> str:
        job_id = str(job_id)
        if not job_id.isdigit():
            raise JobError("no job %r on this host" % job_id, "not_found")
        path = os.path.join(self.jobs_dir, job_id)
        if not os.path.isfile(os.path.join(path, "job.json")):
            raise JobError("no job %r on this host" % job_id, "not_found")
        return path

    def log_path(self, job_id: str) -> str:
        return os.path.join(self.job_dir(job_id), "output.log")

    def describe(self, job_id: str, sessions: Optional[set] = None) -> Dict[str, Any]:
        """The job's record plus its current state, exit code and log size."""
        if str(job_id) in self._ended:
            return dict(self._ended[str(job_id)])
        path = self.job_dir(job_id)
        record = read_json(os.path.join(path, "job.json")) or {}
        record.pop("env", None)
        record["usage"] = read_json(os.path.join(path, "usage.json"))
        status = read_json(os.path.join(path, "status.json"))
        pids = read_json(os.path.join(path, "pid.json")) or {}
        killed = os.path.exists(os.path.join(path, "kill.json"))
        record["started_at"] = pids.get("started_at", record.get("created_at"))
        record["pid"] = pids.get("pid")
        live = self._live_state(record, pids, sessions) if status is None else None
        if live == LOST:  # the runner may have written its status and exited since we looked
            status = read_json(os.path.join(path, "status.json"))
        if status is not None:
            code = status.get("exit_code")
            record["exit_code"] = code
            record["ended_at"] = status.get("ended_at")
            record["state"] = KILLED if killed else (SUCCEEDED if code == 0 else FAILED)
            if status.get("error"):
                record["error"] = status["error"]
            ended = True
        else:
            ended = False
            record["exit_code"] = None
            record["ended_at"] = None
            record["state"] = live
        try:
            record["log_size"] = os.path.getsize(os.path.join(path, "output.log"))
        except OSError:
            record["log_size"] = 0
        if ended:  # the runner wrote its last log byte and usage before the status: final
            self._ended[record["id"]] = dict(record)
        return record

    def _live_state(self, record: Dict[str, Any], pids: Dict[str, Any], sessions: Optional[set]) -> str:
        if _pid_alive(pids.get("runner_pid")):
            return RUNNING
        if not pids and time.time() - record.get("created_at", 0) < START_GRACE_S:
            return RUNNING  # the runner has not written its pid yet
        if sessions is None:
            sessions = self.tmux_sessions() or set()
        return RUNNING if record.get("tmux_session") in sessions and not pids else LOST

    def list(self) -> List[Dict[str, Any]]:
        sessions = None
        out = []
        ids = sorted((n for n in os.listdir(self.jobs_dir) if n.isdigit()), key=int)
        for job_id in ids:
            try:
                out.append(self.describe(job_id, sessions))
            except JobError:
                continue  # a half-created dir from a crashed start
        return out

    def owner_lookup(self) -> Callable[[int], Optional[str]]:
        """pid -> id of the running job whose process tree holds it (walking up the parents), or None."""
        owners = self.owner_map()

        def owner_of(pid: int) -> Optional[str]:
            return next((owners[p] for p in ancestors(pid) if p in owners), None)

        return owner_of

    def owner_map(self) -> Dict[int, str]:
        """pid of each running job's main process -> job id."""
        owners = {}
        for job_id in (n for n in os.listdir(self.jobs_dir) if n.isdigit()):
            path = os.path.join(self.jobs_dir, job_id)
            if os.path.exists(os.path.join(path, "status.json")):
                continue
            pid = (read_json(os.path.join(path, "pid.json")) or {}).get("pid")
            if pid:
                owners[int(pid)] = job_id
        return owners

    # --- kill -------------------------------------------------------------------------------------------------
    def kill(
        self, job_id: str, grace_s: float = 10.0, on_done: Optional[Callable[[Dict], None]] = None
    ) -> Dict:
        """SIGINT the job's process group, then SIGTERM, then SIGKILL, each after ``grace_s``.

        Blocks until the job is gone (call it from a worker thread); returns the final record.
        """
        path = self.job_dir(job_id)
        info = self.describe(job_id)
        if info["state"] != RUNNING:
            raise JobError("job %s is not running (%s)" % (job_id, info["state"]), "bad_args")
        pgid = (read_json(os.path.join(path, "pid.json")) or {}).get("pid")
        write_json(os.path.join(path, "kill.json"), {"asked_at": time.time(), "grace_s": grace_s})
        if pgid:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                if self._wait_ended(path, grace_s):
                    break
        else:  # the runner never started: end its tmux session
            self._tmux("kill-session", "-t", "=" + self.session_name(job_id))
        self._wait_ended(path, 5.0)
        return self.describe(job_id)

    def _wait_ended(self, path: str, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(os.path.join(path, "status.json")):
                return True
            time.sleep(0.05)
        return os.path.exists(os.path.join(path, "status.json"))

"""The tiny runner that lives inside a job's tmux pane.

It starts the job's argv on a fresh pty (so colours and tqdm behave), copies every byte the job prints to
``output.log`` and to the pane (so ``tmux attach`` shows it), forwards keystrokes from the pane to the job,
and writes ``status.json`` atomically when the job ends, whoever was connected at the time.
"""

import errno
import fcntl
import json
import os
import pty
import select
import signal
import struct
import sys
import termios
import threading
import time
import tty
from typing import Any, Dict, List, Optional, Tuple, Union

from ..fsutil import read_json, user_umask, write_json
from ..host.boot import boot_id
from . import group as job_group
from . import image as job_image
from . import restart as restart_policy
from . import secrets as job_secrets
from .logclock import TIMES_NAME, LogClock
from .series import SeriesKeeper
from .usage import UsageRecorder

READ_SIZE = 65536
#: Space set aside at the start so that status.json can still be written when the job fills the disk.
RESERVE_BYTES = 64 * 1024


class LogWriter:
    """Appends the job's output to output.log until a write fails (disk full, file size limit, EIO).

    Then it stops copying, so the job keeps running with its pty drained, and ``error`` says why and where.
    """

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.offset = os.fstat(self.fd).st_size
        self.error: Optional[str] = None

    def write(self, data: bytes) -> None:
        if self.error is not None:
            return
        try:
            while data:
                n = os.write(self.fd, data)
                self.offset += n
                data = data[n:]
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self.error = "disk full at offset %d" % self.offset
            elif exc.errno == errno.EFBIG:
                self.error = "file size limit reached at offset %d" % self.offset
            else:
                self.error = "cannot write output.log at offset %d: %s" % (self.offset, exc.strerror or exc)

    def close(self) -> None:
        os.close(self.fd)


def _reserve(path: str) -> None:
    """Set ``RESERVE_BYTES`` of disk aside in ``path`` (really written: a sparse file reserves nothing)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, bytes(RESERVE_BYTES))
        finally:
            os.close(fd)
    except OSError:
        pass  # no reserve (the disk is full already): status.json is still tried


def _exit_code(wait_status: int) -> "tuple[int, Optional[int]]":
    """(exit code, signal): a signalled job reports 128 + signal like a shell does."""
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        return 128 + sig, sig
    return os.WEXITSTATUS(wait_status), None


def _copy_winsize(src_fd: int, dst_fd: int) -> None:
    try:
        size = fcntl.ioctl(src_fd, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(dst_fd, termios.TIOCSWINSZ, size)
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _spawn(argv: List[str], cwd: str, env: Dict[str, str]) -> "tuple[int, int]":
    """Fork the job on a new pty (it becomes a session and process-group leader); return (pid, master fd)."""
    pid, master = pty.fork()
    if pid == 0:  # child
        try:
            os.umask(user_umask())  # the agent's is 077; the job's files get the user's usual modes
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, ("gputui: cannot start %r: %s\n" % (argv[0], exc.strerror)).encode())
            # Like a shell: 127 when there is no such command, 126 when it was found but cannot run.
            os._exit(127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126)
        os._exit(127)
    return pid, master


def _pump(master: int, pid: int, log: LogWriter, log_clock: LogClock, pane: bool) -> int:
    """Copy the job's pty to its log (and to the pane, ``pane``) and the pane's keys to the job until the job
    ends and its pty is drained; the job's wait status."""
    stdin_fd: Optional[int] = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved_tty = None
    if stdin_fd is not None:
        _copy_winsize(stdin_fd, master)
        signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(stdin_fd, master))
        saved_tty = termios.tcgetattr(stdin_fd)
        tty.setraw(stdin_fd)  # keystrokes (Ctrl-C too) reach the job through its pty, untouched
    out_fd = sys.stdout.fileno()
    pane_ok = pane  # else its stdout (a Slurm batch job's slurm.out) is for the runner's errors
    status: Optional[int] = None
    try:
        while True:
            fds = [master] + ([stdin_fd] if stdin_fd is not None else [])
            try:
                ready, _, _ = select.select(fds, [], [], 0.5)
            except InterruptedError:
                continue
            if master in ready:
                try:
                    data = os.read(master, READ_SIZE)
                except OSError as exc:  # EIO: every holder of the pty's slave side has gone
                    if exc.errno != errno.EIO:
                        raise
                    data = b""
                if not data:
                    break
                before = log.offset
                log.write(data)
                log_clock.wrote(log.offset - before)
                if pane_ok:
                    try:
                        _write_all(out_fd, data)
                    except OSError:
                        pane_ok = False
            if stdin_fd is not None and stdin_fd in ready:
                try:
                    keys = os.read(stdin_fd, 1024)
                except OSError:
                    keys = b""
                if keys:
                    _write_all(master, keys)
                else:
                    stdin_fd = None
            if not ready and status is None:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
                    # The job is gone; leftover background children may hold the pty: drain briefly, then stop.
                    while select.select([master], [], [], 0.2)[0]:
                        try:
                            data = os.read(master, READ_SIZE)
                        except OSError:
                            break
                        if not data:
                            break
                        log.write(data)
                    break
    finally:
        if saved_tty is not None and stdin_fd is not None:
            try:
                termios.tcsetattr(stdin_fd, termios.TCSAFLUSH, saved_tty)
            except termios.error:
                pass
    if status is None:
        _, status = os.waitpid(pid, 0)
    return status


def _attempt(job_dir: str, job: Dict[str, Any], on_slurm: bool) -> Union[Tuple[Dict[str, str], int], int]:
    """(the environment, the number) of the attempt to run now; or the runner's exit status when it must not
    run (killed while waiting to restart, its secrets unreadable: the job ends, saying why)."""
    with open(os.path.join(job_dir, "env.json"), "rb") as f:
        env = json.loads(f.read().decode("utf-8"))
    if on_slurm:  # a Slurm batch job: the allocation's environment is the base
        env = dict(os.environ, **env)
    env.update(restart_policy.attempt_env(job_dir, job))  # GPUTUI_ATTEMPT, GPUTUI_RESUME_FROM (restart policies)
    attempt = restart_policy.current_attempt(job_dir)
    if on_slurm:  # a run Slurm requeued is the job's next attempt (its log marked, the last run's end kept)
        attempt = restart_policy.slurm_requeued(job_dir, os.environ.get("SLURM_RESTART_COUNT", ""))
        if attempt > 1:
            env["GPUTUI_ATTEMPT"] = str(attempt)
    if attempt > 1 and os.path.exists(os.path.join(job_dir, "kill.json")):  # killed as it was being restarted
        job_secrets.end_job(job_dir, {"exit_code": None, "error": "killed while waiting to restart", "ended_at": time.time()})
        return 130
    names = job.get("secrets") or []
    try:
        env.update(job_secrets.load(job_dir, names))  # never through env.json: they must not outlive the job
    except ValueError as exc:  # no attempt without them: the job ends, saying why
        job_secrets.end_job(job_dir, {"exit_code": None, "error": "not started: %s" % exc, "ended_at": time.time()})
        return 1
    if names and not on_slurm and restart_policy.policy_of(job) is None:
        job_secrets.forget(job_dir)  # its one attempt has them: the host keeps them no longer
    return env, attempt


def run(job_dir: str, launcher: Optional[List[str]] = None) -> int:
    """Run the job of ``job_dir`` (its next attempt); ``launcher``: argv starting this agent build again."""
    with open(os.path.join(job_dir, "job.json"), "rb") as f:
        job = json.loads(f.read().decode("utf-8"))
    on_slurm = job.get("scheduler") == "slurm"
    prepared = _attempt(job_dir, job, on_slurm)
    if isinstance(prepared, int):
        return prepared
    env, attempt = prepared

    pid_path = os.path.join(job_dir, "pid.json")
    before = read_json(pid_path)
    if isinstance(before, dict) and before.get("attempt") == attempt:  # this attempt was started: never twice
        sys.stderr.write("gputui: attempt %d of this job was started before: not starting it again\n" % attempt)
        return 0
    group = job.get("group")  # a part of a job over several hosts: it runs once every part is ready
    member = None
    if group:
        member, why = job_group.join(job_dir, group, attempt, launcher or [])
        if why is not None:
            job_secrets.end_job(job_dir, {"exit_code": None, "error": "not started: " + why, "ended_at": time.time()})
            return 1
    reserve = os.path.join(job_dir, ".reserve")
    _reserve(reserve)
    log = LogWriter(os.path.join(job_dir, "output.log"))
    log_clock = LogClock(os.path.join(job_dir, TIMES_NAME), log.offset)
    # The start is on disk before the job runs (a runner that cannot write it, on a full disk, runs nothing and
    # the queue launches it again later); the job's pid is added once it exists.
    started = {"pid": None, "runner_pid": os.getpid(), "started_at": time.time(), "attempt": attempt,
               "boot_id": boot_id()}
    write_json(pid_path, started)
    container = job.get("container")  # an image job: the engine's run in place of the command (jobs/image.py)
    job_id = os.path.basename(job_dir)
    if container and container.get("build"):  # the build first, in the pane (image.build_and_run)
        argv = (launcher or []) + ["image-run", job_dir, str(attempt)]
    elif container:
        argv = job_image.run_argv(job, job_id, attempt, env)
    elif group:  # (in an image, run_argv has the group's command)
        argv = job_group.run_argv(job)
    else:
        argv = job.get("run_argv") or job["argv"]
    pid, master = _spawn(argv, job["cwd"], env)  # run_argv: slurm.launch_fields
    ended = threading.Event()
    image_watch = None  # records the container's ID and image ID (jobs/image.py)
    if container:
        image_watch = job_image.record_image(job_dir, container, job_image.container_name(container, job_id, attempt), ended)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over a file size limit, writes fail with EFBIG instead
    try:
        write_json(pid_path, dict(started, pid=pid))
    except OSError:
        pass  # the job runs (and its runner is on record): it must not be left unwatched for want of its pid
    usage = UsageRecorder(job_dir, pid, job.get("gpus"), job.get("nvidia_smi") or "nvidia-smi")
    usage.start()
    series = SeriesKeeper(job_dir)  # the job's metric series, kept beside its log as it grows
    series.start()
    stopped_by: List[str] = []  # why the group stopped this part (another part failed or was lost)
    if member is not None:

        def send(sig: int) -> None:  # a job in an image: to its container (its CLI on a terminal passes none on)
            name = job_image.running_name(job_dir) if container else None
            if name is None or not job_image.send_signal(container, name, job_id, signal.Signals(sig).name[3:]):
                try:
                    os.killpg(pid, sig)
                except OSError:
                    pass

        stop = job_group.stopper(send, ended, stopped_by.append)
        threading.Thread(target=member.watch, args=(ended, stop), name="group-part", daemon=True).start()

    # Signals aimed at the runner go to the job instead, so the runner survives to write the status.
    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)

    status = _pump(master, pid, log, log_clock, pane=not on_slurm)  # a Slurm batch job has no pane
    code, sig = _exit_code(status)
    log.close()
    log_clock.close()
    usage.stopped.set()
    series.stopped.set()
    ended.set()
    if image_watch is not None:
        image_watch.join(timeout=5.0)
    usage.join(timeout=2.0)  # its last usage.json lands before status.json (records are final then)
    series.join(timeout=5.0)  # never writes once the job has ended (the agent finishes the series then)
    try:
        os.unlink(reserve)  # frees room for status.json on a full disk
    except OSError:
        pass
    end = {"exit_code": code, "signal": sig, "ended_at": time.time(), "log_error": log.error}
    if stopped_by:
        end["error"] = "stopped: " + stopped_by[0]
    # A failed attempt of a job with a restart policy: the watchdog decides (remote_agent/jobs/restart.py).
    final = restart_policy.ends_for_good(job_dir, job, code, sig)
    if final and not on_slurm:
        job_secrets.end_job(job_dir, end)
    else:  # Slurm may requeue the run: its secrets stay until Slurm says the job ended (the store deletes them)
        write_json(os.path.join(job_dir, "status.json" if final else restart_policy.ATTEMPT), end)
    if member is not None:
        member.finish(code)  # the hub stops the other parts when this one failed
    return code

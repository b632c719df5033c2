"""Attaching the terminal to a job's tmux session (argv built here; run by an injectable runner)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence

from gputui.core.session import model as M

Runner = Callable[[list[str]], int]


def attach_argv(prefix: Sequence[str], snapshot: M.HostSnapshot, job: M.Job) -> list[str]:
    """``prefix + tmux -L SOCKET attach -t =SESSION``; raises ValueError when there is nothing to attach.
    A Slurm job: a shell on its (first) node inside its allocation, ``srun --jobid=ID --overlap --pty bash``."""
    if job.state == M.JOB_QUEUED:
        raise ValueError(f"job {job.id} is queued: it has not started yet, nothing to attach to")
    if not job.running:
        raise ValueError(f"job {job.id} has ended ({job.state}): nothing to attach to")
    slurm_id = str((job.record.get("slurm") or {}).get("job_id") or "")
    if slurm_id.isdigit():
        return [*prefix, "srun", f"--jobid={slurm_id}", "--overlap", "--pty", "bash"]
    socket = snapshot.facts.get("tmux_socket")
    if not socket or not job.tmux_session:
        raise ValueError(f"job {job.id}: the host did not report its tmux session")
    return [*prefix, "tmux", "-L", str(socket), "attach", "-t", "=" + job.tmux_session]


def run_in_terminal(argv: list[str]) -> int:
    """Run ``argv`` on this terminal and wait. ``$TMUX`` is dropped: ours is a separate, private server."""
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    try:
        return subprocess.run(argv, env=env).returncode
    except OSError as exc:
        print(f"gputui: cannot run {argv[0]}: {exc}")
        return 127

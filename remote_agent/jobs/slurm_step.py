"""A many-node Slurm job's srun step, inside its allocation: ``slurm-step JOB_DIR`` (the batch step, on the first
node) sets the rendezvous and starts one task per node; ``slurm-step --task JOB_DIR`` (each task) execs torchrun
for its node. Stdlib only, Python 3.8+.
"""

import os
import re
from typing import Any, Dict, List, Tuple

from .group import torchrun_line
from .slurm import SlurmError, _run


def _first_node() -> Tuple[str, str]:
    """(name, address) of the allocation's first node (where the batch step runs): the rendezvous host."""
    names = _run(["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")]).split()
    if not names:
        raise SlurmError("scontrol show hostnames %r gave no node" % os.environ.get("SLURM_JOB_NODELIST"))
    first = names[0]
    shown = _run(["scontrol", "show", "node", "--oneliner", first])
    addr = re.search(r"(?:^|\s)NodeAddr=(\S+)", shown)
    return first, (addr.group(1) if addr and addr.group(1) != "(null)" else first)


def _free_port() -> int:
    """A TCP port free on this node now (the rendezvous port; the first node is this one)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def step_argv(job: Dict[str, Any], job_dir: str, launcher: List[str], nodes: int) -> List[str]:
    """The srun line of a stepped job: one task per node, every line labelled with its task (= node rank), the
    whole step ended when one task fails. torchrun: each task runs ``slurm-step --task``, which execs torchrun."""
    argv = ["srun", "--label", "--kill-on-bad-exit=1", "--nodes=%d" % nodes, "--ntasks=%d" % nodes,
            "--ntasks-per-node=1", "--export=ALL"]
    if (job.get("slurm") or {}).get("launcher") == "torchrun":
        return argv + launcher + ["slurm-step", "--task", job_dir]
    return argv + ["--"] + list(job["argv"])


def torchrun_argv(job: Dict[str, Any], env: Dict[str, str]) -> List[str]:
    """torchrun for this node: nodes from the allocation, node rank from SLURM_NODEID, processes per node from
    the GPUs per node (1 without GPUs), the rendezvous on MASTER_ADDR:MASTER_PORT (the first node)."""
    gpus = (job.get("slurm") or {}).get("gpus") or 1
    return torchrun_line(int(env["SLURM_JOB_NUM_NODES"]), int(env["SLURM_NODEID"]), gpus, env["MASTER_ADDR"],
                         int(env["MASTER_PORT"]), job["argv"])


def run_step(job_dir: str, task: bool, launcher: List[str]) -> int:
    """``slurm-step JOB_DIR``: in the batch step (first node), set the rendezvous (MASTER_ADDR of the first node,
    a free MASTER_PORT) and exec the job's srun step; ``--task``: in a task of that step, exec torchrun."""
    import json
    import sys

    with open(os.path.join(job_dir, "job.json"), "rb") as f:
        job = json.loads(f.read().decode("utf-8"))
    try:
        if task:
            argv = torchrun_argv(job, dict(os.environ))
        else:
            name, addr = _first_node()
            os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(_free_port()), GPUTUI_MASTER_NODE=name)
            argv = step_argv(job, job_dir, launcher, int(os.environ.get("SLURM_JOB_NUM_NODES") or 1))
        os.execvp(argv[0], argv)
    except (SlurmError, KeyError, ValueError, OSError) as exc:
        what = "torchrun" if task else "the job's srun step"
        sys.stderr.write("gputui: cannot start %s: %s\n" % (what, exc))
        return 127 if isinstance(exc, FileNotFoundError) else 1
    return 1  # not reached: exec replaced this process

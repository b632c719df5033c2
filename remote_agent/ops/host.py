"""Host ops: ping, host.exec (release_remote), shutdown, doctor, slurm.info."""

import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any, Dict

from .. import protocol as P
from ..host.doctor import run_doctor
from ..jobs import slurm as slurm_jobs
from ..jobs.store import JobError

if TYPE_CHECKING:
    from ..server import Agent

#: Longest wait an argument may ask for (exec timeout): a day.
MAX_WAIT_S = 86400.0


def ping(agent: "Agent", a: Dict[str, Any]) -> P.PingResult:
    return {"t": time.time()}


def run(agent: "Agent", a: P.ExecArgs) -> P.ExecResult:
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


def shutdown(agent: "Agent", a: Dict[str, Any]) -> None:
    threading.Timer(0.05, agent.stop).start()


def doctor(agent: "Agent", a: P.DoctorArgs) -> P.DoctorResult:
    return run_doctor(agent.sampler, agent.jobs.state_dir, a)


def slurm_info(agent: "Agent", a: Dict[str, Any]) -> P.ClusterInfo:
    return slurm_jobs.cluster_info()


HANDLERS = {
    P.OP_PING: ping, P.OP_EXEC: run, P.OP_SHUTDOWN: shutdown, P.OP_DOCTOR: doctor,
    P.OP_SLURM_INFO: slurm_info,
}

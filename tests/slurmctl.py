"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd on 127.0.0.1, all in a temp dir.

Debian's ``slurm-wlm`` (22.05) and ``munge``, run as root (scripts/test.sh installs them). The node claims
``CPUS`` CPUs (``SlurmdParameters=config_overrides``: more than the machine has, so a few test jobs run side by
side) and two count-only GPUs (``gres.conf`` with ``Count=`` and no device files), so ``--gres=gpu:N`` is
scheduled and a job asking for more GPUs than exist stays pending with reason ``Resources``-like texts.
``extra_nodes`` adds nodes ``n[1-N]`` that never register (DOWN): a big fleet for ``sinfo`` without daemons.
``nodes=2`` is a real two-node cluster instead: nodes ``n1`` and ``n2``, one ``slurmd -N nX`` each, on 127.0.0.1
and 127.0.0.2 (all of 127/8 is loopback) with their own ports and ``%n`` in their spool, pid and log paths;
``srun -N2`` runs one task on each (``SLURMD_NODENAME`` n1/n2, ``SLURM_NODEID`` 0/1).
The daemons get ``SLURM_CONF`` in their own environment only; ``env`` is what a client of the cluster needs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SBIN = "/usr/sbin"
CPUS = 32
GPUS = 2
MEM_MIB = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_available() -> str | None:
    """Why a test Slurm cannot run here, or None when it can."""
    for exe in ("munged", "slurmctld", "slurmd"):
        if not os.path.exists(os.path.join(SBIN, exe)):
            return f"{SBIN}/{exe} is missing (apt install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (run the tests as root, as CI does)"
    return None


class SlurmCluster:
    """munged + slurmctld + slurmd under ``root``; ``start()`` returns once the node is idle."""

    def __init__(self, root: Path, extra_nodes: int = 0, nodes: int = 1, cred_expire: int | None = None) -> None:
        """``cred_expire``: Slurm's credential lifetime (120 s by default), which is also how long a requeued job
        waits before it may start again."""
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.host = socket.gethostname().split(".")[0]
        #: The node names: this host's own name for one node, else n1, n2, ... (one slurmd each, ``-N``).
        self.nodes = [self.host] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]
        self.node = self.nodes[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))  # for sbatch, squeue, the agent, ...
        one = nodes == 1
        self._pid_files = [root / f"slurmd-{n}.pid" if not one else root / "slurmd.pid" for n in self.nodes]
        self._pid_files += [root / "slurmctld.pid", root / "munge" / "munged.pid"]
        for sub in ("munge", "state", "spool", "log"):
            (root / sub).mkdir(mode=0o755, exist_ok=True)  # munged wants its socket's dir searchable
        extra = (
            f"NodeName=n[1-{extra_nodes}] NodeAddr=127.0.0.1 Port={free_port()} CPUs=8 RealMemory=1024 Gres=gpu:8 State=DOWN\n"
            f"PartitionName=big Nodes=n[1-{extra_nodes}] MaxTime=INFINITE State=UP\n"
            if extra_nodes
            else ""
        )
        if one:
            node_lines = (f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEM_MIB} "
                          f"Gres=gpu:{GPUS} State=UNKNOWN\n")
            daemon_paths = (f"SlurmdSpoolDir={root / 'spool'}\nSlurmdPidFile={root / 'slurmd.pid'}\n"
                            f"SlurmdLogFile={root / 'log' / 'slurmd.log'}\n")
        else:  # each node its own address and port; %n: each slurmd its own spool, pid and log
            node_lines = "".join(
                f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.{i} Port={free_port()} CPUs={CPUS} "
                f"RealMemory={MEM_MIB} Gres=gpu:{GPUS} State=UNKNOWN\n"
                for i, n in enumerate(self.nodes, 1)
            )
            daemon_paths = (f"SlurmdSpoolDir={root / 'spool'}/%n\nSlurmdPidFile={root}/slurmd-%n.pid\n"
                            f"SlurmdLogFile={root / 'log'}/slurmd-%n.log\n")
        node_list = ",".join(self.nodes)
        self.conf.write_text(
            "ClusterName=gputuitest\n"
            f"SlurmctldHost={self.host}(127.0.0.1)\n"
            f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}{f',cred_expire={cred_expire}' if cred_expire else ''}\n"
            "CredType=cred/munge\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "SchedulerType=sched/builtin\n"
            "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
            "JobCompType=jobcomp/none\nMpiDefault=none\n"
            "SlurmdParameters=config_overrides\nReturnToService=2\n"
            "KillWait=2\nMinJobAge=300\nInactiveLimit=0\nOverTimeLimit=0\n"
            "GresTypes=gpu\n"
            f"StateSaveLocation={root / 'state'}\n{daemon_paths}"
            f"SlurmctldPidFile={root / 'slurmctld.pid'}\nSlurmctldLogFile={root / 'log' / 'slurmctld.log'}\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            + node_lines
            + f"PartitionName=main Nodes={node_list} Default=YES MaxTime=INFINITE State=UP\n"
            + extra
        )
        # gres/gpu drops GPUs without a File=: plain files stand in for /dev/nvidiaN (nothing opens them;
        # without ConstrainDevices Slurm only counts them and sets CUDA_VISIBLE_DEVICES).
        (root / "dev").mkdir(exist_ok=True)
        for i in range(GPUS):
            (root / "dev" / f"nvidia{i}").touch()
        (root / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={n} Name=gpu File={root / 'dev'}/nvidia[0-{GPUS - 1}]\n" for n in self.nodes
        ))

    # --- process ----------------------------------------------------------------------------------------------
    def _daemon(self, argv: list[str]) -> None:
        """Run a daemon that forks itself away; raise with its log when it fails to start."""
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {res.stderr.strip()}\n{self.logs()}")

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.root / "munge"
        self._daemon([
            f"{SBIN}/munged", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}",
        ])
        self._daemon([f"{SBIN}/slurmctld", "-f", str(self.conf)])
        for node in self.nodes:
            self._daemon(
                [f"{SBIN}/slurmd", "-f", str(self.conf)] + (["-N", node] if len(self.nodes) > 1 else [])
            )
        self.wait_idle(timeout)
        return self

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (sinfo, squeue, scontrol, ...) against this cluster."""
        res = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {res.returncode}: {res.stderr}")
        return res

    def node_state(self, node: str | None = None) -> str:
        res = self.run("sinfo", "-h", "-n", node or self.node, "-o", "%T", check=False)
        return res.stdout.strip() if res.returncode == 0 else ""

    def wait_idle(self, timeout: float) -> None:
        """Until every node is idle (a readiness loop asking slurmctld, not a sleep)."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            while self.node_state(node) != "idle":
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"node {node} not idle (state {self.node_state(node)!r})\n{self.logs()}"
                    )
                time.sleep(0.1)

    def logs(self) -> str:
        out = []
        slurmd = ["log/slurmd.log"] if len(self.nodes) == 1 else [f"log/slurmd-{n}.log" for n in self.nodes]
        for name in ("log/slurmctld.log", *slurmd, "munge/munged.log"):
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n" + (self.root / name).read_text(errors="replace")[-2000:])
        return "\n".join(out)

    def _pids(self) -> list[int]:
        pids = []
        for path in self._pid_files:
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text().split()[0]))
        return pids

    def stop(self) -> None:
        """Cancel every job, stop the daemons (the slurmds first), and wait until each is gone."""
        if shutil.which("scancel"):
            self.run("scancel", "--user", "root", check=False)
        for pid in self._pids():  # slurmd, slurmctld, munged: each daemon by its own pid file
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False

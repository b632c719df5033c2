"""Many-node Slurm jobs against a real two-node cluster (tests/slurmctl.py, ``nodes=2``: slurmd n1 on 127.0.0.1,
n2 on 127.0.0.2), over the real sshd: one srun step with labelled lines, torchrun DDP (the MNIST example's DDP
twin over gloo), kill on every node, a failing rank named, pending for more nodes than exist."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Home, SshHome, stop_host, wait_for
from slurmctl import SlurmCluster, slurm_available

VENV_BIN = str(Path(sys.executable).parent)  # torchrun of the suite's Python
JOB_PATH = f"PATH={VENV_BIN}:/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = slurm_available()
    if why:
        pytest.skip(why)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm2"), nodes=2, cred_expire=30)  # a requeue waits 30 s, not 120
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def sshd2(tmp_path_factory: pytest.TempPathFactory, cluster2: SlurmCluster) -> Iterator[Any]:
    """The real sshd, whose sessions get the two-node cluster's SLURM_CONF through authorized_keys."""
    from sshd import Sshd, ssh_available

    why = ssh_available()
    if why:
        pytest.skip(why)
    server = Sshd(tmp_path_factory.mktemp("sshd-slurm2"))
    server.config.write_text(server.config.read_text().replace("PermitUserEnvironment HOME,PATH,",
                                                               "PermitUserEnvironment HOME,PATH,SLURM_CONF,"))
    server.client_key("ok")
    server.authorized.write_text(f'environment="SLURM_CONF={cluster2.conf}",' + server.authorized.read_text())
    server.start()
    yield server
    server.stop()


class Login:
    """The login node ``box`` over SSH: run, list, follow."""

    def __init__(self, home: SshHome) -> None:
        self.h = home

    def run(self, *args: str) -> str:
        return self.h.cli(
            "run", "box", "--env", JOB_PATH, "--cwd", str(ROOT), *args, check=True
        ).stdout.strip()

    def job(self, job_id: str) -> dict[str, Any]:
        return next(
            j for j in json.loads(self.h.cli("jobs", "box", "--json", check=True).stdout) if j["id"] == job_id
        )

    def follow(self, job_id: str, timeout: float = 240) -> tuple[int, list[str]]:
        res = self.h.cli_bytes("logs", "box", job_id, "-f", timeout=timeout)
        return res.returncode, res.stdout.replace(b"\r\n", b"\n").decode(errors="replace").splitlines()

    def follow_now(self, job_id: str) -> list[str]:
        """The log so far (no follow)."""
        res = self.h.cli_bytes("logs", "box", job_id, timeout=60)
        return res.stdout.replace(b"\r\n", b"\n").decode(errors="replace").splitlines()

    def wait(self, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict[str, Any]:
        return wait_for(
            lambda: (j := self.job(job_id))["state"] in states and j, timeout, 0.5, f"job in {states}"
        )


@pytest.fixture
def box(tmp_path: Path, sshd2: Any, cluster2: SlurmCluster) -> Iterator[Login]:
    h = SshHome(tmp_path / "home", sshd2)
    h.configure(scheduler="slurm")
    yield Login(h)
    cluster2.run("scancel", "--user", "root", check=False)
    stop_host(h.remote_dir)


def by_rank(lines: list[str]) -> dict[str, list[str]]:
    """Each task's lines (srun --label's ``N: `` prefix), in the order they came."""
    ranks: dict[str, list[str]] = {}
    for line in lines:
        m = re.match(r"^ *(\d+): (.*)$", line)
        if m:
            ranks.setdefault(m.group(1), []).append(m.group(2))
    return ranks


def test_a_plain_command_runs_once_on_every_node(box: Login) -> None:
    code = "import os; print('node', os.environ['SLURMD_NODENAME'], os.environ['SLURM_NODEID'], os.environ['MASTER_ADDR'])"
    job_id = box.run("--nodes", "2", "--", sys.executable, "-c", code)
    rc, lines = box.follow(job_id)
    assert rc == 0, lines
    assert by_rank(lines) == {"0": ["node n1 0 127.0.0.1"], "1": ["node n2 1 127.0.0.1"]}  # MASTER_ADDR: n1's
    job = box.job(job_id)
    assert (
        job["state"] == "succeeded"
        and job["slurm"]["nodes"] == "n[1-2]"
        and job["command"][0] == sys.executable
    )


def test_the_insights_of_a_many_node_job_are_rank_0s(box: Login, tmp_path: Path) -> None:
    """Rank 1 prints other progress, after rank 0 is done: the job's epoch and metrics are still rank 0's."""
    gate = tmp_path / "rank0-done"
    code = (
        "import os, time\nrank = os.environ['SLURM_NODEID']\n"
        "if rank == '0':\n"
        "    print('Epoch 3/3 train_loss=0.1000 test_acc=0.9000', flush=True)\n"
        f"    open({str(gate)!r}, 'w').close()\n"
        "else:\n"
        f"    while not os.path.exists({str(gate)!r}): time.sleep(0.1)\n"
        "    time.sleep(0.5)\n"  # after rank 0's line is out (no reader orders the two tasks' lines)
        "    print('Epoch 1/3 train_loss=2.5000 test_acc=0.1000', flush=True)\n"
    )
    job_id = box.run("--nodes", "2", "--", sys.executable, "-c", code)
    rc, lines = box.follow(job_id)
    assert rc == 0 and lines[-1].startswith("1: Epoch 1/3"), lines
    ins = box.job(job_id)["insights"]
    assert (ins["epoch"], ins["total_epochs"]) == (3, 3) and ins["metrics"]["test_acc"]["last"] == 0.9, ins


def test_ddp_on_two_nodes_matches_one_process(box: Login, tmp_path: Path) -> None:
    """The MNIST example's DDP twin, torchrun on 2 nodes x 1 process (gloo, no GPU): both ranks' lines in order,
    the insights read rank 0, and the final accuracy is a single process's, within noise."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "examples" / "mnist_from_digits.py"), str(data)], check=True,
                   capture_output=True)
    args = [
        "--data-dir",
        str(data),
        "--epochs",
        "2",
        "--batch-size",
        "32",
        "--device",
        "cpu",
        "--workers",
        "0",
    ]
    single = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mnist_ddp.py"), *args, "--out",
                             str(tmp_path / "one")], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-2000:]
    one_acc = json.loads((tmp_path / "one" / "summary.json").read_text())["test_acc"]

    out = tmp_path / "ddp"
    job_id = box.run("--nodes", "2", "--launcher", "torchrun", "--", "examples/train_mnist_ddp.py", *args,
                     "--out", str(out))
    rc, lines = box.follow(job_id, timeout=400)
    assert rc == 0, "\n".join(lines[-40:])
    ranks = by_rank(lines)
    assert sorted(ranks) == ["0", "1"], lines[-40:]
    for rank, mine in ranks.items():
        said = [line for line in mine if line.startswith(("gputui MNIST DDP", "Epoch", "Done"))]
        assert [s.split()[0] for s in said] == ["gputui", "Epoch", "Epoch", "Done:"], (rank, mine)
        assert (
            f"rank {rank}/2 " in said[0]
            and said[1].startswith("Epoch 1/2")
            and said[2].startswith("Epoch 2/2")
        )
    ddp_acc = json.loads((out / "summary.json").read_text())["test_acc"]  # rank 0 wrote it
    assert abs(ddp_acc - one_acc) < 0.06, (ddp_acc, one_acc)
    job = box.job(job_id)
    assert job["state"] == "succeeded" and job["slurm"]["launcher"] == "torchrun"
    ins = job["insights"]
    assert (ins["epoch"], ins["total_epochs"]) == (2, 2)
    assert ins["metrics"]["test_acc"]["last"] == pytest.approx(ddp_acc, abs=1e-4)


WAITER = (
    "import os, signal, sys, time\n"
    "def got(n, f):\n"
    "    print('got', signal.Signals(n).name, flush=True)\n"
    "signal.signal(signal.SIGINT, got)\n"
    "signal.signal(signal.SIGTERM, got)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)


def marked(marker: str) -> dict[int, str]:
    """pid -> SLURMD_NODENAME of each live task: a Python running the marked WAITER (srun's argv has it too)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        words = argv.split(b"\0")
        if (
            words[1:3] == [b"-c", f"# {marker}\n".encode() + WAITER.encode()]
            and stat.rsplit(b")", 1)[1].split()[0] != b"Z"
        ):
            node = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"SLURMD_NODENAME=")), "")
            found[int(pid)] = node
    return found


def test_kill_escalates_on_every_node_and_leaves_nothing(box: Login) -> None:
    marker = f"gputui-multinode-{os.getpid()}"
    job_id = box.run("--nodes", "2", "--", sys.executable, "-c", f"# {marker}\n" + WAITER)
    wait_for(lambda: by_rank(box.follow_now(job_id)).keys() >= {"0", "1"}, 90, 0.5, "both tasks ready")
    assert sorted(marked(marker).values()) == ["n1", "n2"]  # one task on each node
    res = box.h.cli("kill", "box", job_id, "--grace", "1", "-y", timeout=120)
    assert res.returncode == 0 and "killed" in res.stdout, res.stderr
    ranks = by_rank(box.follow_now(job_id))
    for rank in ("0", "1"):  # INT, then TERM, reached the task on each node; then KILL
        said = [line for line in ranks[rank] if line == "ready" or line.startswith("got ")]
        assert said[:3] == ["ready", "got SIGINT", "got SIGTERM"], ranks  # (Slurm's own TERMs may follow)
    wait_for(lambda: not marked(marker), 30, 0.2, "no task left on either node")
    assert box.job(job_id)["state"] == "killed"


def test_a_rank_that_exits_1_fails_the_job_naming_it(box: Login) -> None:
    code = ("import os, sys, time\nrank = int(os.environ['SLURM_NODEID'])\nprint('rank', rank, flush=True)\n"
            "if rank == 1:\n    sys.exit(1)\ntime.sleep(300)\n")
    job_id = box.run("--nodes", "2", "--", sys.executable, "-c", code)
    job = box.wait(
        job_id, ("failed", "succeeded", "lost"), timeout=120
    )  # rank 0 ended with it, not after 300 s
    assert job["state"] == "failed" and job["exit_code"] != 0
    assert job["slurm"]["reason"] == "task 1 on n2: Exited with exit code 1", job["slurm"]


def test_three_nodes_of_two_wait_with_slurms_reason(box: Login) -> None:
    job_id = box.run("--nodes", "3", "--", "true")
    job = box.wait(job_id, ("queued",))
    # Slurm's word for "not enough nodes": PartitionConfig here; Resources while the nodes are still busy
    waits = ("PartitionConfig", "PartitionNodeLimit", "Resources")
    wait_for(lambda: box.job(job_id)["slurm"]["reason"] in waits, 60, 0.5, f"a reason in {waits}")
    assert job["slurm"]["state"] == "PENDING"
    assert "queued" in box.h.cli("jobs", "box", check=True).stdout
    assert box.h.cli("kill", "box", job_id, "-y", timeout=60).returncode == 0


STEPPER = ("import os, time\nprint('attempt', os.environ.get('GPUTUI_ATTEMPT'), 'on', os.environ['SLURMD_NODENAME'],"
           " flush=True)\nfor i in range(100000):\n    print('step', i, flush=True)\n    time.sleep(0.2)\n")


@contextlib.contextmanager
def node_down(cluster: SlurmCluster, node: str) -> Iterator[None]:
    """A node failure as slurmctld sees one (the node set DOWN ends the jobs on it); the node back after."""
    cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=gputui-test")
    try:
        yield
    finally:
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def started_on(box: Login, job_id: str, attempt: str = "None") -> str:
    """The node the job's run ``attempt`` (GPUTUI_ATTEMPT as the job saw it) printed it started on."""
    prefix = f"attempt {attempt} on "
    return wait_for(
        lambda: next((ln[len(prefix):] for ln in box.follow_now(job_id) if ln.startswith(prefix)), None),
        240, 0.5, f"run {attempt} to start",
    )


def test_a_node_failure_without_requeue_loses_the_job_saying_so(box: Login, cluster2: SlurmCluster) -> None:
    job_id = box.run("--sbatch-arg=--no-requeue", "--", sys.executable, "-c", STEPPER)
    with node_down(cluster2, started_on(box, job_id)):
        job = box.wait(job_id, ("lost", "failed", "killed", "succeeded"), timeout=60)
    assert (job["state"], job["slurm"]["state"]) == ("lost", "NODE_FAIL"), job
    assert job["slurm"]["reason"] in ("node failure", "NodeDown"), job["slurm"]


def test_a_run_slurm_requeues_after_a_node_failure_is_the_jobs_next_attempt(box: Login, cluster2: SlurmCluster) -> None:
    """Slurm's default for batch jobs: a run ended by a node failure is queued again and runs again. gputui shows
    it queued (not failed with the killed run's exit code), then running as attempt 2, with the first run kept in
    attempts and the log marked between the runs."""
    job_id = box.run("--", sys.executable, "-c", STEPPER)
    try:
        first = started_on(box, job_id)
        with node_down(cluster2, first):
            queued = box.wait(job_id, ("queued", "lost", "failed", "succeeded"), timeout=60)
        assert queued["state"] == "queued" and queued["exit_code"] is None, queued
        second = started_on(box, job_id, attempt="2")  # (the node is back: ReturnToService=2)
        job = box.job(job_id)
        assert (job["state"], job["exit_code"]) == ("running", None), job
        [attempt] = job["attempts"]
        assert attempt["attempt"] == 1 and attempt["requeued_by"] == "slurm" and attempt["progress"].startswith("step")
        log = box.follow_now(job_id)
        marker = log.index("── attempt 2, requeued by Slurm ──")
        assert log.index(f"attempt None on {first}") < marker < log.index(f"attempt 2 on {second}")
        assert f"box {job_id} attempts: requeued by Slurm (" in box.h.cli("jobs", "box", check=True).stdout
    finally:
        box.h.cli("kill", "box", job_id, "-y", timeout=60)


def test_many_node_flags_on_a_host_without_slurm_are_a_usage_error(home: Home) -> None:
    home.write_config('[hosts.box]\ntransport = "local"\n')
    for flags in (["--nodes", "2"], ["--launcher", "torchrun"], ["--gpus-per-node", "2"]):
        res = home.cli("run", "box", *flags, "--", "true")
        assert res.returncode == 2, (flags, res.stderr)
        assert f'{flags[0]}: only for a Slurm host (box has no scheduler = "slurm")' in res.stderr


def test_the_insights_of_a_labelled_log_read_rank_0() -> None:
    from gputui.core.jobs.labels import rank0_view

    log = (b"0: Epoch 1/3 test_acc=0.5\n1: Epoch 1/3 test_acc=0.1\n1: Epoch 2/3 test_acc=0.2\n"
           b"srun: error: n2: task 1: Exited with exit code 1\n 0: Epoch 2/3 test_acc=0.6\n")
    view = rank0_view(log, 0)
    assert len(view) == len(log)  # every byte keeps its offset
    assert [line.strip() for line in view.split(b"\n") if line.strip()] == [
        b"Epoch 1/3 test_acc=0.5",
        b"srun: error: n2: task 1: Exited with exit code 1",
        b"Epoch 2/3 test_acc=0.6",
    ]
    assert rank0_view(b"_acc=0.2\n0: Epoch 3/3\n", 100).split(b"\n")[0].strip() == b""  # a cut line: whose?


def test_gpu_cards_of_every_node_of_a_running_job(tmp_path: Path, cluster2: SlurmCluster) -> None:
    """A running two-node job's GPUs come from each of its nodes (one ``srun --overlap``, ``gpu-stream`` per
    node, here a recorded H100 nvidia-smi), one card per node GPU, named by Slurm's node name."""
    from conftest import AgentProc
    from test_metrics_smi import H100, fake_smi

    from remote_agent import protocol as P

    state, gate = tmp_path / "state", tmp_path / "gate"
    agent = AgentProc(state, "--nvidia-smi", fake_smi(tmp_path, H100, "load"), env=cluster2.env)
    try:
        code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"
        asked = {"gpus": 1, "nodes": 2}
        job = agent.call(P.OP_JOBS_START, argv=[sys.executable, "-c", code], slurm=asked)["result"]
        agent.wait_event(P.EV_JOB, timeout=60, id=job["id"], state="running")
        agent.call(P.OP_METRICS_SUBSCRIBE, interval=0.5)

        def node_cards() -> list[str]:
            sample = agent.wait_event(P.EV_METRICS, timeout=30)["data"]
            return sorted(g["name"] for g in sample["gpus"] if g["name"].startswith(("n1: ", "n2: ")))

        wanted = ["n1: NVIDIA H100 80GB HBM3", "n2: NVIDIA H100 80GB HBM3"]
        wait_for(lambda: node_cards() == wanted, 60, 0, "a card for each node's GPU")
        gate.touch()
        agent.wait_event(P.EV_JOB, timeout=60, id=job["id"], state="succeeded")
    finally:
        agent.close()
        stop_host(state)


def test_the_jobs_row_shows_a_many_node_jobs_nodes() -> None:
    from gputui.core.session import model as M
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.host import job_row

    wire = {"id": "7", "name": "ddp", "state": "running", "argv": ["train.py"], "scheduler": "slurm",
            "slurm": {"job_id": "12", "state": "RUNNING", "nodes": "n[1-2]", "nodes_count": 2, "gpus": 4}}
    row = job_row(M.Job.from_wire("hpc", wire), None, 0.0, Palette())  # type: ignore[arg-type]
    assert row[1].plain == "ddp · on n[1-2]" and row[4].plain == "4x2"

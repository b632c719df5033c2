"""Slurm clusters as a backend, against a real slurmctld (tests/slurmctl.py): submit, queued with a reason, run,
follow by byte offset, kill with escalation, a failing job, TIMEOUT; the same over the real sshd."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, Home, SshHome, stop_host, wait_for
from slurmctl import SlurmCluster, slurm_available

# A job that says which signal it got and goes on, until SIGKILL: proves the escalation's steps.
TRAPPER = (
    "import signal, sys, time\n"
    "def got(n, f):\n"
    "    print('got', signal.Signals(n).name, flush=True)\n"
    "signal.signal(signal.SIGINT, got)\n"
    "signal.signal(signal.SIGTERM, got)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = slurm_available()
    if why:
        pytest.skip(why)
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


class ClusterHome(Home):
    """A client HOME whose config has one Slurm host, ``hpc`` (the login node is this machine)."""

    def __init__(self, root: Path, cluster: SlurmCluster) -> None:
        super().__init__(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.env["SLURM_CONF"] = cluster.env["SLURM_CONF"]  # the agent inherits it (local transport)
        self.write_config('[hosts.hpc]\ntransport = "local"\nscheduler = "slurm"\n')

    def run(self, *args: str) -> str:
        res = self.cli("run", "hpc", *args, check=True)
        return res.stdout.strip()

    def job(self, job_id: str, host: str = "hpc") -> dict[str, Any]:
        jobs = json.loads(self.cli("jobs", host, "--json", check=True).stdout)
        return next(j for j in jobs if j["id"] == job_id)


@pytest.fixture
def chome(tmp_path: Path, cluster: SlurmCluster) -> Iterator[ClusterHome]:
    h = ClusterHome(tmp_path / "home", cluster)
    yield h
    cluster.run("scancel", "--user", "root", check=False)
    stop_host(h.state_dir)


def py(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def wait_state(h: ClusterHome, job_id: str, states: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    return wait_for(lambda: (j := h.job(job_id))["state"] in states and j, timeout, 0.3, f"job in {states}")


def test_run_follow_and_succeed(chome: ClusterHome, cluster: SlurmCluster) -> None:
    job_id = chome.run("--gpus", "1", *py("import os\nfor i in range(3): print('line', i)\nprint(os.environ['SLURM_JOB_ID'])"))
    assert job_id.isdigit()  # the gputui id, printed at once
    res = chome.cli_bytes("logs", "hpc", job_id, "-f", timeout=90)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.replace(b"\r\n", b"\n").decode().splitlines()
    job = chome.job(job_id)
    slurm_id = job["slurm"]["job_id"]
    assert lines == ["line 0", "line 1", "line 2", slurm_id]  # every byte, from offset 0, once
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert job["slurm"]["state"] == "COMPLETED" and job["slurm"]["gpus"] == 1
    shown = cluster.run("scontrol", "show", "job", slurm_id).stdout
    assert "gres:gpu:1" in shown and f"JobName=gputui-{job_id}" in shown
    # reading by byte offset: from the middle of the log on
    tail = chome.cli_bytes("logs", "hpc", job_id, "--tail", "1").stdout.decode().strip()
    assert tail == slurm_id


def test_a_secret_reaches_a_slurm_job_and_leaves_the_state_dir_once_slurm_says_it_ended(chome: ClusterHome) -> None:
    """The runner on the allocation's node puts the secret into the job's environment; the host keeps it (a run
    Slurm requeues needs it again) until Slurm says the job ended, and then no file under the state dir holds it."""
    import hashlib
    import secrets

    value = "hf_" + secrets.token_hex(16)
    stored = chome.root / ".config" / "gputui" / "secrets.toml"  # (in the environment, the local agent would inherit it)
    stored.write_text(f'HF_TOKEN = "{value}"\n')
    stored.chmod(0o600)
    job_id = chome.run("--secret", "HF_TOKEN", *py("import hashlib, os\n"
                       "print(hashlib.sha256(os.environ['HF_TOKEN'].encode()).hexdigest())"))
    job = wait_state(chome, job_id, ("succeeded", "failed", "lost"), timeout=90)
    assert job["state"] == "succeeded", job
    job_dir = chome.job_dir(job_id)
    assert (job_dir / "output.log").read_text().strip() == hashlib.sha256(value.encode()).hexdigest()
    assert not (job_dir / "secrets").exists()
    files = [p for p in chome.state_dir.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    assert files == []


def test_queued_with_reason_then_runs(chome: ClusterHome, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hold = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)\nprint('released')"
    first = chome.run("--gpus", "2", *py(hold))  # both GPUs of the node
    wait_state(chome, first, ("running",))
    second = chome.run("--gpus", "1", *py("print('my turn')"))
    queued = wait_state(chome, second, ("queued",))
    assert queued["slurm"]["state"] == "PENDING"
    wait_for(lambda: chome.job(second)["slurm"]["reason"] == "Resources", 30, 0.3, "reason Resources")
    table = chome.cli("jobs", "hpc", check=True).stdout
    assert "queued" in table
    gate.touch()
    assert wait_state(chome, second, ("succeeded",))["exit_code"] == 0
    assert chome.job(first)["state"] == "succeeded"
    assert chome.cli("logs", "hpc", second, check=True).stdout.strip() == "my turn"


def test_more_gpus_than_exist_is_refused_clearly(chome: ClusterHome) -> None:
    res = chome.cli("run", "hpc", "--gpus", "3", *py("print(1)"))
    assert res.returncode != 0
    assert "Requested node configuration is not available" in res.stderr
    assert "Traceback" not in res.stderr


def stand_in(h: ClusterHome, where: Path, name: str, script: str) -> str:
    """Put a ``name`` running ``script`` (sh) first on the agent's PATH; the PATH it had, to put back."""
    where.mkdir(exist_ok=True)
    (where / name).write_text("#!/bin/sh\n" + script)
    (where / name).chmod(0o755)
    path = h.env["PATH"]
    h.env["PATH"] = f"{where}:{path}"
    return path


def test_kill_escalates_sigint_sigterm_sigkill(chome: ClusterHome, tmp_path: Path) -> None:
    job_id = chome.run(*py(TRAPPER))
    wait_for(lambda: b"ready" in chome.cli_bytes("logs", "hpc", job_id).stdout, 60, 0.3, "job ready")
    calls = tmp_path / "scancel-calls"  # each scancel's arguments, then the real scancel runs them
    scancel = shutil.which("scancel", path=chome.env["PATH"])
    path = stand_in(chome, tmp_path / "spy", "scancel", f'echo "$*" >> "{calls}"\nexec "{scancel}" "$@"\n')
    try:
        res = chome.cli("kill", "hpc", job_id, "--grace", "1", "-y", timeout=90)
    finally:
        chome.env["PATH"] = path
    assert res.returncode == 0, res.stderr
    assert "killed" in res.stdout
    log = chome.cli("logs", "hpc", job_id, check=True).stdout
    assert "got SIGINT" in log and "got SIGTERM" in log
    assert log.index("got SIGINT") < log.index("got SIGTERM")
    job = chome.job(job_id)
    assert job["state"] == "killed" and job["ended_at"] is not None
    slurm_id = job["slurm"]["job_id"]  # the job ignores INT and TERM: the KILL step to every step ends it
    assert calls.read_text().splitlines() == [f"--batch --signal=INT {slurm_id}", f"--batch --signal=TERM {slurm_id}",
                                              f"--full --signal=KILL {slurm_id}", slurm_id]


def test_a_failing_scancel_is_said_at_once_and_the_job_ends_as_it_does(chome: ClusterHome, tmp_path: Path) -> None:
    """scancel refusing: the kill says scancel's error (nothing reported killed), and the job's own end is kept."""
    gate = tmp_path / "gate"
    job_id = chome.run(*py(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"))
    wait_state(chome, job_id, ("running",))
    path = stand_in(chome, tmp_path / "bin", "scancel",
                    "echo 'scancel: error: Kill job error on job id 1: Access/permission denied' >&2\nexit 1\n")
    try:
        res = chome.cli("kill", "hpc", job_id, "--grace", "1", "-y", timeout=60)
    finally:
        chome.env["PATH"] = path
    assert res.returncode != 0 and "killed" not in res.stdout
    assert "not killed: scancel failed: scancel: error: Kill job error on job id 1: Access/permission denied" in res.stderr
    assert chome.job(job_id)["state"] == "running"
    gate.touch()
    assert wait_state(chome, job_id, ("succeeded", "killed"))["state"] == "succeeded"  # not "killed"


def test_a_scancel_that_changes_nothing_is_no_kill(chome: ClusterHome, tmp_path: Path) -> None:
    """scancel exits 0 but the job runs on (scancel says nothing for a job Slurm does not know): not reported killed."""
    gate = tmp_path / "gate"
    job_id = chome.run(*py(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"))
    wait_state(chome, job_id, ("running",))
    path = stand_in(chome, tmp_path / "bin", "scancel", "exit 0\n")
    try:
        res = chome.cli("kill", "hpc", job_id, "--grace", "0", "-y", timeout=60)
    finally:
        chome.env["PATH"] = path
    assert res.returncode != 0 and "killed" not in res.stdout
    assert "scancel was accepted, but after 8 s the job has not ended (squeue says RUNNING)" in res.stderr, res.stderr
    gate.touch()
    assert wait_state(chome, job_id, ("succeeded", "killed"))["state"] == "succeeded"


def test_a_controller_that_does_not_answer_fails_the_kill_at_once(chome: ClusterHome, tmp_path: Path) -> None:
    """scancel hanging (slurmctld down): a bounded wait, then the kill says so, well before the client gives up."""
    gate = tmp_path / "gate"
    job_id = chome.run(*py(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"))
    wait_state(chome, job_id, ("running",))
    path = stand_in(chome, tmp_path / "bin", "scancel", "exec sleep 120\n")
    try:
        res = chome.cli("kill", "hpc", job_id, "--grace", "0", "-y", timeout=60)
    finally:
        chome.env["PATH"] = path
    assert res.returncode != 0 and "agent did not answer" not in res.stderr
    assert "not killed: scancel did not answer within 4 s" in res.stderr, res.stderr
    gate.touch()
    assert wait_state(chome, job_id, ("succeeded", "killed"))["state"] == "succeeded"


def test_kill_queued_job(chome: ClusterHome) -> None:
    job_id = chome.run("--sbatch-arg=--hold", *py("print('never')"))
    assert wait_state(chome, job_id, ("queued",))["slurm"]["reason"] == "JobHeldUser"
    res = chome.cli("kill", "hpc", job_id, "-y", timeout=60)
    assert res.returncode == 0, res.stderr
    job = chome.job(job_id)
    assert job["state"] == "killed" and job["slurm"]["state"] == "CANCELLED"


def test_failing_job(chome: ClusterHome) -> None:
    job_id = chome.run(*py("import sys\nprint('bad input', flush=True)\nsys.exit(3)"))
    job = wait_state(chome, job_id, ("failed",))
    assert job["exit_code"] == 3 and job["slurm"]["state"] == "FAILED"
    assert chome.cli("logs", "hpc", job_id, check=True).stdout.strip() == "bad input"


def test_bad_slurm_input_is_a_clear_error(chome: ClusterHome) -> None:
    for args, words in (
        (("--time", "soon"), "time 'soon'"),
        (("--gpus", "0,1"), "the GPUs per node"),
        (("--partition", "nope"), "invalid partition"),
        (("--sbatch-arg=--output=/tmp/x",), "gputui sets the log"),
    ):
        res = chome.cli("run", "hpc", *args, *py("print(1)"))
        assert res.returncode != 0 and words in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    chome.write_config('[hosts.hpc]\ntransport = "local"\nscheduler = "pbs"\n')
    res = chome.cli("jobs", "hpc")
    assert res.returncode == 2 and "config.toml:3: hosts.hpc.scheduler: 'pbs' is not a scheduler" in res.stderr
    chome.write_config('[hosts.box]\ntransport = "local"\n')
    res = chome.cli("run", "box", "--partition", "main", *py("print(1)"))
    assert res.returncode == 2 and "--partition: only for a Slurm host" in res.stderr


def test_timeout_fails_with_the_reason(chome: ClusterHome) -> None:
    """``--time 1`` (one minute, Slurm's smallest limit; it checks limits every 30 s): about 60-90 s."""
    job_id = chome.run("--time", "1", *py(TRAPPER))
    job = wait_state(chome, job_id, ("failed",), timeout=180)
    assert job["slurm"]["state"] == "TIMEOUT" and job["slurm"]["reason"] == "TimeLimit"
    assert "got SIGTERM" in chome.cli("logs", "hpc", job_id, check=True).stdout  # Slurm's own TERM, passed on


# --- the login node over SSH --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm_sshd(tmp_path_factory: pytest.TempPathFactory, cluster: SlurmCluster) -> Iterator[Any]:
    """The real sshd, whose sessions get SLURM_CONF (the login node's Slurm config) through authorized_keys."""
    from sshd import Sshd, ssh_available

    why = ssh_available()
    if why:
        pytest.skip(why)
    server = Sshd(tmp_path_factory.mktemp("sshd-slurm"))
    server.config.write_text(server.config.read_text().replace("PermitUserEnvironment HOME,PATH,",
                                                               "PermitUserEnvironment HOME,PATH,SLURM_CONF,"))
    server.client_key("ok")
    line = server.authorized.read_text()
    server.authorized.write_text(f'environment="SLURM_CONF={cluster.conf}",' + line)
    server.start()
    yield server
    server.stop()


def test_over_ssh_run_follow_kill(tmp_path: Path, slurm_sshd: Any, cluster: SlurmCluster) -> None:
    """The login node reached over SSH (the agent deployed there): submit, queued with a reason, follow, kill with
    escalation, a failing job; the agent, runner and batch script are the deployed build's."""
    h = SshHome(tmp_path / "home", slurm_sshd)
    h.configure(scheduler="slurm")

    def job(job_id: str) -> dict[str, Any]:
        return next(j for j in json.loads(h.cli("jobs", "box", "--json", check=True).stdout) if j["id"] == job_id)

    def run(*args: str) -> str:
        return h.cli("run", "box", *args, check=True).stdout.strip()

    try:
        held = run("--sbatch-arg=--hold", *py("print('never')"))
        ok = run("--gpus", "1", *py("print('over ssh')"))
        res = h.cli_bytes("logs", "box", ok, "-f", timeout=90)
        assert res.returncode == 0 and res.stdout.strip() == b"over ssh", res.stderr
        assert job(ok)["slurm"]["state"] == "COMPLETED" and job(ok)["state"] == "succeeded"
        assert job(held)["state"] == "queued" and job(held)["slurm"]["reason"] == "JobHeldUser"
        bad = run(*py("import sys; sys.exit(4)"))
        assert h.cli_bytes("logs", "box", bad, "-f", timeout=90).returncode == 4
        assert job(bad)["state"] == "failed" and job(bad)["exit_code"] == 4
        trapped = run(*py(TRAPPER))
        wait_for(lambda: b"ready" in h.cli_bytes("logs", "box", trapped).stdout, 60, 0.3, "job ready")
        killed = h.cli("kill", "box", trapped, "--grace", "1", "-y", timeout=90)
        assert killed.returncode == 0 and "killed" in killed.stdout, killed.stderr
        log = h.cli("logs", "box", trapped, check=True).stdout
        assert log.index("got SIGINT") < log.index("got SIGTERM")
        assert h.cli("kill", "box", held, "-y", timeout=60).returncode == 0
        assert job(held)["state"] == "killed"
    finally:
        cluster.run("scancel", "--user", "root", check=False)
        stop_host(h.remote_dir)


# --- the agent: the wire schema, and one squeue per refresh ------------------------------------------------------
def test_agent_records_are_in_the_schema(tmp_path: Path, cluster: SlurmCluster) -> None:
    from conftest import AgentProc
    from test_wire_schema import conforms

    from remote_agent import protocol as P

    state = tmp_path / "state"
    agent = AgentProc(state, env=cluster.env)
    try:
        reply = agent.call(P.OP_JOBS_START, argv=[sys.executable, "-c", "print(1)"], slurm={"gpus": 1, "time": "5"})
        assert reply["ok"], reply
        assert conforms(reply["result"], P.JobRecord), reply["result"]
        job_id = reply["result"]["id"]
        ended = agent.wait_event(P.EV_JOB, timeout=60, id=job_id, state="succeeded")
        assert conforms(ended["data"], P.JobRecord)
        listed = agent.call(P.OP_JOBS_LIST)["result"]
        assert conforms(listed, P.ListResult) and listed["jobs"][0]["slurm"]["time"] == "5"
        info = agent.call(P.OP_SLURM_INFO)["result"]
        assert conforms(info, P.ClusterInfo) and info["nodes"][0]["gpus"] == 2, info
        bad = agent.call(P.OP_JOBS_START, argv=["true"], slurm={"gpus": -1})
        assert bad["error"]["code"] == "bad_args" and "gpus" in bad["error"]["message"]
    finally:
        agent.close()
        stop_host(state)


def test_one_squeue_per_refresh_for_all_jobs(
    tmp_path: Path, cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remote_agent.__main__ import launcher
    from remote_agent.jobs import slurm
    from remote_agent.jobs.store import JobStore

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setattr(slurm, "VIEW_MAX_AGE_S", 60.0)  # one refresh, however slow this machine is
    store = JobStore(str(tmp_path / "state"), launcher())
    try:
        ids = [store.start(["true"], slurm={"sbatch_args": ["--hold"]})["id"] for _ in range(5)]
        store.slurm.forget()  # a new refresh
        before = store.slurm.commands
        jobs = store.list()
        assert [j["state"] for j in jobs] == ["queued"] * 5
        assert store.slurm.commands - before == 1  # one squeue for the five jobs, never one per job
        store.start(["true"], slurm={})
        store.kill(ids[0], grace_s=0.1)
        before = store.slurm.commands
        assert store.describe(ids[0])["state"] == "killed"  # final: from the ended index from now on
        for _ in range(2):
            store.slurm.forget()
            store.list()
        assert store.slurm.commands - before == 2  # the job that is still queued: one squeue per refresh
    finally:
        cluster.run("scancel", "--user", "root", check=False)
        stop_host(tmp_path / "state")


# --- the fleet view: partitions and nodes from one sinfo ----------------------------------------------------------
def test_status_shows_partitions_and_nodes_with_gpus(chome: ClusterHome, cluster: SlurmCluster, tmp_path: Path) -> None:
    from gputui.core.session import model as M
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.host import host_info

    gate = tmp_path / "gate"
    job_id = chome.run("--gpus", "1", *py(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"))
    wait_state(chome, job_id, ("running",))
    status = json.loads(chome.cli("status", "--json", check=True).stdout)
    info = status["hosts"][0]["cluster"]
    assert info["error"] is None and info["nodes_total"] == 1
    assert info["partitions"] == [{"name": "main", "default": True, "available": "up", "time_limit": "infinite",
                                   "nodes": 1, "gpus": 2, "gpus_used": 1}]
    node = info["nodes"][0]
    assert (node["name"], node["state"], node["gpus"], node["gpus_used"]) == (cluster.node, "mixed", 2, 1)
    assert node["cpus_alloc"] == 1 and node["cpus"] == 32 and node["partitions"] == ["main"]
    text = chome.cli("status", check=True).stdout
    assert "slurm: main* up 1 nodes GPUs 1/2 · nodes 1 mixed" in text
    # the app's host pane: the same line, as data (a node name is never markup)
    snap = M.HostSnapshot(name="hpc", cluster=dict(info, nodes=[dict(node, state="[bold]down")]))
    assert "nodes 1 [bold]down" in host_info(snap, Palette()).plain
    gate.touch()
    wait_state(chome, job_id, ("succeeded",))


def test_cost_is_price_per_gpu_hour_times_gpus_while_running(chome: ClusterHome) -> None:
    chome.write_config('[hosts.hpc]\ntransport = "local"\nscheduler = "slurm"\nprice_per_gpu_hour = 1.8\n')
    ran = chome.run("--gpus", "2", *py("import time; time.sleep(1)"))
    held = chome.run("--gpus", "1", "--sbatch-arg=--hold", *py("print(1)"))
    wait_state(chome, ran, ("succeeded",))
    chome.cli("kill", "hpc", held, "-y", check=True)
    runs = {r["id"]: r for r in json.loads(chome.cli("history", "hpc", "--json", check=True).stdout)}
    run = runs[ran]
    assert run["duration_s"] >= 1 and run["cost"] == pytest.approx(run["duration_s"] * 2 * 1.8 / 3600)
    assert runs[held]["duration_s"] is None and runs[held]["cost"] is None  # never ran: queue time is free


def test_app_session_keeps_the_cluster_view(tmp_path: Path, cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connected session with metrics on (the app's) asks for the cluster view by itself, and again later."""
    import asyncio

    from gputui.core.config import file as cfg
    from gputui.core.hosts.fleet import Fleet

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    state = tmp_path / "state"
    text = f'[hosts.hpc]\ntransport = "local"\nscheduler = "slurm"\nremote_dir = "{state}"\n'

    async def main() -> list[Any]:
        fleet = Fleet(cfg.parse(text, tmp_path / "config.toml"), metrics_interval=1.0)
        session = fleet.session("hpc")
        seen: list[Any] = []
        try:
            fleet.run_in_background()
            while len(seen) < 2:
                info = session.snapshot.cluster
                if info is not None and (not seen or info["t"] != seen[-1]["t"]):
                    seen.append(info)
                await asyncio.sleep(0.1)
        finally:
            await fleet.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 120))
    assert seen[0]["partitions"][0]["name"] == "main" and seen[1]["t"] > seen[0]["t"]
    stop_host(state)


def test_slurm_unreachable_keeps_the_state_and_says_why(
    chome: ClusterHome, tmp_path: Path, cluster: SlurmCluster
) -> None:
    """squeue failing (slurmctld down, a network blip) never turns a job final or lost: it stays as it was."""
    gate = tmp_path / "gate"
    job_id = chome.run(*py(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"))
    wait_state(chome, job_id, ("running",))
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "squeue").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    (broken / "squeue").chmod(0o755)
    path = chome.env["PATH"]
    chome.env["PATH"] = f"{broken}:{path}"
    try:
        job = chome.job(job_id)
        assert job["state"] == "running" and job["ended_at"] is None
        assert "Unable to contact slurm controller" in job["slurm"]["error"]
    finally:
        chome.env["PATH"] = path
    gate.touch()
    job = wait_state(chome, job_id, ("succeeded",))  # never cached as final while Slurm could not be asked
    assert "error" not in job["slurm"]


def test_gpu_cards_of_a_running_jobs_node_come_from_inside_its_allocation(
    tmp_path: Path, cluster: SlurmCluster
) -> None:
    """The agent streams a running job's node GPUs with one ``srun --overlap`` (the sampler on the node, here a
    recorded H100 nvidia-smi); they join the metrics samples as ``node: model`` cards and go when the job ends."""
    from conftest import AgentProc
    from test_metrics_smi import H100, fake_smi

    from remote_agent import protocol as P

    state, gate = tmp_path / "state", tmp_path / "gate"
    agent = AgentProc(state, "--nvidia-smi", fake_smi(tmp_path, H100, "load"), env=cluster.env)
    try:
        code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"
        job = agent.call(P.OP_JOBS_START, argv=[sys.executable, "-c", code], slurm={"gpus": 1})["result"]
        agent.wait_event(P.EV_JOB, timeout=60, id=job["id"], state="running")
        agent.call(P.OP_METRICS_SUBSCRIBE, interval=0.5)

        def node_gpus() -> list[dict[str, Any]]:
            sample = agent.wait_event(P.EV_METRICS, timeout=30)["data"]
            return [g for g in sample["gpus"] if g["name"].startswith(f"{cluster.node}: ")]

        gpus = wait_for(node_gpus, 60, 0, "the node's GPUs in a sample")
        assert gpus[0]["name"] == f"{cluster.node}: NVIDIA H100 80GB HBM3" and gpus[0]["index"] == 1  # after GPU 0
        assert gpus[0]["util_percent"] is not None
        slurm_id = agent.call(P.OP_JOBS_GET, job=job["id"])["result"]["slurm"]["job_id"]
        steps = cluster.run("squeue", "--steps", "--noheader", "--jobs", slurm_id, "--format=%i %j").stdout
        assert f"{slurm_id}.0 gputui-gpus" in steps  # a step of the job itself: inside its allocation
        gate.touch()
        agent.wait_event(P.EV_JOB, timeout=60, id=job["id"], state="succeeded")
        wait_for(lambda: not node_gpus(), 60, 0, "the node's GPUs gone with the job")
    finally:
        agent.close()
        stop_host(state)


def test_attach_opens_a_shell_on_the_jobs_node(chome: ClusterHome, tmp_path: Path, cluster: SlurmCluster) -> None:
    """The app's attach on a Slurm job: ``srun --overlap --pty`` into the job's allocation, run here on a pty."""
    import pty
    import select
    import time

    from gputui.core.session import model as M
    from gputui.ui.attach import attach_argv

    gate = tmp_path / "gate"
    job_id = chome.run(*py(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"))
    record = wait_state(chome, job_id, ("running",))
    job = M.Job.from_wire("hpc", {**record, "argv": record["command"]})
    argv = attach_argv([], M.HostSnapshot(name="hpc"), job)
    assert argv == ["srun", f"--jobid={record['slurm']['job_id']}", "--overlap", "--pty", "bash"]
    pid, fd = pty.fork()
    if pid == 0:  # the terminal the user would hand over
        os.execvpe(argv[0], argv, cluster.env)
    os.write(fd, b"echo inside-$SLURM_JOB_ID; exit\n")
    out, deadline = b"", time.monotonic() + 60
    while b"inside-" + record["slurm"]["job_id"].encode() not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    os.waitpid(pid, 0)
    assert b"inside-" + record["slurm"]["job_id"].encode() in out, out
    gate.touch()
    wait_state(chome, job_id, ("succeeded",))


async def test_app_shows_the_cluster_and_kills_a_queued_job(
    chome: ClusterHome, tmp_path: Path, cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_ui_app import SIZE, until
    from ui_fixtures import screen_text

    from gputui.core.config import file as cfg
    from gputui.core.session import model as M
    from gputui.ui.app import GpuTuiApp
    from gputui.ui.screens.confirm import ConfirmScreen

    job_id = chome.run("--sbatch-arg=--hold", *py("print('never')"))
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    path = chome.write_config(
        f'[hosts.hpc]\ntransport = "local"\nscheduler = "slurm"\nremote_dir = "{chome.state_dir}"\n'
    )
    app = GpuTuiApp(cfg.load(str(path)), state_path=tmp_path / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "slurm: main* up 1 nodes GPUs 0/2 · nodes 1 idle" in screen_text(app), 60,
                    what="the cluster line")
        app.select_job("hpc", job_id)
        await until(pilot, lambda: (j := app.current_job()) is not None and j.state == "queued", what="queued")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await pilot.press("y")
        await until(pilot, lambda: app.current_job().state == M.JOB_KILLED, 60, what="killed")
    assert chome.job(job_id)["slurm"]["state"] == "CANCELLED"


def test_a_listing_older_than_the_submission_never_ends_the_job(
    tmp_path: Path, cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing that asked squeue while sbatch ran does not see the new job: it must not call it lost (and
    make that final), only wait for the next refresh."""
    from remote_agent.__main__ import launcher
    from remote_agent.jobs import slurm
    from remote_agent.jobs.store import JobStore

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setattr(slurm, "VIEW_MAX_AGE_S", 60.0)
    store = JobStore(str(tmp_path / "state"), launcher())
    try:
        store.list()  # an (empty) listing: squeue asked now, before the job exists
        store.slurm.queue("0")
        monkeypatch.setattr(store.slurm, "forget", lambda: None)  # the submit's own refresh comes too late
        job = store.start(["true"], slurm={"sbatch_args": ["--hold"]})
        assert job["state"] == "queued" and job["ended_at"] is None
        monkeypatch.undo()
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        store.slurm.forget()
        assert store.describe(job["id"])["slurm"]["reason"] == "JobHeldUser"
    finally:
        cluster.run("scancel", "--user", "root", check=False)
        stop_host(tmp_path / "state")


def test_a_state_dir_with_percent_signs_is_taken_literally(
    tmp_path: Path, cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch expands %j, %u, ... in --output: gputui's paths are escaped, so slurm.out lands in the job dir."""
    from remote_agent.__main__ import launcher
    from remote_agent.jobs.store import JobStore

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    state = tmp_path / "st%j%u"
    store = JobStore(str(state), launcher())
    try:
        job = store.start([sys.executable, "-c", "print('ok')"], slurm={})
        wait_for(lambda: store.describe(job["id"])["state"] == "succeeded", 60, 0.2, "job done")
        assert (state / "jobs" / job["id"] / "slurm.out").exists()
        assert (state / "jobs" / job["id"] / "output.log").read_bytes().strip() == b"ok"
        with pytest.raises(ValueError, match="at most 64 options"):
            store.start(["true"], slurm={"sbatch_args": ["--hold"] * 65})
    finally:
        stop_host(state)


def test_a_slurm_job_is_never_judged_stalled_by_the_login_nodes_gpus() -> None:
    from remote_agent.watchdog.stall import StallTracker

    idle_gpu = {"index": 0, "util_percent": 0.0, "processes": []}
    jobs = [{"id": "1", "state": "running", "log_size": 0, "gpus": None, "scheduler": "slurm"},
            {"id": "2", "state": "running", "log_size": 0, "gpus": None}]
    tracker = StallTracker()
    tracker.update({"gpus": [idle_gpu]}, jobs, 5.0, 1.0, 0.0, 0.0)
    stalled = tracker.update({"gpus": [idle_gpu]}, jobs, 5.0, 1.0, 120.0, 120.0)
    assert list(stalled) == ["2"]  # the tmux job on this host's idle GPU is; the Slurm job runs elsewhere


def test_a_huge_sinfo_gives_a_bounded_cluster_view(tmp_path: Path) -> None:
    """A cluster (or a broken sinfo) with 30,000 partitions of 400-character names, each node in 100 of them:
    slurm.info still answers, with the first partitions and nodes, counting all of them."""
    from gputui.core.hosts.cluster import cluster_text

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text(
        f"#!{sys.executable}\nimport sys\nfor n in range(30000):\n"
        "    for k in range(100 if n < 50 else 1):\n"
        "        sys.stdout.write('node%d|%s%d|idle|gpu:4|gpu:0|0/4/0/4|up|infinite|none\\n'"
        " % (n, 'p' * 400, n + k))\n"
    )
    (fake / "sinfo").chmod(0o755)
    agent = AgentProc(tmp_path / "state", env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}"))
    try:
        reply = agent.call("slurm.info", timeout=120)
        assert "error" not in reply, reply["error"]
        info = reply["result"]
        assert info["error"] is None and info["nodes_total"] == 30000 and info["partitions_total"] == 30000
        assert 0 < len(info["partitions"]) < 30000 and 0 < len(info["nodes"]) < 30000
        assert all(len(n["partitions"]) <= 32 for n in info["nodes"])
        assert cluster_text(info).startswith("slurm: " + "p" * 400 + "0 up 1 nodes GPUs 0/4")
        assert f"+{30000 - 6} more" in cluster_text(info)
    finally:
        agent.close()


def test_node_gpu_streams_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user with 40 running Slurm jobs: the app's samples stream the nodes of a bounded number of them, not one
    long-lived srun per job on a shared login node (here a stand-in srun that just waits)."""
    from remote_agent.metrics import slurm_gpus

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexec sleep 120\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    running = [{"id": str(n), "scheduler": "slurm", "state": "running", "slurm": {"job_id": str(1000 + n)}}
               for n in range(1, 41)]
    node_gpus = slurm_gpus.NodeGpus([sys.executable, "-m", "remote_agent"], str(tmp_path), "nvidia-smi")
    try:
        node_gpus.add_to({"gpus": []}, running)
        streams = node_gpus._streams
        assert len(streams) == slurm_gpus.MAX_NODE_STREAMS and sorted(streams, key=int) == [str(n) for n in range(1, 17)]
        node_gpus.add_to({"gpus": []}, running[1:])  # job 1 ended: its stream goes, job 17's comes
        assert sorted(node_gpus._streams, key=int) == [str(n) for n in range(2, 18)]
    finally:
        node_gpus.close()


def test_node_gpu_cards_in_a_sample_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight running 300-node jobs of 8 GPUs (stand-in sruns printing their readings): 19,200 node cards would
    make a sample of over 4 MB, which the agent drops whole (no metrics at all); at most MAX_NODE_GPUS go in."""
    from conftest import wait_for

    from remote_agent import protocol as P
    from remote_agent.metrics import slurm_gpus

    fake = tmp_path / "bin"
    fake.mkdir()
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-" + "0" * 32, "util_percent": 99.0,
           "mem_used_mib": 80000, "processes": [{"pid": 7, "name": "python", "mem_mib": 79000}]}
    lines = "".join(json.dumps({"node": f"n{k}", "gpus": [dict(gpu, index=i) for i in range(8)]}) + "\n"
                    for k in range(300))
    (tmp_path / "readings.jsonl").write_text(lines)
    (fake / "srun").write_text(f"#!/bin/sh\ncat {tmp_path / 'readings.jsonl'}\nexec sleep 120\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    running = [{"id": str(n), "scheduler": "slurm", "state": "running", "slurm": {"job_id": str(1000 + n)}}
               for n in range(1, 9)]
    node_gpus = slurm_gpus.NodeGpus([sys.executable, "-m", "remote_agent"], str(tmp_path), "nvidia-smi")
    try:
        node_gpus.add_to({"gpus": []}, running)
        wait_for(lambda: all(len(s.latest) == 300 for s in node_gpus._streams.values()), what="the readings")
        sample: dict[str, Any] = {"gpus": [dict(gpu, name="login GPU")]}
        node_gpus.add_to(sample, running)
        assert len(sample["gpus"]) == 1 + slurm_gpus.MAX_NODE_GPUS and sample["gpus"][0]["name"] == "login GPU"
        assert len(P.encode(P.event(P.EV_METRICS, sample))) < P.MAX_FRAME_BYTES // 4
    finally:
        node_gpus.close()

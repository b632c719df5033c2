"""One job over several SSH hosts without Slurm (``gputui run h1,h2``): two real sshd on one machine (h1 on
127.0.0.1, h2 on 127.0.0.2), each host with its own state dir, the agent deployed on both. Over them: a plain
command once per host with the rendezvous variables, torchrun DDP (the MNIST example's DDP twin over gloo)
matching one process, one job in jobs/history, kill on both hosts, a failing rank and a lost host stopping the
other part with no client connected, a host down or a part that cannot run at start starting nothing anywhere.
The hub's rules and wire are tested alone first (remote_agent/jobs/group.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Home, stop_host, wait_for

from gputui.core.config import file as cfg
from gputui.core.jobs import group as job_group
from gputui.core.session import model as M
from remote_agent.jobs import group as agent_group

VENV_BIN = str(Path(sys.executable).parent)  # torchrun of the suite's Python
JOB_PATH = f"PATH={VENV_BIN}:/usr/local/bin:/usr/bin:/bin"
KEY = "ab" * 32


# --- the hub's rules and wire, alone ----------------------------------------------------------------------------
def test_the_hub_stops_the_job_for_a_failed_a_lost_or_a_missing_part() -> None:
    hosts = ["h1", "h2", "h3"]
    now = 1000.0
    ok = [{"seen": now, "state": "running"} for _ in hosts]
    assert agent_group.decide(ok, hosts, now, now - 10, 30) is None
    failed = [dict(p) for p in ok]
    failed[1].update(state="ended", code=3)
    assert agent_group.decide(failed, hosts, now, now - 10, 30) == "h2 (rank 1) failed (exit 3)"
    done = [dict(p, state="ended", code=0) for p in ok]
    assert agent_group.decide(done, hosts, now, now - 10, 30) is None  # every part succeeded: nothing to stop
    lost = [dict(p) for p in ok]
    lost[2]["seen"] = now - 31
    assert agent_group.decide(lost, hosts, now, now - 100, 30) == "h3 (rank 2) lost: no word from it for 30 s"
    missing = [dict(p) for p in ok]
    missing[0] = {"seen": None, "state": None}
    assert agent_group.decide(missing, hosts, now, now - 10, 30) is None  # still within the start bound
    assert "h1 (rank 0) never joined" in str(agent_group.decide(missing, hosts, now, now - agent_group.START_S - 1, 30))


def test_the_wire_takes_only_sealed_fresh_messages_of_its_group() -> None:
    key = bytes.fromhex(KEY)
    group = {"id": "g1", "hosts": ["h1", "h2"], "lost_s": 30.0}
    hub = agent_group.Hub(group, key, lambda _line: None)
    msg = {"from": "part", "g": "g1", "rank": 1, "seq": 5, "state": "ready", "code": None}
    line = agent_group.seal(key, msg)
    assert agent_group.opened(key, line, "part") == dict(msg, mac=json.loads(line)["mac"])
    assert agent_group.opened(bytes(32), line, "part") is None  # another key
    assert agent_group.opened(key, line, "hub") is None  # a part's message is no hub's answer
    assert agent_group.opened(key, line.replace(b'"rank": 1', b'"rank": 0'), "part") is None  # tampered
    assert agent_group.opened(key, b"x" * (agent_group.MAX_LINE + 1), "part") is None
    reply = hub.answer(agent_group.opened(key, line, "part") or {})
    assert reply is not None and reply["go"] is False and reply["stop"] is None  # rank 0 has not joined yet
    assert hub.answer(agent_group.opened(key, line, "part") or {}) is None  # the same message again: a replay
    assert hub.answer(dict(msg, g="other", seq=6)) is None
    assert hub.answer(dict(msg, rank=7, seq=6)) is None
    assert hub.answer(dict(msg, rank=0, seq=1))["go"] is True  # type: ignore[index]


@pytest.mark.parametrize(
    ("change", "field"),
    [({"hosts": ["h1"]}, "hosts"), ({"hosts": ["h1", "bad name"]}, "hosts"), ({"rank": 2}, "rank"),
     ({"rank": True}, "rank"), ({"key": "00"}, "key"), ({"master_addr": "a b"}, "master_addr"),
     ({"master_port": 0}, "master_port"), ({"lost_s": 1}, "lost_s"), ({"launcher": "mpirun"}, "launcher"),
     ({"id": "../x"}, "id")],
)
def test_a_bad_group_request_is_refused_naming_its_field(change: dict[str, Any], field: str) -> None:
    good = {"id": "g1", "hosts": ["h1", "h2"], "rank": 1, "nproc_per_node": 1, "master_addr": "10.0.0.1",
            "master_port": 29500, "hub_port": 29501, "key": KEY}
    assert agent_group.check_request(good)["lost_s"] == agent_group.LOST_S
    with pytest.raises(agent_group.GroupError, match=f"group.{field}"):
        agent_group.check_request(dict(good, **change))


def _hub(tmp_path: Path, lost_s: float = 5.0) -> tuple[dict[str, Any], threading.Thread]:
    group = {"id": "g1", "hosts": ["h1", "h2"], "rank": 0, "nproc_per_node": 1, "master_addr": "127.0.0.1",
             "master_port": 1, "hub_port": agent_group.free_ports(1)[0], "lost_s": lost_s, "launcher": None}
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({"group": group}))
    (job_dir / agent_group.KEY_FILE).write_text(KEY)
    hub = threading.Thread(target=agent_group.serve_hub, args=(str(job_dir),), daemon=True)
    hub.start()
    return group, hub


def test_parts_start_together_and_a_failed_one_stops_the_other(tmp_path: Path) -> None:
    """Two members over real TCP: neither goes before both joined; rank 1 fails, rank 0 is told to stop (how
    soon: bench/group_stop.py); the hub exits once both ended."""
    group, hub = _hub(tmp_path)
    key = bytes.fromhex(KEY)
    members = [agent_group.Member(dict(group, rank=r), key) for r in (0, 1)]
    first = wait_for(lambda: members[0].ask("ready"), 10, 0.05, "the hub listening")
    assert first["go"] is False and first["stop"] is None  # rank 1 has not joined yet
    joined: list[str | None] = []
    second = threading.Thread(target=lambda: joined.append(members[1].join(timeout=10)))
    second.start()
    assert members[0].join(timeout=10) is None
    second.join(10)
    assert joined == [None]
    ended, told = threading.Event(), []
    watcher = threading.Thread(target=members[0].watch, args=(ended, told.append))
    watcher.start()
    members[1].finish(3)
    watcher.join(60)  # (how soon: bench/group_stop.py)
    assert told == ["h2 (rank 1) failed (exit 3)"]
    members[0].finish(143)
    hub.join(10)
    assert not hub.is_alive()
    log = (tmp_path / "job" / agent_group.HUB_LOG).read_text()
    assert "stopping every part: h2 (rank 1) failed (exit 3)" in log and "done:" in log


def test_a_part_that_loses_the_hub_stops_itself(tmp_path: Path) -> None:
    group = {"id": "g1", "hosts": ["h1", "h2"], "rank": 1, "master_addr": "127.0.0.1",
             "hub_port": agent_group.free_ports(1)[0], "lost_s": 1.0}  # (nobody listens there)
    told: list[str] = []
    agent_group.Member(group, bytes.fromhex(KEY)).watch(threading.Event(), told.append)
    assert told == ["lost the group's hub on h1 (rank 0's host): no answer for 1 s"]


# --- the client's rules ------------------------------------------------------------------------------------------
def _config(tmp_path: Path, text: str) -> cfg.Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return cfg.load(path)


HOSTS = '[hosts.h1]\nhost = "a"\n[hosts.h2]\nhost = "b"\n[hosts.hpc]\nhost = "c"\nscheduler = "slurm"\n'


def test_which_hosts_a_job_runs_on(tmp_path: Path) -> None:
    config = _config(tmp_path, HOSTS + '[groups.pair]\nhosts = ["h1", "h2"]\n')
    assert job_group.hosts_of(config, "h1") is None
    assert job_group.hosts_of(config, "h1,h2") == ["h1", "h2"] == job_group.hosts_of(config, "pair")
    for spec, said in (("h1,h1", "h1 named twice"), ("h1,", "empty host name"), ("h1,hpc", "hpc is a Slurm")):
        with pytest.raises(job_group.GroupError, match=said):
            job_group.hosts_of(config, spec)
    with pytest.raises(cfg.ConfigError, match="unknown host 'nope'"):
        job_group.hosts_of(config, "h1,nope")


@pytest.mark.parametrize(
    ("table", "said"),
    [('hosts = ["h1"]', "two or more"), ('hosts = ["h1", "zz"]', "'zz' is not a configured host"),
     ('hosts = ["h1", "h1"]', "named twice"), ('hosts = ["h1", "hpc"]', "Slurm cluster"),
     ('hosts = ["h1", "h2"]\nextra = 1', "unknown key")],
)
def test_a_bad_group_in_the_config_names_its_line(tmp_path: Path, table: str, said: str) -> None:
    with pytest.raises(cfg.ConfigError, match=said) as err:
        _config(tmp_path, HOSTS + "[groups.pair]\n" + table + "\n")
    assert "config.toml:" in str(err.value) and "groups.pair" in str(err.value)


def test_processes_per_node_and_the_rendezvous_address(tmp_path: Path) -> None:
    assert job_group.processes_per_node(["a", "b"], [8, 8], None) == 8
    assert job_group.processes_per_node(["a", "b"], [0, 0], None) == 1
    assert job_group.processes_per_node(["a", "b"], [8, 4], 4) == 4
    with pytest.raises(job_group.GroupError, match=r"different GPU counts \(a: 8, b: 4\): give --gpus-per-node"):
        job_group.processes_per_node(["a", "b"], [8, 4], None)
    with pytest.raises(job_group.GroupError, match="--gpus-per-node 8: b has 4 GPU"):
        job_group.processes_per_node(["a", "b"], [8, 4], 8)
    config = _config(tmp_path, HOSTS)
    checks: dict[str, Any] = {"h1": {"address": "10.0.0.5", "routes": {"10.1.0.7": "10.1.0.5"}}, "h2": {}}
    assert job_group.master_address(config, "h1", checks) == ("10.1.0.5", "h1's route to the other hosts")
    checks["h1"]["routes"] = {"127.0.0.2": "127.0.0.2"}  # the peer is this same machine
    assert job_group.master_address(config, "h1", checks) == ("10.0.0.5", "the address h1's SSH server answered on")
    config = _config(tmp_path, HOSTS.replace('host = "a"', 'host = "a"\nprivate_address = "192.168.9.1"'))
    assert job_group.master_address(config, "h1", checks) == ("192.168.9.1", "private_address of h1")


def test_a_hosts_check_answer_of_the_wrong_shape_reads_as_empty_and_its_words_as_text() -> None:
    hostile = {"address": "10.0.0.1; rm -rf /", "gpu_count": "8", "problems": ["no \x1b[31mtorchrun"] * 50,
               "ports": ["29500", 70000, True, 29501], "routes": {"10.0.0.2": ["x"], "10.0.0.3": "10.0.0.1"}}
    got = job_group._checked(hostile)
    assert got == {"address": None, "gpu_count": 0, "problems": ["no \\x1b[31mtorchrun"] * 20, "ports": [29501],
                   "routes": {"10.0.0.3": "10.0.0.1"}}, got
    assert job_group._checked({"problems": "a string"})["problems"] == []


def _job(host: str, job_id: str, rank: int, state: str, code: int | None, error: str | None = None) -> M.Job:
    record: dict[str, Any] = {"group": {"id": "g1", "hosts": ["h1", "h2"], "rank": rank}}
    if error:
        record["error"] = error
    return M.Job(host, job_id, "train", state, ("x",), exit_code=code, started_at=10.0 + rank,
                 ended_at=None if state == "running" else 20.0 + rank, record=record)  # type: ignore[arg-type]


def test_the_parts_list_as_one_job_with_the_first_failure() -> None:
    other = M.Job("h1", "1", "solo", "succeeded", ("y",))
    jobs = [other, _job("h1", "4", 0, "failed", 143, "stopped: h2 (rank 1) failed (exit 3)"),
            _job("h2", "9", 1, "failed", 3)]
    merged = job_group.merge_parts(jobs)
    assert [j.id for j in merged] == ["1", "4"]
    one = merged[1]
    assert (one.host, one.state, one.exit_code, one.started_at, one.ended_at) == ("h1", "failed", 3, 10.0, 21.0)
    parts = one.to_json()["group"]["parts"]
    assert [(p["host"], p["id"], p["state"]) for p in parts] == [("h1", "4", "failed"), ("h2", "9", "failed")]
    running = job_group.merge_parts([_job("h1", "4", 0, "running", None)])[0]  # h2 did not answer
    assert running.state == "running" and running.ended_at is None
    assert running.record["group"]["parts"][1] == {"rank": 1, "host": "h2", "id": None, "state": "unknown",
                                                   "exit_code": None, "error": None, "ended_at": None}


# --- two real SSH hosts -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    from sshd import Sshd, ssh_available

    why = ssh_available()
    if why:
        pytest.skip(why)
    servers = [Sshd(tmp_path_factory.mktemp(f"sshd-{n}"), address=a) for n, a in (("h1", "127.0.0.1"),
                                                                                 ("h2", "127.0.0.2"))]
    for s in servers:
        s.client_key("ok")
        s.start()
    yield servers
    for s in servers:
        s.stop()


class Pair(Home):
    """A client HOME whose config names the two sshd as h1 and h2, each with its own state dir."""

    def __init__(self, root: Path, servers: list[Any]) -> None:
        super().__init__(root)
        self.root.mkdir(parents=True)
        self.servers = servers
        self.remote = [root.parent / f"remote-{n}" for n in ("h1", "h2")]
        known = root / "known_hosts"
        known.write_text("".join(s.host_key_line() for s in servers))
        self.configure(known)

    def configure(self, known: Path, h2_port: int | None = None, *extra: str) -> None:
        lines = []
        for name, s, remote, port in zip(("h1", "h2"), self.servers, self.remote, (None, h2_port), strict=True):
            lines += [f"[hosts.{name}]", f'host = "{s.address}"', f"port = {port or s.port}", f'user = "{s.user}"',
                      f'identity_file = "{s.keys["ok"]}"', f'known_hosts = "{known}"', f'remote_dir = "{remote}"', *extra]
        self.write_config("\n".join(lines) + "\n")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cli("run", "h1,h2", "--env", JOB_PATH, "--cwd", str(ROOT), *args, check=check, timeout=120)

    def job(self, job_id: str) -> dict[str, Any]:
        jobs = json.loads(self.cli("jobs", "--json", check=True).stdout)
        return next(j for j in jobs if j["host"] == "h1" and j["id"] == job_id)

    def part_dirs(self, job_id: str) -> list[Path]:
        """Each part's job dir (rank order)."""
        parts = self.job(job_id)["group"]["parts"]
        return [remote / "jobs" / str(p["id"]) for remote, p in zip(self.remote, parts, strict=True)]

    def wait(self, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict[str, Any]:
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout, 0.5, f"job in {states}")

    def logs(self, job_id: str, *extra: str, timeout: float = 120) -> tuple[int, str]:
        res = self.cli_bytes("logs", "h1", job_id, *extra, timeout=timeout)
        return res.returncode, res.stdout.replace(b"\r\n", b"\n").decode(errors="replace")


@pytest.fixture
def pair(tmp_path: Path, two_sshd: list[Any]) -> Iterator[Pair]:
    p = Pair(tmp_path / "home", two_sshd)
    yield p
    for remote in p.remote:
        stop_host(remote)


SHOW = ("import os; print('part', *(os.environ[k] for k in ('NODE_RANK', 'NNODES', 'WORLD_SIZE', 'MASTER_ADDR', "
        "'MASTER_PORT', 'GPUTUI_GROUP_JOB')))")


def test_a_plain_command_runs_once_on_every_host_with_the_rendezvous(pair: Pair) -> None:
    res = pair.run("--name", "hello", "--", sys.executable, "-c", SHOW)
    job_id = res.stdout.strip()
    assert "MASTER_ADDR=127.0.0.1 (h1's route to the other hosts)" in res.stderr, res.stderr
    rc, out = pair.logs(job_id, "-f")
    assert rc == 0, out
    rc1, out1 = pair.logs(job_id, "--rank", "1")
    words0, words1 = out.split(), out1.split()
    assert words0[:4] == ["part", "0", "2", "2"] and words1[:4] == ["part", "1", "2", "2"], (out, out1)
    assert words0[4:] == words1[4:] and words0[4] == "127.0.0.1"  # one rendezvous for both
    job = pair.wait(job_id, ("succeeded",))
    parts = job["group"]["parts"]
    assert [(p["host"], p["state"], p["exit_code"]) for p in parts] == [("h1", "succeeded", 0), ("h2", "succeeded", 0)]
    assert [j["name"] for j in json.loads(pair.cli("jobs", "--json", check=True).stdout)] == ["hello"]  # one line
    history = json.loads(pair.cli("history", "--json", check=True).stdout)
    assert len(history) == 1 and [p["host"] for p in history[0]["group"]["parts"]] == ["h1", "h2"]
    for d in pair.part_dirs(job_id):  # the key rests in the job's dir only, private, never in its record
        assert (d / agent_group.KEY_FILE).stat().st_mode & 0o077 == 0
        key = (d / agent_group.KEY_FILE).read_text()
        assert key not in (d / "job.json").read_text() and key not in (d / "output.log").read_text()


def test_ddp_over_two_hosts_matches_one_process(pair: Pair, tmp_path: Path) -> None:
    """torchrun over h1 and h2 (1 process each, gloo): both ranks trained, rank 0's accuracy is a single
    process's within noise (the Slurm test's tolerance), and it is one job in the lists."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "examples" / "mnist_from_digits.py"), str(data)], check=True,
                   capture_output=True)
    args = ["--data-dir", str(data), "--epochs", "2", "--batch-size", "32", "--device", "cpu", "--workers", "0"]
    single = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mnist_ddp.py"), *args, "--out",
                             str(tmp_path / "one")], capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-2000:]
    one_acc = json.loads((tmp_path / "one" / "summary.json").read_text())["test_acc"]
    out = tmp_path / "ddp"
    job_id = pair.run("--launcher", "torchrun", "--", "examples/train_mnist_ddp.py", *args, "--out",
                      str(out)).stdout.strip()
    rc, log0 = pair.logs(job_id, "-f", timeout=400)
    assert rc == 0, log0[-3000:]
    _, log1 = pair.logs(job_id, "--rank", "1")
    for rank, log in enumerate((log0, log1)):  # each rank trained both epochs (a pane: bars end with \r)
        said = [seg for line in log.splitlines() for seg in line.split("\r") if seg.startswith(("gputui MNIST", "Done"))]
        assert len(said) == 2 and f"rank {rank}/2 " in said[0] and said[1].startswith("Done:"), (rank, log[-2000:])
        assert "Epoch 2/2" in log
    ddp_acc = json.loads((out / "summary.json").read_text())["test_acc"]
    assert abs(ddp_acc - one_acc) < 0.06, (ddp_acc, one_acc)
    job = pair.wait(job_id, ("succeeded",))
    assert job["insights"]["metrics"]["test_acc"]["last"] == pytest.approx(ddp_acc, abs=1e-4)  # rank 0's log


LOOP = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.1)\n"


def _alive(marker: str) -> list[int]:
    """Live processes whose argv holds ``marker`` (the job's command, on either host)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        if marker.encode() in argv and stat.rsplit(b")", 1)[1].split()[0] != b"Z":
            found.append(int(pid))
    return found


def test_kill_stops_every_part(pair: Pair, tmp_path: Path) -> None:
    marker = f"# kill-{tmp_path.name}\n"
    job_id = pair.run("--", sys.executable, "-c", marker + LOOP).stdout.strip()
    wait_for(lambda: len(_alive(marker)) == 2, 60, 0.2, "both parts running")
    res = pair.cli("kill", "h1", job_id, "-y", "--grace", "2", check=True)
    assert res.stdout.count(": killed") == 2, res.stdout
    assert _alive(marker) == []
    job = pair.wait(job_id, ("killed",), timeout=30)
    assert [p["state"] for p in job["group"]["parts"]] == ["killed", "killed"]


def test_a_failing_rank_stops_the_other_part_with_no_client(pair: Pair, tmp_path: Path) -> None:
    marker = f"# fail-{tmp_path.name}\n"
    code = marker + "import os, sys, time\nprint('ready', flush=True)\n" + (
        "if os.environ['NODE_RANK'] == '1':\n    time.sleep(1)\n    sys.exit(3)\nwhile True:\n    time.sleep(0.1)\n"
    )
    job_id = pair.run("--", sys.executable, "-c", code).stdout.strip()  # the CLI is gone from here on
    wait_for(lambda: _alive(marker) == [], 120, 0.2, "rank 0's part stopped")  # (how soon: bench/group_stop.py)
    job = pair.wait(job_id, ("failed",), timeout=30)
    parts = job["group"]["parts"]
    assert parts[1]["exit_code"] == 3 and parts[0]["error"] == "stopped: h2 (rank 1) failed (exit 3)", parts
    assert job["error"] == "h2 (rank 1) failed (exit 3)"  # the cause
    assert job["exit_code"] == 3


FAILING_RANK = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print("joined", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1":
    time.sleep(1)
    sys.exit(3)
dist.barrier()  # rank 1 is gone: gloo fails, or the hub stops this part
while True:
    time.sleep(0.1)
"""


def test_torchrun_with_a_failing_rank_ends_both_parts(pair: Pair, tmp_path: Path) -> None:
    """torchrun over both hosts; rank 1 exits 3 after the rendezvous: the job fails and no process is left on
    either host (torchrun's own rendezvous may end rank 0 before the hub does)."""
    pytest.importorskip("torch")
    script = tmp_path / f"failing_rank_{tmp_path.name}.py"
    script.write_text(FAILING_RANK)
    job_id = pair.run("--launcher", "torchrun", "--", str(script)).stdout.strip()
    rc, out = pair.logs(job_id, "-f", timeout=180)
    _, out1 = pair.logs(job_id, "--rank", "1")
    assert "joined 0" in out and "joined 1" in out1, (out[-2000:], out1[-2000:])
    assert rc != 0
    job = pair.wait(job_id, ("failed",), timeout=60)
    parts = job["group"]["parts"]
    assert parts[1]["exit_code"] not in (0, None) and parts[0]["state"] == "failed", parts
    # the cause is the part that ended first: rank 1 almost always, but both torchruns notice their workers'
    # ends on their own monitor ticks, so rank 0's may come a tick before
    assert re.fullmatch(r"h[12] \(rank [01]\) failed \(exit \d+\)", job["error"]), job
    wait_for(lambda: _alive(script.name) == [], 10, 0.2, "no process of the job left")


def test_the_parts_restart_together(pair: Pair, tmp_path: Path) -> None:
    """--restart on-failure: rank 1 fails its first attempt, rank 0's is stopped for it, and both start their
    second attempt together (a new hub for it), which succeeds: one job, succeeded, each part on attempt 2."""
    pair.configure(pair.root / "known_hosts", None, "restart_backoff_s = 1")
    marker = f"# restart-{tmp_path.name}\n"
    code = marker + (
        "import os, sys, time\nattempt, rank = os.environ['GPUTUI_ATTEMPT'], os.environ['NODE_RANK']\n"
        "print('attempt', attempt, 'rank', rank, flush=True)\n"
        "if attempt == '1' and rank == '1':\n    time.sleep(1)\n    sys.exit(3)\n"
        "while attempt == '1':\n    time.sleep(0.1)\n"
    )
    job_id = pair.run("--restart", "on-failure:2", "--", sys.executable, "-c", code).stdout.strip()
    job = pair.wait(job_id, ("succeeded", "failed"), timeout=150)
    assert job["state"] == "succeeded", job
    _, out0 = pair.logs(job_id)
    _, out1 = pair.logs(job_id, "--rank", "1")
    assert "attempt 1 rank 0" in out0 and "attempt 2 rank 0" in out0, out0
    assert "attempt 1 rank 1" in out1 and "attempt 2 rank 1" in out1, out1
    for host, first in (("h1", 143), ("h2", 3)):  # each part's own record: its first attempt's end
        part = json.loads(pair.cli("jobs", host, "--json", check=True).stdout)[0]
        assert part["attempt"] == 2 and [a["exit_code"] for a in part["attempts"]] == [first], part


def test_a_lost_host_fails_the_job_naming_it(pair: Pair, tmp_path: Path) -> None:
    """h2's part dies without a word (its runner and command SIGKILLed, as when the host is gone): the hub
    stops h1's part after lost_s and names h2."""
    marker = f"# lost-{tmp_path.name}\n"
    job_id = pair.run("--", sys.executable, "-c", marker + LOOP).stdout.strip()
    wait_for(lambda: len(_alive(marker)) == 2, 60, 0.2, "both parts running")
    h2_dir = pair.part_dirs(job_id)[1]
    pids = json.loads((h2_dir / "pid.json").read_text())
    os.kill(pids["runner_pid"], signal.SIGKILL)
    os.killpg(pids["pid"], signal.SIGKILL)
    wait_for(lambda: _alive(marker) == [], agent_group.LOST_S + agent_group.HEARTBEAT_S + agent_group.KILL_GRACE_S + 20, 0.5, "h1 stopped")
    status = json.loads((pair.part_dirs(job_id)[0] / "status.json").read_text())
    assert status["error"] == f"stopped: h2 (rank 1) lost: no word from it for {int(agent_group.LOST_S)} s", status


def test_a_host_down_at_start_starts_nothing_anywhere(pair: Pair, two_sshd: list[Any]) -> None:
    from sshd import free_port

    pair.configure(pair.root / "known_hosts", h2_port=free_port())  # nothing listens there
    res = pair.run("--", sys.executable, "-c", "print(1)", check=False)
    assert res.returncode != 0 and "nothing started: not every host answered" in res.stderr and "h2:" in res.stderr
    assert not (pair.remote[0] / "jobs").exists() or not any((pair.remote[0] / "jobs").iterdir())


def test_a_part_that_cannot_run_starts_nothing_anywhere(pair: Pair) -> None:
    res = pair.run("--launcher", "torchrun", "--", "no_such_script.py", check=False)
    assert res.returncode == 1, res.stderr
    assert f"h1: no no_such_script.py in {ROOT}" in res.stderr and f"h2: no no_such_script.py in {ROOT}" in res.stderr
    for remote in pair.remote:
        assert not (remote / "jobs").exists() or not any((remote / "jobs").iterdir())


@pytest.mark.parametrize(
    ("args", "said"),
    [(("h1,h1",), "h1 named twice"), (("h1,nope",), "unknown host 'nope'"),
     (("h1,h2", "--nodes", "3"), "--nodes 3: the job runs on 2 hosts"),
     (("h1,h2", "--gpus", "0"), "--gpus: not for a job over several hosts"),
     (("h1,h2", "--queue"), "--queue/--after: not for"), (("h1,h2", "--image", "a b"), "run: image 'a b'"),
     (("h1,h2", "--build"), "run --build builds from the job's dir"),
     (("h1,h2", "--resume-from", "x"), "--resume-from needs a restart policy"),
     (("h1,h2", "--env", "MASTER_PORT=1"), "--env MASTER_PORT: gputui sets these")],
)
def test_bad_input_is_refused_before_connecting(home: Home, args: tuple[str, ...], said: str) -> None:
    home.write_config('[hosts.h1]\nhost = "192.0.2.1"\n[hosts.h2]\nhost = "192.0.2.2"\n')  # unreachable: unused
    res = home.cli("run", *args, "--", "python3", "-c", "pass", timeout=30)
    assert res.returncode == 2 and said in res.stderr, res.stderr

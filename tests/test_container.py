"""Containers without a container: detection, cgroup limits and the attribution of GPU processes from another
PID namespace, on recorded inputs (file trees laid out as Docker/Kubernetes show them, the NVML double)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from remote_agent.host import container, doctor
from remote_agent.host.container import HiddenAttribution, Owners
from remote_agent.host.stats import HostStats
from remote_agent.jobs.usage import UsageRecorder
from remote_agent.metrics import sampler as metrics
from remote_agent.metrics.sampler import MetricsSampler
from remote_agent.watchdog.activity import busy_reasons

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
sys.path.insert(0, str(FIXTURES))
from fake_nvidia_smi import sections  # noqa: E402
from nvml_double import NvmlDouble  # noqa: E402

H100_LOAD = sections((FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt").read_text())["load :: query (-q)"]
H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"
# Host pids as NVML reports them in a pod; none of them exists in the fake /proc below.
HOST_PIDS = [2811337, 2811338, 2811402]
OVERLAY_ROOT = "1 0 0:50 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"


def tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def pod_proc(tmp_path: Path, job_pids=((7, 1),)) -> Path:
    """A container's /proc: PID 1 is the agent's shell, the job's processes are visible, host pids are not."""
    files = {
        "1/comm": "bash\n",
        "1/cgroup": "0::/\n",
        "self/mountinfo": OVERLAY_ROOT,
        "self/cgroup": "0::/\n",
    }
    for pid, ppid in job_pids:
        files[f"{pid}/stat"] = f"{pid} (python) S {ppid} {pid}"
    return tree(tmp_path / "proc", files)


def job(job_id: str, gpus, started_at: float, pid: int = 0) -> dict:
    return {"id": job_id, "pid": pid, "gpus": gpus, "started_at": started_at}


@pytest.fixture(autouse=True)
def no_local_proc_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "process_name", lambda pid: None)  # this machine's /proc is not the pod's


# --- detection ---------------------------------------------------------------------------------------------
def test_detects_docker_kubernetes_and_a_bare_host(tmp_path: Path) -> None:
    pod = tree(tmp_path / "pod", {".dockerenv": ""})
    proc = tree(
        tmp_path / "proc",
        {
            "1/comm": "python3\n",
            "1/cgroup": "0::/kubepods/burstable/pod1/abc\n",
            "self/mountinfo": OVERLAY_ROOT,
        },
    )
    info = container.detect(str(pod), str(proc), {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert info["in_container"] and info["runtime"] == "kubernetes"
    assert info["signs"] == [
        "KUBERNETES_SERVICE_HOST is set",
        "/.dockerenv exists",
        "PID 1's cgroup names kubepods",
        "PID 1 is python3, not an init",
        "/ is an overlay filesystem",
    ]
    bare = tree(tmp_path / "bare", {"etc/hostname": "h"})
    host_proc = tree(
        tmp_path / "hproc",
        {
            "1/comm": "systemd\n",
            "1/cgroup": "0::/init.scope\n",
            "self/mountinfo": "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        },
    )
    assert container.detect(str(bare), str(host_proc), {}) == {
        "in_container": False,
        "runtime": None,
        "signs": [],
    }


# --- cgroup limits -------------------------------------------------------------------------------------------
def test_cgroup_v2_limits_drive_the_host_line(tmp_path: Path) -> None:
    proc = tree(
        tmp_path / "proc",
        {
            "self/cgroup": "0::/kubepods/pod1\n",
            "meminfo": "MemTotal: 263855616 kB\nMemAvailable: 200000000 kB\n",
            "stat": "cpu 1 0 1 100 0 0 0 0\n",
        },
    )
    cg = tree(
        tmp_path / "cg",
        {
            "cgroup.controllers": "cpuset cpu io memory pids\n",
            "kubepods/pod1/memory.max": f"{16 << 30}\n",
            "kubepods/pod1/memory.current": f"{5 << 30}\n",
            "kubepods/pod1/memory.stat": f"anon 1\ninactive_file {1 << 30}\n",
            "kubepods/pod1/cpu.max": "150000 100000\n",
            "kubepods/pod1/cpu.stat": "usage_usec 5000000\n",
            "kubepods/memory.max": "max\n",
        },
    )
    assert container.memory_limit(str(proc), str(cg)) == (16 << 30, 4 << 30)
    assert container.cpu_limit(str(proc), str(cg)) == 1.5
    assert container.cpu_usage_s(str(proc), str(cg)) == 5.0
    h = HostStats(str(tmp_path), proc=str(proc), cgroup_root=str(cg)).sample()
    assert (h["mem_used_mib"], h["mem_total_mib"], h["mem_scope"]) == (4096, 16384, "cgroup")
    assert h["cpu_count"] == 1.5


def test_cgroup_v1_limit_and_no_limit(tmp_path: Path) -> None:
    proc = tree(tmp_path / "proc", {"self/cgroup": "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n"})
    cg = tree(
        tmp_path / "cg",
        {
            "memory/docker/abc/memory.limit_in_bytes": f"{8 << 30}\n",
            "memory/docker/abc/memory.usage_in_bytes": f"{3 << 30}\n",
            "memory/docker/abc/memory.stat": f"total_inactive_file {1 << 30}\n",
            "memory/docker/memory.limit_in_bytes": "9223372036854771712\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    assert container.memory_limit(str(proc), str(cg)) == (8 << 30, 2 << 30)
    assert container.cpu_limit(str(proc), str(cg)) is None  # -1: no quota


# --- attribution -------------------------------------------------------------------------------------------
def sample(tmp_path: Path, owners: Owners, sampler=None, pids=HOST_PIDS) -> tuple:
    s = sampler or MetricsSampler(str(tmp_path), nvml=NvmlDouble(H100_LOAD, pids={0: list(pids)}))
    s.sampler_double = s.source.nvml
    s.source.nvml.pids = {0: list(pids)}
    return s, s.sample(owners)


def test_the_only_job_given_the_gpu_gets_its_hidden_processes(tmp_path: Path) -> None:
    proc = pod_proc(tmp_path)
    owners = Owners([job("7", "0", 100.0, pid=7)], proc=str(proc))
    _, out = sample(tmp_path, owners)
    [gpu] = out["gpus"]
    assert [(p["pid"], p["mem_mib"], p["job"], p.get("inferred")) for p in gpu["processes"]] == [
        (2811337, 2566, "7", True),
        (2811338, 1542, "7", True),
        (2811402, 15690, "7", True),
    ]
    assert busy_reasons(out, [{"id": "7", "state": "running", "gpus": "0"}], 101.0) == ["job 7 running"]


def test_a_visible_pid_is_proven_not_inferred(tmp_path: Path) -> None:
    proc = pod_proc(tmp_path, job_pids=((7, 1), (8, 7)))
    owners = Owners([job("7", "0", 100.0, pid=7)], proc=str(proc))
    _, out = sample(tmp_path, owners, pids=[8])
    [proc] = out["gpus"][0]["processes"]
    assert {k: proc[k] for k in ("pid", "mem_mib", "job", "hidden", "inferred")} == {
        "pid": 8, "mem_mib": 2566, "job": "7", "hidden": False, "inferred": False}


def test_unmatched_stays_unknown_and_blocks_idle_only_off_a_held_gpu(tmp_path: Path) -> None:
    proc = pod_proc(tmp_path)
    # Two jobs share GPU 0 and the processes were there before the first sample: no way to tell.
    owners = Owners([job("7", "0", 100.0, pid=7), job("8", None, 110.0)], proc=str(proc))
    _, out = sample(tmp_path, owners)
    procs = out["gpus"][0]["processes"]
    assert [(p["job"], p.get("hidden")) for p in procs] == [(None, True)] * 3
    running = [{"id": "7", "state": "running", "gpus": "0"}, {"id": "8", "state": "running", "gpus": None}]
    assert busy_reasons(out, running, 101.0) == ["job 7 running", "job 8 running"]
    # A running job given only GPU 1: GPU 0's unknown processes are foreign, and named.
    elsewhere = [{"id": "9", "state": "running", "gpus": "1"}]
    assert busy_reasons(out, elsewhere, 101.0)[1:] == [f"pid {p} uses GPU 0" for p in HOST_PIDS]
    # The user's own CUDA_VISIBLE_DEVICES wins over the gpus spec.
    env_held = [{"id": "9", "state": "running", "gpus": "1", "env": {"CUDA_VISIBLE_DEVICES": H100_UUID}}]
    assert busy_reasons(out, env_held, 101.0) == ["job 9 running"]


def test_among_jobs_sharing_a_gpu_the_one_started_before_the_memory_appeared(tmp_path: Path) -> None:
    proc = pod_proc(tmp_path)
    now = time.time()
    jobs = [job("7", "0", now - 1000, pid=7), job("8", "0", now - 10)]
    s, out = sample(tmp_path, Owners(jobs, proc=str(proc)), pids=[])
    assert out["gpus"][0]["processes"] == []
    s.hidden._first_t = now - 500  # the first sample was taken between the two starts
    _, out = sample(tmp_path, Owners(jobs, proc=str(proc)), sampler=s, pids=[2811337])
    assert [(p["job"], p["inferred"]) for p in out["gpus"][0]["processes"]] == [("8", True)]
    # A later job on the same GPU does not take it over while job 8 runs.
    later = jobs + [job("9", "0", out["t"] + 1)]
    _, out = sample(tmp_path, Owners(later, proc=str(proc)), sampler=s, pids=[2811337])
    assert out["gpus"][0]["processes"][0]["job"] == "8"


def test_attribution_rules_on_their_own() -> None:
    h = HiddenAttribution()
    owners = Owners([job("1", "0,1", 10.0), job("2", "GPU-b", 20.0), job("3", "", 5.0)], proc="/nonexistent")
    gpus = [
        {"index": 0, "uuid": "GPU-a", "processes": [{"pid": 5, "job": None}]},
        {"index": 1, "uuid": "GPU-b", "processes": [{"pid": 6, "job": None}]},
        {"index": 2, "uuid": "GPU-c", "processes": [{"pid": 9, "job": None}]},
    ]
    h.apply(gpus, owners, 30.0)
    got = [(p["pid"], p["job"], p.get("inferred")) for g in gpus for p in g["processes"]]
    assert got == [(5, "1", True), (6, None, None), (9, None, None)]


def test_usage_record_counts_the_inferred_memory(tmp_path: Path) -> None:
    jobs_dir = tmp_path / "jobs" / "7"
    jobs_dir.mkdir(parents=True)
    rec = UsageRecorder(str(jobs_dir), 7, "0", "nvidia-smi")
    proc = pod_proc(tmp_path)
    _, out = sample(tmp_path, Owners([job("7", "0", 1.0, pid=7)], proc=str(proc)))
    rec.add(out)
    assert rec.usage["gpu_peak_mem_mib"] == 2566 + 1542 + 15690
    assert rec.usage["gpu_mem_inferred"] is True


# --- doctor ------------------------------------------------------------------------------------------------
def test_doctor_container_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = {"in_container": True, "runtime": "docker", "signs": ["/.dockerenv exists"]}
    proc = tree(
        tmp_path / "proc",
        {"self/mountinfo": OVERLAY_ROOT + "2 1 0:60 / /workspace rw - fuse.mfs mfs rw\n"},
    )
    layer = doctor.volume_check("/root/.gputui", info, str(proc))
    assert layer["status"] == "warn" and "writable layer" in layer["detail"] and "remote_dir" in layer["fix"]
    vol = doctor.volume_check("/workspace/.gputui", info, str(proc))
    assert vol["status"] == "ok" and "/workspace" in vol["detail"]
    assert doctor.volume_check("/x", {"in_container": False}, str(proc))["status"] == "skip"
    assert doctor.container_check(info)["status"] == "ok"
    assert doctor.container_check({"in_container": False})["status"] == "skip"
    mem = doctor.memory_check(15000, 16384, "cgroup")
    assert mem["status"] == "warn" and mem["title"] == "container memory (cgroup limit)"
    assert "--memory" in mem["fix"]
    docker_default = SimpleNamespace(f_blocks=16384, f_bavail=16384, f_frsize=4096)  # 64 MiB
    monkeypatch.setattr(doctor.os, "statvfs", lambda path: docker_default)
    shm = doctor.shm_check("/dev/shm", runtime="kubernetes")
    assert shm["status"] == "warn" and shm["detail"] == "64 MiB, 64 MiB free"
    assert "--shm-size" in shm["fix"] and "emptyDir" in shm["fix"]


def test_status_json_says_whether_the_host_is_a_container(home) -> None:
    """The real CLI and agent on this machine: the host facts carry what detect() finds here."""
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    assert host["container"] == container.detect()
    assert host["host"]["mem_scope"] in ("host", "cgroup")


def test_host_line_says_the_memory_is_the_containers_limit() -> None:
    from gputui.core.session import model as M
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.host import host_info

    wire = {"cpu_percent": 50.0, "cpu_count": 1.5, "mem_used_mib": 4096, "mem_total_mib": 16384}
    limited = M.HostStats.from_wire(dict(wire, mem_scope="cgroup", cpu_scope="cgroup"))
    snap = M.HostSnapshot(name="pod", metrics=M.MetricsSample(seq=1, t=0.0, host=limited, gpus=()))
    line = host_info(snap, Palette()).plain
    assert "cpu 50% of 1.5" in line and "(container limit)" in line
    bare = M.HostSnapshot(
        name="h", metrics=M.MetricsSample(seq=1, t=0.0, host=M.HostStats.from_wire(wire), gpus=())
    )
    assert "(container limit)" not in host_info(bare, Palette()).plain


def test_running_jobs_reads_the_grants_and_skips_a_lost_job(tmp_path: Path) -> None:
    from remote_agent.jobs.store import running_jobs

    dead = subprocess.Popen(["true"])
    dead.wait()
    grants = {
        "1": ({"pid": 11, "runner_pid": os.getpid(), "started_at": 5.0}, {"CUDA_VISIBLE_DEVICES": "1,2"}),
        "2": ({"pid": 12, "runner_pid": dead.pid}, {}),  # lost: its runner is gone
        "3": ({"pid": 13, "runner_pid": os.getpid()}, {"PATH": "/bin"}),
    }
    for job_id, (pids, env) in grants.items():
        tree(tmp_path / job_id, {"pid.json": json.dumps(pids), "env.json": json.dumps(env)})
    tree(tmp_path / "4", {"pid.json": json.dumps({"pid": 14}), "status.json": "{}"})  # ended
    assert running_jobs(str(tmp_path)) == [
        {"id": "1", "pid": 11, "started_at": 5.0, "gpus": "1,2", "container_id": None},
        {"id": "3", "pid": 13, "started_at": None, "gpus": None, "container_id": None},
    ]


def test_mount_of_decodes_escapes_and_takes_the_deepest(tmp_path: Path) -> None:
    proc = tree(
        tmp_path / "proc",
        {"self/mountinfo": OVERLAY_ROOT + "3 1 0:61 / /my\\040data rw - ext4 /dev/vdb rw\n"},
    )
    assert container.mount_of("/my data/state", str(proc)) == ("/my data", "ext4")
    assert container.mount_of("/my datas", str(proc)) == ("/", "overlay")

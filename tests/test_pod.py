"""An emulated pod: the agent and its job in a new PID and mount namespace (``unshare``, as root), the NVML
double fed the job's pid as seen from outside (what NVML reports in a real pod), and a memory cgroup limit.

Skipped, with the reason, where this machine allows no namespace or cgroup.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from gputui.core.session import model as M
from gputui.ui.widgets.host import proc_job

HERE = Path(__file__).parent
LIMIT = 512 << 20


def unshare_works() -> str:
    """Why a PID + mount namespace cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root for unshare --pid --mount-proc"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return "" if res.returncode == 0 else "unshare failed: " + res.stderr.decode(errors="replace").strip()


# The pod's limits: 512 MiB of memory, half a CPU.
V2 = {"memory.max": str(LIMIT), "cpu.max": "50000 100000"}
V1 = {"memory": {"memory.limit_in_bytes": str(LIMIT)}, "cpu": {"cpu.cfs_quota_us": "50000"}, "cpuacct": {}}


def make_cgroups(name: str) -> tuple:
    """([cgroup dirs the pod joins], "") with the pod's limits set, or ([], why not)."""
    try:
        lines = [ln.split(":", 2) for ln in Path("/proc/self/cgroup").read_text().splitlines()]
    except OSError as e:
        return [], f"no /proc/self/cgroup: {e}"
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():  # cgroup v2 only: one directory holds every limit
        plan = [(root / next(p for _, n, p in lines if n == "").strip("/") / name, V2)]
    else:
        plan = []
        for controller, files in V1.items():
            hit = next(((n, p) for _, n, p in lines if controller in n.split(",")), None)
            if hit is None:
                return [], f"no {controller} cgroup controller here"
            base = root / hit[0] if (root / hit[0]).is_dir() else root / controller
            plan.append((base / hit[1].strip("/") / name, files))
    made: list = []
    try:
        for d, files in plan:
            if d not in made:
                d.mkdir()
                made.append(d)
            for f, value in files.items():
                (d / f).write_text(value)
    except OSError as e:
        remove_cgroups(made)
        return [], f"cannot make the pod's cgroups ({d}): {e}"
    return made, ""


def remove_cgroups(dirs: list) -> None:
    for d in dirs:
        wait_for(lambda d=d: not (d / "cgroup.procs").read_text().strip(), what="the pod to leave its cgroup")
        d.rmdir()


def outside_pid(ns: str, inside: int) -> int:
    """The pid, in this (outer) namespace, of process ``inside`` of PID namespace ``ns``: what NVML reports."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
        if len(nspid) >= 2 and int(nspid[-1]) == inside:
            return int(entry)
    return 0


@pytest.fixture
def pod_cgroups():
    made, why = make_cgroups(f"gputui-test-{os.getpid()}")
    yield made, why
    remove_cgroups(made)


def test_emulated_pod(tmp_path: Path, pod_cgroups) -> None:
    why = unshare_works()
    if why:
        pytest.skip(why)
    cgroups, cg_why = pod_cgroups
    enter = "".join(f"echo $$ > {d / 'cgroup.procs'} && " for d in cgroups)
    cmd = f'{enter}exec unshare --pid --fork --mount-proc "{sys.executable}" "{HERE / "pod_agent.py"}" "{tmp_path}"'
    pod = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ready = wait_for(lambda: _read(tmp_path / "ready.json") or pod.poll() is not None, 60, what="the job")
        assert isinstance(ready, dict), pod.stdout.read().decode(errors="replace")
        host_pid = wait_for(lambda: outside_pid(ready["ns"], ready["pid"]), what="the job's outside pid")
        assert host_pid != ready["pid"]  # NVML's pid is not the one the pod sees
        (tmp_path / "pids.json").write_text(json.dumps({"0": [host_pid]}))
        assert pod.wait(timeout=120) == 0, pod.stdout.read().decode(errors="replace")
    finally:
        if pod.poll() is None:
            pod.kill()
            pod.wait()
    out = json.loads((tmp_path / "result.json").read_text())

    # The GPU processes pane names the job, marked as inferred.
    [proc] = out["sample"]["gpus"][0]["processes"]
    assert (proc["pid"], proc["mem_mib"], proc["job"], proc["inferred"]) == (
        host_pid,
        2566,
        ready["job"],
        True,
    )
    gpu = M.GpuSample.from_wire(out["sample"]["gpus"][0])
    assert proc_job(gpu.processes[0], {ready["job"]: "train"}) == f"~{ready['job']} train"

    # Idle reasons: the job, never its own process as a foreign pid.
    assert out["activity"]["reasons"] == [f"job {ready['job']} running"]

    # The runner's run record: peak memory from the inferred process.
    usage = out["record"]["usage"]
    assert usage["gpu_peak_mem_mib"] == 2566 and usage["gpu_mem_inferred"] is True
    assert out["record"]["state"] == "killed"

    # Doctor: in a container; the state dir on a volume survives, the overlay layer does not.
    info, checks = out["info"], {c["detail"].split(" ")[0]: c for c in out["checks"][1:3]}
    assert info["in_container"] and any(s.startswith("PID 1 is python") for s in info["signs"])
    assert out["checks"][0]["status"] == "ok"
    volume, layer = out["checks"][1], out["checks"][2]
    assert volume["status"] == "ok" and "tmpfs" in volume["detail"], checks
    assert layer["status"] == "warn" and "writable layer (overlay" in layer["detail"]
    memory = out["checks"][3]
    if not cgroups:
        pytest.skip(f"namespace parts passed; cgroup limits not checked: {cg_why}")
    host = out["sample"]["host"]
    assert (host["mem_total_mib"], host["mem_scope"]) == (LIMIT >> 20, "cgroup")
    assert (host["cpu_count"], host["cpu_scope"]) == (0.5, "cgroup") and 0 <= host["cpu_percent"] <= 100
    assert memory["title"] == "container memory (cgroup limit)" and "of 0.5 GiB" in memory["detail"]


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

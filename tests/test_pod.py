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

from gputui.core import model as M
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


def memory_cgroup(tmp_name: str) -> tuple:
    """(cgroup dir with a 512 MiB memory limit, "" ) or (None, why not)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as e:
        return None, f"no /proc/self/cgroup: {e}"
    for line in lines:
        _, names, path = line.split(":", 2)
        if names == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            base, limit_file = Path("/sys/fs/cgroup") / path.strip("/"), "memory.max"
        elif "memory" in names.split(","):
            base, limit_file = Path("/sys/fs/cgroup/memory") / path.strip("/"), "memory.limit_in_bytes"
        else:
            continue
        cg = base / tmp_name
        try:
            cg.mkdir()
            (cg / limit_file).write_text(str(LIMIT))
        except OSError as e:
            return None, f"cannot make a memory cgroup under {base}: {e}"
        return cg, ""
    return None, "no memory cgroup controller here"


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
def pod_cgroup():
    cg, why = memory_cgroup(f"gputui-test-{os.getpid()}")
    yield cg, why
    if cg is not None:
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), what="the pod to leave its cgroup")
        cg.rmdir()


def test_emulated_pod(tmp_path: Path, pod_cgroup) -> None:
    why = unshare_works()
    if why:
        pytest.skip(why)
    cg, cg_why = pod_cgroup
    enter = f"echo $$ > {cg / 'cgroup.procs'} && " if cg is not None else ""
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
    if cg is None:
        pytest.skip(f"namespace parts passed; memory limit not checked: {cg_why}")
    host = out["sample"]["host"]
    assert (host["mem_total_mib"], host["mem_scope"]) == (LIMIT >> 20, "cgroup")
    assert memory["title"] == "container memory (cgroup limit)" and "of 0.5 GiB" in memory["detail"]


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

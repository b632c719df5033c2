"""The agent's side of an emulated pod (test-only): run as root inside ``unshare --pid --fork --mount-proc``.

    python3 pod_agent.py WORK_DIR

Starts one job on GPU 0 through the real JobStore (real tmux, real runner), writes ``ready.json`` (the job's
pid in this namespace and the namespace's inode) and waits for ``pids.json`` (the pids NVML would report: the
job's pid as seen from OUTSIDE the namespace, written by the test). Then it samples through the NVML double
fed those pids, as the agent does, takes the idle reasons and the doctor's container checks, ends the job
and waits for its record; everything goes to ``result.json``.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "gpu"
sys.path[:0] = [str(ROOT), str(FIXTURES)]

from fake_nvidia_smi import sections  # noqa: E402
from nvml_double import NvmlDouble  # noqa: E402

from remote_agent.__main__ import launcher  # noqa: E402
from remote_agent.host import container, doctor  # noqa: E402
from remote_agent.jobs.store import JobStore  # noqa: E402
from remote_agent.metrics.sampler import MetricsSampler  # noqa: E402
from remote_agent.watchdog.activity import ActivityLog, idle_status  # noqa: E402

CAPTURE = FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt"


def wait(pred, what, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit("pod_agent: timed out waiting for " + what)


def read(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def mounts(work):
    """A container's writable layer (overlay) and a mounted volume (tmpfs), in this mount namespace only."""
    for d in ("lower", "upper", "ovwork", "layer", "volume"):
        (work / d).mkdir()
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={work / 'lower'},upperdir={work / 'upper'},workdir={work / 'ovwork'}",
         str(work / "layer")],
        check=True,
    )
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(work / "volume")], check=True)


def main(work):
    work = Path(work)
    mounts(work)
    state = str(work / "volume" / "state")
    feed = work / "pids.json"
    smi = work / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_nvidia_smi.py"}" --capture "{CAPTURE}" '
        '--state load "$@"\n'
    )
    smi.chmod(0o755)
    os.environ["FAKE_NVIDIA_SMI_PIDS"] = str(work / "smi_pids.json")  # the runner's tmux server inherits it
    (work / "smi_pids.json").write_text("[]")
    jobs = JobStore(state, launcher(), nvidia_smi=str(smi))
    job = jobs.start([sys.executable, "-c", "import time; time.sleep(600)"], name="train", gpus="0")
    # The runner writes pid.json twice: its start (pid null) before the job runs, then the job's pid.
    pid_json = os.path.join(state, "jobs", job["id"], "pid.json")
    pid = wait(lambda: (read(pid_json) or {}).get("pid"), "the job's pid in pid.json")
    ns = os.readlink("/proc/self/ns/pid")
    (work / "ready.json").write_text(json.dumps({"job": job["id"], "pid": pid, "ns": ns}))
    fed = wait(lambda: read(feed), "pids.json")
    (work / "smi_pids.json").write_text(json.dumps(fed["0"]))

    q = sections(CAPTURE.read_text())["load :: query (-q)"]
    sampler = MetricsSampler(state, nvml=NvmlDouble(q, pid_file=str(feed)))
    sampler.sample(jobs.owner_lookup())
    time.sleep(0.2)  # CPU percent is a difference between two samples
    sample = sampler.sample(jobs.owner_lookup())
    facts = {"boot_id": "b", "boot_time": 0.0}
    activity = idle_status(sample, jobs.list(), ActivityLog(state), facts, 101.0, False)
    info = container.detect()
    checks = [
        doctor.container_check(info),
        doctor.volume_check(state, info),
        doctor.volume_check(str(work / "layer" / "state"), info),
        doctor.memory_check(sample["host"]["mem_used_mib"], sample["host"]["mem_total_mib"],
                            sample["host"]["mem_scope"]),
    ]
    usage_path = os.path.join(state, "jobs", job["id"], "usage.json")
    wait(lambda: (read(usage_path) or {}).get("gpu_peak_mem_mib"), "the runner's usage.json", timeout=60)
    jobs.kill(job["id"], grace_s=2.0)
    record = wait(
        lambda: next((j for j in jobs.list() if j["id"] == job["id"] and j["state"] != "running"), None),
        "the job's end",
    )
    jobs._tmux("kill-server")
    result = {"sample": sample, "activity": activity, "checks": checks, "record": record, "info": info}
    (work / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])

"""A job's runner takes its GPU usage samples from the agent's metrics ring while an agent samples."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import wait_for

from remote_agent.jobs.usage import UsageRecorder
from remote_agent.metrics.ring import MetricsRing, latest_sample


def gpu_sample(t: float) -> dict:
    proc = {"pid": 4242, "job": "1", "mem_mib": 1234.0, "name": "python", "hidden": False, "inferred": False}
    return {"t": t, "host": {}, "gpu_source": "nvml", "gpu_error": None,
            "gpus": [{"index": 0, "uuid": "GPU-a", "util_percent": 60, "processes": [proc]},
                     {"index": 1, "uuid": "GPU-b", "util_percent": 0, "processes": []}]}


def test_the_runner_uses_the_agents_fresh_sample_and_no_nvml_of_its_own(tmp_path: Path) -> None:
    state = tmp_path / "state"
    job_dir = state / "jobs" / "1"
    job_dir.mkdir(parents=True)
    ring = MetricsRing(str(state))
    assert ring.try_own()
    ring.append(gpu_sample(time.time()))
    # This machine has no GPU: a runner reading NVML itself would find none and record nothing.
    rec = UsageRecorder(str(job_dir), 4242, "0", str(tmp_path / "no-nvidia-smi"))
    rec.start()
    try:
        wait_for(lambda: (job_dir / "usage.json").exists(), timeout=30, what="usage.json")
    finally:
        rec.stopped.set()
        rec.join(10)
    usage = json.loads((job_dir / "usage.json").read_text())
    assert usage["gpu_peak_mem_mib"] == 1234.0 and usage["gpu_mean_util"] == 60.0
    assert rec._sampler is None  # no NVML context opened by the runner


def test_a_stale_ring_sample_is_not_used(tmp_path: Path) -> None:
    ring = MetricsRing(str(tmp_path))
    assert ring.try_own()
    ring.append(gpu_sample(time.time() - 60))
    assert latest_sample(str(tmp_path), 5.0) is None
    ring.append(gpu_sample(time.time()))
    assert latest_sample(str(tmp_path), 5.0)["seq"] == 2

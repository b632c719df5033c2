"""Host-only path of the metrics sampler on this machine's real /proc."""

import json
import os
import time

import pynvml

from remote_agent.host.stats import HostStats, nearest_existing, process_name
from remote_agent.metrics.sampler import MetricsSampler


class NoDriver:
    """nvmlInit fails as on a host without the NVIDIA driver (the real pynvml error class)."""

    NVMLError = pynvml.NVMLError

    def nvmlInit(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_host_only_readings_are_sane(tmp_path):
    state_dir = tmp_path / "not" / "created" / "yet"
    s = MetricsSampler(str(state_dir), nvidia_smi=str(tmp_path / "no-nvidia-smi"), nvml=NoDriver())
    first = s.sample(lambda pid: None)
    busy = time.process_time() + 0.05
    while time.process_time() < busy:
        pass
    second = s.sample(lambda pid: None)
    json.dumps(second)
    assert (second["gpu_source"], second["gpus"]) == (None, [])
    assert second["t"] >= first["t"]
    h = second["host"]
    assert h["cpu_count"] == os.cpu_count()
    assert 0 <= h["cpu_percent"] <= 100
    assert 0 < h["mem_used_mib"] < h["mem_total_mib"]
    assert 0 <= h["disk_free_gib"] <= h["disk_total_gib"] and h["disk_total_gib"] > 0
    assert h["load1"] >= 0 and h["load5"] >= 0 and h["load15"] >= 0
    assert h["uptime_s"] > 0
    assert not state_dir.exists()  # statvfs of the nearest existing parent, nothing created
    s.close()


def test_unreadable_proc_gives_none_not_errors(tmp_path):
    h = HostStats(str(tmp_path), proc=str(tmp_path / "no-proc"))
    out = h.sample()
    assert out["cpu_percent"] is None and out["mem_total_mib"] is None and out["uptime_s"] is None
    assert out["disk_total_gib"] > 0


def test_nearest_existing_parent(tmp_path):
    assert nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)


def test_process_name_and_owner_from_this_process(tmp_path):
    me = os.getpid()
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    assert process_name(me) == comm
    p = MetricsSampler._process({"pid": me, "mem_mib": 12}, {me: "job-3"}.get)
    assert p == {"pid": me, "mem_mib": 12, "job": "job-3", "name": comm, "hidden": False, "inferred": False}

    def broken(pid):
        raise KeyError(pid)

    assert MetricsSampler._process({"pid": me, "mem_mib": None}, broken)["job"] is None

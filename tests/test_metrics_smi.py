"""nvidia-smi path of the metrics sampler, against a stand-in replaying CSV recorded on real GPUs.

Recordings and their sources: tests/fixtures/gpu/README.md. Expected values below are read off the
recordings by hand (the H100 one under gpu-burn load, the RTX 4080 SUPER one idle).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote_agent.metrics import sampler as metrics
from remote_agent.metrics.sampler import MetricsSampler

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
H100 = FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt"
RTX4080 = FIXTURES / "rtx-4080-super_595.71.05_capture.txt"
MISMATCH = FIXTURES / "nvidia-smi_driver-library-mismatch_570.txt"
H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # masked by the recorder


def fake_smi(tmp_path: Path, capture: Path, state: str) -> str:
    """An executable nvidia-smi stand-in replaying ``capture`` in ``state``."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(
        '#!/bin/sh\nexec "{}" "{}" --capture "{}" --state {} "$@"\n'.format(
            sys.executable, FIXTURES / "fake_nvidia_smi.py", capture, state
        )
    )
    exe.chmod(0o755)
    return str(exe)


class NoNvml:
    """Only what the sampler touches before giving up on NVML: a real LibraryNotFound from nvmlInit."""

    def __init__(self, code: int = 12) -> None:
        import pynvml

        self.NVMLError = pynvml.NVMLError
        self.code = code

    def nvmlInit(self) -> None:
        raise self.NVMLError(self.code)


@pytest.fixture(autouse=True)
def no_local_proc_names(monkeypatch):
    """The recorded pids mean nothing on this machine: don't let /proc answer for them."""
    monkeypatch.setattr(metrics, "process_name", lambda pid: None)


def test_h100_under_load_exact_values(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOG", str(log))
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, H100, "load"), nvml=NoNvml())
    out = s.sample({11345: "job-7"}.get)
    assert out["gpu_source"] == "nvidia-smi"
    assert out["gpu_error"].startswith("NVML library (libnvidia-ml.so.1) not found")
    assert out["gpus"] == [
        {
            "index": 0,
            "uuid": H100_UUID,
            "name": "NVIDIA H100 80GB HBM3",
            "util_percent": 100,
            "mem_used_mib": 19818,
            "mem_total_mib": 81559,
            "temp_c": 59,
            "power_w": 631.95,
            "power_limit_w": 700.0,
            "fan_percent": None,  # "[N/A]": passively cooled
            "sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619,
            "pstate": "P0",
            "persistence_mode": True,
            "ecc_errors_uncorrected": 0,
            "throttle_reasons": [],
            "processes": [
                {"pid": 11327, "mem_mib": 2566, "job": None, "name": "memhog", "hidden": False, "inferred": False},
                {"pid": 11328, "mem_mib": 1542, "job": None, "name": "memhog", "hidden": False, "inferred": False},
                {"pid": 11345, "mem_mib": 15690, "job": "job-7", "name": "gpu_burn", "hidden": False, "inferred": False},
            ],
        }
    ]
    json.dumps(out)
    calls = log.read_text().splitlines()
    queries = [c for c in calls if "--query-gpu=" in c]
    assert all(c.endswith("--format=csv,noheader,nounits") for c in queries)
    assert len([c for c in calls if "--query-compute-apps=" in c]) == 1


def test_h100_facts_and_idle_reading(tmp_path):
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, H100, "idle"), nvml=NoNvml())
    facts = s.facts()
    assert facts["gpu_source"] == "nvidia-smi"
    assert (facts["driver_version"], facts["cuda_version"], facts["nvml_version"]) == (
        "590.48.01",
        "13.1",
        "590.48",
    )
    assert facts["gpus"] == [
        {"index": 0, "uuid": H100_UUID, "name": "NVIDIA H100 80GB HBM3", "mem_total_mib": 81559}
    ]
    g = s.sample(lambda pid: None)["gpus"][0]
    assert (g["util_percent"], g["mem_used_mib"], g["temp_c"], g["power_w"]) == (0, 0, 41, 69.85)
    assert (g["sm_clock_mhz"], g["mem_clock_mhz"], g["throttle_reasons"]) == (345, 2619, ["gpu_idle"])
    assert g["processes"] == []


def test_consumer_card_fan_and_missing_ecc(tmp_path):
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, RTX4080, "idle"), nvml=NoNvml())
    facts = s.facts()
    # This recording has no --version section: the stand-in fails that call like an old driver would.
    assert (facts["driver_version"], facts["cuda_version"], facts["nvml_version"]) == (
        "595.71.05",
        None,
        None,
    )
    out = s.sample(lambda pid: "job-1" if pid == 2165 else None)
    assert out["gpus"] == [
        {
            "index": 0,
            "uuid": H100_UUID,  # same masked uuid
            "name": "NVIDIA GeForce RTX 4080 SUPER",
            "util_percent": 0,
            "mem_used_mib": 596,
            "mem_total_mib": 16376,
            "temp_c": 43,
            "power_w": 26.2,
            "power_limit_w": 320.0,
            "fan_percent": 0,  # a real 0 %, not a missing value
            "sm_clock_mhz": 210,
            "mem_clock_mhz": 405,
            "pstate": "P8",
            "persistence_mode": False,
            "ecc_errors_uncorrected": None,  # "[N/A]" on GeForce
            "throttle_reasons": ["gpu_idle"],
            "processes": [{"pid": 2165, "mem_mib": 25, "job": "job-1", "name": "kwin_wayland", "hidden": False, "inferred": False}],
        }
    ]


def test_stand_in_rejects_fields_the_recording_lacks():
    argv = [sys.executable, str(FIXTURES / "fake_nvidia_smi.py"), "--capture", str(H100), "--state", "load"]
    bad = subprocess.run(
        argv + ["--query-gpu=index,fan.speed,no.such.field", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0
    assert 'Field "no.such.field" is not a valid field to query.' in bad.stderr


def test_nvidia_smi_missing_gives_host_only(tmp_path):
    s = MetricsSampler(str(tmp_path), nvidia_smi=str(tmp_path / "no-such-nvidia-smi"), nvml=NoNvml(9))
    out = s.sample(lambda pid: None)
    assert out["gpu_source"] is None and out["gpus"] == []
    assert out["gpu_error"].startswith("no NVIDIA driver: nvidia-smi not found and NVML unavailable (")
    assert "NVIDIA driver not loaded" in out["gpu_error"]
    assert out["host"]["cpu_count"] == os.cpu_count()


def test_version_mismatch_in_both_sources(tmp_path):
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, MISMATCH, "failing"), nvml=NoNvml(18))
    facts = s.facts()
    assert facts["gpu_source"] is None and facts["gpus"] == []
    assert facts["gpu_error"].startswith(
        "NVIDIA driver/library version mismatch: reboot the host or reload the nvidia kernel module"
    )
    assert "Failed to initialize NVML: Driver/library version mismatch" in facts["gpu_error"]

"""nvidia-smi path of the metrics sampler, against a stand-in replaying CSV recorded on real GPUs.

Recordings and their sources: tests/fixtures/gpu/README.md. Expected values below are read off the
recordings by hand (the H100 one under gpu-burn load, the RTX 4080 SUPER one idle).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from remote_agent import protocol as P
from remote_agent.host import doctor
from remote_agent.host.procfs import ProcessUse
from remote_agent.metrics import sampler as metrics
from remote_agent.metrics import smi
from remote_agent.metrics.nvml import THROTTLE_BITS
from remote_agent.metrics.sampler import MetricsSampler

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
H100 = FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt"
RTX4080 = FIXTURES / "rtx-4080-super_595.71.05_capture.txt"
MISMATCH = FIXTURES / "nvidia-smi_driver-library-mismatch_570.txt"
A100_Q = FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt"
H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # masked by the recorder
HEALTHY = {"state": "ok", "error": None, "fix": None, "faults": []}
NVML_ONLY = dict.fromkeys(smi.NVML_ONLY)  # the thermal violation counter: not on this path


def sections(text: str) -> dict[str, str]:
    sys.path.insert(0, str(FIXTURES))
    from fake_nvidia_smi import sections as fenced

    return fenced(text)


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
def no_local_proc_names(monkeypatch, tmp_path):
    """The recorded pids mean nothing on this machine: don't let its /proc answer for them (a process of this
    machine may have the same pid)."""
    monkeypatch.setattr(metrics, "process_name", lambda pid: None)
    monkeypatch.setattr(metrics, "ProcessUse", lambda: ProcessUse(str(tmp_path / "no-proc")))
    monkeypatch.setattr(metrics, "children", lambda pid: [])


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
            "ecc_errors_uncorrected": 0, "ecc_errors_uncorrected_aggregate": 0,
            "throttle_reasons": [],
            "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
            "remap_pending": False, "remap_failed": False,
            "sm_clock_max_mhz": 1980, "mem_clock_max_mhz": 2619,
            "app_clock_mhz": None, "app_clock_default_mhz": None,  # "[Requested functionality has been deprecated]"
            "retired_pages_single": None, "retired_pages_double": None, "retired_pages_pending": None,  # "[N/A]"
            **NVML_ONLY,
            **HEALTHY,
            "processes": [
                {"pid": 11327, "mem_mib": 2566, "job": None, "name": "memhog", "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None},
                {"pid": 11328, "mem_mib": 1542, "job": None, "name": "memhog", "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None},
                {"pid": 11345, "mem_mib": 15690, "job": "job-7", "name": "gpu_burn", "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None},
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
            "ecc_errors_uncorrected": None, "ecc_errors_uncorrected_aggregate": None,  # "[N/A]" on GeForce
            "throttle_reasons": ["gpu_idle"],
            "pcie_gen": 1, "pcie_gen_max": 4, "pcie_width": 16, "pcie_width_max": 16,  # idle: the link slows down
            "remap_pending": None, "remap_failed": None,  # "[N/A]" on GeForce
            "sm_clock_max_mhz": 3165, "mem_clock_max_mhz": 11501,
            "app_clock_mhz": None, "app_clock_default_mhz": None,  # "[Requested functionality has been deprecated]"
            "retired_pages_single": None, "retired_pages_double": None, "retired_pages_pending": None,  # "[N/A]"
            **NVML_ONLY,
            **HEALTHY,
            "processes": [{"pid": 2165, "mem_mib": 25, "job": "job-1", "name": "kwin_wayland", "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None}],
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


# --- the corpus: every real capture of ../shared/corpus/nvidia-smi, every field ------------------------------
CORPUS = sorted((FIXTURES / "corpus").glob("*.txt"))
#: The CUDA version each corpus driver prints in its table header (read off the captures by hand).
CORPUS_CUDA = {"595.71.05": "13.2", "610.57.04": "13.3", "590.48.01": "13.1", "595.80": "13.2", "591.86": "13.1",
               "610.62": "13.3"}
#: nvidia-smi field (as the captures' CSV header names it) of each reading, and how its recorded cell reads.
CORPUS_FIELDS = {
    "index": "index", "uuid": "uuid", "name": "name", "util_percent": "utilization.gpu",
    "mem_used_mib": "memory.used", "mem_total_mib": "memory.total", "temp_c": "temperature.gpu",
    "power_w": "power.draw", "power_limit_w": "power.limit", "fan_percent": "fan.speed",
    "sm_clock_mhz": "clocks.current.sm", "mem_clock_mhz": "clocks.current.memory", "pstate": "pstate",
    "persistence_mode": "persistence_mode", "ecc_errors_uncorrected": "ecc.errors.uncorrected.volatile.total",
    "ecc_errors_uncorrected_aggregate": "ecc.errors.uncorrected.aggregate.total",
    "throttle_reasons": "clocks_event_reasons.active", "pcie_gen": "pcie.link.gen.current",
    "pcie_gen_max": "pcie.link.gen.max", "pcie_width": "pcie.link.width.current", "pcie_width_max": "pcie.link.width.max",
    "remap_pending": "remapped_rows.pending", "remap_failed": "remapped_rows.failure",
    "sm_clock_max_mhz": "clocks.max.sm", "mem_clock_max_mhz": "clocks.max.memory",
    "app_clock_mhz": "clocks.applications.graphics", "app_clock_default_mhz": "clocks.default_applications.graphics",
    "retired_pages_single": "retired_pages.single_bit_ecc.count", "retired_pages_double": "retired_pages.double_bit.count",
    "retired_pages_pending": "retired_pages.pending",
}


def recorded_csv(capture: Path, section: str) -> list[dict[str, str]]:
    """The rows of a recorded ``--format=csv`` section as {field: cell with its unit}."""
    lines = [ln for ln in sections(capture.read_text())[section].splitlines() if ln.strip()]
    header = [h.split(" [")[0] for h in lines[0].split(", ")]
    return [dict(zip(header, ln.split(", "), strict=True)) for ln in lines[1:]]


def expected_reading(cell: str, key: str) -> object:
    """What a recorded cell ("19818 MiB", "[N/A]", "Enabled", "0x...04") must read as."""
    if cell.startswith("["):
        return None
    if key == "persistence_mode":
        return {"Enabled": True, "Disabled": False}[cell]
    if key in ("remap_pending", "remap_failed", "retired_pages_pending"):
        return {"Yes": True, "No": False}[cell]
    if key == "throttle_reasons":
        return [name for bit, name in THROTTLE_BITS if int(cell, 16) & bit]
    if key in ("uuid", "name", "pstate"):
        return cell
    number = cell.split(" ")[0]
    return float(number) if "." in number else int(number)


@pytest.mark.parametrize("state", ["idle", "load"])
@pytest.mark.parametrize("capture", CORPUS, ids=lambda p: p.stem)
def test_corpus_every_field_of_every_capture(tmp_path, capture, state):
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, capture, state), nvml=NoNvml())
    out = s.sample(lambda pid: None)
    rows = recorded_csv(capture, f"{state} :: query-gpu (csv, what the exporter parses)")
    apps = recorded_csv(capture, f"{state} :: query-compute-apps (per-process)")
    assert len(out["gpus"]) == len(rows) >= 1
    for gpu, row in zip(out["gpus"], rows, strict=True):
        want = {key: expected_reading(row[field], key) for key, field in CORPUS_FIELDS.items()}
        want["processes"] = [
            {"pid": int(a["pid"]), "mem_mib": expected_reading(a["used_gpu_memory"], "mem"),
             "name": re.split(r"[/\\]", a["process_name"])[-1], "job": None, "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None}
            for a in apps if a["gpu_uuid"] == row["uuid"]
        ]
        assert gpu == want | NVML_ONLY | HEALTHY
    facts = s.facts()
    driver = capture.stem.rsplit("__", 1)[1]
    assert (facts["driver_version"], facts["cuda_version"]) == (driver, CORPUS_CUDA[driver])
    assert facts["nvml_version"] == re.search(r"NVML version\s*: (\S+)", capture.read_text()).group(1)


@pytest.mark.parametrize("capture", CORPUS, ids=lambda p: p.stem)
def test_corpus_cuda_version_from_the_table_header_when_there_is_no_version_option(tmp_path, capture, monkeypatch):
    """A driver without ``--version`` (or without its CUDA line): the doctor reads the header of plain
    ``nvidia-smi``, "CUDA Version: 13.1" or driver 610's "CUDA UMD Version: 13.3"."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_NO_VERSION", "1")
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, capture, "idle"), nvml=NoNvml())
    driver = capture.stem.rsplit("__", 1)[1]
    assert (s.facts()["cuda_version"], s.facts()["nvml_version"]) == (CORPUS_CUDA[driver], None)
    [cuda] = [c for c in doctor.gpu_checks(s.facts(), s.sample(lambda pid: None), {}) if c["id"] == "cuda"]
    assert cuda["detail"] == f"driver {driver} supports CUDA up to {CORPUS_CUDA[driver]}"


def test_corpus_covers_every_capture_of_the_shared_corpus():
    found = [p / "shared/corpus/nvidia-smi/captures" for p in Path(__file__).resolve().parents]
    shared = next((p for p in found if p.is_dir()), None)
    if shared is None:
        pytest.skip("no shared corpus (../shared/corpus/nvidia-smi) above this checkout")
    assert sorted(p.name for p in shared.glob("*.txt")) == [p.name for p in CORPUS]


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("525.60.11", "12.0"), ("525.60.13", "12.0"), ("525.85.12", "12.0"), ("450.51", "11.0"),
        ("450.51.05", "11.0"), ("460.32.03", "11.2"), ("535.104.05", "12.2"), ("580.65.06", "13.0"),
        ("520.61.05", "11.8"), ("440.33.01", "10.2"), ("340.108", None), ("garbage", None), (None, None),
    ]
    + [(d, c) for d, c in CORPUS_CUDA.items()],
)
def test_driver_to_cuda_fallback_follows_nvidias_release_notes(driver, cuda):
    assert doctor.cuda_from_driver(driver) == cuda


def test_four_gpus_with_gpu_2_failing_its_handle_the_others_report(tmp_path, monkeypatch):
    """8x A100 recording cut to 4 GPUs; nvidia-smi prints its handle error in GPU 2's place and exits non-zero."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "4")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_NO_HANDLE", "2")
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, A100_Q, "q"), nvml=NoNvml())
    out = s.sample(lambda pid: None)
    assert out["gpu_source"] == "nvidia-smi"
    gpus = out["gpus"]
    assert [(g["index"], g["state"]) for g in gpus] == [(0, "ok"), (1, "ok"), (2, "lost"), (3, "ok")]
    assert gpus[2] == dict.fromkeys(P.GPU_FIELDS) | {
        "index": 2,
        "processes": [],
        "faults": [],
        "state": "lost",
        "error": "Unable to determine the device handle for GPU 00000003:00:00.0: Unknown Error",
        "fix": "Reboot the host; if the GPU is still lost, ask the provider for another instance.",
    }
    assert [g["power_w"] for g in gpus] == [55.63, 56.96, None, 56.14]
    assert [g["mem_total_mib"] for g in s.facts()["gpus"]] == [40536, 40536, None, 40536]
    checks = doctor.gpu_checks(s.facts(), out, {})
    assert [c["status"] for c in checks if c["id"].startswith("gpu.")] == ["warn", "warn", "fail", "warn"]


def test_rows_of_a_lost_gpu_and_the_error_on_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "4")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOST", "1")
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, A100_Q, "q"), nvml=NoNvml())
    gpus = s.sample(lambda pid: None)["gpus"]
    assert [(g["index"], g["state"], g["error"]) for g in gpus] == [
        (0, "ok", None), (1, "lost", "GPU is lost"), (2, "ok", None), (3, "ok", None)
    ]
    # Only GPU 1's own failure: a single "[Unknown Error]" field of a live GPU is just that field.
    row = ("0, GPU-1, A100, 460.32.03, [Unknown Error], 0, 40536, 41, 55.63, 400.00, [N/A], 210, 1215, P0, Disabled, 0, 0, "
           "0x1, 4, 4, 16, 16, No, No, 1410, 1215, 1095, 1095, [N/A], [N/A], [N/A]")
    [g] = smi.parse_gpus(row)
    assert (g["state"], g["util_percent"], g["mem_total_mib"]) == ("ok", None, 40536)
    # The handle error may come on stderr, after every row: it takes the index no row has; control
    # characters and length are cut.
    text = row + "\n" + row.replace("0, GPU-1", "2, GPU-3") + "\nUnable to determine the device handle for GPU 0000:0B:00.0: \x1b]52;c;AAAA\x07Unknown Error"
    assert [(g["index"], g["state"], g["error"]) for g in smi.parse_gpus(text)] == [
        (0, "ok", None), (1, "lost", "Unable to determine the device handle for GPU 0000:0B:00.0: ]52;c;AAAA Unknown Error"),
        (2, "ok", None),
    ]

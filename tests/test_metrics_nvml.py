"""NVML path of the metrics sampler, against a pynvml double fed ``nvidia-smi -q`` recorded on real GPUs.

Recordings, sources and the -q line -> NVML call mapping: tests/fixtures/gpu/README.md.
"""

import json
import sys
from pathlib import Path

import pynvml
import pytest

from remote_agent import protocol as P
from remote_agent.host.procfs import ProcessUse
from remote_agent.metrics import sampler as metrics
from remote_agent.metrics.sampler import MetricsSampler

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
sys.path.insert(0, str(FIXTURES))
from fake_nvidia_smi import sections  # noqa: E402
from nvml_double import NvmlDouble  # noqa: E402

HEALTHY = {"state": "ok", "error": None, "fix": None}
A100_X8 = (FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt").read_text()
H100_LOAD = sections((FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt").read_text())["load :: query (-q)"]

# Per GPU of the Azure ND A100 v4 recording: (uuid, GPU temp C, power draw W).
A100_GPUS = [
    ("GPU-b01e9f90-c60c-4ad1-2052-154833662357", 41, 55.63),
    ("GPU-fccd4a78-556b-7b41-320b-f2a10438c176", 40, 56.96),
    ("GPU-0b64e86a-a39a-9261-7e62-798d98e599af", 40, 56.35),
    ("GPU-e58a4615-3aae-089b-9161-2c78eb0bf227", 41, 56.14),
    ("GPU-bf404e05-68b6-34c1-386f-94eda8a08cd7", 39, 57.46),
    ("GPU-083904c0-9140-4a80-ae74-4c2682d585b3", 38, 55.03),
    ("GPU-2d82fc40-f4a8-9df4-effd-d6f6f22c88d8", 39, 55.41),
    ("GPU-1291f09c-b6e3-8fb1-6879-89b8b8a9dbc6", 40, 55.47),
]


@pytest.fixture(autouse=True)
def no_local_proc_names(monkeypatch, tmp_path):
    """The recorded pids mean nothing on this machine: don't let its /proc answer for them (a process of this
    machine may have the same pid)."""
    monkeypatch.setattr(metrics, "process_name", lambda pid: None)
    monkeypatch.setattr(metrics, "ProcessUse", lambda: ProcessUse(str(tmp_path / "no-proc")))
    monkeypatch.setattr(metrics, "children", lambda pid: [])


def test_eight_a100s_exact_values_and_fan_not_supported(tmp_path):
    nv = NvmlDouble(A100_X8)
    s = MetricsSampler(str(tmp_path), nvidia_smi=str(tmp_path / "unused"), nvml=nv)
    out = s.sample(lambda pid: None)
    assert (out["gpu_source"], out["gpu_error"]) == ("nvml", None)
    assert [g["index"] for g in out["gpus"]] == list(range(8))
    for g, (uuid, temp, power) in zip(out["gpus"], A100_GPUS, strict=True):
        assert g == {
            "index": g["index"],
            "uuid": uuid,
            "name": "A100-SXM4-40GB",
            "util_percent": 0,
            "mem_used_mib": 0,
            "mem_total_mib": 40536,
            "temp_c": temp,
            "power_w": power,
            "power_limit_w": 400.0,
            "fan_percent": None,  # "Fan Speed : N/A" -> NVML_ERROR_NOT_SUPPORTED
            "sm_clock_mhz": 210,
            "mem_clock_mhz": 1215,
            "pstate": "P0",
            "ecc_errors_uncorrected": 0, "ecc_errors_uncorrected_aggregate": 0,
            "throttle_reasons": ["gpu_idle"],
            "persistence_mode": False,
            "pcie_gen": 4, "pcie_gen_max": 4, "pcie_width": 16, "pcie_width_max": 16,  # "GPU Link Info"
            "remap_pending": False, "remap_failed": False,  # "Remapped Rows"
            "sm_clock_max_mhz": 1410, "mem_clock_max_mhz": 1215,  # "Max Clocks"
            "app_clock_mhz": 1095, "app_clock_default_mhz": 1095,  # "(Default) Applications Clocks/Graphics"
            "retired_pages_single": None, "retired_pages_double": None,  # "Retired Pages": N/A (Ampere remaps rows)
            "retired_pages_pending": None,
            "thermal_violation_ms": None, "thermal_slowdown_percent": None, "thermal_window_s": None,  # 460: no counters
            "nvlink_links": None, "nvlink_active": None,  # no `nvlink -s` recorded for these
            "processes": [],
            "faults": [],
            **HEALTHY,
        }
    json.dumps(out)
    facts = s.facts()
    assert (facts["driver_version"], facts["cuda_version"], facts["nvml_version"]) == (
        "460.32.03",
        "11.2",
        None,
    )
    assert facts["gpus"][4] == {
        "index": 4,
        "uuid": A100_GPUS[4][0],
        "name": "A100-SXM4-40GB",
        "mem_total_mib": 40536,
    }


def test_h100_under_load_processes_and_owner(tmp_path):
    s = MetricsSampler(str(tmp_path), nvml=NvmlDouble(H100_LOAD))
    g = s.sample({11327: "job-a", 11328: "job-a"}.get)["gpus"][0]
    assert (g["name"], g["util_percent"], g["mem_used_mib"], g["mem_total_mib"]) == (
        "NVIDIA H100 80GB HBM3",
        100,
        19818,
        81559,
    )
    assert (g["temp_c"], g["power_w"], g["power_limit_w"], g["fan_percent"]) == (59, 629.45, 700.0, None)
    assert (g["sm_clock_mhz"], g["mem_clock_mhz"], g["pstate"]) == (1980, 2619, "P0")
    assert (g["throttle_reasons"], g["persistence_mode"], g["ecc_errors_uncorrected"]) == ([], True, 0)
    assert g["processes"] == [
        {"pid": 11327, "mem_mib": 2566, "job": "job-a", "name": None, "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None},
        {"pid": 11328, "mem_mib": 1542, "job": "job-a", "name": None, "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None},
        {"pid": 11345, "mem_mib": 15690, "job": None, "name": None, "hidden": False, "inferred": False,
             "cpu_percent": None, "rss_mib": None, "children": None, "children_cpu_percent": None},
    ]
    assert s.facts()["cuda_version"] == "13.1"


def test_slow_fields_are_cached_fast_ones_are_not(tmp_path):
    nv = NvmlDouble(A100_X8)
    s = MetricsSampler(str(tmp_path), nvml=nv, slow_interval=3600)
    nv.calls.clear()
    first = s.sample(lambda pid: None)
    second = s.sample(lambda pid: None)
    for fast in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetComputeRunningProcesses",
    ):
        assert nv.calls[fast] == 16, fast
    for slow in (
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetPersistenceMode",
    ):
        assert nv.calls[slow] == 8, slow
    assert nv.calls["nvmlDeviceGetClockInfo"] == 16  # SM + memory, once per GPU
    assert nv.calls["nvmlDeviceGetTotalEccErrors"] == 16  # since the driver loaded, and in the GPU's life
    assert [g["sm_clock_mhz"] for g in second["gpus"]] == [g["sm_clock_mhz"] for g in first["gpus"]]

    nv2 = NvmlDouble(A100_X8)
    s2 = MetricsSampler(str(tmp_path), nvml=nv2, slow_interval=0)
    nv2.calls.clear()
    s2.sample(lambda pid: None)
    s2.sample(lambda pid: None)
    assert nv2.calls["nvmlDeviceGetFanSpeed"] == 16
    assert nv.calls["nvmlInit"] == 0 and nv2.calls["nvmlInit"] == 0  # one context: init only at construction


def test_each_field_fails_on_its_own(tmp_path):
    class LostTemperature(NvmlDouble):
        def nvmlDeviceGetTemperature(self, h, sensor):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    s = MetricsSampler(str(tmp_path), nvml=LostTemperature(A100_X8))
    g = s.sample(lambda pid: None)["gpus"][0]
    assert g["temp_c"] is None
    assert (g["power_w"], g["mem_total_mib"], g["pstate"]) == (55.63, 40536, "P0")


def test_one_context_shut_down_once(tmp_path):
    nv = NvmlDouble(A100_X8)
    s = MetricsSampler(str(tmp_path), nvml=nv)
    s.sample(lambda pid: None)
    s.close()
    s.close()
    assert (nv.calls["nvmlInit"], nv.calls["nvmlShutdown"]) == (1, 1)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library (libnvidia-ml.so.1) not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
        (
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "NVIDIA driver/library version mismatch: reboot the host or reload the nvidia kernel module",
        ),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to use the NVIDIA driver"),
    ],
)
def test_init_errors_fall_back_to_host_only_with_their_message(tmp_path, code, message):
    nv = NvmlDouble(A100_X8, init_error=code)
    s = MetricsSampler(str(tmp_path), nvidia_smi=str(tmp_path / "missing-nvidia-smi"), nvml=nv)
    out = s.sample(lambda pid: None)
    assert out["gpu_source"] is None and out["gpus"] == []
    prefix = "no NVIDIA driver: nvidia-smi not found and NVML unavailable ("
    assert out["gpu_error"].startswith(prefix + message)
    assert out["host"]["mem_total_mib"] > 0
    s.close()
    assert nv.calls["nvmlShutdown"] == 0  # never initialised


def test_real_pynvml_without_a_gpu(tmp_path):
    """On a machine without the NVIDIA driver the real pynvml fails to init: host-only, clear reason."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    s = MetricsSampler(str(tmp_path), nvidia_smi=str(tmp_path / "missing-nvidia-smi"))
    facts = s.facts()
    assert facts["gpu_source"] is None and facts["gpus"] == []
    assert facts["gpu_error"].startswith("no NVIDIA driver: nvidia-smi not found and NVML unavailable (")


def test_a_1hz_sampler_makes_at_most_6_nvml_calls_per_gpu_per_second(tmp_path, monkeypatch):
    """Fast fields every second, slow ones every few seconds, settings (power limit...) once a minute."""
    clock = [1000.0]
    monkeypatch.setattr(metrics.gpu_nvml.time, "monotonic", lambda: clock[0])
    nv = NvmlDouble(A100_X8)
    s = MetricsSampler(str(tmp_path), nvml=nv)
    s.sample(lambda pid: None)  # facts and every tier once
    nv.calls.clear()
    seconds = 600
    for _ in range(seconds):
        clock[0] += 1.0
        out = s.sample(lambda pid: None)
    waits = nv.calls.pop("nvmlEventSetWait")  # the XID event set: one read for every GPU, every 5 s
    assert waits == seconds // 5
    per_gpu_per_s = sum(nv.calls.values()) / 8 / seconds
    assert per_gpu_per_s <= 6.0, nv.calls
    assert nv.calls["nvmlDeviceGetEnforcedPowerLimit"] == 8 * seconds // 60
    assert [g["power_limit_w"] for g in out["gpus"]] == [400.0] * 8  # cached settings still in every sample


def test_a_runner_reads_only_its_own_gpus(tmp_path):
    nv = NvmlDouble(A100_X8)
    s = MetricsSampler(str(tmp_path), nvml=nv, only=["3", A100_GPUS[5][0]])
    nv.calls.clear()
    out = s.sample(lambda pid: None)
    assert [(g["index"], g["uuid"]) for g in out["gpus"]] == [(3, A100_GPUS[3][0]), (5, A100_GPUS[5][0])]
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 2


def _lost(index: int, error: str) -> dict:
    """What a GPU the driver cannot reach reads as: its index, the driver's words and the fix, nothing else."""
    return dict.fromkeys(P.GPU_FIELDS) | {
        "index": index,
        "processes": [],
        "faults": [],
        "state": "lost",
        "error": error,
        "fix": "Reboot the host; if the GPU is still lost, ask the provider for another instance.",
    }


def test_four_gpus_with_gpu_2_failing_its_handle_the_others_report(tmp_path):
    nv = NvmlDouble(A100_X8, gpus=4, handle_errors={2: pynvml.NVML_ERROR_UNKNOWN})
    s = MetricsSampler(str(tmp_path), nvml=nv)
    out = s.sample(lambda pid: None)
    assert (out["gpu_source"], out["gpu_error"]) == ("nvml", None)
    gpus = out["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert gpus[2] == _lost(2, "Unable to determine the device handle for GPU 2: Unknown Error")
    for g in gpus[:2] + gpus[3:]:
        uuid, temp, power = A100_GPUS[g["index"]]
        assert (g["uuid"], g["temp_c"], g["power_w"], g["mem_total_mib"]) == (uuid, temp, power, 40536)
        assert (g["state"], g["error"], g["fix"]) == ("ok", None, None)
    assert [f["uuid"] for f in s.facts()["gpus"]] == [A100_GPUS[0][0], A100_GPUS[1][0], None, A100_GPUS[3][0]]
    json.dumps(out)
    # A runner given GPUs 2 and 3 gets the lost one by its index, and the live one.
    only = MetricsSampler(str(tmp_path), nvml=NvmlDouble(A100_X8, gpus=4, handle_errors={2: 999}), only=["2", "3"])
    assert [(g["index"], g["state"]) for g in only.sample(lambda pid: None)["gpus"]] == [(2, "lost"), (3, "ok")]


def test_a_gpu_whose_reads_say_it_is_lost_is_lost_in_the_drivers_words(tmp_path):
    class Hostile(pynvml.NVMLError):
        def __str__(self):
            return "GPU \x1b[31mis\x07 lost\r\n" + "x" * 1000

    class LostReads(NvmlDouble):
        def nvmlDeviceGetUtilizationRates(self, h):
            if h == 1:
                raise Hostile(pynvml.NVML_ERROR_GPU_IS_LOST)
            return super().nvmlDeviceGetUtilizationRates(h)

    s = MetricsSampler(str(tmp_path), nvml=LostReads(A100_X8, gpus=4, lost={3}))
    gpus = s.sample(lambda pid: None)["gpus"]
    assert [(g["index"], g["state"]) for g in gpus] == [(0, "ok"), (1, "lost"), (2, "ok"), (3, "lost")]
    assert gpus[1]["error"] == "GPU [31mis lost " + "x" * (300 - len("GPU [31mis lost "))
    assert gpus[3]["error"] == "GPU is lost" and gpus[3]["fix"].startswith("Reboot the host")
    assert gpus[2]["power_w"] == A100_GPUS[2][2]

"""What gputui reads from a real NVIDIA GPU, against nvidia-smi's own answer: run by scripts/gpu_check.sh.

No network, stdlib + pynvml (nvidia-ml-py) + what the machine has; each part says "skip: why" when it cannot
run. Writes into OUT (the first argument):
- ``readings.json``: the agent's NVML and nvidia-smi samples, facts and doctor checks, the fields of issue 39
  read raw from NVML (throttle/clock-event reasons, violation times, ECC, remapped rows, retired pages, PCIe
  generation/width/throughput, NVLink, total energy), the job attribution of a CUDA process;
- ``nvidia-smi-q.txt`` and ``query-gpu.csv``: nvidia-smi's own, as fixtures for tests/fixtures/gpu/;
- ``summary.txt``: one line per check, ``ok`` / ``MISMATCH`` / ``skip``.
Exit 1 when a reading disagrees with nvidia-smi beyond its rounding.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remote_agent.host.container import Owners  # noqa: E402
from remote_agent.host.doctor import run_doctor  # noqa: E402
from remote_agent.metrics import smi  # noqa: E402
from remote_agent.metrics.sampler import MetricsSampler  # noqa: E402

#: How far the agent's reading may be from nvidia-smi's, taken a moment apart: (absolute, relative).
TOLERANCE = {"util_percent": (15, 0), "mem_used_mib": (64, 0.02), "mem_total_mib": (1, 0), "temp_c": (3, 0),
             "power_w": (30, 0.15), "power_limit_w": (1, 0), "fan_percent": (5, 0), "sm_clock_mhz": (300, 0.3),
             "mem_clock_mhz": (300, 0.3)}


class Report:
    def __init__(self, out: Path) -> None:
        self.out, self.lines, self.failed = out, [], False
        self.data: dict[str, Any] = {}

    def say(self, status: str, what: str) -> None:
        line = f"{status:9} {what}"
        print(line, flush=True)
        self.lines.append(line)
        self.failed |= status == "MISMATCH"

    def save(self) -> None:
        (self.out / "summary.txt").write_text("\n".join(self.lines) + "\n")
        (self.out / "readings.json").write_text(json.dumps(self.data, indent=1, default=str))


def smi_csv(fields: list[str]) -> list[dict[str, str]]:
    text = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30, check=True).stdout
    rows = [[c.strip() for c in line.split(", ", len(fields) - 1)] for line in text.splitlines() if line.strip()]
    return [dict(zip(fields, row, strict=True)) for row in rows if len(row) == len(fields)]


def compare(report: Report, source: str, gpus: list[dict[str, Any]]) -> None:
    """The agent's reading (via ``source``) of each field against nvidia-smi's, within TOLERANCE."""
    fields = [f for f, _ in smi.GPU_FIELDS]
    rows = {r["index"]: r for r in smi_csv(fields)}
    for g in gpus:
        row = rows.get(str(g.get("index")))
        if row is None:
            report.say("MISMATCH", f"{source}: GPU {g.get('index')} is not in nvidia-smi's list")
            continue
        for field, key in smi.GPU_FIELDS:
            if key in ("throttle_reasons", "driver_version", "index", "pcie_gen") or key not in g:
                continue  # names vs a bitmask; a fact, not a reading; the link's generation moves with load
                # (nvidia-smi's own query may wake it); not read by this source
            ours, theirs = g.get(key), smi.value(row[field])
            number = smi.number(theirs)
            if key in TOLERANCE and isinstance(ours, (int, float)) and isinstance(number, (int, float)):
                absolute, relative = TOLERANCE[key]
                good = abs(ours - number) <= max(absolute, relative * abs(number))
            elif key == "persistence_mode":
                good = ours == {"Enabled": True, "Disabled": False}.get(str(theirs))
            elif key in ("remap_pending", "remap_failed", "retired_pages_pending"):
                good = ours == {"Yes": True, "No": False}.get(str(theirs))
            elif isinstance(ours, (int, float)) or ours is None:
                good = ours == number
            else:
                good = str(ours) == theirs
            report.say("ok" if good else "MISMATCH", f"{source} GPU {g.get('index')} {key}: {ours} vs nvidia-smi {theirs}")


def thermal_counter(report: Report, gpus: list[dict[str, Any]]) -> None:
    """The agent's thermal violation counter (NVML's ``nvmlDeviceGetViolationStatus(THERMAL)``, ms) against
    nvidia-smi's ``clocks_event_reasons_counters.sw_thermal_slowdown`` (us, drivers 535 and later): the same
    counter, as tests/fixtures/gpu/README.md assumes? Read a moment apart, so within 5 s."""
    field = "clocks_event_reasons_counters.sw_thermal_slowdown"
    try:
        rows = {r["index"]: r for r in smi_csv(["index", field])}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        report.say("skip", f"thermal counter: nvidia-smi has no {field} ({exc})")
        return
    for g in gpus:
        ours, theirs = g.get("thermal_violation_ms"), smi.number(smi.value(rows.get(str(g.get("index")), {}).get(field, "")))
        if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)):
            report.say("skip", f"thermal counter GPU {g.get('index')}: {ours} ms vs nvidia-smi {theirs} us")
            continue
        good = abs(ours * 1000 - theirs) <= 5e6
        report.say("ok" if good else "MISMATCH", f"thermal counter GPU {g.get('index')}: {ours} ms vs nvidia-smi {theirs} us")


def raw_nvml() -> dict[str, Any]:
    """Issue 39's fields straight from NVML, each call guarded: the fixture future tests are written against."""
    import pynvml as nvml_lib

    def get(fn: Any, *args: Any) -> Any:
        try:
            value = fn(*args)
            return value.decode() if isinstance(value, bytes) else value
        except Exception as exc:  # noqa: BLE001 - any NVML error is a reading: "not supported" included
            return {"error": str(exc)}

    nvml_lib.nvmlInit()
    try:
        out: dict[str, Any] = {"driver": get(nvml_lib.nvmlSystemGetDriverVersion), "gpus": []}
        for i in range(nvml_lib.nvmlDeviceGetCount()):
            h = nvml_lib.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i, "name": get(nvml_lib.nvmlDeviceGetName, h)}
            g["clock_event_reasons"] = get(nvml_lib.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            g["violation_ns"] = {name: str(get(nvml_lib.nvmlDeviceGetViolationStatus, h, code))
                                 for name, code in (("power", 0), ("thermal", 1), ("sync_boost", 2),
                                                    ("board_limit", 3), ("low_util", 4), ("reliability", 5))}
            g["ecc_uncorrected_volatile"] = get(nvml_lib.nvmlDeviceGetTotalEccErrors, h, 1, 0)
            g["ecc_uncorrected_aggregate"] = get(nvml_lib.nvmlDeviceGetTotalEccErrors, h, 1, 1)
            g["remapped_rows"] = get(nvml_lib.nvmlDeviceGetRemappedRows, h)
            g["retired_pages_pending"] = get(nvml_lib.nvmlDeviceGetRetiredPagesPendingStatus, h)
            g["retired_pages"] = {cause: get(nvml_lib.nvmlDeviceGetRetiredPages, h, code)
                                  for cause, code in (("single_bit", 0), ("double_bit", 1))}
            g["app_clocks"] = {"now": get(nvml_lib.nvmlDeviceGetApplicationsClock, h, 0),
                               "default": get(nvml_lib.nvmlDeviceGetDefaultApplicationsClock, h, 0)}
            g["pcie"] = {"gen": get(nvml_lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
                         "gen_max": get(nvml_lib.nvmlDeviceGetMaxPcieLinkGeneration, h),
                         "width": get(nvml_lib.nvmlDeviceGetCurrPcieLinkWidth, h),
                         "width_max": get(nvml_lib.nvmlDeviceGetMaxPcieLinkWidth, h),
                         "tx_kbps": get(nvml_lib.nvmlDeviceGetPcieThroughput, h, 0),
                         "rx_kbps": get(nvml_lib.nvmlDeviceGetPcieThroughput, h, 1)}
            g["nvlink"] = [get(nvml_lib.nvmlDeviceGetNvLinkState, h, link) for link in range(18)]
            g["energy_mj"] = get(nvml_lib.nvmlDeviceGetTotalEnergyConsumption, h)
            g["clocks_max"] = {"sm": get(nvml_lib.nvmlDeviceGetMaxClockInfo, h, 1), "mem": get(nvml_lib.nvmlDeviceGetMaxClockInfo, h, 2)}
            out["gpus"].append(g)
        return out
    finally:
        nvml_lib.nvmlShutdown()


def cuda_process(report: Report, state: Path) -> None:
    """A CUDA process started as a job's child is that job's on the agent's GPU reading (Owners)."""
    python = shutil.which("python3") or sys.executable
    code = "import torch,time; x=torch.ones(1<<20, device='cuda'); print('up', flush=True); time.sleep(20)"
    proc = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout is None or proc.stdout.readline().strip() != "up":
            report.say("skip", "CUDA process: torch could not allocate on the GPU")
            return
        owners = Owners([{"id": "1", "pid": proc.pid, "gpus": None, "started_at": time.time()}])
        sample = MetricsSampler(str(state)).sample(owners)
        procs = [p for g in sample["gpus"] for p in g.get("processes") or []]
        report.data["cuda_process"] = procs
        mine = [p for p in procs if p["pid"] == proc.pid]
        report.say("ok" if mine and mine[0]["job"] == "1" else "MISMATCH",
                   f"CUDA process {proc.pid} attributed to its job: {mine}")
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    state = Path(tempfile.mkdtemp(prefix="gputui-gpu-check-"))
    if shutil.which("nvidia-smi") is None:
        report.say("skip", "no nvidia-smi: not a GPU machine; nothing to check")
        report.save()
        return 0
    q = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60)
    (out / "nvidia-smi-q.txt").write_text(q.stdout)
    fields = [f for f, _ in smi.GPU_FIELDS]
    csv = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv"],
                         capture_output=True, text=True, timeout=30)
    (out / "query-gpu.csv").write_text(csv.stdout + csv.stderr)
    nvml = MetricsSampler(str(state))
    report.data["nvml"] = {"source": nvml.gpu_source, "error": nvml.gpu_error, "facts": nvml.facts(),
                           "sample": nvml.sample(lambda pid: None)}
    if nvml.gpu_source == "nvml":
        compare(report, "nvml", report.data["nvml"]["sample"]["gpus"])
        thermal_counter(report, report.data["nvml"]["sample"]["gpus"])
        watcher = nvml.faults  # the XID event set the agent holds (opened by the first sample)
        heard = sorted(watcher.uuids) if watcher is not None else []
        report.data["xid_event_set"] = {"gpus": heard, "why_not": watcher.why if watcher is not None else "none"}
        report.say("ok" if heard else "MISMATCH", f"XID event set registered on GPUs {heard} {watcher.why if watcher else ''}")
    else:
        report.say("skip", f"NVML path: {nvml.gpu_error}")
    source = smi.SmiSource("nvidia-smi", 10.0)
    report.data["smi"] = {"facts": source.facts(), "sample": source.sample()}
    compare(report, "nvidia-smi", report.data["smi"]["sample"])
    try:
        report.data["raw_nvml"] = raw_nvml()
        report.say("ok", "raw NVML fields (faults, links, energy) recorded in readings.json")
    except Exception as exc:  # noqa: BLE001
        report.say("skip", f"raw NVML fields: {exc}")
    doctor = run_doctor(nvml, str(state), {"timeout_s": 120})
    report.data["doctor"] = doctor
    for c in doctor["checks"]:
        report.say(c["status"], f"doctor {c['id']}: {c['detail']}")
    cuda_process(report, state)
    report.save()
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

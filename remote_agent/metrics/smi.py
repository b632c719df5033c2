"""GPU readings from ``nvidia-smi --query-gpu`` CSV: the fallback when NVML cannot be used.

The executable is run as an argv list with a timeout. "[N/A]", "[Not Supported]", "N/A" and any other
bracketed value read as None. Stdlib only, Python 3.8+.
"""

import os
import re
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import protocol as P
from .nvml import throttle_names

# (nvidia-smi field, key of ``protocol.Gpu``, or of ``protocol.GpuFacts`` for the driver version); fields that
# every driver since long before Python 3.8 knows.
GPU_FIELDS = (
    ("index", "index"),
    ("uuid", "uuid"),
    ("name", "name"),
    ("driver_version", "driver_version"),
    ("utilization.gpu", "util_percent"),
    ("memory.used", "mem_used_mib"),
    ("memory.total", "mem_total_mib"),
    ("temperature.gpu", "temp_c"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
    ("fan.speed", "fan_percent"),
    ("clocks.sm", "sm_clock_mhz"),
    ("clocks.mem", "mem_clock_mhz"),
    ("pstate", "pstate"),
    ("persistence_mode", "persistence_mode"),
    ("ecc.errors.uncorrected.volatile.total", "ecc_errors_uncorrected"),
    ("clocks_throttle_reasons.active", "throttle_reasons"),
)
# process_name last: it is the one column that may itself contain ", ".
APP_FIELDS = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")
CSV_FORMAT = "--format=csv,noheader,nounits"
_TEXT_KEYS = ("uuid", "name", "driver_version", "pstate")


class SmiUnavailable(Exception):
    """nvidia-smi cannot be used; the message is meant for a human."""


class SmiNotFound(SmiUnavailable):
    pass


def value(raw: str) -> Optional[str]:
    """The CSV cell, or None for "[N/A]", "[Not Supported]", "N/A" and other bracketed non-values."""
    raw = raw.strip()
    if not raw or raw.startswith("[") or raw in ("N/A", "Unknown Error"):
        return None
    return raw


def number(raw: Optional[str]) -> Any:
    """int or float from a cell, None when it is not a number."""
    if raw is None:
        return None
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    return None


def run(argv: Sequence[str], timeout: float) -> str:
    """stdout of argv; SmiUnavailable with the tool's own first line on failure."""
    try:
        proc = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            universal_newlines=True,
            errors="replace",
        )
    except FileNotFoundError:
        raise SmiNotFound("nvidia-smi not found ({})".format(argv[0])) from None
    except subprocess.TimeoutExpired:
        raise SmiUnavailable("nvidia-smi timed out after {:g} s".format(timeout)) from None
    except OSError as e:
        raise SmiUnavailable("nvidia-smi could not run: {}".format(e)) from None
    if proc.returncode != 0:
        lines = (proc.stdout + "\n" + proc.stderr).strip().splitlines()
        first = lines[0].strip() if lines else "no output"
        raise SmiUnavailable("nvidia-smi failed (exit {}): {}".format(proc.returncode, first))
    return proc.stdout


def parse_gpus(text: str) -> List[Dict[str, Any]]:
    """Rows of the GPU query as our dicts (driver_version included); malformed lines are skipped."""
    gpus = []
    for line in text.splitlines():
        cells = line.split(", ")
        if len(cells) != len(GPU_FIELDS):
            continue
        row: Dict[str, Any] = {}
        for i, (_, key) in enumerate(GPU_FIELDS):
            v = value(cells[i])
            if key in _TEXT_KEYS:
                row[key] = v
            elif key == "persistence_mode":
                row[key] = {"Enabled": True, "Disabled": False}.get(v or "")
            elif key == "throttle_reasons":
                mask = None
                if v is not None:
                    try:
                        mask = int(v, 16) if v.lower().startswith("0x") else int(v)
                    except ValueError:
                        mask = None
                row[key] = throttle_names(mask)
            else:
                row[key] = number(v)
        if row["index"] is None:
            continue
        gpus.append(row)
    return gpus


def parse_apps(text: str) -> Dict[str, List[Dict[str, Any]]]:
    """Compute processes by GPU uuid: {"pid", "mem_mib", "smi_name"}."""
    apps: Dict[str, List[Dict[str, Any]]] = {}
    for line in text.splitlines():
        cells = line.split(", ", len(APP_FIELDS) - 1)
        if len(cells) != len(APP_FIELDS):
            continue
        uuid, pid, mem, name = (value(c) for c in cells)
        pid_num = number(pid)
        if uuid is None or not isinstance(pid_num, int):
            continue
        apps.setdefault(uuid, []).append(
            {"pid": pid_num, "mem_mib": number(mem), "smi_name": os.path.basename(name) if name else None}
        )
    return apps


def parse_version(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(CUDA version, NVML version) from ``nvidia-smi --version`` output."""
    cuda = re.search(r"CUDA Version\s*:\s*([0-9.]+)", text)
    nvml = re.search(r"NVML version\s*:\s*([0-9.]+)", text)
    return (cuda.group(1) if cuda else None), (nvml.group(1) if nvml else None)


class SmiSource:
    """Reads every GPU with one ``nvidia-smi --query-gpu`` call (plus one for compute processes)."""

    name = "nvidia-smi"

    def __init__(self, path: str = "nvidia-smi", timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self._probe = self._query()  # raises SmiUnavailable: nothing usable here
        self._facts: Optional[P.GpuFacts] = None

    def _query(self) -> List[Dict[str, Any]]:
        fields = ",".join(f for f, _ in GPU_FIELDS)
        gpus = parse_gpus(run([self.path, "--query-gpu=" + fields, CSV_FORMAT], self.timeout))
        if not gpus:
            raise SmiUnavailable("nvidia-smi reported no GPU")
        return gpus

    def facts(self) -> P.GpuFacts:
        if self._facts is None:
            try:
                cuda, nvml = parse_version(run([self.path, "--version"], self.timeout))
            except SmiUnavailable:  # older drivers have no --version
                cuda, nvml = None, None
            rows = sorted(self._probe, key=lambda g: g["index"])
            self._facts = {
                "driver_version": rows[0]["driver_version"],
                "cuda_version": cuda,
                "nvml_version": nvml,
                "gpus": [
                    {"index": g["index"], "uuid": g["uuid"], "name": g["name"], "mem_total_mib": g["mem_total_mib"]}
                    for g in rows
                ],
            }
        return self._facts

    def sample(self) -> List[Dict[str, Any]]:
        """One ``protocol.Gpu`` per GPU, but processes carry pid, mem_mib and smi_name (the sampler maps them);
        raises SmiUnavailable when this call failed."""
        gpus = self._query()
        fields = "--query-compute-apps=" + ",".join(APP_FIELDS)
        try:
            apps = parse_apps(run([self.path, fields, CSV_FORMAT], self.timeout))
        except SmiUnavailable:
            apps = {}
        for g in gpus:
            del g["driver_version"]
            g["processes"] = apps.get(g["uuid"] or "", [])
        return gpus

    def close(self) -> None:
        pass

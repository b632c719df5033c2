"""GPU readings from ``nvidia-smi --query-gpu`` CSV: the fallback when NVML cannot be used.

The executable is run as an argv list with a timeout. "[N/A]", "[Not Supported]", "N/A" and any other
bracketed value read as None. One failed GPU fails the whole call (a non-zero exit) but the others' rows are
still printed: they are read, and the failed GPU ("Unable to determine the device handle for GPU ...", a row of
"[GPU is lost]") is reported ``lost`` with the driver's words. Stdlib only, Python 3.8+.
"""

import ntpath
import os
import re
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import protocol as P
from .nvml import gpu_health, lost_gpu, throttle_names

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
    ("ecc.errors.uncorrected.aggregate.total", "ecc_errors_uncorrected_aggregate"),
    ("clocks_throttle_reasons.active", "throttle_reasons"),
    ("pcie.link.gen.current", "pcie_gen"),
    ("pcie.link.gen.max", "pcie_gen_max"),
    ("pcie.link.width.current", "pcie_width"),
    ("pcie.link.width.max", "pcie_width_max"),
    ("remapped_rows.pending", "remap_pending"),
    ("remapped_rows.failure", "remap_failed"),
    ("clocks.max.sm", "sm_clock_max_mhz"),
    ("clocks.max.memory", "mem_clock_max_mhz"),
    ("clocks.applications.graphics", "app_clock_mhz"),
    ("clocks.default_applications.graphics", "app_clock_default_mhz"),
    ("retired_pages.single_bit_ecc.count", "retired_pages_single"),
    ("retired_pages.double_bit.count", "retired_pages_double"),
    ("retired_pages.pending", "retired_pages_pending"),
)
#: ``protocol.Gpu`` keys only NVML gives (the thermal violation counter): None on this path.
NVML_ONLY = ("thermal_violation_ms", "thermal_slowdown_percent", "thermal_window_s", "nvlink_links", "nvlink_active")
_YES_NO = ("remap_pending", "remap_failed", "retired_pages_pending")
# process_name last: it is the one column that may itself contain ", ".
APP_FIELDS = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")
CSV_FORMAT = "--format=csv,noheader,nounits"
_TEXT_KEYS = ("uuid", "name", "driver_version", "pstate")


class SmiUnavailable(Exception):
    """nvidia-smi cannot be used; the message is meant for a human."""


class SmiNotFound(SmiUnavailable):
    pass


class SmiFailed(SmiUnavailable):
    """nvidia-smi ran and exited non-zero; ``output`` is what it printed (stdout, then stderr)."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


#: At most this many lost GPUs are read off lines of nvidia-smi's words (a hostile tool may print millions).
MAX_FAILED_LINES = 64
#: A line of nvidia-smi's output that says a GPU cannot be reached (instead of its CSV row).
_GPU_FAILED_LINE = re.compile(r"device handle|GPU is lost|requires (?:reset|restart)|fallen off the bus", re.I)
#: A cell that says the GPU itself is gone (as opposed to one field being unsupported).
_GPU_FAILED_CELL = re.compile(r"^\[(GPU is lost|GPU requires (?:reset|restart)|Unknown Error)\]$", re.I)


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
        output = proc.stdout + "\n" + proc.stderr
        lines = output.strip().splitlines()
        first = lines[0].strip() if lines else "no output"
        raise SmiFailed("nvidia-smi failed (exit {}): {}".format(proc.returncode, first), output)
    return proc.stdout


def parse_gpus(text: str) -> List[Dict[str, Any]]:
    """Rows of the GPU query as our dicts (driver_version included), by index; malformed lines are skipped.

    A GPU the driver cannot reach is a ``lost`` entry with the driver's words: a row whose uuid or any cell
    reads "[GPU is lost]" (or "[Unknown Error]" for the uuid, which every live GPU knows), or a line such as
    "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error", which takes the first index
    no row has (nvidia-smi goes through the GPUs in index order)."""
    gpus: List[Dict[str, Any]] = []
    failed: List[str] = []  # the driver's words for each GPU that printed no row
    uuid_at = [key for _, key in GPU_FIELDS].index("uuid")
    for line in text.splitlines():
        cells = line.split(", ")
        if len(cells) != len(GPU_FIELDS):
            if _GPU_FAILED_LINE.search(line) and len(failed) < MAX_FAILED_LINES:
                failed.append(line.strip())
            continue
        gone = [c.strip()[1:-1] for c in cells if _GPU_FAILED_CELL.match(c.strip())]
        uuid_gone = _GPU_FAILED_CELL.match(cells[uuid_at].strip()) is not None
        gone = [g for g in gone if uuid_gone or g.lower() != "unknown error"]
        row: Dict[str, Any] = {}
        for i, (_, key) in enumerate(GPU_FIELDS):
            v = value(cells[i])
            if key in _TEXT_KEYS:
                row[key] = v
            elif key == "persistence_mode":
                row[key] = {"Enabled": True, "Disabled": False}.get(v or "")
            elif key in _YES_NO:
                row[key] = {"Yes": True, "No": False}.get(v or "")
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
        if not isinstance(row["index"], int):
            if gone:
                failed.append(gone[0])
            continue
        row.update(gpu_health(gone[0] if gone else None))
        gpus.append(row)
    taken = {g["index"] for g in gpus}
    free = [i for i in range(len(gpus) + len(failed)) if i not in taken]  # at least len(failed) of them
    for k, words in enumerate(failed):
        gpus.append(dict(lost_gpu(free[k], words), driver_version=None))
    return sorted(gpus, key=lambda g: g["index"])


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
        apps.setdefault(uuid, []).append({"pid": pid_num, "mem_mib": number(mem), "smi_name": _base(name)})
    return apps


def _base(path: Optional[str]) -> Optional[str]:
    """The file name of a process path as nvidia-smi prints it (``C:\\...\\dwm.exe`` on Windows too)."""
    if not path:
        return None
    return ntpath.basename(path) if re.match(r"^[A-Za-z]:\\", path) else os.path.basename(path)


#: "CUDA UMD version : 13.3" (driver 610 on), "CUDA Version : 13.1" (--version before 610), "CUDA Version:
#: 12.0" (the table header of plain ``nvidia-smi``); "CUDA version : Deprecated, ..." has no number.
_CUDA = (re.compile(r"CUDA UMD Version\s*:\s*(\d+\.\d+)", re.I), re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)", re.I))


def parse_version(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(CUDA version, NVML version) from ``nvidia-smi --version`` output, or the CUDA version from the header
    of plain ``nvidia-smi`` (``-q`` output reads too); None for what the text lacks."""
    cuda = next((m.group(1) for m in (p.search(text) for p in _CUDA) if m), None)
    nvml = re.search(r"NVML version\s*:\s*(\d+(?:\.\d+)*)", text, re.I)
    return cuda, (nvml.group(1) if nvml else None)


class SmiSource:
    """Reads every GPU with one ``nvidia-smi --query-gpu`` call (plus one for compute processes)."""

    name = "nvidia-smi"

    def __init__(self, path: str = "nvidia-smi", timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self._probe = self._query()  # raises SmiUnavailable: nothing usable here
        self._facts: Optional[P.GpuFacts] = None

    def _query(self) -> List[Dict[str, Any]]:
        """Every GPU's row; a failed run still gives the rows it printed (one lost GPU fails the call)."""
        fields = ",".join(f for f, _ in GPU_FIELDS)
        try:
            gpus = parse_gpus(run([self.path, "--query-gpu=" + fields, CSV_FORMAT], self.timeout))
        except SmiFailed as e:
            gpus = parse_gpus(e.output)
            if not gpus:
                raise
        if not gpus:
            raise SmiUnavailable("nvidia-smi reported no GPU")
        return gpus

    def _cuda_and_nvml(self) -> Tuple[Optional[str], Optional[str]]:
        """From ``nvidia-smi --version``; an older driver without it (or without the CUDA line there) shows
        the CUDA version in the header of plain ``nvidia-smi``."""
        try:
            cuda, nvml = parse_version(run([self.path, "--version"], self.timeout))
        except SmiUnavailable:
            cuda, nvml = None, None
        if cuda is None:
            try:
                cuda = parse_version(run([self.path], self.timeout))[0]
            except SmiFailed as e:  # a lost GPU fails the call; the header is printed all the same
                cuda = parse_version(e.output)[0]
            except SmiUnavailable:
                pass
        return cuda, nvml

    def facts(self) -> P.GpuFacts:
        if self._facts is None:
            cuda, nvml = self._cuda_and_nvml()
            rows = sorted(self._probe, key=lambda g: g["index"])
            self._facts = {
                "driver_version": next((g["driver_version"] for g in rows if g["driver_version"]), None),
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
        except SmiFailed as e:  # a lost GPU fails this call too: the others' processes are printed all the same
            apps = parse_apps(e.output)
        except SmiUnavailable:
            apps = {}
        for g in gpus:
            g.pop("driver_version", None)
            g.update(dict.fromkeys(NVML_ONLY))
            g["processes"] = apps.get(g["uuid"] or "", [])
        return gpus

    def close(self) -> None:
        pass

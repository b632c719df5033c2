"""GPU readings through NVML (pynvml), one long-lived context per sampler.

Every field is queried on its own: NotSupported (fan speed on H100/T4) or any other NVML error makes that
one field None. Three tiers keep a 1 Hz sampler under 6 NVML calls per GPU per second: fast fields
(utilisation, memory, power, processes: 4 calls) on every call, slow ones (temperature, SM clock, pstate,
throttle reasons, fan, the thermal violation counter: 6 calls) at most every ``slow_interval`` seconds,
settings (power limit, persistence mode, ECC counts, memory clock, the PCIe link, remapped rows, clocks at most,
application clocks, retired pages: 17 calls, and one per NVLink link plus one) at most every SETTINGS_INTERVAL_S.
Stdlib only apart from pynvml, which is imported lazily; Python 3.8+.
"""

import collections
import sys
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .. import protocol as P

MIB = 1024 * 1024
#: Slow fields at most this often by default: 5 calls / 6 s per GPU.
SLOW_INTERVAL_S = 6.0
#: Settings (power limit, persistence mode, ECC count, memory clock) change rarely, if ever, under a job.
SETTINGS_INTERVAL_S = 60.0

# NVML return codes (nvml.h); read from the module when it has them.
_ERR_NO_PERMISSION = 4
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_LIB_RM_VERSION_MISMATCH = 18

# Clock event ("throttle") reason bits (nvml.h nvmlClocksEventReason*), short names.
THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "app_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)


#: A read failing with one of these (nvml.h) means the GPU itself is gone: it is reported ``lost``.
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
#: What to do about a lost GPU (shown with the driver's words).
LOST_FIX = "Reboot the host; if the GPU is still lost, ask the provider for another instance."
NO_ACCESS_FIX = (
    "This user or container cannot open this GPU: check access to /dev/nvidia* (or the container's GPU "
    "mapping); if that is right, reboot the host or ask the provider for another instance."
)
#: NVLink links read per GPU at most (NVML_NVLINK_MAX_LINKS is 18 up to Hopper, 36 from Blackwell).
MAX_NVLINKS = 36
#: The driver's words about a lost GPU are cut to this many characters.
MAX_ERROR_CHARS = 300


class NvmlUnavailable(Exception):
    """NVML cannot be used; the message is meant for a human."""


class _LibraryNotFound(Exception):
    value = _ERR_LIBRARY_NOT_FOUND


def throttle_names(mask: Optional[int]) -> Optional[List[str]]:
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_BITS if mask & bit]


def _remaps(rows: Any) -> Dict[str, Optional[bool]]:
    """``remap_pending`` and ``remap_failed`` of nvmlDeviceGetRemappedRows' (correctable, uncorrectable, pending,
    failure occurred); None where the GPU cannot say."""
    if not isinstance(rows, (tuple, list)) or len(rows) < 4:
        return {"remap_pending": None, "remap_failed": None}
    return {"remap_pending": bool(rows[2]), "remap_failed": bool(rows[3])}


def _count(pages: Any) -> Optional[int]:
    """How many pages nvmlDeviceGetRetiredPages listed (None where the GPU cannot say)."""
    return len(pages) if isinstance(pages, (list, tuple)) else None


def _ns_to_ms(violation: Any) -> Optional[float]:
    """A violation counter (nvmlDeviceGetViolationStatus's ``violationTime``, ns) in ms."""
    ns = getattr(violation, "violationTime", None)
    return ns / 1e6 if isinstance(ns, int) and ns >= 0 else None


class ThermalWindow:
    """The share of the last ``P.THROTTLE_WINDOW_S`` seconds a GPU's clocks were slowed for heat, from readings
    of its thermal violation counter: (monotonic time, ms since the driver loaded), at most one per second kept."""

    #: Readings spanning less than this give no share (a few seconds say nothing about the last minutes).
    MIN_SPAN_S = 60.0

    def __init__(self) -> None:
        self.readings: Deque[Tuple[float, float]] = collections.deque(maxlen=int(P.THROTTLE_WINDOW_S) + 2)

    def add(self, now: float, violation_ms: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
        """Keep this reading; (percent of the window so slowed, the window in seconds: THROTTLE_WINDOW_S, or the
        span of the readings kept when shorter), or (None, None) before they span MIN_SPAN_S."""
        if violation_ms is None:
            self.readings.clear()
            return None, None
        if self.readings and (violation_ms < self.readings[-1][1] or now < self.readings[-1][0]):
            self.readings.clear()  # the counter went back: the driver was reloaded
        if not self.readings or now - self.readings[-1][0] >= 1.0:
            self.readings.append((now, violation_ms))
        while len(self.readings) > 2 and now - self.readings[1][0] >= P.THROTTLE_WINDOW_S:
            self.readings.popleft()
        t0, v0 = self.readings[0]
        if now - t0 < self.MIN_SPAN_S:
            return None, None
        share = min(max((violation_ms - v0) / 1000.0 / (now - t0), 0.0), 1.0)
        return round(share * 100.0, 1), round(now - t0, 1)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def driver_words(text: Any) -> str:
    """The driver's message as one bounded line: control characters dropped, whitespace collapsed."""
    printable = "".join(ch if ch.isprintable() else " " for ch in _text(text)[: MAX_ERROR_CHARS * 4])
    return " ".join(printable.split())[:MAX_ERROR_CHARS] or "unknown error"


def gpu_health(error: Optional[str] = None) -> Dict[str, Any]:
    """The ``state``, ``error`` and ``fix`` of a ``protocol.Gpu``: ok, or lost with the driver's words."""
    if error is None:
        return {"state": P.GPU_OK, "error": None, "fix": None}
    words = driver_words(error)
    fix = NO_ACCESS_FIX if "permission" in words.lower() else LOST_FIX
    return {"state": P.GPU_LOST, "error": words, "fix": fix}


def lost_gpu(index: int, error: str, uuid: Optional[str] = None, name: Optional[str] = None) -> Dict[str, Any]:
    """A ``protocol.Gpu`` for a GPU the driver cannot reach: every reading None, state ``lost``."""
    gpu: Dict[str, Any] = dict.fromkeys(P.GPU_FIELDS)
    gpu.update(index=index, uuid=uuid, name=name, processes=[])
    gpu.update(gpu_health(error))
    return gpu


def init_error_message(nvml: Any, err: BaseException) -> str:
    """A clear message for an nvmlInit failure."""
    code = getattr(err, "value", None)
    if code == getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", _ERR_LIB_RM_VERSION_MISMATCH):
        return "NVIDIA driver/library version mismatch: reboot the host or reload the nvidia kernel module"
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", _ERR_DRIVER_NOT_LOADED):
        return "NVIDIA driver not loaded: the nvidia kernel module is missing (modprobe nvidia, or reinstall the driver)"
    if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", _ERR_LIBRARY_NOT_FOUND):
        return "NVML library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed?"
    if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", _ERR_NO_PERMISSION):
        return "no permission to use the NVIDIA driver (check access to /dev/nvidia*)"
    return "NVML init failed: {}".format(err)


def load_nvml(nvml: Any = None) -> Any:
    """The given pynvml-like module, or pynvml imported now (not on a host without the NVML library: pynvml
    defines hundreds of classes, ~20 ms of every agent start, to find that out)."""
    if nvml is not None:
        return nvml
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libnvidia-ml.so.1")  # what pynvml's nvmlInit loads; cached by the dynamic linker
        except OSError:
            raise NvmlUnavailable(init_error_message(None, _LibraryNotFound())) from None
    try:
        import pynvml  # optional at run time
    except Exception as e:  # ImportError, or a broken install
        raise NvmlUnavailable("pynvml (nvidia-ml-py) is not importable: {}".format(e)) from None
    return pynvml


class NvmlSource:
    """Reads every GPU through one NVML context; call close() to shut it down."""

    name = "nvml"

    def __init__(
        self, nvml: Any = None, slow_interval: float = SLOW_INTERVAL_S, only: Optional[List[str]] = None
    ) -> None:
        """``only``: read just these GPUs (indices or UUIDs, as CUDA_VISIBLE_DEVICES names them)."""
        self.nvml = load_nvml(nvml)
        self.slow_interval = slow_interval
        self.settings_interval = (
            SETTINGS_INTERVAL_S if slow_interval > 0 else 0.0
        )  # 0: every field, every call
        try:
            self.nvml.nvmlInit()
        except Exception as e:
            raise NvmlUnavailable(init_error_message(self.nvml, e)) from None
        self._open = True
        self._gone: Optional[str] = None  # why the GPU being read is gone, if a read said so
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except Exception as e:
            self.close()
            raise NvmlUnavailable("NVML could not list the GPUs: {}".format(e)) from None
        self.indices = list(range(count))
        #: None for a GPU whose handle failed; ``lost`` holds the driver's words for it (and for a GPU
        #: whose reads said it is lost): one failed GPU never hides the others.
        self.handles: List[Any] = []
        self.lost: Dict[int, str] = {}
        for i in self.indices:
            try:
                self.handles.append(self.nvml.nvmlDeviceGetHandleByIndex(i))
            except Exception as e:
                self.handles.append(None)
                self.lost[i] = "Unable to determine the device handle for GPU {}: {}".format(i, e)
        if only is not None:
            keep = [k for k, h in enumerate(self.handles) if self._is_one_of(k, h, set(only))]
            self.indices = [self.indices[k] for k in keep]
            self.handles = [self.handles[k] for k in keep]
        # pynvml >= 12.535 names it "event reasons"; older ones only "throttle reasons".
        self._reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        if getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) is not None:
            self._reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._slow: List[Dict[str, Any]] = [{} for _ in self.handles]
        self._slow_at: List[Optional[float]] = [None for _ in self.handles]
        self._settings: List[Dict[str, Any]] = [{} for _ in self.handles]
        self._settings_at: List[Optional[float]] = [None for _ in self.handles]
        self._thermal = [ThermalWindow() for _ in self.handles]
        self._facts: Optional[P.GpuFacts] = None

    def _is_one_of(self, index: int, handle: Any, names: "set[str]") -> bool:
        if str(index) in names:
            return True
        if handle is None:  # a lost GPU has no UUID to match
            return False
        return any(not n.isdigit() for n in names) and self._str("nvmlDeviceGetUUID", handle) in names

    def _get(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None on any NVML error (NotSupported included); an error saying the GPU is gone
        ("GPU is lost", "GPU requires reset") is kept in ``_gone`` for the GPU being read."""
        try:
            return fn(*args)
        except Exception as e:
            code = getattr(e, "value", None)
            lost = (
                getattr(self.nvml, "NVML_ERROR_GPU_IS_LOST", _ERR_GPU_IS_LOST),
                getattr(self.nvml, "NVML_ERROR_RESET_REQUIRED", _ERR_RESET_REQUIRED),
            )
            if code in lost and self._gone is None:
                self._gone = str(e)
            return None

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, name, None)
        return None if fn is None else self._get(fn, *args)

    def facts(self) -> P.GpuFacts:
        if self._facts is None:
            cuda = self._call("nvmlSystemGetCudaDriverVersion")
            driver = self._call("nvmlSystemGetDriverVersion")
            nvml_version = self._call("nvmlSystemGetNVMLVersion")
            gpus: List[P.GpuFact] = []
            for k, h in enumerate(self.handles):
                if h is None:
                    gpus.append({"index": self.indices[k], "uuid": None, "name": None, "mem_total_mib": None})
                    continue
                mem = self._call("nvmlDeviceGetMemoryInfo", h)
                gpus.append(
                    {
                        "index": self.indices[k],
                        "uuid": self._str("nvmlDeviceGetUUID", h),
                        "name": self._str("nvmlDeviceGetName", h),
                        "mem_total_mib": mem.total // MIB if mem is not None else None,
                    }
                )
            self._facts = {
                "driver_version": _text(driver) if driver is not None else None,
                "cuda_version": "{}.{}".format(cuda // 1000, cuda % 1000 // 10) if cuda else None,
                "nvml_version": _text(nvml_version) if nvml_version is not None else None,
                "gpus": gpus,
            }
        return self._facts

    def _str(self, name: str, *args: Any) -> Optional[str]:
        value = self._call(name, *args)
        return _text(value) if value is not None else None

    def _read_slow(self, i: int, h: Any, now: float) -> Dict[str, Any]:
        """The fields of ``protocol.Gpu`` read every few seconds only (GPU ``i``, handle ``h``)."""
        nv = self.nvml
        pstate = self._call("nvmlDeviceGetPerformanceState", h)
        thermal = _ns_to_ms(self._call("nvmlDeviceGetViolationStatus", h, getattr(nv, "NVML_PERF_POLICY_THERMAL", 1)))
        share, window = self._thermal[i].add(now, thermal)
        return {
            "temp_c": self._call("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)),
            "fan_percent": self._call("nvmlDeviceGetFanSpeed", h),
            "sm_clock_mhz": self._call("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            "pstate": "P{}".format(pstate) if pstate is not None and 0 <= pstate <= 15 else None,
            "throttle_reasons": throttle_names(self._call(self._reasons_fn, h)),
            "thermal_violation_ms": thermal,
            "thermal_slowdown_percent": share,
            "thermal_window_s": window,
        }

    def _read_settings(self, h: Any) -> Dict[str, Any]:
        """The fields of ``protocol.Gpu`` that are settings more than readings: read once a minute."""
        nv = self.nvml
        limit = self._call("nvmlDeviceGetEnforcedPowerLimit", h)
        persistence = self._call("nvmlDeviceGetPersistenceMode", h)
        pending = self._call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return {
            "power_limit_w": limit / 1000.0 if limit is not None else None,
            "mem_clock_mhz": self._call("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2)),
            "ecc_errors_uncorrected": self._call(
                "nvmlDeviceGetTotalEccErrors",
                h,
                getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(nv, "NVML_VOLATILE_ECC", 0),
            ),
            "ecc_errors_uncorrected_aggregate": self._call(
                "nvmlDeviceGetTotalEccErrors",
                h,
                getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(nv, "NVML_AGGREGATE_ECC", 1),
            ),
            "persistence_mode": bool(persistence) if persistence is not None else None,
            "pcie_gen": self._call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_gen_max": self._call("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "pcie_width": self._call("nvmlDeviceGetCurrPcieLinkWidth", h),
            "pcie_width_max": self._call("nvmlDeviceGetMaxPcieLinkWidth", h),
            **_remaps(self._call("nvmlDeviceGetRemappedRows", h)),
            **self._nvlinks(h),
            "sm_clock_max_mhz": self._call("nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            "mem_clock_max_mhz": self._call("nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2)),
            "app_clock_mhz": self._call("nvmlDeviceGetApplicationsClock", h, getattr(nv, "NVML_CLOCK_GRAPHICS", 0)),
            "app_clock_default_mhz": self._call(
                "nvmlDeviceGetDefaultApplicationsClock", h, getattr(nv, "NVML_CLOCK_GRAPHICS", 0)
            ),
            "retired_pages_single": _count(self._call("nvmlDeviceGetRetiredPages", h, 0)),  # multiple single-bit errors
            "retired_pages_double": _count(self._call("nvmlDeviceGetRetiredPages", h, 1)),  # a double-bit error
            "retired_pages_pending": bool(pending) if pending is not None else None,
        }

    def _nvlinks(self, h: Any) -> Dict[str, Optional[int]]:
        """``nvlink_links`` (the links NVML answers for, in order) and ``nvlink_active`` (those up); None for both
        on a GPU without NVLink. One call where there is none."""
        states = []
        for link in range(min(int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18)), MAX_NVLINKS)):
            state = self._call("nvmlDeviceGetNvLinkState", h, link)
            if state is None:  # past the GPU's last link (or no NVLink at all)
                break
            states.append(bool(state))
        if not states:
            return {"nvlink_links": None, "nvlink_active": None}
        return {"nvlink_links": len(states), "nvlink_active": sum(states)}

    @staticmethod
    def _due(at: List[Optional[float]], i: int, now: float, every: float) -> bool:
        """Whether GPU ``i``'s cached tier is older than ``every`` seconds (marking it read now if so)."""
        if at[i] is not None and now - at[i] < every:  # type: ignore[operator]
            return False
        at[i] = now
        return True

    def sample(self) -> List[Dict[str, Any]]:
        """One ``protocol.Gpu`` per GPU, but processes carry pid and mem_mib only (the sampler adds the rest);
        a GPU whose handle failed, or whose reads say it is gone, is reported ``lost``."""
        facts = self.facts()["gpus"]
        now = time.monotonic()
        out = []
        for i, h in enumerate(self.handles):
            index = self.indices[i]
            if h is None:
                out.append(lost_gpu(index, self.lost[index]))
                continue
            self._gone = None
            util = self._call("nvmlDeviceGetUtilizationRates", h)
            mem = self._call("nvmlDeviceGetMemoryInfo", h)
            power = self._call("nvmlDeviceGetPowerUsage", h)
            if self._due(self._slow_at, i, now, self.slow_interval):
                self._slow[i] = self._read_slow(i, h, now)
            if self._due(self._settings_at, i, now, self.settings_interval):
                self._settings[i] = self._read_settings(h)
            gpu: Dict[str, Any] = {
                "index": self.indices[i],
                "uuid": facts[i]["uuid"],
                "name": facts[i]["name"],
                "util_percent": util.gpu if util is not None else None,
                "mem_used_mib": mem.used // MIB if mem is not None else None,
                "mem_total_mib": mem.total // MIB if mem is not None else None,
                "power_w": power / 1000.0 if power is not None else None,
                "processes": self._processes(h),
            }
            gpu.update(self._slow[i])
            gpu.update(self._settings[i])
            if self._gone is not None:
                self.lost[index] = self._gone
            gpu.update(gpu_health(self.lost.get(index)))
            out.append(gpu)
        return out

    def _processes(self, h: Any) -> List[Dict[str, Any]]:
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", h) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append({"pid": p.pid, "mem_mib": used // MIB if used is not None else None})
        return out

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            self._get(self.nvml.nvmlShutdown)

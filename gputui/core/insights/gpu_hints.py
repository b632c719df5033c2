"""Hints from GPU telemetry: low utilisation, throttling, other processes holding memory after an OOM."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gputui.core.durations import duration
from remote_agent import protocol as P

from .snapshot import Hint, cap_line

LOW_UTIL_PCT = 30.0
LOW_UTIL_MIN_SAMPLES = 10
HOT_TEMP_C = 85.0
CPU_BOUND_PCT = 90.0  # a GPU process at this share of a core is the bottleneck of a GPU left idle

_THERMAL_REASONS = P.HW_THROTTLE
_POWER_REASONS = ("sw_power_cap",)
MAX_LISTED_PROCESSES = 5


def _reasons(gpu: Any, known: tuple[str, ...]) -> list[str]:
    """The known throttle reasons a GPU reports (NVML-style longer names match too)."""
    got = [str(r).lower() for r in (_get(gpu, "throttle_reasons") or ())]
    return [k for k in known if any(k in r for r in got)]


def _get(gpu: Any, key: str) -> Any:
    """Field of a GPU sample given as a wire dict or an object (``GpuSample``)."""
    return gpu.get(key) if isinstance(gpu, Mapping) else getattr(gpu, key, None)


def _proc(p: Any, key: str) -> Any:
    return p.get(key) if isinstance(p, Mapping) else getattr(p, key, None)


def _gpu_label(gpu: Any) -> str:
    name = _get(gpu, "name")
    return f"GPU {_get(gpu, 'index') or 0}" + (f" ({name})" if name else "")


def hints_from_metrics(
    job_running: bool,
    gpu_util_history: Sequence[float],
    gpus: Sequence[Mapping[str, Any] | Any],
    *,
    job: str | None = None,
    oom: bool = False,
    min_samples: int = LOW_UTIL_MIN_SAMPLES,
    low_util_pct: float = LOW_UTIL_PCT,
) -> list[Hint]:
    """Hints from GPU telemetry for one job.

    ``gpu_util_history``: recent utilisation samples (percent) of the job's GPU(s), oldest first.
    ``gpus``: the job's GPUs as agent wire dicts (``index``, ``name``, ``temp_c``,
    ``throttle_reasons``, ``processes`` = [{"pid", "mem_mib", "job", "name"}]) or ``GpuSample``-like
    objects. ``job``: this job's id, so its own processes are not blamed. ``oom``: the job hit CUDA
    OOM (e.g. a ``cuda_oom`` log hint), which names the other processes holding memory.
    """
    hints: list[Hint] = []
    util = [float(u) for u in gpu_util_history if u is not None]
    if job_running and len(util) >= min_samples:
        med = statistics.median(util)
        if med < low_util_pct:
            evidence = f"median GPU util {med:.0f}% over {len(util)} samples"
            evidence += _loader_evidence(gpus, job)
            hints.append(
                Hint(
                    "low_gpu_util",
                    "GPU mostly idle: input pipeline bound?",
                    "Median GPU utilisation is low while the job runs, so the GPU waits for data. Raise "
                    "DataLoader num_workers (about the CPU core count), set pin_memory=True and "
                    "persistent_workers=True, and check whether the CPU is at 100% (a process on the GPU at "
                    "100% of a core loads the data itself: num_workers=0).",
                    evidence,
                )
            )
    hints.extend(_throttle_hints(gpus))
    if oom:
        other = _other_processes(gpus, job)
        if other:
            hints.append(
                Hint(
                    "gpu_memory_others",
                    "Other processes hold GPU memory",
                    "These processes use memory on the job's GPU: "
                    + "; ".join(other)
                    + ". Stop them (or pick another GPU via CUDA_VISIBLE_DEVICES) before retrying.",
                    cap_line(", ".join(other)),
                )
            )
    return hints


def _loader_evidence(gpus: Iterable[Any], job: str | None) -> str:
    """What the CPU says of a GPU left waiting, from the job's busiest process on its GPUs (any process there when
    the job is not named): ``; the job's process at 100% of a CPU core, with no worker processes`` (the data is
    loaded in the main process) or ``; its 4 worker processes at 390% of a core together``; "" when neither."""
    mine = [p for gpu in gpus for p in _get(gpu, "processes") or () if job is None or _proc(p, "job") == job]
    busiest = max(mine, key=lambda p: _number(_proc(p, "cpu_percent")) or 0.0, default=None)
    if busiest is None:
        return ""
    cpu, kids = _number(_proc(busiest, "cpu_percent")), _proc(busiest, "children")
    kids_cpu = _number(_proc(busiest, "children_cpu_percent"))
    out = ""
    if cpu is not None and cpu >= CPU_BOUND_PCT:
        out = f"; the job's process at {cpu:.0f}% of a CPU core" + (", with no worker processes" if kids == 0 else "")
    if isinstance(kids, int) and kids > 0 and kids_cpu is not None and kids_cpu >= CPU_BOUND_PCT:
        out += f"; its {kids} worker process{'es' if kids != 1 else ''} at {kids_cpu:.0f}% of a core together"
    return out


def _throttle_hints(gpus: Iterable[Any]) -> list[Hint]:
    thermal: list[str] = []
    power: list[str] = []
    for gpu in gpus:
        hw = _reasons(gpu, _THERMAL_REASONS)
        temp = _get(gpu, "temp_c")
        hot = isinstance(temp, (int, float)) and temp >= HOT_TEMP_C
        if hw or hot:
            degrees = f", {temp:.0f}°C" if isinstance(temp, (int, float)) else ""
            thermal.append(f"{_gpu_label(gpu)}: {','.join(hw) or 'temperature'}{degrees}")
        if _reasons(gpu, _POWER_REASONS):
            power.append(f"{_gpu_label(gpu)}: sw_power_cap")
    hints = []
    if thermal:
        hints.append(
            Hint(
                "gpu_thermal_throttle",
                "GPU throttled (heat / hardware slowdown)",
                "The GPU slows its clocks because it is too hot (or hardware slowdown is asserted). This is "
                "a host problem (cooling, fans, airflow): ask the provider or move to another machine.",
                cap_line("; ".join(thermal)),
            )
        )
    if power:
        hints.append(
            Hint(
                "gpu_power_cap",
                "GPU clocks capped by power limit",
                "The GPU runs at its power limit. Normal at full load, but compare power_limit_w with the "
                "card's default (nvidia-smi -q -d POWER): a lowered limit on a rented host costs speed.",
                cap_line("; ".join(power)),
            )
        )
    return hints


#: Clock-event reasons that are a problem of the GPU you pay for, as said (``sw_power_cap`` at full load is normal:
#: not here). ``hw_slowdown`` is asserted with both hardware reasons: named only alone.
PROBLEM_REASONS = {"hw_thermal": "thermal slowdown (hardware)", "sw_thermal": "thermal slowdown",
                   "hw_power_brake": "power brake", "hw_slowdown": "hardware slowdown"}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def gpu_problems(gpu: Any) -> list[str]:
    """What is wrong with a GPU now, a few words each, each ``KIND: details`` (KIND: ``lost``, ``throttled``,
    ``PCIe``, ``NVLink``, ``memory``, ``ECC``, ``clocks``, ``XID``); empty when nothing is known to be: lost, clocks
    slowed by heat or hardware (with the temperature, and the share of the last 10 minutes), a PCIe link narrower
    than the GPU and host allow, NVLink links down beside others up, memory rows waiting to be remapped or a
    remap that failed, memory pages retired or waiting to be, uncorrected ECC errors (since the driver loaded, or
    in the GPU's life), an application clock set below its default, the driver's XIDs of the last day (the
    newest, how long ago, what to do)."""
    faults = _fault_lines(gpu)
    if _get(gpu, "state") == "lost":
        return ["lost", *faults]
    out = faults
    throttled = _throttled(gpu)
    if throttled:
        out.append(throttled)
    width, widest = _get(gpu, "pcie_width"), _get(gpu, "pcie_width_max")
    if _count(width) and _count(widest) and width < widest:  # (its generation drops at idle by design: not judged)
        gen, top = _get(gpu, "pcie_gen"), _get(gpu, "pcie_gen_max")
        gens = f", gen{gen} of gen{top}" if _count(gen) and _count(top) else ""
        out.append(f"PCIe: link x{width} of x{widest}{gens} (every transfer to the GPU is slower: ask the provider for "
                   "another instance)")
    links, up = _get(gpu, "nvlink_links"), _get(gpu, "nvlink_active")
    if _count(links) and _count(up) and up < links:  # (none up: a card without its bridge looks the same)
        out.append(f"NVLink: {up} of {links} links up (traffic between the GPUs, all-reduce, is slower: ask the "
                   "provider for another instance)")
    if _get(gpu, "remap_failed") is True:
        out.append("memory: a row remap failed, no spare row is left (ask the provider for another instance)")
    elif _get(gpu, "remap_pending") is True:
        out.append("memory: rows wait to be remapped (reset the GPU or reboot the host to apply)")
    retired = sum(n for n in (_get(gpu, "retired_pages_single"), _get(gpu, "retired_pages_double")) if _count(n))
    if retired >= P.RETIRED_PAGES_LIMIT:
        out.append(f"memory: {retired} pages retired after ECC errors, of the 64 the driver can retire (ask the "
                   "provider for another instance)")
    elif _get(gpu, "retired_pages_pending") is True:
        out.append("memory: a page retirement waits for a reboot (reboot the host to apply)")
    ecc, life = _get(gpu, "ecc_errors_uncorrected"), _get(gpu, "ecc_errors_uncorrected_aggregate")
    if _count(ecc):
        out.append(f"ECC: {ecc} uncorrected error{'s' if ecc != 1 else ''} since the driver loaded (reboot; again "
                   "after that: ask for another instance)")
    elif _count(life):
        out.append(f"ECC: {life} uncorrected error{'s' if life != 1 else ''} in the GPU's life, none since the driver "
                   "loaded (memory that failed before: if they come back, ask for another instance)")
    app, default = _number(_get(gpu, "app_clock_mhz")), _number(_get(gpu, "app_clock_default_mhz"))
    if app is not None and default is not None and 0 < app < default:
        out.append(f"clocks: application clock set to {app:.0f} of its default {default:.0f} MHz (`sudo nvidia-smi "
                   "-rac` resets it; on a rented host ask the provider)")
    return out


def _throttled(gpu: Any) -> str | None:
    """``throttled: thermal slowdown (hardware) at 91°C, 14% of the last 10 min``: clock-event reasons that slow
    the GPU now, and the share of the last minutes its driver slowed it for heat (when P.THERMAL_SHARE_PCT or
    more)."""
    reasons = _reasons(gpu, tuple(PROBLEM_REASONS))
    if len(reasons) > 1 and "hw_slowdown" in reasons:
        reasons.remove("hw_slowdown")
    share, window = _number(_get(gpu, "thermal_slowdown_percent")), _number(_get(gpu, "thermal_window_s"))
    recent = f"{share:.0f}% of the last {window / 60:.0f} min" if share is not None and window is not None and \
        share >= P.THERMAL_SHARE_PCT else None
    if not reasons and not recent:
        return None
    temp = _number(_get(gpu, "temp_c"))
    what = (", ".join(PROBLEM_REASONS[r] for r in reasons) or "thermal slowdown") + \
        (f" at {temp:.0f}°C" if temp is not None else "")
    return "throttled: " + what + (f", {recent}" if recent else "")


def _fault_lines(gpu: Any, now: float | None = None) -> list[str]:
    """``XID: 79 (GPU has fallen off the bus) 2m ago, 3 today: reboot the host; ...`` for a GPU with faults."""
    faults = [f for f in (_get(gpu, "faults") or ()) if _proc(f, "t") is not None]
    if not faults:
        return []
    last = faults[-1]
    kind, xid = _proc(last, "kind"), _proc(last, "xid")
    what = f"{xid} ({_proc(last, 'meaning')})" if kind == "xid" else str(kind)
    ago = duration(max(0.0, (time.time() if now is None else now) - float(_proc(last, "t"))))
    more = f", {len(faults)} in the last day" if len(faults) > 1 else ""
    return [f"XID: {what} {ago} ago{more}: {_proc(last, 'fix') or 'reset the GPU or reboot'}"]


def _other_processes(gpus: Iterable[Any], job: str | None) -> list[str]:
    """The biggest processes not of ``job`` holding memory on these GPUs, as short descriptions."""
    found: list[tuple[float, str]] = []
    for gpu in gpus:
        for p in _get(gpu, "processes") or ():
            owner, mem = _proc(p, "job"), _proc(p, "mem_mib")
            if (job is not None and owner == job) or not mem:
                continue
            tag = f" (job {owner})" if owner else ""
            desc = f"pid {_proc(p, 'pid')} {_proc(p, 'name') or '?'}{tag} {float(mem):.0f} MiB on {_gpu_label(gpu)}"
            found.append((float(mem), desc))
    found.sort(key=lambda item: -item[0])
    return [desc for _, desc in found[:MAX_LISTED_PROCESSES]]

"""Progress, training metrics and hints parsed from a job's raw log bytes.

Pure and headless: no I/O, no UI imports. One :class:`LogInsights` per job is fed the raw bytes of
the job's output as they arrive (any chunking; ``\\r`` counts as a line end so tqdm redraws are
seen one by one) and :meth:`LogInsights.snapshot` returns a frozen :class:`JobInsights`.

Every line is capped to :data:`MAX_LINE` bytes (its tail is kept) before any regex runs, each
regex sits behind a cheap substring check, and all state is bounded (metric names, loss
history, hints de-duplicated by code).

:func:`hints_from_metrics` turns GPU telemetry into hints (low utilisation, throttling, other
processes holding memory after an OOM) and :func:`hint_for_exit` explains an exit status.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

__all__ = [
    "MAX_LINE",
    "MAX_METRICS",
    "LOSS_HISTORY",
    "Hint",
    "JobInsights",
    "LogInsights",
    "hint_for_exit",
    "hints_from_metrics",
]

MAX_LINE = 4096  # bytes of one line kept (the tail) before parsing
MAX_METRICS = 32  # metric names tracked per job; later new names are ignored
LOSS_HISTORY = 200  # loss values kept for the sparkline
MAX_HINT_LINE = 300  # chars of the triggering log line kept in a Hint
MAX_BARS = 4  # progress bars (by total) remembered at once
BURST_S = 0.2  # progress changes closer together than this (a log replay) do not start the ETA clock

LOW_UTIL_PCT = 30.0
LOW_UTIL_MIN_SAMPLES = 10
HOT_TEMP_C = 85.0


@dataclass(frozen=True)
class Hint:
    """A diagnosis with a short, specific fix; ``code`` is a stable id (e.g. ``"cuda_oom"``)."""

    code: str
    title: str
    fix: str
    line: str = ""

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "title": self.title, "fix": self.fix, "line": self.line}


@dataclass(frozen=True)
class JobInsights:
    """What the log says so far. ``metrics``: name -> {"last", "best", "count"}."""

    progress: float | None = None
    eta_s: float | None = None
    rate: str | None = None
    epoch: int | None = None
    total_epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    metrics: Mapping[str, Mapping[str, float | int]] = field(default_factory=dict)
    loss_history: tuple[float, ...] = ()
    hints: tuple[Hint, ...] = ()
    last_line: str = ""

    def to_json(self) -> dict[str, Any]:
        """A plain dict that ``json.dumps`` accepts (non-finite floats become None)."""
        return {
            "progress": _finite(self.progress),
            "eta_s": _finite(self.eta_s),
            "rate": self.rate,
            "epoch": self.epoch,
            "total_epochs": self.total_epochs,
            "step": self.step,
            "total_steps": self.total_steps,
            "metrics": {
                k: {"last": _finite(m["last"]), "best": _finite(m["best"]), "count": m["count"]}
                for k, m in self.metrics.items()
            },
            "loss_history": [_finite(v) for v in self.loss_history],
            "hints": [h.to_json() for h in self.hints],
            "last_line": self.last_line,
        }


def _clamp(v: float) -> float:
    return min(max(v, 0.0), 1.0)


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def _cap(line: str) -> str:
    return line if len(line) <= MAX_HINT_LINE else line[: MAX_HINT_LINE - 1] + "…"


# --------------------------------------------------------------------------------------------
# Metric names: which way is "best"
# --------------------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_LOWER_BETTER = _words("loss err error mse mae rmse ppl perplexity wer cer nll time runtime seconds secs")
_HIGHER_BETTER = _words(
    "acc accuracy f1 auc auroc precision recall iou miou map bleu rouge rougel psnr ssim dice top score reward r2"
)
_NEUTRAL = _words("lr learning grad norm")
_NOT_METRICS = _words("epoch epochs step global_step iter iteration batch v_num total_flos num_epochs")
_CONFIG_TOKENS = _words("warmup steps epochs size num workers decay seed")
_TOKEN_SPLIT = re.compile(r"[_./\-]+")


@lru_cache(maxsize=2048)
def _metric_kind(name: str) -> str | None:
    """ "min", "max" or "last" (neutral) for a metric-like name, None for anything else."""
    if name in _NOT_METRICS or len(name) > 48:
        return None
    raw = _TOKEN_SPLIT.split(name)
    tokens = set(raw).union(t.rstrip("0123456789") for t in raw)  # "f1" and "top1" -> "top"
    if not _CONFIG_TOKENS.isdisjoint(tokens):  # lr_warmup_steps, batch_size: settings, not metrics
        return None
    if any(t in _LOWER_BETTER for t in tokens):
        return "min"
    if any(t in _HIGHER_BETTER for t in tokens):
        return "max"
    if any(t in _NEUTRAL for t in tokens):
        return "last"
    return None


_MAIN_LOSSES = frozenset(["loss", "train_loss", "training_loss", "total_loss", "train/loss"])
_EVAL_TOKENS = frozenset(["val", "valid", "validation", "eval", "test", "dev"])


def _is_train_loss(name: str) -> bool:
    """A loss that is not a validation/test loss (those stay out of the sparkline)."""
    return "loss" in name and _EVAL_TOKENS.isdisjoint(_TOKEN_SPLIT.split(name))


class _Metric:
    __slots__ = ("last", "best", "count", "kind")

    def __init__(self, kind: str, value: float) -> None:
        self.kind, self.last, self.best, self.count = kind, value, value, 1

    def add(self, value: float) -> None:
        self.last = value
        self.count += 1
        if math.isnan(value):
            return
        if math.isnan(self.best) or self.kind == "last":
            self.best = value
        elif self.kind == "min":
            self.best = min(self.best, value)
        else:
            self.best = max(self.best, value)


# --------------------------------------------------------------------------------------------
# Regexes (all precompiled; each behind a substring pre-check in LogInsights._parse)
# --------------------------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|inf|Inf)"
# key=value, key: value, key value (the key is filtered by _metric_kind afterwards)
_KV = re.compile(
    r"(?<![\w./\-])(?P<k>[A-Za-z][\w./\-]{0,47})\s*(?:[=:]\s*|\s+)(?P<v>" + _NUM + r")(?:%|ms\b|s\b)?"
    r"(?![\w.:/\-])"
)
# 'key': value / "key": value in JSON lines and Python dict reprs (HF Trainer)
_DICT_KV = re.compile(
    r"""(["'])(?P<k>[\w./\-@ ]{1,64})\1\s*:\s*(?:np\.float\d*\(|tensor\()?(?P<v>""" + _NUM + r")"
)
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[@-Z\\-_])")
# "Epoch 2/5", "epoch 3 of 10", "Epoch: [4]", optionally followed by an inner "(996/1926)"
_EPOCH = re.compile(
    r"(?i)\bepoch\b(?:\(train\))?[\s:#\[]*(\d+)(?:\s*(?:/|of)\s*(\d+))?\]?"
    r"(?:\s*[(\[]\s*(\d+)\s*/\s*(\d+)\s*[)\]])?"
)
_STEP = re.compile(r"(?i)\b(?:global[_ ]step|step|iter|iteration)\b[\s:=#\[]*(\d+)(?:\s*(?:/|of)\s*(\d+))?")
_TOTAL_EPOCHS = re.compile(
    r"(?i)\b(?:num[_ ]?(?:train[_ ])?epochs|n_?epochs|max_?epochs|total_?epochs|epochs)\s*[=:]\s*(\d+)\b"
)
_TOTAL_STEPS = re.compile(r"(?i)\b(?:total optimization steps|max_?steps|total_?steps)\s*[=:]\s*([\d,]+)")
_ETA = re.compile(
    r"(?i)\beta\b\s*[:=]?\s*(?:(\d+)\s*days?,\s*)?(\d+(?::\d\d){1,2}|\d+(?:\.\d+)?\s*(?:s|m|h|min)\b)"
)
# tqdm: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}, {postfix}]" (or "{n}it [...]").
# The bracket is searched first (a literal "[" prefix is fast), then the count just before it.
_TQDM = re.compile(
    r"\[(?P<el>\d+(?::\d\d)+)(?:<(?P<rem>\d+(?::\d\d)+|\?))?,\s*(?P<rate>[^,\[\]]*)(?:,\s*(?P<post>[^\[\]]*))?\]"
)
_TQDM_COUNT = re.compile(r"(?P<n>\d+(?:\.\d+)?[kMGTP]?)(?:/(?P<total>\d+(?:\.\d+)?[kMGTP]?))?[A-Za-z]*")
# ascii bars: "Epoch 2/5 [#####.....] 45%" or keras "120/469 [=====>....]"
_ASCII_BAR = re.compile(
    r"(?:(?P<n>\d+)/(?P<total>\d+)\s*)?\[[#=>.\-]{4,}[#=>.\- ]*\]\s*(?:(?P<pct>\d{1,3})%)?"
)
_SM = re.compile(r"\bsm_\d{2,3}\b")
_OOM_ALLOC = re.compile(r"Tried to allocate ([\d.]+ [KMGT]i?B)")

# tqdm bars that are not the training run (their description starts with one of these)
_SKIP_BAR_DESCS = tuple(
    sorted(_words("val eval test predict sanity map filter download load generating token extract resolving"))
) + ("fetching", "saving", "upload", "running tokenizer")
_IGNORED = "\x00ignored"  # _parse_tqdm's answer for bars that are not the training run
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _skipped_bar(head: str) -> bool:
    """Whether a bar's description ("Validation DataLoader 0: 12%|...") marks a non-training bar."""
    pct = head.find("%")
    desc = (head[:pct].rstrip("0123456789") if pct >= 0 else head).strip(" :|\t").lower()
    return bool(desc) and desc.startswith(_SKIP_BAR_DESCS)


def _hms(text: str) -> float:
    """ "01:02" / "1:02:03" -> seconds."""
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + int(part)
    return total


def _eta_seconds(m: re.Match[str]) -> float:
    days, val = m.group(1), m.group(2)
    secs = float(days or 0) * 86400
    if ":" in val:
        return secs + _hms(val)
    num = float(re.sub(r"[^\d.]", "", val))
    unit = val.rstrip()[-1]
    return secs + num * {"s": 1, "m": 60, "n": 60, "h": 3600}[unit]


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# Hints from log lines
# --------------------------------------------------------------------------------------------

_DL_SHM_FIX = (
    "A DataLoader worker died from SIGBUS: shared memory (/dev/shm) is too small for the batches "
    "workers hand over. Run the container with a bigger --shm-size (e.g. --shm-size=16g or --ipc=host), "
    "or lower num_workers / batch size."
)
_DL_RAM_FIX = (
    "A DataLoader worker died. If it was SIGKILL the host ran out of RAM: lower num_workers and "
    "prefetch_factor, avoid copying the dataset into every worker; for bus errors raise /dev/shm "
    "(docker --shm-size)."
)


def _oom_hint(line: str) -> Hint:
    m = _OOM_ALLOC.search(line)
    need = f" (it tried to allocate {m.group(1)} more)" if m else ""
    return Hint(
        "cuda_oom",
        "CUDA out of memory",
        f"The GPU ran out of memory{need}. Lower the batch size (keep the effective batch with "
        "gradient accumulation), use AMP/bf16 autocast or gradient checkpointing, and set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; "
        "check that no other process holds memory on that GPU.",
        _cap(line),
    )


def _kernel_image_hint(line: str) -> Hint:
    m = _SM.search(line)
    arch = f" ({m.group(0)})" if m else ""
    return Hint(
        "no_kernel_image",
        "Torch build lacks kernels for this GPU",
        f"The installed torch (or a CUDA extension) was not compiled for this GPU's architecture{arch}. "
        "Install a torch wheel whose torch.cuda.get_arch_list() includes it (RTX 50xx/B200 need a cu128+ "
        "build) and rebuild custom extensions with TORCH_CUDA_ARCH_LIST set to the GPU's capability.",
        _cap(line),
    )


def _dataloader_hint(line: str) -> Hint:
    low = line.lower()
    shm = "bus error" in low or "shared memory" in low
    return Hint(
        "dataloader_worker",
        "DataLoader worker killed" + (" (shared memory)" if shm else ""),
        _DL_SHM_FIX if shm else _DL_RAM_FIX,
        _cap(line),
    )


def _disk_hint(line: str) -> Hint:
    shm = "/dev/shm" in line or "shm" in line.lower()
    fix = (
        "/dev/shm is full: give the container more shared memory (--shm-size=16g or --ipc=host) "
        "or use fewer DataLoader workers."
        if shm
        else "The disk is full (checkpoints, the HF cache or /tmp are the usual suspects). Free space "
        "(df -h; du -sh ~/.cache/huggingface), keep fewer checkpoints (save_total_limit) or point the "
        "output dir, HF_HOME and TMPDIR at a larger volume."
    )
    return Hint("disk_full", "No space left on device", fix, _cap(line))


def _fixed(code: str, title: str, fix: str) -> Callable[[str], Hint]:
    def make(line: str) -> Hint:
        return Hint(code, title, fix, _cap(line))

    return make


@dataclass(frozen=True)
class _Rule:
    code: str
    keys: tuple[str, ...]  # the regex runs only when one of these substrings is in the line
    pattern: re.Pattern[str] | None
    make: Callable[[str], Hint]


_RULES: tuple[_Rule, ...] = (
    _Rule(
        "cuda_oom",
        ("CUDA", "OutOfMemory", "ALLOC_FAILED"),
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"
        ),
        _oom_hint,
    ),
    _Rule(
        "no_kernel_image",
        ("kernel image", "CUDA capability"),
        re.compile(r"(?i)no kernel image is available|not compatible with the current PyTorch installation"),
        _kernel_image_hint,
    ),
    _Rule(
        "cuda_driver_too_old",
        ("CUDA driver", "NVIDIA driver"),
        re.compile(r"driver version is insufficient|driver on your system is too old"),
        _fixed(
            "cuda_driver_too_old",
            "NVIDIA driver too old for this torch build",
            "The torch wheel's CUDA runtime is newer than the host driver supports (see 'CUDA Version' in "
            "nvidia-smi). Install a torch build for that CUDA version or older (e.g. the cu118/cu121 "
            "index on download.pytorch.org), or update the NVIDIA driver.",
        ),
    ),
    _Rule(
        "cuda_unavailable",
        ("NVIDIA driver", "CUDA initialization", "CUDA GPUs", "cudaGetDeviceCount"),
        re.compile(
            r"Found no NVIDIA driver|CUDA initialization|no CUDA GPUs are available|cudaGetDeviceCount"
        ),
        _fixed(
            "cuda_unavailable",
            "PyTorch cannot use the GPU",
            "torch.cuda.is_available() is False here. Check nvidia-smi works on the host, that the container "
            "was started with --gpus all (NVIDIA Container Toolkit) and that CUDA_VISIBLE_DEVICES is right; "
            "errors 803/804 mean a driver/CUDA mismatch, 802 on NVSwitch hosts a stopped nvidia-fabricmanager.",
        ),
    ),
    _Rule(
        "nccl_error",
        ("NCCL", "DistBackendError", "Watchdog"),
        re.compile(
            r"NCCL error|nccl[A-Z]\w*Error|DistBackendError|Watchdog caught collective operation timeout"
            r"|NCCL communicator was aborted"
        ),
        _fixed(
            "nccl_error",
            "NCCL (multi-GPU communication) failed",
            "Rerun with NCCL_DEBUG=INFO to see the failing transport. On multi-NIC hosts set "
            "NCCL_SOCKET_IFNAME to the right interface; if GPUs cannot peer (some cloud VMs) try "
            "NCCL_P2P_DISABLE=1, and NCCL_IB_DISABLE=1 without InfiniBand. Also check every rank is alive.",
        ),
    ),
    _Rule(
        "dataloader_worker",
        ("DataLoader worker", "Bus error", "bus error", "shared memory"),
        re.compile(r"DataLoader worker \(pid|[Bb]us error|insufficient shared memory|out of shared memory"),
        _dataloader_hint,
    ),
    _Rule(
        "disk_full",
        ("No space left", "Disk quota", "Errno 28", "StorageFull"),
        None,
        _disk_hint,
    ),
    _Rule(
        "host_oom",
        (
            "Killed",
            "SIGKILL",
            "Out of memory",
            "oom-kill",
            "exitcode",
            "exit code",
            "exit status",
            "return code",
        ),
        re.compile(
            r"(?:^|[\s\]\)|])Killed\s*$|exit(?:ed with)? (?:code|status)\s*:?\s*137\b|exitcode\s*:\s*-9\b"
            r"|return code\s*=\s*-9\b|[Ss]ignal 9\b|Signals\.SIGKILL|Out of memory: Kill|oom-kill"
        ),
        _fixed(
            "host_oom",
            "Killed (host out of memory)",
            "The process got SIGKILL, most likely from the Linux OOM killer: host RAM, not GPU memory, ran "
            "out (check dmesg | grep -i oom). Lower DataLoader num_workers/prefetch_factor, stream the "
            "dataset instead of loading it into RAM, or use a host with more memory.",
        ),
    ),
)


_RULE_KEYS: tuple[tuple[str, _Rule], ...] = tuple((key, rule) for rule in _RULES for key in rule.keys)
# One search over all keys first: most keys start with a capital, so this skips clean lines fast.
_HINT_GATE = re.compile("|".join(sorted({re.escape(key) for key, _ in _RULE_KEYS})))


def hint_for_exit(exit_code: int | None) -> Hint | None:
    """Explain a job's exit status (137/-9 SIGKILL, 139/-11 segfault, 134/-6 abort); else None."""
    if exit_code in (137, -9):
        return Hint(
            "exit_sigkill",
            "Killed (exit 137, SIGKILL)",
            "Something sent SIGKILL, usually the Linux OOM killer because host RAM ran out (check "
            "dmesg | grep -i oom). Lower DataLoader workers, batch or dataset caching, or use more RAM.",
            f"exit code {exit_code}",
        )
    if exit_code in (139, -11):
        return Hint(
            "exit_segfault",
            "Segmentation fault (exit 139)",
            "A native extension crashed. Common causes: mismatched torch / CUDA extension builds "
            "(reinstall them for the same torch), or a crash in a DataLoader worker (retry with "
            "num_workers=0); run with PYTHONFAULTHANDLER=1 to get the Python stack.",
            f"exit code {exit_code}",
        )
    if exit_code in (134, -6):
        return Hint(
            "exit_abort",
            "Aborted (exit 134, SIGABRT)",
            "A C++ assertion or uncaught exception aborted the process (often a CUDA/NCCL error or a "
            "corrupted install). Read the lines just before the abort; rerun with CUDA_LAUNCH_BLOCKING=1.",
            f"exit code {exit_code}",
        )
    return None


# --------------------------------------------------------------------------------------------
# Hints from GPU telemetry
# --------------------------------------------------------------------------------------------

_THERMAL_REASONS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
_POWER_REASONS = ("sw_power_cap",)
MAX_LISTED_PROCESSES = 5


def _reasons(gpu: Any, known: tuple[str, ...]) -> list[str]:
    """The known throttle reasons a GPU reports (NVML-style longer names match too)."""
    got = [str(r).lower() for r in (_get(gpu, "throttle_reasons") or ())]
    return [k for k in known if any(k in r for r in got)]


def _get(gpu: Any, key: str) -> Any:
    """Field of a GPU sample given as a wire dict or an object (with an ``extra`` dict)."""
    if isinstance(gpu, Mapping):
        return gpu.get(key)
    value = getattr(gpu, key, None)
    if value is None:
        extra = getattr(gpu, "extra", None)
        if isinstance(extra, Mapping):
            value = extra.get(key)
    return value


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
            hints.append(
                Hint(
                    "low_gpu_util",
                    "GPU mostly idle: input pipeline bound?",
                    "Median GPU utilisation is low while the job runs, so the GPU waits for data. Raise "
                    "DataLoader num_workers (about the CPU core count), set pin_memory=True and "
                    "persistent_workers=True, and check whether the CPU is at 100%.",
                    f"median GPU util {med:.0f}% over {len(util)} samples",
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
                    _cap(", ".join(other)),
                )
            )
    return hints


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
                _cap("; ".join(thermal)),
            )
        )
    if power:
        hints.append(
            Hint(
                "gpu_power_cap",
                "GPU clocks capped by power limit",
                "The GPU runs at its power limit. Normal at full load, but compare power_limit_w with the "
                "card's default (nvidia-smi -q -d POWER): a lowered limit on a rented host costs speed.",
                _cap("; ".join(power)),
            )
        )
    return hints


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


# --------------------------------------------------------------------------------------------
# The log parser
# --------------------------------------------------------------------------------------------


def _count(text: str) -> float:
    """tqdm counts, possibly unit-scaled: "450" -> 450.0, "1.2k" -> 1200.0."""
    scale = _SCALE.get(text[-1])
    return float(text[:-1]) * scale if scale else float(text)


class _Bar:
    """The latest state of one progress bar. Kept as text; numbers are parsed only when read,
    which is once per feed for the main bar instead of once per redraw."""

    __slots__ = ("_n", "_total", "_el", "_rem", "_rate")

    def __init__(
        self,
        n: str,
        total: str | None,
        el: str | None = None,
        rem: str | None = None,
        rate: str | None = None,
    ) -> None:
        self._n, self._total, self._el, self._rem, self._rate = n, total, el, rem, rate

    @property
    def n(self) -> float:
        return _count(self._n)

    @property
    def total(self) -> float | None:
        return (_count(self._total) or None) if self._total else None

    @property
    def remaining(self) -> float | None:
        return _hms(self._rem) if self._rem and self._rem != "?" else None

    @property
    def elapsed(self) -> float | None:
        return _hms(self._el) if self._el else None

    @property
    def rate(self) -> str | None:
        rate = (self._rate or "").strip()
        return rate if rate and not rate.startswith("?") else None


# LogInsights fields that reading a progress bar may change (saved around the peek in snapshot()).
_BAR_STATE = (
    "_bars",
    "_bar_post",
    "_epoch",
    "_epoch_float",
    "_epoch_from_text",
    "_epoch_done",
    "_zero_based",
    "_total_epochs",
)


class LogInsights:
    """Incremental parser of one job's log: ``feed()`` raw bytes, read ``snapshot()``; call
    ``flush()`` when the output has ended so an unterminated last line is read too.

    ``clock`` (seconds, monotonic) is read at most once per ``feed`` call and only serves the ETA
    fallback from the elapsed progress rate; inject a fake one for deterministic tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._partial = bytearray()
        self._metrics: dict[str, _Metric] = {}
        self._loss_name: str | None = None
        self._loss_history: deque[float] = deque(maxlen=LOSS_HISTORY)
        self._hints: dict[str, Hint] = {}
        self._last_line = ""
        self._bars: dict[str | None, _Bar] = {}  # by total; a few at most (nested/eval bars)
        self._bar_post: str | None = None
        self._glued = ""  # text after a tqdm bar on the same line
        self._epoch: int | None = None
        self._epoch_from_text = False
        self._epoch_float: float | None = None  # HF-style fractional epochs done (0.3 of epoch 1)
        self._epoch_done = False
        self._zero_based = False
        self._total_epochs: int | None = None
        self._step: int | None = None  # explicit ("step 5/100", {'step': 5}); else the bar's count
        self._total_steps: int | None = None
        self._log_eta: float | None = None
        self._first_point: tuple[float, float] | None = None
        self._last_point: tuple[float, float] | None = None
        self._snap: JobInsights | None = None

    # ---- input ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Consume raw log bytes; lines may be split anywhere, ``\\r`` and ``\\n`` end a line."""
        if not data:
            return
        if b"\r" in data:
            data = data.replace(b"\r", b"\n")
        parts = data.split(b"\n")
        self._snap = None
        if len(parts) == 1:
            self._extend_partial(data)
            return
        self._extend_partial(parts[0])
        self._line(bytes(self._partial[-MAX_LINE:]))
        self._partial.clear()
        for raw in parts[1:-1]:
            if raw:
                self._line(raw[-MAX_LINE:] if len(raw) > MAX_LINE else raw)
        self._extend_partial(parts[-1])
        self._track_rate()

    def flush(self) -> None:
        """Treat the unfinished last line as complete (call once the job's output has ended)."""
        if self._partial:
            self._line(bytes(self._partial[-MAX_LINE:]))
            self._partial.clear()
            self._snap = None
            self._track_rate()

    def _extend_partial(self, chunk: bytes) -> None:
        """Append to the unfinished line, keeping only a bounded tail."""
        if len(chunk) > MAX_LINE:
            self._partial.clear()
            chunk = chunk[-MAX_LINE:]
        self._partial += chunk
        if len(self._partial) > 2 * MAX_LINE:
            del self._partial[:-MAX_LINE]

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        text = text.strip()
        if not text:
            return
        self._last_line = text
        self._scan_hints(text)
        self._parse(text)

    def _scan_hints(self, text: str) -> None:
        if _HINT_GATE.search(text) is None:
            return
        for key, rule in _RULE_KEYS:
            if (
                key in text
                and rule.code not in self._hints
                and (rule.pattern is None or rule.pattern.search(text))
            ):
                self._hints[rule.code] = rule.make(text)

    # ---- parsing --------------------------------------------------------------------------

    def _parse(self, text: str) -> None:
        epoch = self._parse_epoch(text) if "poch" in text or "POCH" in text else None  # may reset bars
        post = self._parse_bar(text) if "[" in text else None
        if post is None:
            self._parse_plain(text, summary=epoch is False)
            return
        if self._glued:  # a print() right after a bar without a newline: " 45%|...| [..]Epoch 1 loss=.."
            glued = self._glued
            epoch = self._parse_epoch(glued) if "poch" in glued or "POCH" in glued else None
            self._parse_plain(glued, summary=epoch is False)
        if post is not _IGNORED and post and post != self._bar_post:
            self._bar_post = post  # a redraw's postfix only counts when it changed
            if "=" in post and ": " not in post:
                self._parse_postfix(post)
            else:  # keras: "- ETA: 3s - loss: 0.25 - accuracy: 0.91"
                self._parse_kv(post)
                self._parse_eta(post)

    def _parse_bar(self, text: str) -> str | None:
        """A tqdm or ascii bar line -> its postfix text; None when the line is no bar."""
        self._glued = ""
        post = self._parse_tqdm(text)
        if post is None and ("##" in text or "==" in text or ".." in text or "#." in text):
            post = self._parse_ascii_bar(text)
        return post

    def _parse_plain(self, text: str, summary: bool) -> None:
        """Non-bar lines: step counts, eta, dict/JSON lines and key=value metrics.

        ``summary``: the line named an epoch without an inner count; with metrics it reports a
        finished epoch ("Epoch 2/5 train_loss=...").
        """
        low = text.lower()
        if ("step" in low or "iter" in low) and self._parse_step(text, low):
            summary = False
        self._parse_eta(text)
        found = False
        if "': " in text or '": ' in text:
            found = self._parse_dict(text)
        if not found:
            found = self._parse_kv(text)
        if found and summary:
            self._epoch_done = True
            self._bars.clear()

    def _parse_tqdm(self, text: str) -> str | None:
        """tqdm line -> its postfix ("" when none); None when not tqdm; _IGNORED when skipped."""
        m = _TQDM.search(text)
        if m is None:
            return None
        head = text[: m.start()].rstrip()
        cm = _TQDM_COUNT.fullmatch(head, max(head.rfind(" "), head.rfind("|")) + 1)
        if cm is None:
            return None
        el, rem, rate, post = m.groups()
        if "B/s" in rate or _skipped_bar(head[: cm.start()]):
            return _IGNORED
        n, total = cm.groups()
        self._set_bar(_Bar(n, total, el, rem, rate))
        if m.end() < len(text):
            self._glued = text[m.end() :].strip()
        return post.strip() if post else ""

    def _parse_ascii_bar(self, text: str) -> str | None:
        m = _ASCII_BAR.search(text)
        if m is None or (m.group("pct") is None and m.group("total") is None):
            return None
        if m.group("pct") is not None:  # "Epoch 2/5 [###...] 30%": the 2/5 is not this bar's count
            self._set_bar(_Bar(m.group("pct"), "100"))
        else:
            self._set_bar(_Bar(m.group("n"), m.group("total")))
        return text[m.end() :].strip()

    def _set_bar(self, bar: _Bar) -> None:
        bars = self._bars
        bars.pop(bar._total, None)  # re-insert: the dict order is the recency order
        bars[bar._total] = bar
        if len(bars) > MAX_BARS:
            del bars[next(iter(bars))]

    def _main_bar(self) -> _Bar | None:
        """The bar that tracks the run: the largest unfinished known-total bar, else the newest.

        So an evaluation bar drawn in the middle of a longer training bar does not take over.
        """
        best: _Bar | None = None
        best_total = 0.0
        for bar in self._bars.values():
            total = bar.total
            if total and bar.n < total and total > best_total:
                best, best_total = bar, total
        if best is None and self._bars:
            best = next(reversed(self._bars.values()))
        return best

    def _parse_epoch(self, text: str) -> bool | None:
        """Epoch counters and totals. None: no epoch number; True: it came with an inner "(i/N)"."""
        if "pochs" in text or "POCHS" in text:  # "Num Epochs = 3", "epochs=5"
            m2 = _TOTAL_EPOCHS.search(text)
            if m2:
                self._total_epochs = int(m2.group(1)) or None
        m = _EPOCH.search(text)
        if m is None:
            return None
        self._set_epoch(int(m.group(1)), from_text=True)
        if m.group(2):
            self._total_epochs = int(m.group(2)) or None
        if m.group(4):
            self._set_bar(_Bar(m.group(3), m.group(4)))
            return True
        return False

    def _set_epoch(self, epoch: int, from_text: bool, fraction: float | None = None) -> None:
        self._epoch_float = fraction
        if epoch == 0:
            self._zero_based = True
        if epoch != self._epoch and from_text:  # per-epoch bars restart; HF's global bar does not
            self._bars.clear()
            self._bar_post = None
            self._epoch_done = False
        self._epoch = epoch
        self._epoch_from_text = self._epoch_from_text or from_text

    def _parse_eta(self, text: str) -> None:
        """detectron2 / mmcv / keras style "eta: 0:05:12", "eta: 1 day, 16:44:26", "ETA: 3s"."""
        if "eta" in text or "ETA" in text:
            m = _ETA.search(text)
            if m:
                self._log_eta = _eta_seconds(m)

    def _parse_step(self, text: str, low: str) -> bool:
        """Step totals, and "step 50/100" / "Step [50/100]" counts (True: a count was read)."""
        if "total optimization steps" in low or "max_steps" in low or "total_steps" in low:
            m = _TOTAL_STEPS.search(text)
            if m:
                self._total_steps = int(m.group(1).replace(",", "")) or None
            return False
        m = _STEP.search(text)
        if m and m.group(2):  # only "step i/N" shapes (a bar of its own); a bare "step 5" is ambiguous
            self._set_bar(_Bar(m.group(1), m.group(2)))
            return True
        return False

    def _parse_dict(self, text: str) -> bool:
        """JSON lines / Python dict reprs: epoch, step and metric keys."""
        found = False
        for m in _DICT_KV.finditer(text):
            key, value = m.group("k").strip().lower().replace(" ", "_"), _float(m.group("v"))
            if value is None:
                continue
            if key == "epoch":
                self._dict_epoch(value)
            elif key in ("step", "global_step"):
                self._step = int(value)
            elif key in ("num_train_epochs", "num_epochs", "epochs", "total_epochs", "max_epochs"):
                self._total_epochs = int(value) or None
            elif key in ("max_steps", "total_steps", "num_training_steps"):
                self._total_steps = int(value) or None
            elif self._add_metric(key, value):
                found = True
        return found

    def _dict_epoch(self, value: float) -> None:
        """HF logs fractional epochs (0.3 = 30% into epoch 1); count them 1-based."""
        if value.is_integer():
            self._set_epoch(int(value), from_text=False, fraction=value)
            self._epoch_done = value > 0
        else:
            self._set_epoch(math.floor(value) + 1, from_text=False, fraction=value)

    def _parse_postfix(self, post: str) -> None:
        """tqdm's set_postfix() text: "loss=0.123, acc=0.9" (faster than the generic regex)."""
        for part in post.split(","):
            key, sep, value = part.partition("=")
            if sep:
                num = _float(value.strip().rstrip("%s"))
                if num is not None:
                    self._add_metric(key.strip().lower(), num)

    def _parse_kv(self, text: str) -> bool:
        """key=value / key: value / "Loss 0.12" pairs whose key looks like a metric."""
        found = False
        for m in _KV.finditer(text):
            value = _float(m.group("v"))
            if value is not None and self._add_metric(m.group("k").lower(), value):
                found = True
        return found

    def _add_metric(self, name: str, value: float) -> bool:
        kind = _metric_kind(name)
        if kind is None:
            return False
        metric = self._metrics.get(name)
        if metric is not None:
            metric.add(value)
        elif len(self._metrics) < MAX_METRICS:
            self._metrics[name] = _Metric(kind, value)
        else:
            return False
        if name != self._loss_name and _is_train_loss(name) and self._loss_name not in _MAIN_LOSSES:
            if self._loss_name is not None and name in _MAIN_LOSSES:  # "loss" beats "loss_rpn_cls"
                self._loss_history.clear()
            if self._loss_name is None or name in _MAIN_LOSSES:
                self._loss_name = name
        if name == self._loss_name:
            self._loss_history.append(value)
            if not math.isfinite(value) and "loss_nan" not in self._hints:
                self._hints["loss_nan"] = Hint(
                    "loss_nan",
                    "Loss is NaN/inf",
                    "Training diverged. Lower the learning rate or add warmup, clip gradients "
                    "(clip_grad_norm_ 1.0), prefer bf16 over fp16 autocast, and check inputs for NaNs.",
                    _cap(self._last_line),
                )
        return True

    # ---- output ---------------------------------------------------------------------------

    def _progress(self) -> tuple[float | None, float | None]:
        """(overall progress 0..1, ETA seconds): from the bar, the step count or the epoch count."""
        bar, n_ep, ep = self._main_bar(), self._total_epochs, self._epoch
        if bar is not None and bar.total:
            return self._bar_progress(bar)
        if self._total_steps and self._step is not None:
            return _clamp(self._step / self._total_steps), None
        if n_ep and self._epoch_float is not None:
            return _clamp(self._epoch_float / n_ep), None
        if n_ep and ep is not None:
            done = ep + 1 if self._zero_based else ep
            if not self._epoch_done:
                done -= 1
            return _clamp(done / n_ep), None
        return None, None

    def _bar_progress(self, bar: _Bar) -> tuple[float, float | None]:
        """A bar inside a known epoch ("Epoch 2/5" + batches) counts as (epoch-1 + fraction)/N."""
        frac = _clamp(bar.n / (bar.total or 1.0))
        n_ep, ep = self._total_epochs, self._epoch
        if (
            not n_ep
            or ep is None
            or not self._epoch_from_text
            or bar.total in (n_ep, self._total_steps)  # an epochs bar or the global step bar
        ):
            return frac, bar.remaining
        idx = min(max(ep if self._zero_based else ep - 1, 0), n_ep - 1)
        eta = None
        if bar.remaining is not None and bar.elapsed is not None:
            eta = bar.remaining + (n_ep - idx - 1) * (bar.elapsed + bar.remaining)
        return (idx + frac) / n_ep, eta

    def _track_rate(self) -> None:
        """Remember when progress changed, for the ETA from elapsed rate.

        The anchor (first point) follows progress while it moves in a burst (a replayed log arrives
        all at once), so only progress made in real time counts towards the rate.
        """
        progress, _ = self._progress()
        last = self._last_point
        if progress is None or (last is not None and progress == last[1]):
            return
        now = self._clock()
        first = self._first_point
        if first is None or progress < first[1] or (first == last and now - first[0] < BURST_S):
            self._first_point = (now, progress)
        self._last_point = (now, progress)

    def _fallback_eta(self, progress: float | None) -> float | None:
        """ETA without a tqdm estimate: the log's own "eta:", the progress rate, or epoch times."""
        if self._log_eta is not None:
            return self._log_eta
        if progress is None:
            return None
        if progress >= 1.0:
            return 0.0
        if self._first_point and self._last_point:
            (t0, p0), (t1, p1) = self._first_point, self._last_point
            if t1 > t0 and p1 > p0:
                return (t1 - t0) / (p1 - p0) * (1.0 - progress)
        epoch_time = self._metrics.get("time") or self._metrics.get("epoch_time")
        if epoch_time and self._total_epochs and self._epoch is not None and self._epoch_done:
            left = self._total_epochs - (self._epoch + 1 if self._zero_based else self._epoch)
            return max(left, 0) * epoch_time.last
        return None

    def snapshot(self) -> JobInsights:
        """The current state as an immutable :class:`JobInsights` (cached until the next feed).

        tqdm writes ``\\r<bar>``, so its newest state is the unfinished line: a complete-looking bar
        there counts for progress (nothing else of that line does until it ends).
        """
        if self._snap is not None:
            return self._snap
        tail = self._partial_bar_text()
        if not tail:
            self._snap = self._build()
            return self._snap
        saved = {name: getattr(self, name) for name in _BAR_STATE}
        self._bars = dict(self._bars)
        try:
            if "poch" in tail or "POCH" in tail:
                self._parse_epoch(tail)
            self._parse_bar(tail)
            self._snap = self._build()
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
        return self._snap

    def _partial_bar_text(self) -> str:
        """The unfinished line when it ends like a drawn bar ("...]" or "...%..."), else ""."""
        raw = bytes(self._partial[-MAX_LINE:]).rstrip()
        if not raw or b"[" not in raw or not (raw.endswith(b"]") or b"%" in raw):
            return ""
        text = raw.decode("utf-8", "replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        return text.strip()

    def _build(self) -> JobInsights:
        progress, eta = self._progress()
        if eta is None:
            eta = self._fallback_eta(progress)
        bar = self._main_bar()
        step, total_steps = self._step, self._total_steps
        if step is None and bar is not None:
            step = int(bar.n)
        if total_steps is None and bar is not None and bar.total:
            total_steps = int(bar.total)
        self._snap = JobInsights(
            progress=progress,
            eta_s=eta,
            rate=bar.rate if bar else None,
            epoch=self._epoch,
            total_epochs=self._total_epochs,
            step=step,
            total_steps=total_steps,
            metrics={k: {"last": m.last, "best": m.best, "count": m.count} for k, m in self._metrics.items()},
            loss_history=tuple(self._loss_history),
            hints=tuple(self._hints.values()),
            last_line=self._last_line,
        )
        return self._snap

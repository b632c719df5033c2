"""Hints from log lines (CUDA OOM, driver, NCCL, DataLoader, disk, host OOM) and from exit statuses."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from .snapshot import Hint, cap_line

_SM = re.compile(r"\bsm_\d{2,3}\b")
_OOM_ALLOC = re.compile(r"Tried to allocate ([\d.]+ [KMGT]i?B)")


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
        cap_line(line),
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
        cap_line(line),
    )


def _dataloader_hint(line: str) -> Hint:
    low = line.lower()
    shm = "bus error" in low or "shared memory" in low
    return Hint(
        "dataloader_worker",
        "DataLoader worker killed" + (" (shared memory)" if shm else ""),
        _DL_SHM_FIX if shm else _DL_RAM_FIX,
        cap_line(line),
    )


def _disk_hint(line: str) -> Hint:
    # torch shares DataLoader batches through /dev/shm files named "/torch_<pid>_..."
    if "/dev/shm" in line or "shm" in line.lower() or "</torch_" in line:
        return Hint(
            "shm_full",
            "Shared memory (/dev/shm) is full",
            "DataLoader workers hand batches over in /dev/shm, and it is full: give the container more "
            "shared memory (docker --shm-size=16g or --ipc=host), or lower num_workers / batch size. "
            "The disk itself may have room (df -h /dev/shm shows the limit).",
            cap_line(line),
        )
    return Hint(
        "disk_full",
        "No space left on device",
        "The disk is full (checkpoints, the HF cache or /tmp are the usual suspects). Free space "
        "(df -h; du -sh ~/.cache/huggingface), keep fewer checkpoints (save_total_limit) or point the "
        "output dir, HF_HOME and TMPDIR at a larger volume.",
        cap_line(line),
    )


def _fixed(code: str, title: str, fix: str) -> Callable[[str], Hint]:
    def make(line: str) -> Hint:
        return Hint(code, title, fix, cap_line(line))

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
        "nccl_network",
        ("NCCL WARN",),
        re.compile(r"NCCL WARN .*(?:ibv_\w+ failed|NET/IB|NET/Socket|[Cc]onnect|failed)"),
        _fixed(
            "nccl_network",
            "NCCL cannot set up its network (InfiniBand/RoCE or sockets)",
            "NCCL failed to open its transport between GPUs/hosts. In a container pass the IB devices and "
            "lift the locked-memory limit (--ulimit memlock=-1, --cap-add IPC_LOCK); without working "
            "InfiniBand set NCCL_IB_DISABLE=1 (TCP), pick the interface with NCCL_SOCKET_IFNAME, and rerun "
            "with NCCL_DEBUG=INFO to see the failing step.",
        ),
    ),
    _Rule(
        "cuda_device_assert",
        ("device-side assert",),
        re.compile(r"device-side assert triggered"),
        _fixed(
            "cuda_device_assert",
            "CUDA device-side assert (index out of range?)",
            "A CUDA kernel assertion failed, usually a label or index out of range: class ids must be "
            "0..num_classes-1 (check the model's output size against the dataset's classes, embedding "
            "sizes against the vocabulary). Rerun with CUDA_LAUNCH_BLOCKING=1, or on the CPU, to see "
            "the failing operation.",
        ),
    ),
    _Rule(
        "device_mismatch",
        ("same device",),
        re.compile(r"Expected all tensors to be on the same device"),
        _fixed(
            "device_mismatch",
            "Tensors on different devices",
            "A tensor or part of the model is on another device (e.g. cpu vs cuda:0). Call model.to(device) "
            "before building the optimizer, move every input, label and mask to the same device, create "
            "new tensors with device=x.device, and create modules in __init__, not in forward().",
        ),
    ),
    _Rule(
        "checkpoint_write",
        ("PytorchStreamWriter", "file write failed"),
        re.compile(r"PytorchStreamWriter failed writing|file write failed"),
        _fixed(
            "checkpoint_write",
            "Writing a checkpoint failed",
            "torch.save could not write the checkpoint: usually the disk or a quota is full, or a network "
            "filesystem dropped the write. Check df -h on the output dir, keep fewer checkpoints "
            "(save_total_limit), save to a local volume with room, and retry on NFS/Lustre errors.",
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
HINT_KEYS: tuple[str, ...] = tuple(sorted({key for key, _ in _RULE_KEYS}))  # no hint without one of these
# One search over all keys first: most keys start with a capital, so this skips clean lines fast.
_HINT_GATE = re.compile("|".join(map(re.escape, HINT_KEYS)))
_HINT_GATE_BYTES = re.compile(_HINT_GATE.pattern.encode())


def first_hint_key(data: bytes) -> int:
    """Where in raw log bytes the first text that may start a hint is; -1 when none (a pre-filter)."""
    m = _HINT_GATE_BYTES.search(data)
    return -1 if m is None else m.start()


_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")
_SHAPED_MAX = 512  # characters of a line beyond which its rules are not looked up by its shape


@lru_cache(maxsize=512)
def _rules_of(shape: str) -> tuple[tuple[str, _Rule], ...]:
    """The (key, rule) pairs, in order, whose key may be in a line of this shape (digits read 0)."""
    return tuple((key, rule) for key, rule in _RULE_KEYS if key.translate(_KEY_SHAPE) in shape)


_KEY_SHAPE = str.maketrans("123456789", "000000000")


def add_line_hints(text: str, found: dict[str, Hint]) -> None:
    """Add the hints that one log line triggers to ``found`` (by code; the first line of a code is kept)."""
    if len(text) <= _SHAPED_MAX:  # only the rules whose key the line's shape holds
        shape = text.encode("utf-8", "surrogatepass").translate(_DIGITS_AS_0).decode("utf-8", "surrogatepass")
        rules = _rules_of(shape)
    elif _HINT_GATE.search(text) is None:
        return
    else:
        rules = _RULE_KEYS
    for key, rule in rules:
        if key in text and rule.code not in found and (rule.pattern is None or rule.pattern.search(text)):
            found[rule.code] = rule.make(text)


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

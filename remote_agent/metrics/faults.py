"""GPU faults as the driver reports them: XID events (and NVML's other critical events), caught live.

Runs on the GPU host: stdlib only, Python >= 3.8, pynvml where present. An NVML event set, registered on every
GPU that supports the critical event types, is held by one long-lived process at a time (a lock file: the
watchdog, which runs without a client, or the agent while a client is connected); each event becomes a line of
``gpu_faults.jsonl`` in the state dir (time, GPU index and UUID, XID, what it means, what to do), kept to the
last ``MAX_KEPT``. Everything else reads that file: the sampler (a GPU's recent faults on its card and in
``status --json``), the watchdog's ``gpu_fault`` notification, the runner (the XIDs seen during a run).

An event set only hears what happens after it is made: an XID from before (``dmesg``) is not read here.
"""

import fcntl
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from ..fsutil import open_regular, write_atomic
from .nvml import load_nvml

FAULTS = "gpu_faults.jsonl"
LOCK = "gpu_faults.lock"
MAX_KEPT = 500  # faults kept in the file (the newest)
MAX_LINE = 2048
MAX_PER_POLL = 100  # events read in one poll (a storm is read over several)
RECENT_S = 24 * 3600.0  # a GPU's faults shown on its card: of the last day
RETRY_S = 30.0  # a watcher that could not open (no NVML, the lock held elsewhere) tries again this much later

# NVML's event type bits (nvml.h; pynvml's nvmlEventType*): the critical ones gputui listens for.
EV_XID = 0x8
EV_DBE_RETIREMENT = 0x400  # nvmlEventTypeDramRetirementEvent
EV_DBE_RETIREMENT_FAILURE = 0x800
EV_FATAL_POISON = 0x2000
EV_GPU_UNAVAILABLE = 0x4000
KINDS = {
    EV_XID: "xid",
    EV_DBE_RETIREMENT: "memory page retired",
    EV_DBE_RETIREMENT_FAILURE: "memory page retirement failed",
    EV_FATAL_POISON: "fatal poison error",
    EV_GPU_UNAVAILABLE: "GPU unavailable",
}
_ERR_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event within the wait

APP = "the job's own error (a bad memory access): restart it; if it comes back with other jobs, the GPU"
RESET = "reset the GPU or reboot the host (`sudo nvidia-smi -r -i N`, or ask the provider); if it comes back, ask for another instance"
REPLACE = "hardware: ask the provider for another instance (and to take this GPU out)"
#: What the common XIDs mean and what a renter does (NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors).
XIDS: Dict[int, Tuple[str, str]] = {
    13: ("graphics engine exception", APP),
    31: ("GPU memory page fault", APP),
    43: ("GPU stopped processing (a channel was reset)", APP),
    45: ("preemptive cleanup after an earlier error", "follows another XID: see that one"),
    48: ("uncorrectable (double bit) ECC error", RESET),
    61: ("internal micro-controller breakpoint", RESET),
    62: ("internal micro-controller halt", RESET),
    63: ("ECC page retirement or row remap recorded", "reset the GPU or reboot to apply the remap"),
    64: ("ECC page retirement or row remap failed", REPLACE),
    74: ("NVLink error", RESET),
    79: ("GPU has fallen off the bus", "reboot the host; if it comes back, " + REPLACE),
    92: ("high single-bit ECC error rate", "watch it; if it goes on, " + REPLACE),
    94: ("contained ECC error (the job was stopped, the GPU is fine)", "restart the job"),
    95: ("uncontained ECC error", RESET),
    119: ("GSP firmware timed out", RESET),
    120: ("GSP firmware error", RESET),
    154: ("the driver asks for a recovery action", RESET),
}


def describe(kind: str, xid: Optional[int]) -> Tuple[str, str]:
    """(what it means, what to do) for a fault."""
    if kind == "xid" and xid is not None:
        return XIDS.get(xid, ("XID %d (see NVIDIA's Xid catalog)" % xid, RESET))
    if kind == "memory page retirement failed":
        return kind, REPLACE
    return kind, RESET


def label(fault: Dict[str, Any]) -> str:
    """``XID 79 (GPU has fallen off the bus)`` / ``memory page retired``."""
    if fault.get("kind") == "xid":
        return "XID %s (%s)" % (fault.get("xid"), fault.get("meaning"))
    return str(fault.get("kind"))


def read(state_dir: str, since: float = 0.0) -> List[Dict[str, Any]]:
    """The faults on record from ``since`` on, oldest first; every line checked (a bad one is skipped)."""
    out = []
    try:
        with open(os.path.join(state_dir, FAULTS), "rb") as f:
            data = f.read((MAX_KEPT * 2 + 1) * MAX_LINE)
    except OSError:
        return []
    for line in data.splitlines():
        try:
            fault = json.loads(line.decode("utf-8"))
        except ValueError:
            continue
        if not isinstance(fault, dict) or not isinstance(fault.get("kind"), str):
            continue
        t, gpu = fault.get("t"), fault.get("gpu")
        if _number(t) and t >= since and isinstance(gpu, int) and not isinstance(gpu, bool):
            out.append(fault)
    return out


def record(state_dir: str, faults: List[Dict[str, Any]]) -> None:
    """Append ``faults``; past ``2 * MAX_KEPT`` lines the file is rewritten with the newest ``MAX_KEPT``."""
    if not faults:
        return
    path = os.path.join(state_dir, FAULTS)
    data = b"".join(json.dumps(f, sort_keys=True).encode()[:MAX_LINE - 1] + b"\n" for f in faults)
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > 2 * MAX_KEPT * 32:  # (no fault's line is shorter): count them
        kept = read(state_dir)
        if len(kept) > 2 * MAX_KEPT:
            data = b"".join(json.dumps(f, sort_keys=True).encode() + b"\n" for f in kept[-MAX_KEPT:])
            write_atomic(path, data, 0o600)


def by_gpu(state_dir: str, now: float) -> Dict[int, List[Dict[str, Any]]]:
    """Each GPU's faults of the last ``RECENT_S``, newest last (at most 5 each)."""
    out: Dict[int, List[Dict[str, Any]]] = {}
    for fault in read(state_dir, now - RECENT_S):
        out.setdefault(fault["gpu"], []).append(fault)
    return {gpu: faults[-5:] for gpu, faults in out.items()}


class FaultWatcher:
    """The event set of this host's GPUs, held by one process at a time (``LOCK``); ``poll`` records what
    arrived. Never raises: without NVML, or while another process holds the lock, ``poll`` finds nothing."""

    def __init__(self, state_dir: str, nvml: Any = None, source: Any = None) -> None:
        """``source``: an open ``NvmlSource`` whose NVML context and GPU handles to use (a sampler's: no second
        context); without one, the watcher opens its own."""
        self.state_dir = state_dir
        self._nvml_arg = nvml
        self._source = source
        self.nvml: Any = None
        self._set: Any = None
        self._lock: Any = None
        self.uuids: Dict[int, Optional[str]] = {}
        self.why = ""  # why it does not watch (no NVML, another process does, ...)
        self._retry_at = 0.0  # after a failed open, not tried again before this (monotonic)
        self._seen: Tuple[float, Dict[int, List[Dict[str, Any]]]] = (-1.0, {})  # (file mtime, by_gpu)

    def _open(self) -> bool:
        """Take the lock and make the event set; False (with ``why``) when this process cannot watch now."""
        if self._set is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        self._retry_at = time.monotonic() + RETRY_S
        try:
            lock = os.fdopen(open_regular(os.path.join(self.state_dir, LOCK), os.O_WRONLY | os.O_CREAT, 0o600), "w")
        except OSError as exc:
            self.why = "cannot open %s: %s" % (LOCK, exc)
            return False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            self.why = "another gputui process watches the GPUs' faults"
            return False
        nvml = None
        try:
            nvml = self._source.nvml if self._source is not None else load_nvml(self._nvml_arg)
            if self._source is None:
                nvml.nvmlInit()
            handles = self._handles(nvml)
            events = nvml.nvmlEventSetCreate()
        except Exception as exc:
            if nvml is not None and self._source is None:
                _quietly(nvml, "nvmlShutdown")
            lock.close()
            self.why = "no NVML event set: %s" % exc
            return False
        wanted = EV_XID | EV_DBE_RETIREMENT | EV_DBE_RETIREMENT_FAILURE | EV_FATAL_POISON | EV_GPU_UNAVAILABLE
        for i, handle in handles:  # per GPU: one that fails (lost, unsupported) never stops the others
            try:
                types = nvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted
                if types:
                    nvml.nvmlDeviceRegisterEvents(handle, types, events)
                    self.uuids[i] = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                continue
        self.nvml, self._set, self._lock = nvml, events, lock
        self.why = "" if self.uuids else "no GPU here reports critical events"
        return True

    def _handles(self, nvml: Any) -> List[Tuple[int, Any]]:
        """(index, handle) of each GPU to listen to: the source's readable ones, else every GPU's."""
        if self._source is not None:
            handles = self._source.handles
            return [(i, handles[k]) for k, i in enumerate(self._source.indices) if handles[k] is not None]
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                out.append((i, nvml.nvmlDeviceGetHandleByIndex(i)))
            except Exception:
                continue
        return out

    def poll(self, wait_ms: int = 0, now: Optional[float] = None) -> List[Dict[str, Any]]:
        """The faults that arrived since the last poll (waiting at most ``wait_ms`` for the first), recorded."""
        if not self._open() or not self.uuids:
            return []
        found = []
        for _ in range(MAX_PER_POLL):
            try:
                event = self.nvml.nvmlEventSetWait(self._set, wait_ms)
            except Exception as exc:
                if getattr(exc, "value", None) != getattr(self.nvml, "NVML_ERROR_TIMEOUT", _ERR_TIMEOUT):
                    self.why = "reading the event set failed: %s" % exc
                break
            wait_ms = 0
            found.append(self._fault(event, time.time() if now is None else now))
        record(self.state_dir, found)
        return found

    def recent(self, now: float) -> Dict[int, List[Dict[str, Any]]]:
        """``by_gpu``, read again only when the file changed (the sampler asks every second)."""
        try:
            mtime = os.stat(os.path.join(self.state_dir, FAULTS)).st_mtime
        except OSError:
            return {}
        if mtime != self._seen[0]:
            self._seen = (mtime, by_gpu(self.state_dir, now))
        return self._seen[1]

    def _fault(self, event: Any, now: float) -> Dict[str, Any]:
        try:
            gpu = int(self.nvml.nvmlDeviceGetIndex(event.device))
        except Exception:
            gpu = -1
        kind = KINDS.get(int(getattr(event, "eventType", 0)), "event 0x%x" % int(getattr(event, "eventType", 0)))
        xid = int(getattr(event, "eventData", 0)) if kind == "xid" else None
        meaning, fix = describe(kind, xid)
        return {"t": now, "gpu": gpu, "uuid": self.uuids.get(gpu), "kind": kind, "xid": xid,
                "meaning": meaning, "fix": fix}

    def close(self) -> None:
        if self._set is not None:
            _quietly(self.nvml, "nvmlEventSetFree", self._set)
            if self._source is None:
                _quietly(self.nvml, "nvmlShutdown")
            self._set = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _quietly(nvml: Any, name: str, *args: Any) -> None:
    try:
        getattr(nvml, name)(*args)
    except Exception:
        pass


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None

"""Running inside a container (a rented pod): how to tell, its cgroup limits, and GPU processes it cannot see.

In a pod, NVML reports GPU processes with the host's PIDs, which do not exist in the container's /proc. Such
a process is matched to a job from what the agent knows: the GPUs each running job was given
(CUDA_VISIBLE_DEVICES), and when the process appeared compared with when each job started. That match is
marked ``inferred``; a process no rule matches stays unknown (``hidden``, job None).
Stdlib only, Python 3.8+; every reader returns None when a file is missing or unreadable.
"""

import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .procfs import ancestors, read_text

#: Container runtimes and orchestrators named in /proc/1/cgroup paths.
_CGROUP_WORDS = ("kubepods", "docker", "containerd", "libpod", "crio", "lxc")
_INITS = ("systemd", "init", "launchd", "upstart")
#: A memory limit at or above this is "no limit" (cgroup v1 writes 2^63 rounded down to a page).
_NO_LIMIT = 1 << 60
#: A container's full ID (Docker's and Podman's: 64 hex digits), as in its processes' cgroup paths.
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
#: A hidden process that appeared this long after the most recent start of a candidate job is not matched.
APPEAR_WINDOW_S = 300.0


# --- detection ------------------------------------------------------------------------------------------------
def root_fs_type(proc: str = "/proc") -> Optional[str]:
    """Filesystem type mounted at / (``overlay`` in Docker and most pods)."""
    return mount_of("/", proc)[1]


def mount_of(path: str, proc: str = "/proc") -> Tuple[Optional[str], Optional[str]]:
    """(mount point, filesystem type) of the deepest mount holding ``path``, from /proc/self/mountinfo."""
    text = read_text(os.path.join(proc, "self", "mountinfo")) or ""
    path = os.path.realpath(path)  # a state dir reached through a symlink lives where it points
    best: Tuple[Optional[str], Optional[str]] = (None, None)
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 is a space
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best[0] is None or len(point) >= len(best[0])):
            best = (point, tail[0])
    return best


def detect(root: str = "/", proc: str = "/proc", env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """``{"in_container": bool, "runtime": name or None, "signs": [what gave it away]}``."""
    env = os.environ if env is None else env
    signs: List[str] = []
    runtime = None
    if env.get("KUBERNETES_SERVICE_HOST"):
        signs.append("KUBERNETES_SERVICE_HOST is set")
        runtime = "kubernetes"
    if os.path.exists(os.path.join(root, ".dockerenv")):
        signs.append("/.dockerenv exists")
        runtime = runtime or "docker"
    if os.path.exists(os.path.join(root, "run", ".containerenv")):
        signs.append("/run/.containerenv exists")
        runtime = runtime or "podman"
    cgroup = read_text(os.path.join(proc, "1", "cgroup")) or ""
    word = next((w for w in _CGROUP_WORDS if w in cgroup), None)
    if word:
        signs.append("PID 1's cgroup names %s" % word)
        runtime = runtime or ("kubernetes" if word == "kubepods" else word)
    init = (read_text(os.path.join(proc, "1", "comm")) or "").strip()
    if init and init not in _INITS:
        shown = "".join(c if c.isprintable() else "?" for c in init[:40])  # a name is data
        signs.append("PID 1 is %s, not an init" % shown)
    if root_fs_type(proc) == "overlay":
        signs.append("/ is an overlay filesystem")
    return {"in_container": bool(signs), "runtime": runtime, "signs": signs}


# --- cgroup limits --------------------------------------------------------------------------------------------
def cgroup_dirs(controller: str, proc: str = "/proc", root: str = "/sys/fs/cgroup") -> List[str]:
    """This process's cgroup directories for ``controller`` (v1) or the unified tree (v2), deepest first."""
    text = read_text(os.path.join(proc, "self", "cgroup")) or ""
    out: List[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        names = parts[1].split(",") if parts[1] else []
        if parts[1] == "":
            bases = [root, os.path.join(root, "unified")]
            base = next((b for b in bases if os.path.exists(os.path.join(b, "cgroup.controllers"))), None)
            enabled = (read_text(os.path.join(base, "cgroup.controllers")) or "").split() if base else []
            if controller not in enabled and controller != "cpuacct":  # cpu.stat is always there in v2
                continue
        elif controller in names:
            base = os.path.join(root, parts[1])
            base = base if os.path.isdir(base) else os.path.join(root, controller)
        else:
            continue
        if base is None or not os.path.isdir(base):
            continue
        rel = parts[2].strip().strip("/")
        path = os.path.join(base, rel) if rel else base
        if not os.path.isdir(path):
            path = base  # a cgroup namespace shows "/" for a tree mounted at its own root
        while True:
            out.append(path)
            if os.path.normpath(path) == os.path.normpath(base):
                break
            path = os.path.dirname(path)
    return out


#: cgroup counters and limits are 64-bit: a number beyond is not a reading (and would overflow a float).
_MAX_VALUE = 1 << 64


def _int(text: Optional[str]) -> Optional[int]:
    """The first word as a cgroup number (-1 allowed: v1's "no quota"), or None."""
    word = (text or "").split()[:1]
    if not word or len(word[0]) > 24:
        return None
    try:
        value = int(word[0])
    except ValueError:
        return None
    return value if -1 <= value < _MAX_VALUE else None


def _stat_value(path: str, key: str) -> Optional[int]:
    """``key``'s value in a flat-keyed cgroup file (memory.stat, cpu.stat), or None."""
    for line in (read_text(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return _int(parts[1])
    return None


def memory_limit(proc: str = "/proc", root: str = "/sys/fs/cgroup") -> Optional[Tuple[int, int]]:
    """(limit bytes, used bytes without reclaimable page cache) of the tightest memory cgroup, or None."""
    best: Optional[Tuple[int, int]] = None
    for d in cgroup_dirs("memory", proc, root):
        v2 = os.path.exists(os.path.join(d, "memory.max"))
        limit = _int(read_text(os.path.join(d, "memory.max" if v2 else "memory.limit_in_bytes")))
        if limit is None or limit >= _NO_LIMIT or (best is not None and limit >= best[0]):
            continue
        usage = _int(read_text(os.path.join(d, "memory.current" if v2 else "memory.usage_in_bytes"))) or 0
        cache = (
            _stat_value(os.path.join(d, "memory.stat"), "inactive_file" if v2 else "total_inactive_file") or 0
        )
        best = (limit, max(0, usage - cache))
    return best


def cpu_limit(proc: str = "/proc", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """CPUs allowed by the tightest CFS quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us), or None."""
    best: Optional[float] = None
    for d in cgroup_dirs("cpu", proc, root):
        text = read_text(os.path.join(d, "cpu.max"))
        if text is not None:
            parts = text.split()
            quota, period = (_int(parts[0]) if parts else None), (_int(parts[1]) if len(parts) > 1 else None)
        else:
            quota = _int(read_text(os.path.join(d, "cpu.cfs_quota_us")))
            period = _int(read_text(os.path.join(d, "cpu.cfs_period_us")))
        if quota is not None and quota > 0 and period:
            best = min(best, quota / period) if best is not None else quota / period
    return best


def cpu_usage_s(proc: str = "/proc", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """CPU seconds used by this process's cgroup (v2 cpu.stat usage_usec, v1 cpuacct.usage), or None."""
    for d in cgroup_dirs("cpuacct", proc, root) + cgroup_dirs("cpu", proc, root):
        usec = _stat_value(os.path.join(d, "cpu.stat"), "usage_usec")  # v2
        if usec is not None:
            return usec / 1e6
        ns = _int(read_text(os.path.join(d, "cpuacct.usage")))
        if ns is not None:
            return ns / 1e9
    return None


# --- GPU processes from another PID namespace -------------------------------------------------------------------
def _granted(spec: Optional[str], gpu: Dict[str, Any]) -> bool:
    """Whether a job given ``spec`` (its CUDA_VISIBLE_DEVICES; None: not set) may use ``gpu``."""
    if spec is None or spec.strip() == "all":
        return True
    tokens = [t.strip() for t in spec.split(",")]
    return str(gpu.get("index")) in tokens or (gpu.get("uuid") is not None and gpu.get("uuid") in tokens)


def grant_of(record: Dict[str, Any]) -> Optional[str]:
    """The CUDA_VISIBLE_DEVICES a job record was started with (its explicit env wins over ``gpus``)."""
    env = record.get("env")
    if isinstance(env, dict) and isinstance(env.get("CUDA_VISIBLE_DEVICES"), str):
        return env["CUDA_VISIBLE_DEVICES"]
    spec = record.get("gpus")
    return "" if spec == "none" else None if spec in (None, "all") else spec


def holders(gpu: Dict[str, Any], jobs: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The running jobs given this GPU (each job: id, gpus = its CUDA_VISIBLE_DEVICES or None, started_at)."""
    return [j for j in jobs if _granted(j.get("gpus"), gpu)]


class Owners:
    """pid -> running job id through /proc parents (proven), and the jobs' GPU grants for the rest.

    ``jobs``: one dict per running job: ``id``, ``pid`` (its main process), ``gpus`` (CUDA_VISIBLE_DEVICES
    it was given, None when unset) and ``started_at``.
    """

    def __init__(self, jobs: List[Dict[str, Any]], proc: str = "/proc") -> None:
        self.jobs = jobs
        self.proc = proc
        self._roots = {int(j["pid"]): j["id"] for j in jobs if j.get("pid")}
        #: a job run in an image: its container's full ID, which names the cgroup of every process in it
        self._containers = {j["container_id"]: j["id"] for j in jobs if _CONTAINER_ID.fullmatch(j.get("container_id") or "")}

    def __call__(self, pid: int) -> Optional[str]:
        job = next((self._roots[p] for p in ancestors(pid, proc=self.proc) if p in self._roots), None)
        if job is None and self._containers:  # a container's processes descend from the engine, not the job
            cgroup = read_text(os.path.join(self.proc, str(pid), "cgroup")) or ""
            job = next((j for cid, j in self._containers.items() if cid in cgroup), None)
        return job

    def visible(self, pid: int) -> bool:
        return os.path.exists(os.path.join(self.proc, str(pid)))


class HiddenAttribution:
    """Matches GPU processes whose pid is not in this /proc to running jobs; keeps what it saw between samples.

    Rules, per GPU: the only running job given that GPU gets the process; among several, the one that started
    most recently before the process appeared (seen appearing between two samples, within APPEAR_WINDOW_S).
    Anything else stays unknown. A match holds while its job runs, so a later job start cannot take it over.
    """

    def __init__(self) -> None:
        self._first_t: Optional[float] = None
        self._appeared: Dict[Tuple[Any, int], Optional[float]] = {}  # None: already there at the first sample
        self._matched: Dict[Tuple[Any, int], str] = {}

    def apply(self, gpus: List[Dict[str, Any]], owners: Owners, now: float) -> None:
        """Fill ``job``/``inferred``/``hidden`` in place for the processes of ``gpus`` that owners cannot see."""
        first = self._first_t is None
        self._first_t = now if first else self._first_t
        running = {j["id"] for j in owners.jobs}
        present = set()
        for gpu in gpus:
            for p in gpu.get("processes") or []:
                if p.get("job") or owners.visible(p["pid"]):
                    continue
                key = (gpu.get("uuid") or gpu.get("index"), p["pid"])
                present.add(key)
                if key not in self._appeared:
                    self._appeared[key] = None if first else now
                job = self._matched.get(key)
                if job not in running:
                    job = self._match(holders(gpu, owners.jobs), self._appeared[key])
                p["hidden"] = True
                if job is not None:
                    self._matched[key] = job
                    p["job"], p["inferred"] = job, True
        for key in list(self._appeared):
            if key not in present:
                self._appeared.pop(key, None)
                self._matched.pop(key, None)

    @staticmethod
    def _match(candidates: List[Dict[str, Any]], appeared: Optional[float]) -> Optional[str]:
        if len(candidates) == 1:
            return candidates[0]["id"]
        if not candidates or appeared is None:
            return None
        before = [j for j in candidates if j.get("started_at") is not None and j["started_at"] <= appeared]
        if not before:
            return None
        latest = max(before, key=lambda j: j["started_at"])
        return latest["id"] if appeared - latest["started_at"] <= APPEAR_WINDOW_S else None

"""The agent's metrics sampler: host readings plus GPUs from the best source that works.

Sources in order: NVML (one long-lived context) -> ``nvidia-smi`` CSV -> host only. Why a better source is not
used is reported as ``gpu_error`` in a sentence a human can act on; nothing here raises.
Stdlib only (pynvml optional, imported lazily), Python 3.8+.

    s = MetricsSampler(state_dir="~/.gputui", nvidia_smi="nvidia-smi")
    s.facts()            # static: driver, CUDA, the GPU list
    s.sample(owner_of)   # one reading; owner_of(pid) -> gputui job id or None
    s.close()
"""

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import protocol as P
from ..host.container import HiddenAttribution, Owners
from ..host.procfs import ProcessUse, children
from ..host.stats import HostStats, process_name
from . import nvml as gpu_nvml
from . import smi as gpu_smi
from .faults import FaultWatcher

OwnerOf = Callable[[int], Optional[str]]
FAULTS_EVERY_S = 5.0  # the XID event set is read at most this often (the events wait in it meanwhile)


class MetricsSampler:
    """Host + GPU sampler. ``nvml=None`` imports pynvml lazily; tests pass a pynvml-like double."""

    def __init__(
        self,
        state_dir: str,
        nvidia_smi: str = "nvidia-smi",
        nvml: Any = None,
        slow_interval: float = gpu_nvml.SLOW_INTERVAL_S,
        smi_timeout: float = 10.0,
        only: Optional[List[str]] = None,
        faults: Optional[FaultWatcher] = None,
    ) -> None:
        """``only``: NVML reads just these GPUs (indices or UUIDs); nvidia-smi reads all in its one call.
        ``faults``: the XID watcher to poll at each sample (default: one of its own, with NVML)."""
        self.host = HostStats(state_dir)
        self.faults = faults
        self._faults_at = 0.0  # when the watcher was last polled (monotonic)
        self.source: Any = None
        self.gpu_error: Optional[str] = None
        self.hidden = HiddenAttribution()  # GPU processes from another PID namespace (a pod)
        self.use = ProcessUse()  # the GPU processes' CPU % and resident memory
        self._facts: Optional[Dict[str, Any]] = None  # protocol.GpuFacts + gpu_source, gpu_error
        try:
            self.source = gpu_nvml.NvmlSource(nvml, slow_interval, only)
            if self.faults is None:
                self.faults = FaultWatcher(state_dir, source=self.source)
            return
        except gpu_nvml.NvmlUnavailable as e:
            nvml_error = str(e)
        except Exception as e:  # a broken pynvml must not take the agent down
            nvml_error = "NVML unusable: {}".format(e)
        try:
            self.source = gpu_smi.SmiSource(nvidia_smi, smi_timeout)
            self.gpu_error = nvml_error + "; using nvidia-smi"
        except gpu_smi.SmiNotFound:
            self.gpu_error = "no NVIDIA driver: nvidia-smi not found and NVML unavailable ({})".format(
                nvml_error
            )
        except Exception as e:
            self.gpu_error = "{}; {}".format(nvml_error, e)

    @property
    def gpu_source(self) -> Optional[str]:
        return self.source.name if self.source is not None else None

    def facts(self) -> Dict[str, Any]:
        """Static facts, computed on the first call."""
        if self._facts is None:
            gpu = {"driver_version": None, "cuda_version": None, "nvml_version": None, "gpus": []}
            if self.source is not None:
                try:
                    gpu = self.source.facts()
                except Exception as e:
                    self.gpu_error = "GPU facts unreadable: {}".format(e)
            self._facts = dict(gpu, gpu_source=self.gpu_source, gpu_error=self.gpu_error)
        return dict(self._facts, gpus=[dict(g) for g in self._facts["gpus"]])

    def sample(self, owner_of: OwnerOf) -> P.MetricsSample:
        """One JSON-serialisable reading of the host and every GPU (no seq, no activity yet)."""
        t = time.time()
        host = self.host.sample()
        gpus: List[Any] = []
        error = self.gpu_error
        if self.source is not None:
            try:
                gpus = self.source.sample()
            except Exception as e:
                error = "GPU sample failed: {}".format(e)
        recent: Dict[int, List[Dict[str, Any]]] = {}
        if self.faults is not None:
            if time.monotonic() - self._faults_at >= FAULTS_EVERY_S:
                self._faults_at = time.monotonic()
                self.faults.poll(0)
            recent = self.faults.recent(t)
        pids = {p["pid"] for g in gpus for p in g.get("processes") or []}
        kids = {pid: children(pid) for pid in pids}
        use = self.use.read(pids.union(*kids.values()))
        for g in gpus:
            g["processes"] = [self._process(p, owner_of, use, kids[p["pid"]]) for p in g.get("processes") or []]
            g["faults"] = [{"t": f["t"], "kind": f["kind"], "xid": f.get("xid"), "meaning": f.get("meaning"),
                            "fix": f.get("fix")} for f in recent.get(g.get("index"), [])]
        if isinstance(owner_of, Owners):
            self.hidden.apply(gpus, owner_of, t)
        return {"t": t, "host": host, "gpus": gpus, "gpu_source": self.gpu_source, "gpu_error": error}

    @staticmethod
    def _process(p: Dict[str, Any], owner_of: OwnerOf, use: Dict[int, Tuple[Optional[float], Optional[float]]],
                 kids: List[int]) -> P.GpuProcess:
        pid = p["pid"]
        try:
            job = owner_of(pid)
        except Exception:
            job = None
        cpu, rss = use.get(pid, (None, None))
        return {
            "pid": pid,
            "mem_mib": p.get("mem_mib"),
            "job": job,
            "name": process_name(pid) or p.get("smi_name"),
            "hidden": False,
            "inferred": False,
            "cpu_percent": cpu,
            "rss_mib": rss,
            "children": len(kids) if cpu is not None else None,
            "children_cpu_percent": round(sum(use[k][0] or 0.0 for k in kids), 1) if cpu is not None else None,
        }

    def close(self) -> None:
        if self.faults is not None:
            self.faults.close()
        if self.source is not None:
            try:
                self.source.close()
            except Exception:
                pass

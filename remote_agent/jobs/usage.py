"""GPU usage of one job, sampled by its runner for the job's whole life (no client needed).

Written to ``usage.json`` in the job dir: peak GPU memory held by the job's process tree, the mean
utilisation of the GPUs the job was given (all of them when it was not restricted), and how many of the
samples of those GPUs found them all idle (below ``IDLE_UTIL_PERCENT``) or one of them throttled by heat or
hardware: the share of the run's cost paid for nothing (gputui history); and how many busy samples ran over a
PCIe link with lanes missing (``narrow_link_samples``: paid for a slower machine than listed); the energy the
GPUs drew (``energy_j``, from their power readings); how long the driver slowed them for heat
(``thermal_slowdown_s``, from NVML's thermal violation counter: a busy sample after it grew counts as throttled
too, even when no reason was active at the instant of the sample). In a pod, where NVML's
pids are not in this /proc, the job's GPU processes are inferred as the agent does (container.py), and
``gpu_mem_inferred`` says so.

While an agent samples the host (a client is connected), the runner takes the agent's newest sample from the
metrics ring: no NVML call of its own. Otherwise it reads NVML itself, only the GPUs the job was given.
"""

import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .. import protocol as P
from ..fsutil import write_json
from ..host.container import Owners
from ..metrics.ring import latest_sample
from .store import running_jobs

EVERY_S = 5.0
ENERGY_GAP_S = 60.0  # two samples further apart than this: the power between them is not known


def visible_indices(spec: Optional[str]) -> Optional[List[str]]:
    """GPU indices/UUIDs the job may use, or None for all of them."""
    if not spec or spec == "all":
        return None
    return [] if spec == "none" else spec.split(",")


def narrow_link(gpu: Dict[str, Any]) -> bool:
    """The GPU's PCIe link trained with fewer lanes than the GPU and its slot allow (its generation drops when
    it idles, by design: only the width says the link is degraded)."""
    width, widest = gpu.get("pcie_width"), gpu.get("pcie_width_max")
    return isinstance(width, int) and isinstance(widest, int) and 0 < width < widest


class UsageRecorder(threading.Thread):
    """Samples GPUs every ``every_s`` seconds while the job runs; does nothing on a host without GPUs."""

    def __init__(
        self, job_dir: str, job_pid: int, gpus: Optional[str], nvidia_smi: str, every_s: float = EVERY_S
    ):
        super().__init__(name="usage", daemon=True)
        self.job_dir, self.job_pid, self.every_s = job_dir, job_pid, every_s
        self.job_id = os.path.basename(os.path.normpath(job_dir))
        self.visible = visible_indices(gpus)
        self.nvidia_smi = nvidia_smi
        self.stopped = threading.Event()
        self.usage = {"samples": 0, "gpu_peak_mem_mib": 0.0, "gpu_mean_util": None}  # type: Dict[str, Any]
        self._util_sum = 0.0
        self._util_n = 0
        self.started = time.time()
        self._power_at: Optional[Tuple[float, float]] = None  # the last sample's (time, summed watts)
        self._thermal_at: Optional[Tuple[float, Dict[Any, float]]] = None  # (time, {GPU: violation ms})

    def _mine(self, gpu: Dict[str, Any]) -> bool:
        return (
            self.visible is None or str(gpu.get("index")) in self.visible or gpu.get("uuid") in self.visible
        )

    def add(self, sample: Dict[str, Any]) -> None:
        self._faults([g for g in sample.get("gpus") or [] if self._mine(g)])
        mine = [g for g in sample.get("gpus") or [] if self._mine(g) and g.get("state") != P.GPU_LOST]
        self._energy(sample.get("t"), [g.get("power_w") for g in mine])
        slowed = self._thermal(sample.get("t"), mine)
        if mine:  # idle, or slowed by heat or hardware: paid for nothing (a GPU both: counted as idle)
            u = self.usage
            u["gpu_samples"] = u.get("gpu_samples", 0) + 1
            utils = [g.get("util_percent") for g in mine]
            if all(isinstance(x, (int, float)) and x < P.IDLE_UTIL_PERCENT for x in utils):
                u["idle_samples"] = u.get("idle_samples", 0) + 1
            else:
                if slowed or any(r in P.HW_THROTTLE for g in mine for r in g.get("throttle_reasons") or ()):
                    u["throttled_samples"] = u.get("throttled_samples", 0) + 1
                if any(narrow_link(g) for g in mine):  # busy over a link with lanes missing: transfers slower
                    u["narrow_link_samples"] = u.get("narrow_link_samples", 0) + 1
        mem = 0.0
        for gpu in sample.get("gpus") or []:
            for p in gpu.get("processes") or []:
                if p.get("job") == self.job_id:
                    mem += p.get("mem_mib") or 0.0
                    if p.get("inferred"):
                        self.usage["gpu_mem_inferred"] = True
            if self._mine(gpu) and gpu.get("util_percent") is not None:
                self._util_sum += gpu["util_percent"]
                self._util_n += 1
        u = self.usage
        u["samples"] += 1
        u["gpu_peak_mem_mib"] = max(u["gpu_peak_mem_mib"], mem)
        u["gpu_mean_util"] = self._util_sum / self._util_n if self._util_n else None

    def _energy(self, t: Any, watts: List[Any]) -> None:
        """The energy the job's GPUs drew (``energy_j``): their summed power between two samples, averaged,
        times the time between them; a gap longer than ``ENERGY_GAP_S`` (no sampler ran) counts nothing."""
        if not watts or not isinstance(t, (int, float)) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < 1e5 for w in watts):
            self._power_at = None
            return
        now = (float(t), float(sum(watts)))
        last, self._power_at = self._power_at, now
        if last is not None and 0 < now[0] - last[0] <= ENERGY_GAP_S:
            self.usage["energy_j"] = self.usage.get("energy_j", 0.0) + (last[1] + now[1]) / 2 * (now[0] - last[0])

    def _thermal(self, t: Any, gpus: List[Dict[str, Any]]) -> bool:
        """Add the time the driver slowed the job's GPUs for heat since the previous sample (the most any one GPU
        was slowed, at most the time between the samples) to ``thermal_slowdown_s``; whether it grew."""
        now = {g.get("index"): float(v) for g in gpus
               if isinstance(v := g.get("thermal_violation_ms"), (int, float)) and not isinstance(v, bool) and v >= 0}
        if not now or not isinstance(t, (int, float)):
            self._thermal_at = None
            return False
        last, self._thermal_at = self._thermal_at, (float(t), now)
        if last is None or not 0 < t - last[0] <= ENERGY_GAP_S:
            return False
        grew = max((now[i] - last[1][i] for i in now if i in last[1]), default=0.0) / 1000.0
        if grew <= 0:  # no growth, or a counter that went back (the driver reloaded)
            return False
        self.usage["thermal_slowdown_s"] = self.usage.get("thermal_slowdown_s", 0.0) + min(grew, t - last[0])
        return True

    def _faults(self, gpus: List[Dict[str, Any]]) -> None:
        """The driver's XIDs on this job's GPUs since it started, kept in its record (``faults``, at most 20)."""
        kept = self.usage.setdefault("faults", [])
        for gpu in gpus:
            for fault in gpu.get("faults") or []:
                t = fault.get("t") if isinstance(fault, dict) else None
                entry = dict(fault, gpu=gpu.get("index"))
                if isinstance(t, (int, float)) and t >= self.started and entry not in kept and len(kept) < 20:
                    kept.append(entry)

    def owners(self) -> Owners:
        """Every running job's processes and GPUs (not just this job's: a shared GPU is told apart)."""
        try:
            jobs = running_jobs(os.path.dirname(os.path.normpath(self.job_dir)))
        except OSError:
            jobs = []
        if not any(j["id"] == self.job_id for j in jobs):
            jobs.append({"id": self.job_id, "pid": self.job_pid, "gpus": None, "started_at": None})
        return Owners(jobs)

    def _own_sample(self) -> Optional[Dict[str, Any]]:
        """A reading of this job's GPUs by the runner itself; None on a host without GPUs."""
        if self._sampler is None:
            from ..metrics.sampler import MetricsSampler

            self._sampler = MetricsSampler(self.job_dir, nvidia_smi=self.nvidia_smi, only=self.visible)
        if self._sampler.gpu_source is None:
            return None
        return self._sampler.sample(self.owners())

    def run(self) -> None:
        state_dir = os.path.dirname(os.path.dirname(os.path.normpath(self.job_dir)))
        self._sampler = None  # type: Optional[Any]
        try:
            while True:
                sample = latest_sample(state_dir, self.every_s)
                if sample is None or (not sample.get("gpus") and sample.get("gpu_source") is None):
                    sample = self._own_sample()
                    if sample is None:
                        return  # no GPU on this host
                self.add(sample)
                try:
                    write_json(os.path.join(self.job_dir, "usage.json"), self.usage)
                except OSError:
                    pass  # a full disk: the job goes on, its usage record just stays older
                if self.stopped.wait(self.every_s):
                    return
        finally:
            if self._sampler is not None:
                self._sampler.close()

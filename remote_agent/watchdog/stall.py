"""Stalled jobs: a running job whose GPUs idle and whose log is silent for ``stall_minutes``.

A job's GPUs are those it was granted (CUDA_VISIBLE_DEVICES / ``--gpus``), or every GPU of the host when it was
given none explicitly. A job given no GPU (``--gpus none``), or on a host with no GPU reading, is never stalled:
a quiet CPU step cannot be told from a hang. A GPU whose utilisation is unknown counts as busy.

Only the watchdog decides, as it watches with no client connected, and the window must have been watched by the
tracker itself on the monotonic clock (a restart starts it again). Its verdicts go to ``watchdog_state.json``
(``stalled``), which the agent reads to mark jobs in listings.
"""

from typing import Any, Dict, List

from ..host.container import grant_of, holders
from ..protocol import JOB_RUNNING


def job_gpus(sample: Dict[str, Any], job: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The GPUs of ``sample`` that ``job`` may use."""
    grant = {"id": job.get("id"), "gpus": grant_of(job)}
    return [g for g in sample.get("gpus") or [] if holders(g, [grant])]


class StallTracker:
    """Per running job: when it was last seen active (a busy GPU, a growing log) by this process."""

    def __init__(self) -> None:
        self._active: Dict[str, Dict[str, Any]] = {}  # job id -> {"log_size", "mono", "at"}

    def update(
        self, sample: Dict[str, Any], jobs: List[Dict[str, Any]], util_percent: float, minutes: float,
        now: float, mono: float,
    ) -> Dict[str, Dict[str, Any]]:
        """Record one sample; return the stalled jobs: ``{id: {"since", "why"}}`` (``since``: last seen active)."""
        window = float(minutes) * 60.0
        active, stalled = {}, {}
        for job in jobs:
            if job.get("state") != JOB_RUNNING or job.get("scheduler") == "slurm":
                continue  # ended, or a Slurm job: its GPUs are a compute node's, not this host's
            jid = str(job.get("id"))
            gpus = job_gpus(sample, job)
            quiet = [
                g for g in gpus if g.get("util_percent") is not None and g["util_percent"] < util_percent
            ]
            last = self._active.get(jid)
            if last is None or not gpus or len(quiet) < len(gpus) or job.get("log_size") != last["log_size"]:
                last = {"log_size": job.get("log_size"), "mono": mono, "at": now}
            active[jid] = last
            silent = mono - last["mono"]
            if gpus and silent >= window:
                names = ", ".join(str(g.get("index")) for g in gpus)
                why = "GPU %s below %g%% and no log output for %.1f min" % (
                    names,
                    util_percent,
                    silent / 60.0,
                )
                stalled[jid] = {"since": last["at"], "why": why}
        self._active = active
        return stalled

"""All hints for one job: from its log, its exit status and its GPUs' telemetry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .gpu_hints import hints_from_metrics
from .log_hints import hint_for_exit
from .snapshot import Hint, JobInsights

if TYPE_CHECKING:
    from ..model import HostSnapshot, Job

UTIL_HISTORY = 120  # host samples of GPU utilisation looked at for the low-utilisation hint


def job_hints(job: Job | None, ins: JobInsights | None, host: HostSnapshot | None) -> list[Hint]:
    """The log's hints, the exit status's hint and, on the GPUs running the job, telemetry hints."""
    if job is None:
        return []
    hints = list(ins.hints) if ins else []
    exit_hint = hint_for_exit(job.exit_code)
    if exit_hint is not None:
        hints.append(exit_hint)
    if host is not None and host.gpus:
        mine = [g for g in host.gpus if any(p.job == job.id for p in g.processes)]
        if mine:
            idx = {g.index for g in mine}
            util = [
                sum(g.util_percent or 0 for g in s.gpus if g.index in idx) / len(idx)
                for s in host.history[-UTIL_HISTORY:]
            ]
            oom = any(h.code == "cuda_oom" for h in hints)
            hints += hints_from_metrics(job.running, util, mine, job=job.id, oom=oom)
    return hints

"""All hints for one job: from its log, its exit status and its GPUs' telemetry."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from .gpu_hints import hints_from_metrics
from .log_hints import hint_for_exit
from .snapshot import Hint, JobInsights, cap_line

if TYPE_CHECKING:
    from ..session.model import HostSnapshot, Job

UTIL_HISTORY = 120  # host samples of GPU utilisation looked at for the low-utilisation hint
_KILLED_CODES = ("host_oom", "dataloader_worker")  # log hints that already explain a SIGKILL


def with_exit_hint(hints: Iterable[Hint], exit_code: int | None) -> list[Hint]:
    """The log's hints plus the exit status's one; a SIGKILL the log already explains is one hint,
    with the exit status added to its evidence."""
    out = list(hints)
    exit_hint = hint_for_exit(exit_code)
    if exit_hint is None or any(h.code == exit_hint.code for h in out):
        return out
    if exit_hint.code == "exit_sigkill":
        for i, h in enumerate(out):
            if h.code in _KILLED_CODES:
                out[i] = replace(h, line=cap_line(f"{h.line} (then {exit_hint.line})"))
                return out
    out.append(exit_hint)
    return out


def job_hints(job: Job | None, ins: JobInsights | None, host: HostSnapshot | None) -> list[Hint]:
    """The log's hints, the exit status's hint and, on the GPUs running the job, telemetry hints."""
    if job is None:
        return []
    hints = with_exit_hint(ins.hints if ins else (), job.exit_code)
    if host is not None and host.gpus:
        mine = [g for g in host.gpus if any(p.job == job.id for p in g.processes)]
        if mine:
            util = host.history.mean_util({g.index for g in mine}, UTIL_HISTORY)
            oom = any(h.code == "cuda_oom" for h in hints)
            hints += hints_from_metrics(job.running, util, mine, job=job.id, oom=oom)
    return hints

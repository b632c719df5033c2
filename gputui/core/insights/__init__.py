"""Progress, training metrics and hints parsed from a job's raw log bytes.

Pure and headless: no I/O, no UI imports. The modules:

- :mod:`.parser`: :class:`LogInsights`, fed raw log bytes, returns frozen :class:`JobInsights` snapshots;
- :mod:`.patterns`: its regexes; :mod:`.plans`: how a line of one shape is read, worked out once per shape;
  :mod:`.redraws`: runs of tqdm redraws read in bulk;
- :mod:`.metrics`: which names are metrics and which way is "best";
- :mod:`.log_hints`: hints from log lines, and :func:`hint_for_exit` for an exit status;
- :mod:`.gpu_hints`: :func:`hints_from_metrics`, hints from GPU telemetry;
- :mod:`.job`: :func:`job_hints`, all of a job's hints together;
- :mod:`.timed`: :func:`timed_parser`, a cold read that knows when the log's bytes were written;
- :mod:`.snapshot`: the :class:`JobInsights` and :class:`Hint` types.
"""

from .gpu_hints import hints_from_metrics
from .job import job_hints, with_exit_hint
from .log_hints import hint_for_exit
from .parser import LOSS_HISTORY, MAX_METRICS, LogInsights
from .patterns import MAX_LINE
from .snapshot import Hint, JobInsights
from .timed import timed_parser

__all__ = [
    "MAX_LINE",
    "MAX_METRICS",
    "LOSS_HISTORY",
    "Hint",
    "JobInsights",
    "LogInsights",
    "hint_for_exit",
    "hints_from_metrics",
    "job_hints",
    "with_exit_hint",
    "timed_parser",
]

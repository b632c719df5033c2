"""srun's task labels in a many-node Slurm job's log (``0: Epoch 1/3 ...``): which jobs have them, and the log
as task 0 alone wrote it (what the insights read)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: The label ``srun --label`` puts before each line of a task (padded to the widest task number).
_LABEL = re.compile(rb"^ *(\d{1,6}): ")


def labelled(record: Mapping[str, Any]) -> bool:
    """Whether a job's log lines carry srun's task labels (a Slurm job run as one step over its nodes)."""
    asked = record.get("slurm")  # only a Slurm job's record has it
    return isinstance(asked, dict) and (bool(asked.get("launcher")) or (asked.get("nodes_count") or 1) > 1)


def rank0_view(data: bytes, offset: int) -> bytes:
    """A labelled log (``data`` from byte ``offset`` on) as task 0 alone printed it: task 0's labels become
    spaces, other tasks' lines become spaces, srun's own lines stay; every byte keeps its offset (the log's
    write times still apply). An unlabelled first line of a tail that starts mid-log is blanked (it may be any task's end)."""
    lines = data.split(b"\n")
    out = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if (i == 0 and offset > 0 and not m) or (m and m.group(1) != b"0"):
            out.append(b" " * len(line))
        elif m:
            out.append(b" " * m.end() + line[m.end() :])
        else:
            out.append(line)
    return b"\n".join(out)

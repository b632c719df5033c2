"""What a job's log says: the :class:`JobInsights` snapshot and the :class:`Hint` it carries."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_HINT_LINE = 300  # chars of the triggering log line kept in a Hint


@dataclass(frozen=True)
class Hint:
    """A diagnosis with a short, specific fix; ``code`` is a stable id (e.g. ``"cuda_oom"``)."""

    code: str
    title: str
    fix: str
    line: str = ""

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "title": self.title, "fix": self.fix, "line": self.line}


@dataclass(frozen=True)
class JobInsights:
    """What the log says so far. ``metrics``: name -> {"last", "best", "count"}."""

    progress: float | None = None
    eta_s: float | None = None
    rate: str | None = None
    epoch: int | None = None  # the current epoch counted from 1, also when the log counts from 0 (Lightning)
    total_epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    metrics: Mapping[str, Mapping[str, float | int]] = field(default_factory=dict)
    loss_history: tuple[float, ...] = ()
    hints: tuple[Hint, ...] = ()
    last_line: str = ""
    phase: str | None = None  # "train", or "eval" while an evaluation/validation loop runs

    def to_json(self) -> dict[str, Any]:
        """A plain dict that ``json.dumps`` accepts (non-finite floats become None)."""
        return {
            "progress": _finite(self.progress),
            "eta_s": _finite(self.eta_s),
            "rate": self.rate,
            "epoch": self.epoch,
            "total_epochs": self.total_epochs,
            "step": self.step,
            "total_steps": self.total_steps,
            "metrics": {
                k: {"last": _finite(m["last"]), "best": _finite(m["best"]), "count": m["count"]}
                for k, m in self.metrics.items()
            },
            "loss_history": [_finite(v) for v in self.loss_history],
            "hints": [h.to_json() for h in self.hints],
            "last_line": self.last_line,
            "phase": self.phase,
        }


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def cap_line(line: str) -> str:
    return line if len(line) <= MAX_HINT_LINE else line[: MAX_HINT_LINE - 1] + "…"

"""A job's metric series as the host keeps them (``logs.series``, remote_agent/jobs/series.py), checked.

The host is not trusted: names are capped and cleaned to plain text, every number must be finite, and a
series' points are bounded. A series' x axis is the step where every point has one, else the epoch, else
the log's line number (``x_label`` says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gputui.core import safetext
from gputui.core.insights.metrics import is_eval_name, metric_kind

MAX_SERIES = 16
MAX_POINTS = 4000
MAX_NAME = 48
X_STEP, X_EPOCH, X_LINE = "step", "epoch", "line"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class Point:
    line: int
    step: int | None
    epoch: float | None
    value: float


@dataclass(frozen=True)
class Series:
    """One metric's points (downsampled on the host beyond a few thousand) and its summary."""

    name: str  # plain text from the log: never markup
    points: tuple[Point, ...]
    count: int
    last: float
    low: float
    high: float

    @property
    def is_eval(self) -> bool:
        return is_eval_name(self.name)

    @property
    def best(self) -> float:
        """The lowest value of a loss-like metric, the highest of an accuracy-like one, else the last."""
        kind = metric_kind(self.name)
        return self.low if kind == "min" else self.high if kind == "max" else self.last

    @property
    def x_label(self) -> str:
        if self.points and all(p.step is not None for p in self.points):
            return X_STEP
        if self.points and all(p.epoch is not None for p in self.points):
            return X_EPOCH
        return X_LINE

    def xy(self, x_label: str | None = None) -> list[tuple[float, float]]:
        """The points as (x, value) on the ``x_label`` axis (this series' own by default)."""
        label = x_label or self.x_label
        out: list[tuple[float, float]] = []
        for p in self.points:
            x = p.step if label == X_STEP else p.epoch if label == X_EPOCH else p.line
            if x is not None:
                out.append((float(x), p.value))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"points": [[p.line, p.step, p.epoch, p.value] for p in self.points], "count": self.count,
                "last": self.last, "low": self.low, "high": self.high, "best": self.best, "x": self.x_label}


def _point(raw: Any) -> Point | None:
    if not isinstance(raw, list) or len(raw) != 4:
        return None
    line, step, epoch, value = raw[0], raw[1], raw[2], _num(raw[3])
    if not isinstance(line, int) or isinstance(line, bool) or value is None:
        return None
    step_ok = step is None or (isinstance(step, int) and not isinstance(step, bool))
    epoch_f = None if epoch is None else _num(epoch)
    if not step_ok or (epoch is not None and epoch_f is None):
        return None
    return Point(line, step, epoch_f, value)


def _series(name: str, raw: Any) -> Series | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("points"), list):
        return None
    pts = tuple(p for p in map(_point, raw["points"][:MAX_POINTS]) if p is not None)
    last, low, high = _num(raw.get("last")), _num(raw.get("low")), _num(raw.get("high"))
    count = raw.get("count")
    if last is None or low is None or high is None or not isinstance(count, int) or isinstance(count, bool):
        return None
    return Series(safetext.clean(name, limit=MAX_NAME), pts, max(0, count), last, low, high)


@dataclass(frozen=True)
class JobSeries:
    """Every series of one job, and whether they are final (the job ended and its log was read)."""

    host: str
    job: str
    series: tuple[Series, ...]
    done: bool
    partial: bool  # the host has not read the whole log yet

    @classmethod
    def from_wire(cls, host: str, job: str, raw: Any) -> JobSeries:
        """The series of a ``logs.series`` reply; what is malformed is left out, never trusted."""
        r: dict[str, Any] = raw if isinstance(raw, dict) else {}
        got = r.get("series")
        items = list(got.items())[:MAX_SERIES] if isinstance(got, dict) else []
        series = tuple(s for s in (_series(str(k), v) for k, v in items) if s is not None)
        offset, size = r.get("offset"), r.get("size")
        partial = isinstance(offset, int) and isinstance(size, int) and offset < size
        done = r.get("done") is True
        return cls(host, job, series, done, partial)

    def get(self, name: str) -> Series | None:
        return next((s for s in self.series if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "partial": self.partial,
            "series": {s.name: s.to_json() for s in self.series},
        }

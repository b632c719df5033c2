"""A host's recent metrics for the sparklines and the telemetry hints, kept as arrays of numbers.

Ten minutes of 1 Hz samples of 256 hosts x 8 GPUs kept as MetricsSample objects are millions of Python
objects, and each full garbage collection walks them all (a pause of ~100 ms in the app). Here a GPU's
series are a few ``array`` objects, which the collector never looks into.

``MetricsRing`` belongs to one writer (a HostSession) and keeps at most ``capacity`` samples. Each append
gives a ``MetricsHistory``: a read-only view of the newest samples, which later appends never change (the
ring only appends to its arrays, and moves to new arrays to drop old samples), so a published HostSnapshot
can keep it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gputui.core.session.model import MetricsSample

NAN = float("nan")
_SEQ_MAX = 2**63 - 1  # a seq the agent cannot have sent (it counts from 0) is clamped, never an error


def _num(value: object) -> float:
    """A reading as a float; NaN for unknown (None) or anything that is not a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return NAN
    return NAN


def _fraction(used: object, total: object) -> float:
    """Memory used as a fraction of the total in 0..1 (as ``fmt.ratio``); NaN when unknown."""
    a, b = _num(used), _num(total)
    if a != a or b != b or not b:
        return NAN
    return max(0.0, min(1.0, a / b))


def _values(a: array[float]) -> list[float | None]:
    return [None if v != v else v for v in a]


class GpuSeries(NamedTuple):
    """One GPU's readings, oldest first; None where a sample had none."""

    util: list[float | None]  # percent
    mem: list[float | None]  # fraction of the total memory in use
    temp: list[float | None]  # degrees C


class _Rows:
    """One GPU index's rows in a store: the sample each row belongs to and its readings."""

    __slots__ = ("pos", "util", "mem", "temp")

    def __init__(self) -> None:
        self.pos = array("q")  # the sample's ordinal in the ring (counts every sample ever appended)
        self.util, self.mem, self.temp = array("d"), array("d"), array("d")

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """Row indexes of the samples with ordinals in [lo, hi)."""
        return bisect_left(self.pos, lo), bisect_left(self.pos, hi)


class _Store:
    """Append-only arrays of the samples from ordinal ``base`` on."""

    __slots__ = ("base", "seq", "t", "gpus")

    def __init__(self, base: int) -> None:
        self.base = base
        self.seq, self.t = array("q"), array("d")
        self.gpus: dict[int, _Rows] = {}

    def tail(self, start: int) -> _Store:
        """A new store with the samples from ordinal ``start`` on (this one is left as it is)."""
        out = _Store(start)
        out.seq, out.t = self.seq[start - self.base :], self.t[start - self.base :]
        for index, rows in self.gpus.items():
            i = bisect_left(rows.pos, start)
            if i < len(rows.pos):
                kept = out.gpus[index] = _Rows()
                kept.pos, kept.util, kept.mem, kept.temp = (
                    rows.pos[i:], rows.util[i:], rows.mem[i:], rows.temp[i:]
                )
        return out


class MetricsHistory:
    """The samples with ordinals in [start, end) of a store: read-only, oldest first."""

    __slots__ = ("_store", "_start", "_end")

    def __init__(self, store: _Store, start: int, end: int) -> None:
        self._store, self._start, self._end = store, start, end

    @classmethod
    def of(cls, samples: Iterable[MetricsSample], capacity: int | None = None) -> MetricsHistory:
        """The history of ``samples`` (oldest first), keeping the last ``capacity`` (all when None)."""
        samples = list(samples)
        ring = MetricsRing(capacity or max(1, len(samples)))
        for s in samples:
            ring.append(s)
        return ring.view

    def __len__(self) -> int:
        return self._end - self._start

    def _offsets(self, window: int | None) -> tuple[int, int]:
        lo = self._start if window is None else max(self._start, self._end - max(0, window))
        return lo - self._store.base, self._end - self._store.base

    @property
    def last_seq(self) -> int | None:
        return self._store.seq[self._end - self._store.base - 1] if len(self) else None

    @property
    def last_t(self) -> float | None:
        return self._store.t[self._end - self._store.base - 1] if len(self) else None

    def seqs(self) -> list[int]:
        i, j = self._offsets(None)
        return self._store.seq[i:j].tolist()

    def times(self) -> list[float]:
        i, j = self._offsets(None)
        return self._store.t[i:j].tolist()

    def gpus(self, window: int | None = None) -> dict[int, GpuSeries]:
        """Per GPU index, its readings in the last ``window`` samples (all when None); a GPU missing from
        a sample has no entry for it (its lists are shorter), a reading the sample lacked is None."""
        lo = self._start if window is None else max(self._start, self._end - max(0, window))
        out: dict[int, GpuSeries] = {}
        for index, rows in self._store.gpus.items():
            i, j = rows.span(lo, self._end)
            if i < j:
                out[index] = GpuSeries(
                    _values(rows.util[i:j]), _values(rows.mem[i:j]), _values(rows.temp[i:j])
                )
        return out

    def mean_util(self, indexes: Sequence[int] | set[int], window: int) -> list[float]:
        """Per sample of the last ``window``, the mean utilisation of the GPUs ``indexes`` (unknown or
        missing counts as 0)."""
        lo = max(self._start, self._end - max(0, window))
        sums = [0.0] * (self._end - lo)
        for index in indexes:
            rows = self._store.gpus.get(index)
            if rows is None:
                continue
            i, j = rows.span(lo, self._end)
            for p, v in zip(rows.pos[i:j], rows.util[i:j], strict=True):
                if v == v:
                    sums[p - lo] += v
        n = len(indexes) or 1
        return [s / n for s in sums]


class MetricsRing:
    """The newest ``capacity`` samples of one host; ``view`` is the history as of the last append."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._slack = max(1, self.capacity // 4)  # old samples are dropped in batches of this many
        self._store = _Store(0)
        self._count = 0
        self.view = MetricsHistory(self._store, 0, 0)

    def append(self, sample: MetricsSample) -> MetricsHistory:
        st = self._store
        if len(st.seq) >= self.capacity + self._slack:
            st = self._store = st.tail(self._count - self.capacity + 1)
        n = self._count
        st.seq.append(max(-_SEQ_MAX, min(_SEQ_MAX, int(sample.seq))))
        st.t.append(_num(sample.t))
        for g in sample.gpus:
            rows = st.gpus.get(g.index)
            if rows is None:
                rows = st.gpus[g.index] = _Rows()
            rows.pos.append(n)
            rows.util.append(_num(g.util_percent))
            rows.mem.append(_fraction(g.mem_used_mib, g.mem_total_mib))
            rows.temp.append(_num(g.temp_c))
        self._count = n + 1
        self.view = MetricsHistory(st, max(st.base, self._count - self.capacity), self._count)
        return self.view


EMPTY = MetricsRing(1).view

"""A job's metric series, kept beside its log (``series.json`` in the job dir), compact and bounded.

The log is read from where the last read stopped, at most READ_BYTES per call, and every metric a line
prints (``loss=0.5``, ``'eval_loss': 0.3``, ``val_acc: 0.9``) becomes a point ``[line, step, epoch, value]``:
the line number, and the last step and epoch printed so far (None where none was). A metric keeps at most
MAX_POINTS points: beyond, every other one is dropped and only every ``stride``-th new one is kept
(the last value, the lowest and the highest are always kept apart). Redraws of one step (tqdm's ``\\r``)
replace that step's point. Once the job has ended and its log is read to the end the file is ``done`` and
the log is never read again. The file also keeps the job's ``progress``: the last step/epoch/iteration any
line printed (``"step 1200"``) and where in the log (the crash-loop guard of remote_agent/jobs/restart.py
takes an attempt's progress from it: the log's whole reading, not a tail). Stdlib only, Python 3.8.
"""

import fcntl
import math
import os
import re
import threading
from typing import Any, Dict, List, Optional, Tuple

from ..fsutil import open_regular, read_json, write_json

SERIES_NAME = "series.json"
VERSION = 2
MAX_SERIES = 16  # metric names kept per job; later new names are ignored
MAX_POINTS = 2000  # points kept per metric before downsampling
READ_BYTES = 4 * 1024 * 1024  # log bytes read per call at most (~0.4 s; the reply says how far it got)
KEEP_S = 10.0  # the job's runner reads the new part of the log this often while the job runs
MAX_LINE = 4096  # bytes of one line read for metrics (a longer line's head)
MAX_NAME = 48


def _words(text: str) -> "frozenset[str]":
    return frozenset(text.split())


_LOWER = "loss err error mse mae rmse ppl perplexity wer cer nll"
_HIGHER = "acc accuracy f1 auc auroc precision recall iou miou map bleu rouge rougel psnr ssim dice top score reward r2"
_METRIC_WORDS = _words(_LOWER + " " + _HIGHER + " lr learning grad norm")
_NOT_METRICS = _words("epoch epochs step global_step iter iteration batch v_num total_flos num_epochs")
_CONFIG_TOKENS = _words("warmup steps epochs size num workers decay seed")
_TOKENS = re.compile(r"[_./\-]+")
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_KV = re.compile(r"['\"]?([A-Za-z][\w./-]{0,47})['\"]?\s*[:=]\s*(?:tensor\()?" + _NUMBER + r"(?![\w.])")
_STEP = re.compile(r"\b(?:global_step|step|iter(?:ation)?)['\"]?\s*[:=]?\s*(\d+)\b", re.I)
_EPOCH = re.compile(r"\bepoch['\"]?\s*[:=]?\s*(\d+(?:\.\d+)?)\b", re.I)
_COUNT = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")  # a tqdm bar's n/total
_SPLIT = re.compile(rb"\r\n|\r|\n")
#: Progress words (``step 1200``, ``Epoch: 3``, ``iter [40``), each its own pattern: a literal start is searched
#: for fast (one alternation with IGNORECASE costs seconds on 50 MB), on the lowercased bytes.
_PROGRESS = tuple(
    (word.decode(), re.compile(re.escape(word) + rb"\b\s*[:=#]?\s*\[?(\d{1,12})"))
    for word in (b"step", b"epoch", b"iteration", b"iter", b"it")
)


def last_progress(data: bytes) -> Optional[Tuple[int, str]]:
    """(offset, ``"step 1200"``) of the last step/epoch/iteration ``data`` prints, or None."""
    low, best = data.lower(), None  # type: bytes, Optional[Tuple[int, str]]
    for word, pattern in _PROGRESS:
        for m in pattern.finditer(low):
            at = m.start()
            if at and (low[at - 1 : at].isalnum() or low[at - 1 : at] == b"_"):
                continue  # inside a longer word ("substep 3", "bit 8")
            if best is None or at > best[0]:
                best = (at, "%s %d" % (word, int(m.group(1))))
    return best


def _position(text: str) -> Tuple[Optional[int], Optional[float]]:
    """The (step, epoch) a line says it is at: ``step 12``, ``'epoch': 1.5``, a bar's ``n/total`` (the step,
    or with ``Epoch 2`` on the line the fraction of that epoch: 2.5)."""
    epoch_m, count, step_m = _EPOCH.search(text), _COUNT.search(text), _STEP.search(text)
    step = int(step_m.group(1)) if step_m else None
    if step is None and count is not None and epoch_m is None:
        step = int(count.group(1))
    epoch = None
    if epoch_m is not None:
        epoch = float(epoch_m.group(1))
        if count is not None and int(count.group(2)) > 0 and "." not in epoch_m.group(1):
            epoch += int(count.group(1)) / int(count.group(2))  # "Epoch 2: 50/100": epoch 2.5
    return step, epoch


def is_metric(name: str) -> bool:
    """A metric-like name (its tokens hold a metric word and no setting's word)."""
    if name.lower() in _NOT_METRICS or len(name) > MAX_NAME:
        return False
    raw = _TOKENS.split(name.lower())
    tokens = set(raw).union(t.rstrip("0123456789") for t in raw)
    return _CONFIG_TOKENS.isdisjoint(tokens) and not _METRIC_WORDS.isdisjoint(tokens)


class Series:
    """One metric's bounded points, with its count, last, lowest and highest value."""

    __slots__ = ("points", "stride", "seen", "count", "last", "low", "high", "key")

    def __init__(self) -> None:
        self.points: List[List[Any]] = []
        self.key: Optional[Tuple[Optional[int], Optional[float]]] = None  # the last point's (step, epoch)
        self.stride, self.seen, self.count = 1, 0, 0
        self.last = self.low = self.high = 0.0

    def add(self, line: int, step: Optional[int], epoch: Optional[float], value: float) -> None:
        self.last = value
        self.low, self.high = (
            (value, value) if not self.count else (min(self.low, value), max(self.high, value))
        )
        self.count += 1
        if step is not None and (step, epoch) == self.key:  # a redraw of the same step
            tail = self.points[-1] if self.points else None
            if tail is not None and tail[1] == step and tail[2] == epoch:
                tail[0], tail[3] = line, value
            return  # (a step that downsampling skipped stays skipped, redrawn or not)
        self.key = (step, epoch)
        self.seen += 1
        if (self.seen - 1) % self.stride:
            return
        self.points.append([line, step, epoch, value])
        if len(self.points) > MAX_POINTS:
            self.points = self.points[::2]
            self.stride *= 2

    def to_json(self) -> Dict[str, Any]:
        return {"points": self.points, "stride": self.stride, "seen": self.seen, "count": self.count,
                "last": self.last, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, obj: Any) -> "Series":
        """A series back from the file; ValueError when it is not one (the file is then rebuilt)."""
        s = cls()
        pts = obj["points"]
        if not isinstance(pts, list) or len(pts) > MAX_POINTS:
            raise ValueError("points")
        for p in pts:
            if not (isinstance(p, list) and len(p) == 4 and isinstance(p[0], int)
                    and (p[1] is None or isinstance(p[1], int)) and (p[2] is None or isinstance(p[2], (int, float)))
                    and isinstance(p[3], (int, float))):
                raise ValueError("point")
        s.points = pts
        s.key = (pts[-1][1], pts[-1][2]) if pts else None
        s.stride, s.seen, s.count = int(obj["stride"]), int(obj["seen"]), int(obj["count"])
        s.last, s.low, s.high = float(obj["last"]), float(obj["low"]), float(obj["high"])
        if s.stride < 1:
            raise ValueError("stride")
        return s


class Extractor:
    """The series of one log, read on from ``offset``: the state kept in ``series.json``."""

    def __init__(self) -> None:
        self.offset, self.line, self.done = 0, 0, False
        self.step: Optional[int] = None
        self.epoch: Optional[float] = None
        self.series: Dict[str, Series] = {}
        self.progress: Optional[str] = None  # the last step/epoch printed, and its offset in the log
        self.progress_at = -1

    # --- lines ----------------------------------------------------------------------------------------------
    def feed_line(self, raw: bytes) -> None:
        self.line += 1
        if not (b"=" in raw or b":" in raw):
            return
        text = raw[:MAX_LINE].decode("utf-8", "replace")
        found = [(name, float(number)) for name, number in _KV.findall(text)]
        found = [(n, v) for n, v in found if math.isfinite(v) and (n in self.series or is_metric(n))]
        if not found:  # a line without metrics (another bar, a config dump) says nothing of the run's step
            return
        step, epoch = _position(text)
        if step is None and epoch is None:  # "val_loss: 0.3" after "step 100 loss=...": at step 100
            step, epoch = self.step, self.epoch
        self.step, self.epoch = step, epoch
        for name, value in found:
            if name in self.series or len(self.series) < MAX_SERIES:
                self.series.setdefault(name, Series()).add(self.line, step, epoch, value)

    def feed(self, data: bytes, final: bool) -> int:
        """Read the whole lines of ``data`` (all of it when ``final``), which starts at ``offset`` in the log;
        how many bytes were read."""
        end = 0
        for m in _SPLIT.finditer(data):
            self.feed_line(data[end : m.start()])
            end = m.end()
        if final or (end == 0 and len(data) >= READ_BYTES):  # no line end in a whole read: cut it
            if end < len(data):
                self.feed_line(data[end:])
            end = len(data)
        found = last_progress(data[:end])
        if found is not None:
            self.progress_at, self.progress = self.offset + found[0], found[1]
        return end

    # --- the file -------------------------------------------------------------------------------------------
    def to_json(self) -> Dict[str, Any]:
        return {"v": VERSION, "offset": self.offset, "line": self.line, "done": self.done, "step": self.step,
                "epoch": self.epoch, "progress": self.progress, "progress_at": self.progress_at,
                "series": {k: s.to_json() for k, s in self.series.items()}}

    @classmethod
    def load(cls, path: str) -> "Extractor":
        """The extractor kept at ``path``, or a new one when there is none or it is not one of ours."""
        ex = cls()
        obj = read_json(path)
        try:
            if not isinstance(obj, dict) or obj.get("v") != VERSION or len(obj["series"]) > MAX_SERIES:
                return ex
            ex.offset, ex.line, ex.done = int(obj["offset"]), int(obj["line"]), obj["done"] is True
            ex.step = None if obj["step"] is None else int(obj["step"])
            ex.epoch = None if obj["epoch"] is None else float(obj["epoch"])
            ex.progress = None if obj["progress"] is None else str(obj["progress"])[:MAX_NAME]
            ex.progress_at = int(obj["progress_at"])
            ex.series = {str(k)[:MAX_NAME]: Series.from_json(v) for k, v in obj["series"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()
        return ex


def _read(path: str, offset: int, size: int) -> bytes:
    fd = open_regular(path)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        chunks, want = [], size
        while want > 0:
            got = os.read(fd, min(want, 1024 * 1024))
            if not got:
                break
            chunks.append(got)
            want -= len(got)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _lock(job_dir: str) -> Optional[int]:
    """The series' lock taken (its fd: close it to let go), or None while another reader holds it."""
    fd = os.open(os.path.join(job_dir, ".series.lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def update(job_dir: str, ended: bool) -> Tuple[Extractor, int]:
    """Read the job's log on from where ``series.json`` stopped (READ_BYTES at most), keep the file, and
    return (the extractor, the log's size). An ended job read to its end is ``done``: never read again.
    One reader at a time (the job's runner, the agents): while another reads, the file is served as it is."""
    fd = _lock(job_dir)
    if fd is None:  # another reader is at it: what it last kept, without waiting for it
        return Extractor.load(os.path.join(job_dir, SERIES_NAME)), _size(os.path.join(job_dir, "output.log"))
    try:
        return _update(job_dir, ended)
    finally:
        os.close(fd)


def read_through(job_dir: str, max_reads: int) -> Optional[Extractor]:
    """The extractor once every whole line of the log is read (at most ``max_reads`` reads of READ_BYTES now);
    None when that takes more, or another reader holds the file: ask again later, it goes on from there."""
    fd = _lock(job_dir)
    if fd is None:
        return None
    try:
        before = -1
        for _ in range(max_reads):
            ex, size = _update(job_dir, False)
            if ex.offset >= size or ex.offset == before:  # all read, or only a line without its end is left
                return ex
            before = ex.offset
        return None
    finally:
        os.close(fd)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _update(job_dir: str, ended: bool) -> Tuple[Extractor, int]:
    path = os.path.join(job_dir, SERIES_NAME)
    ex = Extractor.load(path)
    log = os.path.join(job_dir, "output.log")
    size = _size(log)
    if ex.done:
        return ex, size
    if size < ex.offset:  # the log is not the one read before (truncated): read it again
        ex = Extractor()
    if size > ex.offset:
        data = _read(log, ex.offset, min(READ_BYTES, size - ex.offset))
        ex.offset += ex.feed(data, final=ended and ex.offset + len(data) >= size)
    ex.done = ended and ex.offset >= size
    write_json(path, ex.to_json())
    return ex, size


def result(job_id: str, ex: Extractor, size: int) -> Dict[str, Any]:
    """The ``logs.series`` reply of one job."""
    series = {name: {"points": s.points, "count": s.count, "last": s.last, "low": s.low, "high": s.high}
              for name, s in ex.series.items()}
    return {
        "job": job_id,
        "series": series,
        "offset": ex.offset,
        "size": size,
        "done": ex.done,
        "lines": ex.line,
    }


class SeriesKeeper(threading.Thread):
    """In the job's runner: keeps ``series.json`` up with the log while the job runs (every KEEP_S), so a
    long run's curves are there without anyone reading its whole log later."""

    def __init__(self, job_dir: str) -> None:
        super().__init__(name="series", daemon=True)
        self.job_dir, self.stopped = job_dir, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(KEEP_S):
            try:
                update(self.job_dir, ended=False)
            except (OSError, ValueError):  # a full disk, an unreadable log: the agent tries again on request
                pass

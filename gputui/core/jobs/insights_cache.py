"""The insights of ended jobs, kept on this machine: an ended job's log no longer moves, so its insights are
parsed once, not on every ``jobs``/``history`` call.

One text file in the user's cache dir: a header line that names the parser the entries were made by (a digest
of its sources, so a new parser starts from an empty cache), then a line per entry (key, when stored, the
insights as JSON), newest first. An entry is keyed by the host (config name, hostname, state dir), the job (id,
state, exit code, start and end times) and the size of the log its tail was read from. Bounded: at most
MAX_ENTRIES entries and MAX_FILE_BYTES bytes (the oldest dropped first), MAX_ENTRY_BYTES per entry (a bigger one
is not kept). A file that is unreadable, too big or not what this module writes is ignored and rewritten: the
cache can cost a parse, never an error.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gputui.core import paths
from gputui.core.insights import Hint, JobInsights
from gputui.core.session.model import JOB_ENDED_STATES, Job
from remote_agent.fsutil import open_regular

HEADER = "gputui-insights-cache 1"  # the first line, with the parser version
MAX_ENTRIES = 2000
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_ENTRY_BYTES = 64 * 1024


@functools.lru_cache(maxsize=1)
def parser_version() -> str:
    """A digest of gputui's version and the parser's sources: an upgrade or an edit changes it."""
    from gputui import __version__

    digest = hashlib.sha256(__version__.encode() + b"\0")
    core = Path(__file__).parent.parent
    for path in [*sorted((core / "insights").glob("*.py")), core / "jobs" / "records.py"]:
        digest.update(path.name.encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:  # an install without sources: the version stands for them
            pass
    return digest.hexdigest()[:32]


def cacheable(job: Job) -> bool:
    """Whether the job's log can no longer move: it ended, and the host recorded when."""
    return job.state in JOB_ENDED_STATES and job.ended_at is not None


def entry_key(host: Iterable[str | None], job: Job, log_size: int) -> str:
    fields = [*host, job.id, job.state, job.exit_code, job.started_at, job.ended_at, log_size]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:40]


class InsightsCache:
    """The cache file at ``path`` (default: ``insights.cache`` in the user's cache dir). Threads may share
    one: the jobs of several hosts are parsed at once, each host's in a thread."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else paths.cache_dir() / "insights.cache"
        self._entries: dict[str, tuple[float, str]] | None = None  # key -> (stored at, entry JSON)
        self._new: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> JobInsights | None:
        """The insights stored under ``key``; None when missing or not readable (then parse again)."""
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            found = self._new.get(key) or self._entries.get(key)
        if found is None:
            return None
        try:
            return decode(json.loads(found[1]))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return None

    def put(self, key: str, insights: JobInsights) -> None:
        text = json.dumps(encode(insights), separators=(",", ":"))
        if len(text) <= MAX_ENTRY_BYTES:
            with self._lock:
                self._new[key] = (time.time(), text)

    def save(self) -> None:
        """Merge the new entries into the file as it is now (another process may have written it), drop the
        oldest past the bounds, and replace the file atomically; a failure to write costs only the cache."""
        with self._lock:
            self._save()

    def _save(self) -> None:
        if not self._new:
            return
        merged = {**self._read(), **self._new}
        lines = [f"{HEADER} {parser_version()}".encode()]
        size = len(lines[0]) + 1
        for key, (at, text) in sorted(merged.items(), key=lambda kv: kv[1][0], reverse=True):
            line = f"{key}\t{at!r}\t{text}".encode()
            size += len(line) + 1
            if len(lines) > MAX_ENTRIES or size > MAX_FILE_BYTES:
                break
            lines.append(line)
        try:
            paths.write_atomic(self.path, b"\n".join(lines) + b"\n")
        except OSError:
            return
        self._entries = None  # read again when asked
        self._new.clear()

    def _read(self) -> dict[str, tuple[float, str]]:
        """The file's entries, (stored at, entry JSON) by key, read but not parsed (``get`` parses the ones
        asked for); empty when the file is missing, too big or not this parser's, a bad line skipped."""
        try:
            with os.fdopen(open_regular(str(self.path)), "rb") as f:  # not a FIFO, a symlink, a device
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError:
            return {}
        lines = raw.split(b"\n")
        if len(raw) > MAX_FILE_BYTES or lines[0] != f"{HEADER} {parser_version()}".encode():
            return {}
        out: dict[str, tuple[float, str]] = {}
        for line in lines[1 : MAX_ENTRIES + 1]:
            try:
                key, at, text = line.decode("ascii").split("\t")
                out[key] = (float(at), text)
            except ValueError:  # a torn or foreign line
                continue
        return out


def encode(ins: JobInsights) -> dict[str, Any]:
    """Every field as it is (NaN and infinities too, which ``json`` writes and reads back)."""
    return {
        "progress": ins.progress, "eta_s": ins.eta_s, "rate": ins.rate, "epoch": ins.epoch,
        "total_epochs": ins.total_epochs, "step": ins.step, "total_steps": ins.total_steps,
        "metrics": {k: dict(m) for k, m in ins.metrics.items()}, "loss_history": list(ins.loss_history),
        "hints": [[h.code, h.title, h.fix, h.line] for h in ins.hints], "last_line": ins.last_line,
        "phase": ins.phase,
    }


def decode(d: dict[str, Any]) -> JobInsights:
    """``encode``'s inverse; TypeError, KeyError, ValueError or AttributeError on anything else (a cache is data, like the rest)."""
    metrics = {_str(k): {_str(n): _num(v) for n, v in m.items()} for k, m in d["metrics"].items()}
    hints = []
    for h in d["hints"]:
        code, title, fix, line = h
        hints.append(Hint(_str(code), _str(title), _str(fix), _str(line)))
    return JobInsights(
        progress=_opt(_num, d["progress"]), eta_s=_opt(_num, d["eta_s"]), rate=_opt(_str, d["rate"]),
        epoch=_opt(_int, d["epoch"]), total_epochs=_opt(_int, d["total_epochs"]), step=_opt(_int, d["step"]),
        total_steps=_opt(_int, d["total_steps"]), metrics=metrics,
        loss_history=tuple(float(_num(v)) for v in d["loss_history"]), hints=tuple(hints),
        last_line=_str(d["last_line"]), phase=_opt(_str, d["phase"]),
    )


def _opt(kind: Any, v: Any) -> Any:
    return None if v is None else kind(v)


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError("not a string")
    return v


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("not an int")
    return v


def _num(v: Any) -> float | int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("not a number")
    return v

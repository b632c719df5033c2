"""The ended-jobs index: final records of ended jobs, so a fresh agent lists thousands of them fast.

``jobs/ended.jsonl`` holds one line per ended job (records of ended jobs never change), appended when the
job's status is first seen: ``<id> <inode> <mtime_ns> <crc32> <listing record as JSON>``. The inode and mtime are
its ``job.json``'s: a job dir deleted by hand and its id reused by a new job never shows the old record.
Records stay JSON text until someone needs the dict: a listing splices them into the reply unparsed.
The index is only a cache: a torn line (its CRC fails) or a stale one is skipped and the record read from the
job dir again.
"""

import json
import os
import threading
import zlib
from typing import Any, Dict, List, Optional, Tuple

from ..fsutil import open_regular, write_atomic

INDEX = "ended.jsonl"
Key = Tuple[int, int]


def job_key(job_dir: str) -> Key:
    """Identity of one job (its job.json, written once at start); OSError when there is no such job."""
    st = os.lstat(os.path.join(job_dir, "job.json"))
    if (st.st_mode & 0o170000) != 0o100000:  # not a regular file
        raise FileNotFoundError(os.path.join(job_dir, "job.json"))
    return st.st_ino, st.st_mtime_ns


def to_json(record: Dict[str, Any]) -> str:
    """The record as reply JSON (ASCII, compact)."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=True)


class Entry:
    """One ended job: its key, its record as JSON text, and the parsed dict once someone asked for it."""

    __slots__ = ("key", "text", "_record")

    def __init__(self, key: Key, text: str, record: Optional[Dict[str, Any]] = None) -> None:
        self.key, self.text, self._record = key, text, record

    def record(self) -> Dict[str, Any]:
        if self._record is None:
            self._record = json.loads(self.text)
        return dict(self._record)


class EndedIndex:
    """``ended.jsonl`` in memory. ``add`` queues a line, ``flush`` appends the queued lines."""

    def __init__(self, jobs_dir: str) -> None:
        self.path = os.path.join(jobs_dir, INDEX)
        self._entries: Dict[str, Entry] = {}
        self._pending: List[bytes] = []
        self._lock = threading.Lock()
        self._loaded = False

    def _load(self) -> None:
        lines = 0
        try:
            f = os.fdopen(open_regular(self.path), "rb")
        except OSError:
            return
        with f:
            for line in f:
                lines += 1
                parts = line.decode("ascii", "replace").rstrip("\n").split(" ", 4)
                try:
                    if len(parts) == 5 and int(parts[3]) == zlib.crc32(parts[4].encode("ascii")):
                        self._entries[parts[0]] = Entry((int(parts[1]), int(parts[2])), parts[4])
                except (ValueError, UnicodeEncodeError):
                    continue  # a torn line (a crash mid-append): the job dir has the truth
        if lines > 2 * len(self._entries) + 1000:  # duplicates from racing agents: compact
            try:
                write_atomic(self.path, b"".join(self._line(j, e) for j, e in self._entries.items()))
            except OSError:
                pass

    @staticmethod
    def _line(job_id: str, entry: Entry) -> bytes:
        text = entry.text.encode("ascii")
        head = "%s %d %d %d " % (job_id, entry.key[0], entry.key[1], zlib.crc32(text))
        return head.encode("ascii") + text + b"\n"

    def get(self, job_id: str, key: Optional[Key]) -> Optional[Entry]:
        """The entry when the index holds this very job (``key`` None: the caller knows it is)."""
        with self._lock:
            if not self._loaded:
                self._loaded = True
                self._load()
            entry = self._entries.get(job_id)
        return entry if entry is not None and key in (None, entry.key) else None

    def add(self, job_id: str, key: Key, record: Dict[str, Any], text: str) -> None:
        entry = Entry(key, text, record)
        with self._lock:
            known = self._entries.get(job_id)
            if known is not None and known.key == key:
                return  # another thread of this agent was first
            self._entries[job_id] = entry
            self._pending.append(self._line(job_id, entry))

    def flush(self) -> None:
        """Append the queued lines (each line in one write: concurrent appends never interleave)."""
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending:
                return
            try:
                fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            except OSError:
                return  # a read-only or full disk: the index just stays in memory
            try:
                for line in pending:
                    os.write(fd, line)
            except OSError:
                pass
            finally:
                os.close(fd)

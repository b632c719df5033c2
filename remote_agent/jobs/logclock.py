"""When a job's output was written: a small offset -> time index beside ``output.log``.

The runner appends ``"<offset> <unix time>"`` lines to ``output.times`` as it copies the job's output:
at most one a second at first, then sparser as the job ages (one per age/DENSITY seconds), and never more
than MAX_ENTRIES, so the file stays small (a few hundred KiB at most) for a job of any length. A reader
that parses the log later in one go (``gputui jobs --json``) learns from it how fast the job progressed,
as a parser that watched the log live does.
"""

import os
import time
from typing import Callable, List, Optional, Tuple

TIMES_NAME = "output.times"
MAX_ENTRIES = 20000
DENSITY = 1000  # entries per e-fold of the job's age, once it is older than DENSITY seconds
MAX_TIMES_BYTES = 1 << 20  # a longer file (not written by this runner) is read from its end only


class LogClock:
    """Records, now and then, how many bytes of output had been written at which time."""

    def __init__(self, path: str, offset: int, now: Callable[[], float] = time.time) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._offset, self._now = offset, now
        self._start = now()
        self._last: Optional[float] = None
        self._recorded = offset  # the offset of the last entry
        self._count = 0

    def wrote(self, n: int) -> None:
        self._offset += n
        now = self._now()
        if self._last is None or now - self._last >= max(1.0, (now - self._start) / DENSITY):
            self._record(now)

    def close(self) -> None:
        """The end of the output gets its time too."""
        if self._offset != self._recorded:
            self._record(self._now())
        os.close(self._fd)

    def _record(self, now: float) -> None:
        if self._count >= MAX_ENTRIES:
            return
        self._last, self._recorded = now, self._offset
        self._count += 1
        try:
            os.write(self._fd, ("%d %.3f\n" % (self._offset, now)).encode())
        except OSError:  # a full disk costs the index, never the job
            self._count = MAX_ENTRIES


def read_times(path: str, start: int, end: int, limit: int = 256) -> List[Tuple[int, float]]:
    """The entries with ``start <= offset <= end`` and the last one before ``start``, oldest first,
    thinned evenly to at most ``limit`` (the first and the last are kept)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - MAX_TIMES_BYTES))
            text = f.read(MAX_TIMES_BYTES).decode("ascii", "replace")
    except OSError:
        return []
    before: Optional[Tuple[int, float]] = None
    found: List[Tuple[int, float]] = []
    for line in text.splitlines():
        parts = line.split()
        try:
            entry = (int(parts[0]), float(parts[1]))
        except (IndexError, ValueError):
            continue  # a partial first or last line
        if entry[0] < start:
            before = entry
        elif entry[0] <= end:
            found.append(entry)
    if before is not None:
        found.insert(0, before)
    if len(found) > limit > 1:
        step = (len(found) - 1) / (limit - 1)
        found = [found[round(i * step)] for i in range(limit)]
    return found

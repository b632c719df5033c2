"""Recent metrics samples on disk, so that history survives the agent (which dies with its SSH channel).

``<state_dir>/metrics/ring.jsonl`` holds one sample per line with a ``seq`` that keeps counting across
agents. Exactly one agent per state dir samples into it: the one holding an exclusive ``flock`` on
``metrics/sampler.lock`` (the kernel drops the lock when that agent dies, however it dies). Every agent,
sampler or not, pushes to its own client what the ring holds past the client's last seq. The file is
compacted to the newest ``maxlen`` samples whenever it reaches twice that.

Writers append whole lines with one ``write()``; readers only use lines that end in a newline.
"""

import collections
import fcntl
import json
import os
import time
from typing import Any, Deque, Dict, List, Optional

from ..fsutil import ensure_private_dir, open_regular, write_atomic

RING_SAMPLES = 600  # ten minutes at 1 Hz
#: ``latest_sample`` reads at most this much of the ring's end (a sample line is a few KiB per GPU).
LATEST_READ_BYTES = 1024 * 1024


def ring_path(state_dir: str) -> str:
    return os.path.join(state_dir, "metrics", "ring.jsonl")


def latest_sample(state_dir: str, max_age_s: float) -> Optional[Dict[str, Any]]:
    """The ring's newest sample when an agent wrote it at most ``max_age_s`` ago, else None: what a job's
    runner or the watchdog reads instead of asking NVML themselves while an agent samples."""
    try:
        with os.fdopen(open_regular(ring_path(state_dir)), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LATEST_READ_BYTES))
            data = f.read(LATEST_READ_BYTES)
    except OSError:  # no ring (no agent sampled yet), or not a regular file
        return None
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    samples = _parse(lines[-1:])
    if not samples or not isinstance(samples[0].get("t"), (int, float)):
        return None
    return samples[0] if 0 <= time.time() - samples[0]["t"] <= max_age_s else None


def _dump(sample: Dict[str, Any]) -> bytes:
    return json.dumps(sample, separators=(",", ":")).encode("utf-8") + b"\n"


def _parse(lines: List[bytes]) -> List[Dict[str, Any]]:
    out = []
    for line in lines:
        try:
            sample = json.loads(line.decode("utf-8"))
        except ValueError:
            continue
        if isinstance(sample, dict) and isinstance(sample.get("seq"), int):
            out.append(sample)
    return out


class MetricsRing:
    """The sampler side (``try_own``, ``append``) and the reader side (``since``, ``last_seq``).

    Reader calls must not run concurrently with each other (the agent serialises its pushes).
    """

    def __init__(self, state_dir: str, maxlen: int = RING_SAMPLES) -> None:
        self.dir = ensure_private_dir(os.path.join(state_dir, "metrics"))
        self.path = ring_path(state_dir)
        self.maxlen = maxlen
        self._lock_fd: Optional[int] = None
        self._seq = 0
        self._lines = 0
        # reader state: which file (inode), how far read, the newest samples seen
        self._rd_ino: Optional[int] = None
        self._rd_off = 0
        self._rd_tail: Deque[Dict[str, Any]] = collections.deque(maxlen=maxlen)

    # --- sampler side -----------------------------------------------------------------------------------------
    @property
    def owner(self) -> bool:
        return self._lock_fd is not None

    def try_own(self) -> bool:
        """Become the sampler if no other live agent is; cheap to call every tick."""
        if self._lock_fd is not None:
            return True
        try:
            fd = open_regular(os.path.join(self.dir, "sampler.lock"), os.O_RDWR | os.O_CREAT)
        except OSError:  # e.g. a planted symlink: never sample into a file outside the state dir
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        data = self._read_file()
        cut = data.rfind(b"\n") + 1
        if cut < len(data):  # a write torn by a crash: drop the partial line before appending after it
            with os.fdopen(open_regular(self.path, os.O_RDWR), "r+b") as f:
                f.truncate(cut)
        samples = _parse(data[:cut].splitlines())
        self._seq = samples[-1]["seq"] if samples else 0
        self._lines = len(samples)
        self._lock_fd = fd  # last: ``owner`` turns true only once ``_seq`` is right
        return True

    def append(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        """Number ``sample`` (next seq) and add it; only the owner may call this."""
        if self._lock_fd is None:
            raise RuntimeError("not the sampler")
        self._seq += 1
        sample["seq"] = self._seq
        fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, _dump(sample))
        finally:
            os.close(fd)
        self._lines += 1
        if self._lines >= 2 * self.maxlen:
            keep = _parse(self._read_file().splitlines())[-self.maxlen :]
            write_atomic(self.path, b"".join(_dump(s) for s in keep))
            self._lines = len(keep)
        return sample

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- reader side ------------------------------------------------------------------------------------------
    def _read_file(self, offset: int = 0) -> bytes:
        try:
            with os.fdopen(open_regular(self.path), "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:  # missing, or not a regular file: no samples
            return b""

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if st.st_ino != self._rd_ino or st.st_size < self._rd_off:  # compacted (renamed) or replaced
            self._rd_ino, self._rd_off = st.st_ino, 0
            self._rd_tail.clear()
        data = self._read_file(self._rd_off)
        cut = data.rfind(b"\n") + 1
        if cut:
            self._rd_off += cut
            self._rd_tail.extend(_parse(data[:cut].splitlines()))

    def since(self, seq: int) -> List[Dict[str, Any]]:
        """Samples newer than ``seq``, oldest first."""
        self._refresh()
        return [s for s in self._rd_tail if s["seq"] > seq]

    def last_seq(self) -> int:
        self._refresh()
        return self._rd_tail[-1]["seq"] if self._rd_tail else 0

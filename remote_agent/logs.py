"""Job logs served from a byte offset: one-shot reads and follows that push chunks as the file grows."""

import os
import threading
import time
from typing import Callable, Dict, Optional

from .protocol import LOG_CHUNK_BYTES, LOG_FRAME_BYTES, b64


def read_chunk(path: str, offset: int, max_bytes: int = LOG_CHUNK_BYTES) -> "tuple[bytes, int]":
    """Bytes from ``offset`` (at most ``max_bytes``) and the file's current size."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            return f.read(max(0, min(max_bytes, size - offset))), size
    except FileNotFoundError:
        return b"", 0


def tail_offset(path: str, lines: int, block: int = 65536) -> int:
    """Offset where the last ``lines`` lines of the file start (a final line without newline counts)."""
    try:
        with open(path, "rb") as f:
            end = pos = os.fstat(f.fileno()).st_size
            if lines <= 0 or end == 0:
                return end
            f.seek(end - 1)
            newlines = -1 if f.read(1) == b"\n" else 0  # the file's last newline ends the last line
            while pos > 0:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step)
                idx = len(data)
                while True:
                    idx = data.rfind(b"\n", 0, idx)
                    if idx < 0:
                        break
                    newlines += 1
                    if newlines == lines:
                        return pos + idx + 1
            return 0
    except FileNotFoundError:
        return 0


class Follow(threading.Thread):
    """Pushes a job log's new bytes from ``offset`` on, until the job has ended and every byte was sent.

    ``send(kind, data)`` emits events; ``job_ended()`` tells whether the job's status is written;
    ``room(stopped)`` waits until the client can take another event and says how many bytes it may carry
    (flow control; 0 means stop). A log that shrinks or is replaced is reported as a gap (``reset``) and
    followed again from its start.
    """

    def __init__(
        self,
        job_id: str,
        path: str,
        offset: int,
        send: Callable[[str, Dict], None],
        job_ended: Callable[[], Optional[Dict]],
        poll_s: float = 0.1,
        room: Callable[[threading.Event], int] = lambda stopped: LOG_FRAME_BYTES,
    ) -> None:
        super().__init__(name="follow-%s" % job_id, daemon=True)
        self.job_id, self.path, self.offset = job_id, path, max(0, int(offset))
        self.send, self.job_ended, self.poll_s, self.room = send, job_ended, poll_s, room
        self.stopped = threading.Event()
        self._inode: Optional[int] = None

    def stop(self) -> None:
        self.stopped.set()

    def _check_replaced(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        replaced = self._inode is not None and st.st_ino != self._inode
        self._inode = st.st_ino
        if replaced or st.st_size < self.offset:
            reason = "replaced" if replaced else "truncated"
            self.send(
                "log", {"job": self.job_id, "offset": 0, "b64": "", "reset": reason, "lost_from": self.offset}
            )
            self.offset = 0

    def run(self) -> None:
        while not self.stopped.is_set():
            self._check_replaced()
            limit = self.room(self.stopped)
            if not limit:
                return
            data, size = read_chunk(self.path, self.offset, limit)
            if data:
                self.send("log", {"job": self.job_id, "offset": self.offset, "b64": b64(data)})
                self.offset += len(data)
                continue
            ended = self.job_ended()
            if ended is not None:
                # The runner writes status.json after its last log write: one more read catches every byte.
                data, size = read_chunk(self.path, self.offset, limit)
                if not data:
                    self.send("log_end", dict(ended, job=self.job_id, offset=self.offset))
                    return
                continue
            time.sleep(self.poll_s)

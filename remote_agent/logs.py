"""Job logs served from a byte offset: one-shot reads and follows that push chunks as the file grows."""

import os
import threading
from typing import BinaryIO, Callable, Dict, Optional

from .fsutil import open_regular
from .jobs import JobError
from .protocol import LOG_CHUNK_BYTES, LOG_FRAME_BYTES, b64


def _open_log(path: str) -> BinaryIO:
    """The log for reading; JobError naming the problem when it is a dir, FIFO, link or unreadable."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise JobError("cannot read output.log: %s" % (exc.strerror or exc)) from None


def read_chunk(path: str, offset: int, max_bytes: int = LOG_CHUNK_BYTES) -> "tuple[bytes, int]":
    """Bytes from ``offset`` (at most ``max_bytes``) and the file's current size."""
    try:
        with _open_log(path) as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            return f.read(max(0, min(max_bytes, size - offset))), size
    except FileNotFoundError:
        return b"", 0
    except OSError as exc:  # EIO, ESTALE... while reading
        raise JobError("cannot read output.log: %s" % (exc.strerror or exc)) from None


def tail_offset(path: str, lines: int, block: int = 65536) -> int:
    """Offset where the last ``lines`` lines of the file start (a final line without newline counts)."""
    try:
        with _open_log(path) as f:
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
    except OSError as exc:
        raise JobError("cannot read output.log: %s" % (exc.strerror or exc)) from None


class Follow(threading.Thread):
    """Pushes a job log's new bytes from ``offset`` on, until the job has ended and every byte was sent.

    ``send(kind, data)`` emits events; ``job_ended()`` tells whether the job's status is written;
    ``room(stopped)`` waits until the client can take another event and says how many bytes it may carry
    (flow control; 0 means stop). A log that shrinks, is replaced or deleted is reported as a gap (``reset``)
    and followed again from its start; one that cannot be read (a dir, a FIFO, EIO...) gets an ``error``
    notice and is retried until the job ends, when ``log_end`` carries the error.
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
        self._problem: Optional[str] = None  # why the log cannot be read now, as last told to the client

    def stop(self) -> None:
        self.stopped.set()

    def _check_replaced(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._inode is not None:  # deleted while followed: what the job writes now is lost
                self._reset("deleted")
                self._inode = None
            return
        replaced = self._inode is not None and st.st_ino != self._inode
        self._inode = st.st_ino
        if replaced or st.st_size < self.offset:
            self._reset("replaced" if replaced else "truncated")

    def _reset(self, reason: str) -> None:
        self.send(
            "log", {"job": self.job_id, "offset": 0, "b64": "", "reset": reason, "lost_from": self.offset}
        )
        self.offset = 0

    def _notice(self, problem: Optional[str]) -> None:
        """Tell the client once about a log that cannot be read (a dir, a FIFO, EIO, ESTALE...)."""
        if problem is not None and problem != self._problem:
            self.send("log", {"job": self.job_id, "offset": self.offset, "b64": "", "error": problem})
        self._problem = problem

    def run(self) -> None:
        try:
            self._follow()
        except Exception as exc:  # never leave the client waiting for a follow that died
            self.send("log_end", {"job": self.job_id, "offset": self.offset, "job_state": None,
                                  "exit_code": None, "error": "log follow failed: %r" % exc})  # fmt: skip

    def _read(self, limit: int) -> Optional[bytes]:
        """New bytes (maybe none), or None while the log cannot be read (the client was told why)."""
        try:
            self._check_replaced()
            data, _ = read_chunk(self.path, self.offset, limit)
        except (JobError, OSError) as exc:
            self._notice(str(exc))
            return None
        self._notice(None)
        return data

    def _follow(self) -> None:
        while not self.stopped.is_set():
            limit = self.room(self.stopped)
            if not limit:
                return
            data = self._read(limit)
            if data:
                self.send("log", {"job": self.job_id, "offset": self.offset, "b64": b64(data)})
                self.offset += len(data)
                continue
            try:
                ended = self.job_ended()
            except JobError as exc:  # the job dir itself went away
                self._notice(str(exc))
                ended = {"job_state": None, "exit_code": None, "error": str(exc)}
            if ended is not None:
                # The runner writes status.json after its last log write: one more read catches every byte.
                data = self._read(limit)
                if not data:
                    end = dict(ended, job=self.job_id, offset=self.offset)
                    if self._problem is not None:
                        end["error"] = self._problem
                    self.send("log_end", end)
                    return
                continue
            self.stopped.wait(self.poll_s if data is not None else 1.0)

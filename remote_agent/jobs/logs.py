"""Job logs served from a byte offset: one-shot reads and follows that push chunks as the file grows."""

import os
import select
import threading
from typing import BinaryIO, Callable, Dict, Optional

from ..fsutil import open_regular
from ..protocol import LOG_CHUNK_BYTES, LOG_FRAME_BYTES, b64
from .store import JobError

#: A follow with nothing new re-reads at least this often even when the file watch saw nothing.
QUIET_CHECK_S = 5.0
#: Shortest time between two reads of a busy log: writes that come close together go out together.
MIN_GAP_S = 0.05
#: Without a file watch: a quiet log is polled this often at first, backing off to POLL_MAX_S.
POLL_MIN_S, POLL_MAX_S = 0.1, 1.0

_IN_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
#: IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF,
#: IN_MOVE_SELF: a write to the log, its status file renamed into place, the log replaced or deleted.
_IN_EVENTS = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800


class DirWatch:
    """Wakes a waiter when anything in one directory changes: Linux inotify through ctypes.

    ``DirWatch.open(path)`` is None where inotify is unavailable (not Linux, no libc, out of watches).
    """

    def __init__(self, fd: int, wake_r: int, wake_w: int) -> None:
        self._fd, self._wake_r, self._wake_w = fd, wake_r, wake_w
        self._lock = threading.Lock()  # wake() from another thread never writes to a closed (reused) fd
        self._closed = False

    @classmethod
    def open(cls, path: str) -> "Optional[DirWatch]":
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(path), _IN_EVENTS) < 0:
            os.close(fd)
            return None
        wake_r, wake_w = os.pipe()
        return cls(fd, wake_r, wake_w)

    def wait(self, timeout: float) -> None:
        """Until something in the directory changed, ``wake()`` was called, or ``timeout`` passed."""
        ready, _, _ = select.select([self._fd, self._wake_r], [], [], timeout)
        if self._fd in ready:
            try:
                while os.read(self._fd, 65536):  # the events themselves do not matter: the caller re-reads
                    pass
            except BlockingIOError:
                pass

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                os.write(self._wake_w, b"x")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in (self._fd, self._wake_r, self._wake_w):
                os.close(fd)


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

    Between reads it waits on the job dir (``DirWatch``): a quiet log costs no polling. Without inotify it
    polls, backing off from POLL_MIN_S to POLL_MAX_S while nothing comes.
    """

    def __init__(
        self,
        job_id: str,
        path: str,
        offset: int,
        send: Callable[[str, Dict], None],
        job_ended: Callable[[], Optional[Dict]],
        room: Callable[[threading.Event], int] = lambda stopped: LOG_FRAME_BYTES,
        watch: bool = True,
    ) -> None:
        super().__init__(name="follow-%s" % job_id, daemon=True)
        self.job_id, self.path, self.offset = job_id, path, max(0, int(offset))
        self.send, self.job_ended, self.room = send, job_ended, room
        self.stopped = threading.Event()
        self._watch = DirWatch.open(os.path.dirname(path) or ".") if watch else None
        self._poll_s = POLL_MIN_S
        self._inode: Optional[int] = None
        self._problem: Optional[str] = None  # why the log cannot be read now, as last told to the client

    def stop(self) -> None:
        self.stopped.set()
        if self._watch is not None:
            self._watch.wake()

    def _wait(self) -> None:
        """Until the log may have changed: the dir watch fired (or QUIET_CHECK_S passed), else a backoff poll."""
        if self._watch is None:
            self.stopped.wait(self._poll_s)
            self._poll_s = min(POLL_MAX_S, self._poll_s * 2)
            return
        self._watch.wait(QUIET_CHECK_S)
        self.stopped.wait(MIN_GAP_S)  # let a burst of writes finish: one read for all of them

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
                                  "exit_code": None, "error": "log follow failed: %r" % exc})
        finally:
            if self._watch is not None:
                self._watch.close()

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
                self._poll_s = POLL_MIN_S
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
            if data is None:  # unreadable now: retried every second
                self.stopped.wait(1.0)
            elif not self.stopped.is_set():
                self._wait()

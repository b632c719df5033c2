"""Flow control for the agent's output: log events go out only as fast as the client consumes them.

The client allows bytes (counted from the end of the hello frame) with ``flow.credit`` frames; every frame
the agent writes counts against that allowance, but only bulk senders (log follows) wait for room.
"""

import threading

from .protocol import FLOW_MIN_ROOM, FLOW_WINDOW, LOG_FRAME_BYTES

#: Room kept for a log event's JSON around its base64 (job id, offset, keys).
_FRAME_OVERHEAD = 512


class Credit:
    def __init__(self, window: int = FLOW_WINDOW) -> None:
        self._cond = threading.Condition()
        self.sent = 0  # bytes written since the hello frame
        self.allowed = window

    def restart(self) -> None:
        """Start counting (right after the hello frame)."""
        with self._cond:
            self.sent = 0

    def sent_bytes(self, n: int) -> None:
        with self._cond:
            self.sent += n

    def grant(self, upto: int) -> None:
        """The client allows ``upto`` bytes in all; an older, smaller grant arriving late changes nothing."""
        with self._cond:
            if upto > self.allowed:
                self.allowed = upto
                self._cond.notify_all()

    def log_room(self, stopped: threading.Event) -> int:
        """Wait for room for a log event; return how many raw log bytes it may carry (0 once ``stopped``)."""
        with self._cond:
            while self.allowed - self.sent < FLOW_MIN_ROOM:
                if stopped.is_set():
                    return 0
                self._cond.wait(0.2)
            room = self.allowed - self.sent
        # A quarter of the room: several frames are on their way at once, and on a slow link (small room)
        # each is small, so whole frames keep arriving and a cut one costs little.
        frame = max(FLOW_MIN_ROOM, room // 4)
        return min(LOG_FRAME_BYTES, (frame - _FRAME_OVERHEAD) * 3 // 4)

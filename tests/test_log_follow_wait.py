"""A live follow waits on the log's directory: a quiet log costs (almost) no reads, a new line still comes."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from remote_agent.jobs import logs

QUIET_S = 1.5  # a follow polling at 10 Hz would read 15 times in this quiet stretch


class Events:
    def __init__(self) -> None:
        self.data = bytearray()
        self.changed = threading.Condition()

    def send(self, kind: str, data: dict[str, Any]) -> None:
        with self.changed:
            if kind == "log":
                self.data += base64.b64decode(data["b64"])
            self.changed.notify_all()

    def wait_for(self, want: bytes, timeout: float = 30.0) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: bytes(self.data) == want, timeout), bytes(self.data)


@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "backoff-poll"])
def test_a_quiet_follow_reads_rarely_and_still_delivers_a_new_line(tmp_path: Path, watch: bool) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(b"first line\n")
    events = Events()
    follow = logs.Follow("1", str(log), 0, events.send, lambda: None, watch=watch)
    if watch:
        assert follow._watch is not None, "inotify is available on Linux"
    reads = []
    read = follow._read
    follow._read = lambda limit: reads.append(limit) or read(limit)  # type: ignore[method-assign]
    follow.start()
    try:
        events.wait_for(b"first line\n")
        before = len(reads)
        time.sleep(QUIET_S)  # the quiet stretch itself (the assert below holds however slow the machine)
        quiet_reads = len(reads) - before
        assert quiet_reads <= (1 if watch else 6), quiet_reads
        with log.open("ab") as f:
            f.write(b"second line\n")
        events.wait_for(b"first line\nsecond line\n")
    finally:
        follow.stop()
        follow.join(10)
    assert not follow.is_alive()

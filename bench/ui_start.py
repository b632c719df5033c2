"""App start: launch -> first frame, beside a minimal Textual app (a DataTable and a Footer) in the same run;
and launch -> the local host shown up.

Run: python bench/ui_start.py [--runs 9]. Each run starts a fresh process on a pseudo-terminal (160x48) and
reads what it draws: the first frame is the first output that shows the table's "Host" column header (both
apps have one); the local host is shown up when its row's "● up" or "● idle" arrives. gputui runs as
users start it, the `gputui` script pip installed beside this python (else `python3 -m gputui`), importing
this tree (PYTHONPATH), from a throwaway HOME with no config (the local host only), with its bytecode cached
and its agent unpacked (a warm-up run of each does that); runs alternate between the apps. No asserts.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_FRAME = re.compile(rb"Host")
HOST_UP = re.compile("● (up|idle)".encode())
TIMEOUT_S = 20.0

MINIMAL_APP = """
from textual.app import App
from textual.widgets import DataTable, Footer

class Minimal(App):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self):
        yield DataTable()
        yield Footer()

    def on_mount(self):
        table = self.query_one(DataTable)
        table.add_columns("Host", "State", "GPUs", "Util")
        table.add_row("local", "connecting", "-", "-")

Minimal().run()
"""


def launch(argv: list[str], marks: dict[str, re.Pattern[bytes]], env: dict[str, str]) -> dict[str, float]:
    """Start ``argv`` on a fresh pseudo-terminal; seconds from launch to each mark's first appearance."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
    t0 = time.perf_counter()
    proc = subprocess.Popen(  # cwd: `python -m gputui` imports from the current directory first
        argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=ROOT
    )
    os.close(slave)
    seen: dict[str, float] = {}
    out = b""
    try:
        while len(seen) < len(marks) and time.perf_counter() - t0 < TIMEOUT_S:
            if not select.select([master], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:
                break
            now = time.perf_counter()
            out = (out + chunk)[-(1 << 20) :]
            for name, pattern in marks.items():
                if name not in seen and pattern.search(out):
                    seen[name] = now - t0
        os.write(master, b"q")
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:  # keep reading: a full pty blocks it
            if select.select([master], [], [], 0.1)[0]:
                try:
                    os.read(master, 1 << 16)
                except OSError:
                    break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        os.close(master)
    missing = set(marks) - set(seen)
    if missing:
        raise SystemExit(f"{argv[-1][:40]!r}: never saw {sorted(missing)} within {TIMEOUT_S:g} s")
    return seen


def gputui_argv() -> list[str]:
    """The `gputui` script beside this python (what a user runs: no runpy); else ``python -m gputui``."""
    script = Path(sys.executable).parent / "gputui"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gputui"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "GPUTUI_", "TEXTUAL"))}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(HOME=home, PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="160", LINES="48")
        minimal = ([sys.executable, "-c", MINIMAL_APP], {"frame": FIRST_FRAME})
        gputui = (gputui_argv(), {"frame": FIRST_FRAME, "up": HOST_UP})
        for argv, marks in (minimal, gputui):
            launch(argv, marks, env)  # warm-up: bytecode written, agent unpacked
        peer: list[float] = []
        frame: list[float] = []
        up: list[float] = []
        for _ in range(args.runs):
            peer.append(launch(*minimal, env=env)["frame"])
            seen = launch(*gputui, env=env)
            frame.append(seen["frame"])
            up.append(seen["up"])
    p, f, u = (statistics.median(x) * 1000 for x in (peer, frame, up))
    print(
        f"{'launch -> first frame, minimal Textual app':44s} median {p:6.0f} ms  min {min(peer) * 1000:6.0f} ms"
    )
    print(f"{'launch -> first frame, gputui':44s} median {f:6.0f} ms  min {min(frame) * 1000:6.0f} ms  "
          f"{f / p:4.2f}x the minimal app")  # fmt: skip
    print(f"{'launch -> local host shown up, gputui':44s} median {u:6.0f} ms  min {min(up) * 1000:6.0f} ms")
    print(f"runs: {args.runs}, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

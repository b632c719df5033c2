"""App start: launch -> first frame, beside a minimal Textual app (a DataTable and a Footer) in the same run;
launch -> the local host shown up; with a local-only config and with SSH hosts in the config.

Run: python bench/ui_start.py [--runs 9] [--no-ssh]. Each run starts a fresh process on a pseudo-terminal
(160x48) and reads what it draws (escape sequences stripped): the first frame is the first output that shows
the table's "Host" column header (both apps have one), up to the first 10 ms pause in the output; the local
host is shown up when its row reads "● up" or "● idle"; every pane is drawn when the GPU processes table's
title shows (for an app that would draw the hosts first and its other panes after: one tried that); the CPU to the first frame is what the app's main
thread ran until the bench read the frame, which a loaded machine barely moves. gputui runs as users start it, the `gputui` script
pip installed beside this python (else `python3 -m gputui`), importing this tree (PYTHONPATH), with its
bytecode cached and its agent unpacked (a warm-up run of each does that), over two configs:

- local-only: a throwaway HOME with no config (the fleet is the local host);
- SSH hosts: ``local``, ``box`` (the loopback sshd of the tests, bench/sshbox.py) and ``hung`` (a port that
  takes the TCP connection and never says a word, like a blackholed address); each run reports whether the
  first frame shows both SSH rows ``◌ connecting``.

Each round runs every app once, in a shuffled order. No asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pty
import random
import re
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
FIRST_FRAME = re.compile("Host")
HOST_UP = re.compile("local +● (up|idle)")
PANES = re.compile("GPU processes")  # the host's pane drawn
BOX_UP = re.compile(r"\bbox +● (up|idle)")  # the SSH host's row live, over the app's own connection
SSH_CONNECTING = {name: re.compile(rf"\b{name} +◌ connecting") for name in ("box", "hung")}
ESCAPE = re.compile(rb"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|[()][0-9A-B]|[=>78])")
FRAME_PAUSE_S = 0.01
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


class Plain:
    """The text a program drew, its escape sequences stripped as the bytes arrive."""

    def __init__(self) -> None:
        self.text, self._held = "", b""

    def feed(self, chunk: bytes) -> None:
        data = self._held + chunk
        cut = data.rfind(b"\x1b")
        if cut != -1 and len(data) - cut < 32 and not ESCAPE.match(data, cut):  # a sequence split across reads
            data, self._held = data[:cut], data[cut:]
        else:
            self._held = b""
        self.text = (self.text + ESCAPE.sub(b"", data).decode("utf-8", "replace"))[-(1 << 20) :]


def launch(argv: list[str], marks: dict[str, re.Pattern[str]], env: dict[str, str]) -> tuple[dict[str, float], str]:
    """Start ``argv`` on a fresh pseudo-terminal: seconds from launch to each mark's first appearance (and the
    process's CPU seconds by the first frame: "cpu"), and the text of the first frame (the output from the
    "frame" mark's read to the first pause)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
    t0 = time.perf_counter()
    proc = subprocess.Popen(  # cwd: `python -m gputui` imports from the current directory first
        argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=env.get("PYTHONPATH", ROOT)
    )
    os.close(slave)
    seen: dict[str, float] = {}
    plain = Plain()
    frame_from, frame = -1, ""
    try:
        while (marks.keys() - seen.keys() or not frame) and time.perf_counter() - t0 < TIMEOUT_S:
            if not select.select([master], [], [], FRAME_PAUSE_S if frame_from >= 0 and not frame else 0.5)[0]:
                if frame_from >= 0 and not frame:
                    frame = plain.text[frame_from:]
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:
                break
            now = time.perf_counter()
            before = len(plain.text)
            plain.feed(chunk)
            for name, pattern in marks.items():
                if name not in seen and pattern.search(plain.text, max(0, before - 4096)):
                    seen[name] = now - t0
                    if name == "frame":
                        frame_from = max(0, before - 4096)
                        seen["cpu"] = cpu_s(proc.pid)
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
    missing = marks.keys() - seen.keys()
    if missing:
        raise SystemExit(f"{argv[-1][:40]!r}: never saw {sorted(missing)} within {TIMEOUT_S:g} s")
    return seen, frame


def cpu_s(pid: int) -> float:
    """Seconds of CPU the main thread of process ``pid`` has run so far (/proc/PID/task/PID/schedstat): unlike
    the wall clock, barely moved by the other processes of a loaded machine. The main thread builds the first
    frame; other threads (gputui's agent start before it, the SSH stack's load after it) are left out."""
    with contextlib.suppress(OSError):
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9
    return float("nan")


def gputui_argv() -> list[str]:
    """The `gputui` script beside this python (what a user runs: no runpy); else ``python -m gputui``."""
    script = Path(sys.executable).parent / "gputui"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gputui"]


def clean_env(base: dict[str, str], home: str | Path, tree: Path = ROOT) -> dict[str, str]:
    """The environment of a run from ``home``, importing gputui from ``tree``."""
    env = {k: v for k, v in base.items() if not k.startswith(("XDG_", "GPUTUI_", "TEXTUAL"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(HOME=str(home), PYTHONPATH=str(tree), TERM="xterm-256color", COLUMNS="160", LINES="48")
    return env


@contextlib.contextmanager
def ssh_home() -> Iterator[Path]:
    """A HOME whose config holds ``local``, ``box`` (a loopback sshd) and ``hung``."""
    from sshbox import ssh_box

    with socket.socket() as hung:  # accepts the TCP connection (the kernel's backlog), never speaks
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        with tempfile.TemporaryDirectory() as state:
            extra = (f'[hosts.local]\ntransport = "local"\nremote_dir = "{state}"\n'
                     f'[hosts.hung]\nhost = "127.0.0.1"\nport = {hung.getsockname()[1]}\n')
            with ssh_box(extra_config=extra) as box:
                yield box.home


class Series:
    """One app's runs: the seconds to each mark, and how many first frames showed the SSH rows connecting."""

    def __init__(
        self, name: str, argv: list[str], marks: dict[str, re.Pattern[str]], env: dict[str, str], ssh: bool = False
    ) -> None:
        self.name, self.argv, self.marks, self.env, self.ssh = name, argv, marks, env, ssh
        self.times: dict[str, list[float]] = {m: [] for m in [*marks, "cpu"]}
        self.connecting = 0

    def run(self, record: bool = True) -> None:
        seen, frame = launch(self.argv, self.marks, self.env)
        if record:
            for mark, took in seen.items():
                self.times[mark].append(took)
            self.connecting += all(p.search(frame) for p in SSH_CONNECTING.values())

    def median_ms(self, mark: str) -> float:
        return statistics.median(self.times[mark]) * 1000

    def line(self, label: str, mark: str, peer: Series | None = None, peer_mark: str = "frame") -> str:
        """One figure: median and min of ``mark``, and the median over ``peer``'s median ``peer_mark``."""
        text = f"{label + ', ' + self.name:66s} median {self.median_ms(mark):4.0f} ms  min {min(self.times[mark]) * 1000:4.0f} ms"
        return text + (f"  {self.median_ms(mark) / peer.median_ms(peer_mark):4.2f}x the minimal app" if peer else "")


SERVED_ASKS = """
import statistics, sys, time
from pathlib import Path
from gputui.service import client
config = client.config_path(None)
took = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    reply = client.ask(config, {"op": "status", "form": "json", "host": None, "columns": 160})
    took.append(time.perf_counter() - t)
    assert reply is not None and reply.get("rc") is not None, reply
print(statistics.median(took) * 1000, min(took) * 1000)
"""


def warm_service(env: dict[str, str]) -> None:
    """A session service for ``env``'s config, its hosts connected: a first status starts it (when it ends), a
    second connects them."""
    subprocess.run([*gputui_argv(), "status", "--json"], env=env, capture_output=True)
    deadline = time.monotonic() + 30
    while not subprocess.run([*gputui_argv(), "service", "--json"], env=env, capture_output=True,
                             text=True).stdout.startswith("{"):
        if time.monotonic() > deadline:
            raise SystemExit("no session service came up")
    subprocess.run([*gputui_argv(), "status", "--json"], env=env, capture_output=True)


def served_status_ms(env: dict[str, str], runs: int) -> tuple[float, float]:
    """(median, min) ms of the warm session service's ``status --json`` answer for ``env``'s config, asked from a
    running python."""
    out = subprocess.run([sys.executable, "-c", SERVED_ASKS, str(runs)], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--no-ssh", action="store_true", help="the local-only config only")
    ap.add_argument("--peer", type=Path, action="append", default=[],
                    help="another checkout (e.g. the commit before) whose gputui runs in the same rounds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home, contextlib.ExitStack() as stack:
        env = clean_env(dict(os.environ), home)
        minimal = Series("minimal Textual app", [sys.executable, "-c", MINIMAL_APP], {"frame": FIRST_FRAME}, env)
        marks = {"frame": FIRST_FRAME, "up": HOST_UP, "panes": PANES}
        ssh = None if args.no_ssh else stack.enter_context(ssh_home())
        series = [minimal]
        for tree in [ROOT, *(p.resolve() for p in args.peer)]:
            name = "gputui" if tree == ROOT else f"gputui of {tree.name}"
            series.append(Series(f"{name}, local-only config", gputui_argv(), marks, clean_env(env, home, tree)))
            if ssh is not None:
                ssh_env = clean_env(env, ssh, tree)
                series.append(Series(f"{name}, local + 2 SSH hosts", gputui_argv(), {**marks, "box up": BOX_UP},
                                     ssh_env, ssh=True))
                # the same, a session service of that config and tree running (its own runtime dir)
                served_env = {**ssh_env, "XDG_RUNTIME_DIR": stack.enter_context(tempfile.TemporaryDirectory())}
                stack.callback(subprocess.run, [*gputui_argv(), "service", "stop"], env=served_env, capture_output=True)
                warm_service(served_env)
                series.append(Series(f"{name}, local + 2 SSH hosts, service warm", gputui_argv(),
                                     {**marks, "box up": BOX_UP}, served_env, ssh=True))
        for s in series:
            s.run(record=False)  # warm-up: bytecode written, agent unpacked
        order = random.Random(31)
        for _ in range(args.runs):  # every app once a round, in a shuffled order: no app always follows another
            for s in order.sample(series, len(series)):
                s.run()
        warm = [s for s in series if s.name.endswith("service warm")]
        served = served_status_ms(warm[0].env, args.runs) if warm else None
    print(minimal.line("launch -> first frame", "frame"))
    print(minimal.line("CPU to the first frame", "cpu"))
    for s in series[1:]:
        print(s.line("launch -> first frame", "frame", minimal))
        print(s.line("launch -> local host shown up", "up", minimal))
        print(s.line("launch -> every pane drawn", "panes", minimal))
        print(s.line("CPU to the first frame", "cpu", minimal, "cpu"))
    for s in series:
        if s.ssh:
            print(s.line("launch -> box (SSH) shown up", "box up", minimal))
            print(f"first frames showing box and hung '◌ connecting', {s.name}: {s.connecting} of {args.runs}")
    if served is not None:
        print(f"a warm session service's answer to status --json for the same config, asked from a running "
              f"python (what the app would wait after its first frame): median {served[0]:.0f} ms, min {served[1]:.0f} ms")
    print(f"runs: {args.runs} each, interleaved; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

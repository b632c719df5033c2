"""How much the app costs while it watches a fleet: CPU, memory and key-to-frame latency.

Run: python bench/ui_tick.py [--seconds 10]. Each scenario runs in a fresh process: the real app with
its real terminal driver on a pseudo-terminal (160x48), fed by a synthetic fleet of N hosts x 8 GPUs that
publishes one HostSnapshot per host per second through the app's own snapshot callback (the path the core
uses), optionally with the open job's log flooding 20,000 lines/s. CPU is measured while watching (no keys),
for the whole process (app + synthetic feed) as a percentage of one core; "feed" is the synthetic feed alone,
measured the same way without the app; frames/s: frames handed to the terminal while watching. Then a key
every 200-300 ms: ``l`` (full-screen log on and off, a relayout and full repaint), written as bytes into the
terminal; latency runs from writing the key to the frame that shows it being handed to the terminal. No
asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputui.core.session import model as M  # noqa: E402
from gputui.core.session.metrics_history import MetricsRing  # noqa: E402

GPUS = 8
HISTORY = 600
FLOOD_LINES_PER_S = 20_000
SCENARIOS = [(1, False), (8, False), (64, False), (256, False), (8, True), (64, True)]
WARMUP_S = 2.0


class SyntheticHost:
    """One host whose 8 GPUs wander like a training job's would."""

    def __init__(self, name: str, rng: random.Random) -> None:
        self.name, self.rng, self.seq = name, rng, 0
        self.util = [rng.uniform(30, 95) for _ in range(GPUS)]
        self.history = MetricsRing(HISTORY)  # as a HostSession keeps it
        self.job = M.Job(host=name, id="1", name="train", state=M.JOB_RUNNING, command=("python", "train.py"),
                         started_at=time.time() - 3600, tmux_session="gputui-1")

    def snapshot(self) -> M.HostSnapshot:
        r, now = self.rng, time.time()
        self.seq += 1
        gpus = []
        for i in range(GPUS):
            self.util[i] = min(100.0, max(0.0, self.util[i] + r.uniform(-8, 8)))
            u = self.util[i]
            procs = (M.GpuProcess(pid=5000 + i, mem_mib=50_000, job="1", name="python"),)
            gpus.append(M.GpuSample(index=i, name="NVIDIA H100 80GB HBM3", util_percent=round(u), mem_used_mib=40_000 + 300 * u,
                                    mem_total_mib=81_559, temp_c=40 + u * 0.4, power_w=80 + 6 * u, power_limit_w=700,
                                    processes=procs))
        host = M.HostStats(cpu_percent=r.uniform(20, 60), cpu_count=96, load1=12.0, mem_used_mib=400_000,
                           mem_total_mib=1_000_000, disk_free_gib=900, disk_total_gib=2000, uptime_s=86_400)
        sample = M.MetricsSample(seq=self.seq, t=now, host=host, gpus=tuple(gpus), gpu_source="nvml")
        cost = M.CostInfo(price_per_hour=2.49 * GPUS, accrued=2.49 * GPUS * 5)
        return M.HostSnapshot(name=self.name, state=M.CONNECTED, facts={"tmux_socket": "x"}, metrics=sample,
                              jobs=(self.job,), updated_at=now, history=self.history.append(sample), cost=cost)


class FloodSession:
    """A host session whose job log grows by ``rate`` lines per second while followed."""

    class transport:  # noqa: N801
        @staticmethod
        def terminal_prefix() -> list[str]:
            return []

    def __init__(self, rate: int) -> None:
        self.rate, self.task, self.lines, self.start = rate, None, 0, time.monotonic()

    async def follow_log(self, job: str, offset: int, on_data: Any, on_end: Any, on_gap: Any) -> None:
        if self.rate:
            self.task = asyncio.create_task(self._flood(on_data))

    async def _flood(self, on_data: Any) -> None:
        start = self.start = time.monotonic()
        while True:
            due = int((time.monotonic() - start) * self.rate) - self.lines
            if due > 0:
                on_data(b"".join(
                    b"step %d/100000 loss=%.4f lr=3.0e-04 grad_norm=1.02 tokens/s=31337 | epoch 2\r\n"
                    % (self.lines + i, 2.0 / (1 + (self.lines + i) / 1e4)) for i in range(due)
                ))
                self.lines += due
            await asyncio.sleep(0.01)

    async def unfollow_log(self, job: str) -> None:
        if self.task:
            self.task.cancel()

    async def list_jobs(self) -> list[M.Job]:
        return []


class SyntheticFleet:
    """A fleet-shaped source: each host publishes one snapshot per second, spread over the second."""

    def __init__(self, hosts: int, on_change: Any, flood: bool) -> None:
        rng = random.Random(7)
        self.hosts = [SyntheticHost(f"gpu-{i:02d}", rng) for i in range(hosts)]
        self.on_change, self.task = on_change, None
        self.floods = {h.name: FloodSession(FLOOD_LINES_PER_S if flood else 0) for h in self.hosts}
        self.flood = self.floods[self.hosts[0].name]

    def snapshots(self) -> list[M.HostSnapshot]:
        return [M.HostSnapshot(name=h.name) for h in self.hosts]

    def run_in_background(self) -> None:
        self.task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        gap = 1.0 / len(self.hosts)
        while True:
            for h in self.hosts:
                self.on_change(h.snapshot())
                await asyncio.sleep(gap)

    def session(self, name: str) -> FloodSession:
        return self.floods[name]

    async def close(self) -> None:
        if self.task:
            self.task.cancel()
        for flood in self.floods.values():
            await flood.unfollow_log("1")


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- one scenario, in its own process --------------------------------------------------------------------------
async def feed_only(hosts: int, flood: bool, seconds: float) -> float:
    """CPU % of the synthetic feed alone (same work, callbacks do nothing)."""
    fleet = SyntheticFleet(hosts, lambda snap: None, flood)
    fleet.run_in_background()
    await fleet.flood.follow_log("1", 0, lambda data: None, None, None)
    await asyncio.sleep(1.0)
    c0, t0 = cpu_s(), time.monotonic()
    await asyncio.sleep(seconds)
    used = (cpu_s() - c0) / (time.monotonic() - t0) * 100
    await fleet.close()
    return used


def run_app(hosts: int, flood: bool, seconds: float) -> dict[str, Any]:
    import gc

    from gputui.ui.app import GpuTuiApp

    gc.disable()  # as gputui.appstart.run_app does: the app's on_ready freezes what start-up built, then resumes

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
    os.environ.update(COLUMNS="160", LINES="48", TERM="xterm-256color")
    saved = os.dup(0), os.dup(2)
    os.dup2(slave, 0)
    os.dup2(slave, 2)
    stop = threading.Event()

    def drain() -> None:  # the terminal: read and discard what the app draws
        while not stop.is_set():
            try:
                os.read(master, 1 << 16)
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    frames: list[float] = []
    handled: list[float] = []
    result: dict[str, Any] = {}
    state = Path(tempfile.mkdtemp()) / "ui.json"
    app = GpuTuiApp(source_factory=lambda cb: SyntheticFleet(hosts, cb, flood), state_path=state)

    def timed(method: Any) -> Any:
        def run(*args: Any) -> Any:
            handled.append(time.monotonic())
            return method(*args)

        return run

    app.action_toggle_log = timed(app.action_toggle_log)  # type: ignore[method-assign]
    app.select_host = timed(app.select_host)  # type: ignore[method-assign]

    async def keys(seq: list[bytes]) -> list[float]:
        """Send keys 200-300 ms apart; key-to-frame latencies in ms."""
        sent: list[float] = []
        start = len(handled)
        rng = random.Random(1)
        t1 = time.monotonic()
        i = 0
        while time.monotonic() - t1 < seconds / 2:
            sent.append(time.monotonic())
            os.write(master, seq[i % len(seq)])
            i += 1
            await asyncio.sleep(0.2 + rng.uniform(0, 0.1))
        await asyncio.sleep(0.3)
        lat = []
        for s in sent:
            h = next((x for x in handled[start:] if x >= s), None)
            f = next((x for x in frames if h is not None and x >= h), None)
            if f is not None:
                lat.append((f - s) * 1000)
        return lat

    async def drive() -> None:
        while app._driver is None or app.stream is None:
            await asyncio.sleep(0.05)
        write = app._driver.write

        def timed_write(data: str) -> None:
            write(data)
            frames.append(time.monotonic())

        app._driver.write = timed_write  # type: ignore[method-assign]
        await asyncio.sleep(WARMUP_S)  # warm up: history fills, the log flows
        c0, t0, n0 = cpu_s(), time.monotonic(), app.source.flood.lines  # type: ignore[attr-defined]
        f0 = len(frames)
        await asyncio.sleep(seconds)  # watching, no keys: what leaving it open all day costs
        result["cpu"] = (cpu_s() - c0) / (time.monotonic() - t0) * 100
        result["fps"] = (len(frames) - f0) / (time.monotonic() - t0)
        result["flood_rate"] = (app.source.flood.lines - n0) / (time.monotonic() - t0)  # type: ignore[attr-defined]
        result["rss"] = rss_mib()
        result["latency_ms"] = await keys([b"l"])
        os.write(master, b"1")  # focus the hosts table
        await asyncio.sleep(0.3)
        result["host_ms"] = await keys([b"\x1b[B", b"\x1b[A"]) if hosts > 1 else []
        app.exit()

    async def main() -> None:
        runner = asyncio.create_task(drive())
        await app.run_async(headless=False, mouse=False)
        await runner

    try:
        asyncio.run(main())
    finally:
        stop.set()
        os.dup2(saved[0], 0)
        os.dup2(saved[1], 2)
    result["feed"] = asyncio.run(feed_only(hosts, flood, seconds))
    return result


# --- the table -------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per scenario")
    ap.add_argument("--one", nargs=2, metavar=("HOSTS", "FLOOD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_app(int(args.one[0]), args.one[1] == "1", args.seconds)))
        return
    print(f"gputui app under load: {GPUS} GPUs per host, 1 snapshot per host per second, 160x48 terminal, "
          f"{args.seconds:g} s per scenario")
    head = (f"{'hosts':>5}  {'log flood':>14}  {'CPU % (1 core)':>14}  {'of it feed':>10}  {'RSS MiB':>7}  "
            f"{'frames/s':>8}  {'l: median':>9}  {'p99':>6}  {'↓↑: median':>10}  {'p99':>6}")
    print(head)
    print("-" * len(head))
    for hosts, flood in SCENARIOS:
        out = subprocess.run([sys.executable, __file__, "--one", str(hosts), "1" if flood else "0", "--seconds", str(args.seconds)],
                             capture_output=True, text=True, timeout=args.seconds * 4 + 60)
        if out.returncode != 0:
            print(f"{hosts:>5}  failed: {out.stderr.strip()[-300:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rate = f"{r['flood_rate']:,.0f} lines/s" if flood else "-"
        print(f"{hosts:>5}  {rate:>14}  {r['cpu']:>14.1f}  {r['feed']:>10.1f}  {r['rss']:>7.0f}  {r['fps']:>8.1f}  "
              f"{ms(r['latency_ms'], 0.5):>9}  {ms(r['latency_ms'], 0.99):>6}  {ms(r['host_ms'], 0.5):>10}  {ms(r['host_ms'], 0.99):>6}")
    print(
        "l: full-screen log on/off; ↓↑: next/previous host (its GPUs, jobs and log swap in). Latency: key "
        "bytes written to the terminal -> the frame showing it handed to the terminal. CPU: while watching."
    )


def ms(values: list[float], q: float) -> str:
    return (
        "-"
        if not values
        else (f"{statistics.median(values):.0f} ms" if q == 0.5 else f"{pct(values, q):.0f} ms")
    )


if __name__ == "__main__":
    main()

"""Reconnect timing over SSH under link faults, and bytes lost or duplicated (must both be 0).

    python bench/reconnect.py [--rounds 6] [--hold 5]

Starts a throwaway sshd on 127.0.0.1 (needs /usr/sbin/sshd; as root, like the tests) behind the fault proxy
of tests/faultproxy.py, runs a job printing numbered lines, and follows its log with a HostSession while
the proxy alternately resets the link (RST) and blackholes it for ``--hold`` seconds (bytes dropped, no RST:
a half-open link). For each fault it times:

* detect: fault -> the session says ``reconnecting`` (RST: at once; blackhole: SSH keepalive, 1 s x 2)
* resume: link usable again (reset: at once; blackhole: restore) -> first byte of the resumed log

Prints median and max per kind and compares the received log with the host's file line by line.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from faultproxy import FaultProxy  # noqa: E402
from sshd import Sshd  # noqa: E402

from gputui.core.config.file import HostConfig  # noqa: E402
from gputui.core.session import model as M  # noqa: E402
from gputui.core.session.host import HostSession  # noqa: E402
from gputui.core.transport.ssh import SSHTransport  # noqa: E402

JOB = """
import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]):
    i += 1
    print("line %07d" % i, flush=True)
    time.sleep(0.001)
"""


class Watch:
    """Timestamps of state changes and of received bytes."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.last_byte_at = 0.0
        self.reconnecting_at = 0.0

    def on_change(self, snap: M.HostSnapshot) -> None:
        if snap.state == M.RECONNECTING and not self.reconnecting_at:
            self.reconnecting_at = time.perf_counter()

    def on_data(self, data: bytes) -> None:
        self.buf.extend(data)
        self.last_byte_at = time.perf_counter()


async def until(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.005)


def line_numbers(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"line (\d{7})", data)]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="faults of each kind")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds each blackhole lasts")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    server = Sshd(root / "sshd")
    key = server.client_key("bench")
    server.start()
    proxy = FaultProxy(server.port).start()
    known = root / "known_hosts"
    known.write_text(server.host_key_line(f"[127.0.0.1]:{proxy.port}"))
    cfg = HostConfig(
        name="bench", host="127.0.0.1", port=proxy.port, user=server.user, identity_file=str(key),
        known_hosts=str(known), remote_dir=str(root / "remote"),
    )
    watch = Watch()
    session = HostSession("bench", SSHTransport(cfg), on_change=watch.on_change)
    stop = root / "stop"
    times: dict[str, dict[str, list[float]]] = {
        k: {"detect": [], "resume": []} for k in ("reset", "blackhole")
    }
    try:
        await session.start()
        session.run_in_background()
        job = await session.start_job(["python3", "-c", JOB, str(stop)])
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await session.follow_log(job.id, 0, watch.on_data, lambda i: done.done() or done.set_result(i))
        for kind in ["reset", "blackhole"] * args.rounds:
            size = len(watch.buf)
            await until(lambda s=size: len(watch.buf) > s and session.snapshot.state == M.CONNECTED)
            watch.reconnecting_at = 0.0
            fault_at = time.perf_counter()
            if kind == "reset":
                proxy.reset()
                usable_at = time.perf_counter()
                await until(lambda: watch.reconnecting_at)
            else:
                proxy.blackhole()
                await until(lambda: watch.reconnecting_at)
                await asyncio.sleep(max(0.0, args.hold - (time.perf_counter() - fault_at)))
                proxy.restore()
                usable_at = time.perf_counter()
            await until(lambda u=usable_at: watch.last_byte_at > u)
            times[kind]["detect"].append(watch.reconnecting_at - fault_at)
            times[kind]["resume"].append(watch.last_byte_at - usable_at)
        stop.touch()
        await asyncio.wait_for(done, 60)
    finally:
        await session.close()
        proxy.stop()
        server.stop()
    log = (root / "remote" / "jobs" / job.id / "output.log").read_bytes()
    shutil.rmtree(root, ignore_errors=True)
    got, want = line_numbers(bytes(watch.buf)), line_numbers(log)
    lost = len(set(want) - set(got))
    duplicated = len(got) - len(set(got))
    print(f"{args.rounds} faults of each kind; blackholes held {args.hold:g} s; keepalive 1 s x 2")
    print(f"{'fault':<10} {'detect median':>14} {'detect max':>11} {'resume median':>14} {'resume max':>11}")
    for kind, t in times.items():
        d, r = t["detect"], t["resume"]
        print(
            f"{kind:<10} {statistics.median(d):>12.2f} s {max(d):>9.2f} s "
            f"{statistics.median(r):>12.2f} s {max(r):>9.2f} s"
        )
    print(
        f"log: {len(log)} bytes on the host, {len(watch.buf)} received, byte-identical: {bytes(watch.buf) == log}; "
        f"lines lost: {lost}, duplicated: {duplicated}"
    )


if __name__ == "__main__":
    asyncio.run(main())

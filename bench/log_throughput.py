"""Log throughput over SSH: host's output.log -> agent -> asyncssh -> the client's buffer, beside OpenSSH.

    python bench/log_throughput.py [--mb 200] [--runs 3]

Starts a throwaway sshd on 127.0.0.1 (needs /usr/sbin/sshd; as root, like the tests), runs a job that
writes ``--mb`` MB of text, then, in the same run and on the same file, times (a) a gputui log follow from
offset 0 until its end (what ``gputui logs -f`` and the TUI do) and (b) ``ssh HOST cat output.log`` with the
OpenSSH client into /dev/null. Prints medians and their ratio. No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sshd import Sshd, start_with_client  # noqa: E402

from gputui.core.config.file import HostConfig  # noqa: E402
from gputui.core.session.host import HostSession  # noqa: E402
from gputui.core.transport.ssh import SSHTransport  # noqa: E402

WRITER = """
import sys
line = ("%s\\n" % ("x" * 99)).encode()
block = line * 10000
out = sys.stdout.buffer
for _ in range(int(sys.argv[1]) * 1000000 // len(block)):
    out.write(block)
out.flush()
"""


async def follow_once(session: HostSession, job: str) -> tuple[float, int]:
    buf = bytearray()
    done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter()
    await session.follow_log(job, 0, buf.extend, lambda info: done.done() or done.set_result(info))
    await done
    return time.perf_counter() - t0, len(buf)


def ssh_cat(server: Sshd, key: Path, known_hosts: Path, path: Path) -> float:
    argv = ["ssh", "-p", str(server.port), "-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}"]
    argv += ["-o", "BatchMode=yes", f"{server.user}@127.0.0.1", "cat", str(path)]
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    server, key, known = start_with_client(root)
    cfg = HostConfig(
        name="bench", host="127.0.0.1", port=server.port, user=server.user, identity_file=str(key),
        known_hosts=str(known), remote_dir=str(root / "remote"),
    )
    session = HostSession("bench", SSHTransport(cfg))
    try:
        await session.start()
        job = await session.start_job(["python3", "-c", WRITER, str(args.mb)])
        while (await session.list_jobs())[0].running:
            await asyncio.sleep(0.2)
        log = root / "remote" / "jobs" / job.id / "output.log"
        size = log.stat().st_size
        ours, theirs = [], []
        for _ in range(args.runs):
            seconds, got = await follow_once(session, job.id)
            assert got == size, (got, size)
            ours.append(size / seconds)
            theirs.append(size / ssh_cat(server, key, known, log))
    finally:
        await session.close()
        server.stop()
    mb = 1e6
    print(f"log of {size / mb:.0f} MB on loopback, median of {args.runs} runs")
    print(f"{'path':<40} {'MB/s':>8}")
    print(f"{'gputui follow (agent + asyncssh)':<40} {statistics.median(ours) / mb:>8.1f}")
    print(f"{'ssh HOST cat FILE (OpenSSH)':<40} {statistics.median(theirs) / mb:>8.1f}")
    print(f"{'ratio gputui / OpenSSH':<40} {statistics.median(ours) / statistics.median(theirs):>8.2f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())

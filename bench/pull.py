"""Pull throughput over SSH: ``gputui pull`` (agent + asyncssh, sha256-checked) beside ``ssh HOST cat FILE``.

    python bench/pull.py [--mb 200] [--runs 3]

Starts a throwaway sshd on 127.0.0.1 (needs /usr/sbin/sshd; as root, like the tests), writes a file of
``--mb`` MB of random bytes, then, in the same run and on the same file, times (a) ``pull`` into a fresh
directory (listing, the raw stream, local and remote sha256 included) and (b) ``ssh HOST cat FILE`` with the
OpenSSH client into a local file. Prints medians and their ratio. No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sshd import Sshd, start_with_client  # noqa: E402

from gputui.core.config import HostConfig  # noqa: E402
from gputui.core.pull import pull  # noqa: E402
from gputui.core.session import HostSession  # noqa: E402
from gputui.core.ssh_transport import SSHTransport  # noqa: E402


def ssh_cat(server: Sshd, key: Path, known_hosts: Path, path: Path, dest: Path) -> float:
    argv = ["ssh", "-p", str(server.port), "-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}"]
    argv += ["-o", "BatchMode=yes", f"{server.user}@127.0.0.1", "cat", str(path)]
    t0 = time.perf_counter()
    with dest.open("wb") as out:
        subprocess.run(argv, stdout=out, check=True)
    return time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    server, key, known = start_with_client(root)
    src = root / "host" / "big.bin"
    src.parent.mkdir()
    with src.open("wb") as f:
        for _ in range(args.mb):
            f.write(os.urandom(1_000_000))
    size = src.stat().st_size
    cfg = HostConfig(
        name="bench", host="127.0.0.1", port=server.port, user=server.user, identity_file=str(key),
        known_hosts=str(known), remote_dir=str(root / "remote"),
    )  # fmt: skip
    session = HostSession("bench", SSHTransport(cfg))
    ours, theirs = [], []
    try:
        await session.start()
        for i in range(args.runs):
            dest = root / f"here-{i}"
            t0 = time.perf_counter()
            await pull(session, [str(src)], str(dest) + "/")
            ours.append(size / (time.perf_counter() - t0))
            assert (dest / "big.bin").stat().st_size == size
            shutil.rmtree(dest)
            theirs.append(size / ssh_cat(server, key, known, src, root / "cat.bin"))
    finally:
        await session.close()
        server.stop()
    mb = 1e6
    print(f"file of {size / mb:.0f} MB on loopback, median of {args.runs} runs")
    print(f"{'path':<44} {'MB/s':>8}")
    print(f"{'gputui pull (agent + asyncssh, sha256 both)':<44} {statistics.median(ours) / mb:>8.1f}")
    print(f"{'ssh HOST cat FILE > file (OpenSSH)':<44} {statistics.median(theirs) / mb:>8.1f}")
    print(f"{'ratio gputui / OpenSSH':<44} {statistics.median(ours) / statistics.median(theirs):>8.2f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())

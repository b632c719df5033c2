"""Pull throughput over SSH: ``gputui pull`` (agent + asyncssh, sha256-checked) beside ``scp`` and
``ssh HOST cat FILE``.

    python bench/pull.py [--mb 1000] [--runs 1]

Starts a throwaway sshd on 127.0.0.1 (needs /usr/sbin/sshd; as root, like the tests), writes a file of
``--mb`` MB of random bytes (default 1 GB), then, in the same run and on the same file, times (a) ``pull``
into a fresh directory (listing, the raw stream, local and remote sha256 included), (b) ``scp -O`` (the classic
scp protocol: the throwaway sshd has no sftp subsystem) and (c) ``ssh HOST cat FILE`` into a local file, with
the OpenSSH client. Prints medians and the ratios (target: gputui at least 0.5x of OpenSSH). No asserts:
loopback numbers are noisy.
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

from gputui.core.config.file import HostConfig  # noqa: E402
from gputui.core.files.pull import pull  # noqa: E402
from gputui.core.session.host import HostSession  # noqa: E402
from gputui.core.transport.ssh import SSHTransport  # noqa: E402


def _opts(key: Path, known_hosts: Path) -> list[str]:
    return ["-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "BatchMode=yes"]


def ssh_cat(server: Sshd, key: Path, known_hosts: Path, path: Path, dest: Path) -> float:
    argv = ["ssh", "-p", str(server.port), *_opts(key, known_hosts), f"{server.user}@127.0.0.1", "cat", str(path)]
    t0 = time.perf_counter()
    with dest.open("wb") as out:
        subprocess.run(argv, stdout=out, check=True)
    return time.perf_counter() - t0


def scp(server: Sshd, key: Path, known_hosts: Path, path: Path, dest: Path) -> float:
    argv = ["scp", "-O", "-q", "-P", str(server.port), *_opts(key, known_hosts)]
    argv += [f"{server.user}@127.0.0.1:{path}", str(dest)]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=1)
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
    )
    session = HostSession("bench", SSHTransport(cfg))
    ours, cats, scps = [], [], []
    try:
        await session.start()
        for i in range(args.runs):
            dest = root / f"here-{i}"
            t0 = time.perf_counter()
            await pull(session, [str(src)], str(dest) + "/")
            ours.append(size / (time.perf_counter() - t0))
            assert (dest / "big.bin").stat().st_size == size
            shutil.rmtree(dest)
            scps.append(size / scp(server, key, known, src, root / "scp.bin"))
            os.unlink(root / "scp.bin")
            cats.append(size / ssh_cat(server, key, known, src, root / "cat.bin"))
            os.unlink(root / "cat.bin")
    finally:
        await session.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    mb, ours_mb = 1e6, statistics.median(ours)
    print(f"file of {size / mb:.0f} MB on loopback, median of {args.runs} run(s)")
    print(f"{'path':<44} {'MB/s':>8} {'gputui / it':>12}")
    print(f"{'gputui pull (agent + asyncssh, sha256 both)':<44} {ours_mb / mb:>8.1f}")
    for name, runs in (("scp -O HOST:FILE file (OpenSSH)", scps), ("ssh HOST cat FILE > file (OpenSSH)", cats)):
        print(f"{name:<44} {statistics.median(runs) / mb:>8.1f} {ours_mb / statistics.median(runs):>12.2f}")


if __name__ == "__main__":
    asyncio.run(main())

"""Sync throughput over SSH: ``gputui sync`` beside ``rsync -a`` over OpenSSH, same loopback, same run.

    python bench/sync.py [--files 5000] [--mb 200]

Starts a throwaway sshd on 127.0.0.1 (needs /usr/sbin/sshd; as root, like the tests), writes a tree of
``--files`` random files totalling ``--mb`` MB in 50 dirs, then times for gputui (one HostSession, the way
``gputui sync`` runs after connecting) and for rsync (a fresh ``rsync -a -e ssh`` each time, its own target):
the first sync, a resync with nothing changed, and a resync after one changed file. Prints the times and the
ratios (rsync time / gputui time: above 1 means gputui is faster). No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sshd import Sshd, start_with_client  # noqa: E402

from gputui.core.config.file import HostConfig  # noqa: E402
from gputui.core.files.sync import sync  # noqa: E402
from gputui.core.session.host import HostSession  # noqa: E402
from gputui.core.transport.ssh import SSHTransport  # noqa: E402


def rsync(server: Sshd, key: Path, known: Path, src: Path, dest: Path) -> float:
    ssh = f"ssh -p {server.port} -i {key} -o UserKnownHostsFile={known} -o BatchMode=yes"
    t0 = time.perf_counter()
    subprocess.run(["rsync", "-a", "-e", ssh, f"{src}/", f"{server.user}@127.0.0.1:{dest}/"], check=True)
    return time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--mb", type=int, default=200)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    server, key, known = start_with_client(root)
    src = root / "src"
    size = args.mb * 1_000_000 // args.files
    for i in range(args.files):
        d = src / f"d{i % 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_bytes(os.urandom(size))
    cfg = HostConfig(
        name="bench", host="127.0.0.1", port=server.port, user=server.user, identity_file=str(key),
        known_hosts=str(known), remote_dir=str(root / "remote"),
    )
    session = HostSession("bench", SSHTransport(cfg))
    ours, theirs = {}, {}
    has_rsync = shutil.which("rsync") is not None
    try:
        await session.start()
        for label in ("first sync", "resync, nothing changed", "resync, one file changed"):
            if label.endswith("one file changed"):
                (src / "d1" / "f1.py").write_bytes(os.urandom(size))
            t0 = time.perf_counter()
            await sync(session, str(src), str(root / "ours"), cache_dir=root / "cache")
            ours[label] = time.perf_counter() - t0
            if has_rsync:
                theirs[label] = rsync(server, key, known, src, root / "theirs")
    finally:
        await session.close()
        server.stop()
    print(f"{args.files} files, {args.mb} MB on loopback")
    print(f"{'':<28} {'gputui s':>9} {'rsync s':>9} {'rsync/gputui':>13}")
    for label, seconds in ours.items():
        other = theirs.get(label)
        ratio = f"{other / seconds:>13.2f}" if other else f"{'no rsync':>13}"
        print(f"{label:<28} {seconds:>9.2f} {other or float('nan'):>9.2f} {ratio}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())

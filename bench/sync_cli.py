"""``gputui sync`` as a user runs it, beside ``rsync -a`` over the same sshd, same run.

    python bench/sync_cli.py [--files 20000] [--size 1024] [--runs 3]

Starts a throwaway sshd on 127.0.0.1 (tests/sshd.py; needs /usr/sbin/sshd and rsync), a HOME whose config
holds one SSH host (``box``, beside the built-in ``local``), and a tree of ``--files`` random files of
``--size`` bytes in 50 dirs. Each run times the whole command, connect and agent start included:
``gputui sync box SRC --to DIR`` (run as ``python -c 'from gputui.launch import main; main()'`` with this
checkout on PYTHONPATH: the installed script's entry point, from this tree) into a fresh target, then the
unchanged resync; and ``rsync -a -e ssh`` (OpenSSH) into its own fresh target, then its unchanged resync.
Prints medians and the ratios gputui / rsync (the target: at most 2). No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from sshd import start_with_client  # noqa: E402

GPUTUI = [sys.executable, "-c", "from gputui.launch import main; main()"]


def stop_agents(root: Path) -> None:
    """End the agents this run started (their command lines name its dirs), by pid."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in argv and int(pid) != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{argv[-4:]} failed ({res.returncode}): {res.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not shutil.which("rsync"):
        raise SystemExit("rsync is not installed")
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-"))
    server, key, known = start_with_client(root)
    home = root / "home"
    settings = {"host": "127.0.0.1", "port": server.port, "user": server.user, "identity_file": str(key),
                "known_hosts": str(known), "remote_dir": str(root / "remote")}  # fmt: skip
    (home / ".config" / "gputui").mkdir(parents=True)
    (home / ".config" / "gputui" / "config.toml").write_text(
        "[hosts.box]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
    )
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    src = root / "src"
    for i in range(args.files):
        d = src / f"d{i % 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_bytes(os.urandom(args.size))
    ssh = f"ssh -p {server.port} -i {key} -o UserKnownHostsFile={known} -o BatchMode=yes"
    times: dict[str, list[float]] = {k: [] for k in ("gputui first", "gputui resync", "rsync first", "rsync resync")}
    try:
        for run in range(args.runs):
            ours, theirs = root / f"ours{run}", root / f"theirs{run}"
            for label in ("first", "resync"):
                times[f"gputui {label}"].append(timed([*GPUTUI, "sync", "box", str(src), "--to", str(ours)], env))
                rsync = ["rsync", "-a", "-e", ssh, f"{src}/", f"{server.user}@127.0.0.1:{theirs}/"]
                times[f"rsync {label}"].append(timed(rsync, env))
            shutil.rmtree(ours, ignore_errors=True)
            shutil.rmtree(theirs, ignore_errors=True)
    finally:
        server.stop()
        stop_agents(root)
    print(f"gputui sync (python -c 'from gputui.launch import main; main()', PYTHONPATH={ROOT}) vs rsync -a,")
    print(f"{args.files} files x {args.size} B, {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    for label in ("first", "resync"):
        ours, theirs = statistics.median(times[f"gputui {label}"]), statistics.median(times[f"rsync {label}"])
        print(f"{label:<7} gputui {ours:6.2f} s  rsync {theirs:6.2f} s  gputui/rsync {ours / theirs:5.2f}x"
              f"  (gputui {' '.join(f'{t:.2f}' for t in times[f'gputui {label}'])};"
              f" rsync {' '.join(f'{t:.2f}' for t in times[f'rsync {label}'])})")  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

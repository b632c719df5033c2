"""``gputui sync`` as a user runs it, beside ``rsync -a`` over the same sshd, same run.

    python bench/sync_cli.py [--files 20000] [--size 1024] [--runs 3]

Starts a throwaway sshd on 127.0.0.1 (tests/sshd.py; needs /usr/sbin/sshd and rsync), a HOME whose config
holds one SSH host (``box``, beside the built-in ``local``), and a tree of ``--files`` random files of
``--size`` bytes in 50 dirs. Each run times the whole command, connect and agent start included:
``gputui sync box SRC --to DIR`` (run as ``python -c 'from gputui.launch import main; main()'`` with this
checkout on PYTHONPATH: the installed script's entry point, from this tree) into a fresh target, then the
unchanged resync; and ``rsync -a -e ssh`` (OpenSSH) into its own fresh target, then its unchanged resync;
and, interleaved with those, ``gputui jobs box --json`` (connect, agent start, one small request, close: what
any command pays before its work). Prints medians, the ratios gputui / rsync (the target: at most 2) and the
resync net of that connect. The runs drop ``PYTHONDONTWRITEBYTECODE`` (an installed gputui has its bytecode;
without it every run compiles the modules again). No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshbox import GPUTUI, ROOT, ssh_box  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not shutil.which("rsync"):
        raise SystemExit("rsync is not installed")
    times: dict[str, list[float]] = {
        k: [] for k in ("gputui first", "gputui resync", "rsync first", "rsync resync", "connect")
    }
    with ssh_box() as box:
        box.env.pop("PYTHONDONTWRITEBYTECODE", None)
        src = box.root / "src"
        for i in range(args.files):
            d = src / f"d{i % 50}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i}.py").write_bytes(os.urandom(args.size))
        ssh_e, dest = " ".join(box.ssh[:-1]), box.ssh[-1]
        for run in range(args.runs):
            ours, theirs = box.root / f"ours{run}", box.root / f"theirs{run}"
            for label in ("first", "resync"):
                times[f"gputui {label}"].append(
                    box.timed([*GPUTUI, "sync", "box", str(src), "--to", str(ours)])
                )
                times[f"rsync {label}"].append(
                    box.timed(["rsync", "-a", "-e", ssh_e, f"{src}/", f"{dest}:{theirs}/"])
                )
            times["connect"].append(box.timed([*GPUTUI, "jobs", "box", "--json"]))
            shutil.rmtree(ours, ignore_errors=True)
            shutil.rmtree(theirs, ignore_errors=True)
    print(f"gputui sync (python -c 'from gputui.launch import main; main()', PYTHONPATH={ROOT}) vs rsync -a,")
    print(f"{args.files} files x {args.size} B, {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    for label in ("first", "resync"):
        ours, theirs = statistics.median(times[f"gputui {label}"]), statistics.median(times[f"rsync {label}"])
        print(f"{label:<7} gputui {ours:6.2f} s  rsync {theirs:6.2f} s  gputui/rsync {ours / theirs:5.2f}x"
              f"  (gputui {' '.join(f'{t:.2f}' for t in times[f'gputui {label}'])};"
              f" rsync {' '.join(f'{t:.2f}' for t in times[f'rsync {label}'])})")
    connect, resync = statistics.median(times["connect"]), statistics.median(times["gputui resync"])
    print(f"connect (gputui jobs box --json) {connect:.2f} s ({' '.join(f'{t:.2f}' for t in times['connect'])});"
          f" resync net of it {resync - connect:.2f} s vs rsync {statistics.median(times['rsync resync']):.2f} s")


if __name__ == "__main__":
    main()

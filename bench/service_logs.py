"""`gputui logs HOST JOB` of a big ended job's log answered by the session service (warm: its connection and
agent kept) beside the same command run directly and beside OpenSSH's `ssh HOST cat FILE`, all to /dev/null,
interleaved, over one loopback sshd; and `gputui logs -f` of the same ended job, served.

    python bench/service_logs.py [--mb 120] [--runs 5]

The host and the log are bench/logs_cli.py's (bench/sshbox.py's sshd; training-log lines with a colour
sequence each, printed by a job that has ended). No asserts: loopback numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs_cli import Clock, ended_log_box  # noqa: E402
from sshbox import GPUTUI, Box  # noqa: E402


def warm_service(box: Box, env: dict[str, str]) -> dict[str, object]:
    """Start the session service (the first command goes direct and starts it), then have it connect."""
    subprocess.run([*GPUTUI, "status", "--json"], env=env, capture_output=True, check=True)
    for _ in range(600):
        res = subprocess.run([*GPUTUI, "service", "--json"], env=env, capture_output=True, text=True)
        if res.stdout.startswith("{"):
            subprocess.run([*GPUTUI, "status", "--json"], env=env, capture_output=True, check=True)
            info: dict[str, object] = json.loads(res.stdout)
            return info
        time.sleep(0.05)
    raise SystemExit("no session service came up")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=120)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    labels = ["served", "direct", "ssh cat", "served -f"]
    with ended_log_box(args.mb) as (box, job, log):
        size = log.stat().st_size
        direct_env = dict(box.env)
        served_env = {k: v for k, v in box.env.items() if k != "GPUTUI_DIRECT"}
        warm_service(box, served_env)
        clock = Clock(box, labels)
        logs = [*GPUTUI, "logs", "box", job]
        for _ in range(args.runs):
            box.env = served_env
            clock("served", logs)
            box.env = direct_env
            clock("direct", logs)
            clock("ssh cat", [*box.ssh, "cat", str(log)])
            box.env = served_env
            clock("served -f", [*GPUTUI, "logs", "-f", "box", job])
        box.env = served_env
        served = subprocess.run([*GPUTUI, "logs", "box", job], env=served_env, capture_output=True)
        same = served.stdout == log.read_bytes()
        subprocess.run([*GPUTUI, "service", "stop"], env=served_env, capture_output=True)
    med = statistics.median
    peer = med(clock.wall["ssh cat"])
    print(f"one ended job's log of {size / 1e6:.0f} MB on a loopback sshd, {args.runs} runs interleaved, medians "
          f"(min), load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; CPU: the client's user+sys; "
          f"served bytes equal to the file: {same}")
    for label, text in (("served", "gputui logs (session service)"), ("direct", "gputui logs (GPUTUI_DIRECT=1)"),
                        ("ssh cat", "ssh HOST cat FILE"), ("served -f", "gputui logs -f (session service)")):
        wall = clock.wall[label]
        print(f"{text:34s} {med(wall):5.2f} s ({min(wall):4.2f})  CPU {med(clock.cpu[label]):5.2f} s  "
              f"{size / med(wall) / 1e6:6.1f} MB/s  {peer / med(wall):5.2f}x the speed of ssh cat")


if __name__ == "__main__":
    main()

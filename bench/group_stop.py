"""A job over several hosts: how long a survivor runs on after another part fails, and after another part goes
silent (its host gone), through the real hub and members of remote_agent/jobs/group.py over TCP on loopback.

Run: python bench/group_stop.py [--runs 5] [--lost 5]. Two parts join a hub; rank 1 says it ended with exit 3
(a failure) or stops speaking (a lost host, with lost_s = --lost seconds instead of the default 30); the figure
is the time until rank 0's member is told to stop. Prints the median and max of each, beside the bounds the docs
give (failure: 2 heartbeats; lost: lost_s + 1 heartbeat). No asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remote_agent.jobs import group as agent_group  # noqa: E402

KEY = "ab" * 32


def one_run(root: str, lost: bool, lost_s: float) -> float:
    """Seconds from rank 1's failure (or last word) to rank 0 being told to stop."""
    group = {"id": "bench", "hosts": ["h1", "h2"], "rank": 0, "nproc_per_node": 1, "master_addr": "127.0.0.1",
             "master_port": 1, "hub_port": agent_group.free_ports(1)[0], "lost_s": lost_s, "launcher": None}
    job_dir = tempfile.mkdtemp(dir=root)
    Path(job_dir, "job.json").write_text(json.dumps({"group": group}))
    Path(job_dir, agent_group.KEY_FILE).write_text(KEY)
    threading.Thread(target=agent_group.serve_hub, args=(job_dir,), daemon=True).start()
    key = bytes.fromhex(KEY)
    members = [agent_group.Member(dict(group, rank=r), key) for r in (0, 1)]
    second = threading.Thread(target=members[1].join, args=(30,))
    second.start()
    members[0].join(30)
    second.join(30)
    ended, told = threading.Event(), threading.Event()
    threading.Thread(target=members[0].watch, args=(ended, lambda _why: told.set()), daemon=True).start()
    if not lost:
        members[1].ask("running")
    start = time.monotonic()
    if not lost:
        members[1].finish(3)
    told.wait(lost_s + 60)
    took = time.monotonic() - start
    ended.set()
    members[0].finish(143)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lost", type=float, default=5.0, help="lost_s for the lost-host runs (default 5; jobs use 30)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        failed = [one_run(root, False, agent_group.LOST_S) for _ in range(args.runs)]
        lost = [one_run(root, True, args.lost) for _ in range(args.runs)]
    print(f"a part failed -> the other told to stop: median {statistics.median(failed):.2f} s, max {max(failed):.2f} s"
          f" (bound: 2 heartbeats, {2 * agent_group.HEARTBEAT_S:.0f} s; then SIGTERM, SIGKILL after {agent_group.KILL_GRACE_S:.0f} s)")
    print(f"a part went silent (lost_s {args.lost:g}) -> the other told to stop: median {statistics.median(lost):.2f} s, "
          f"max {max(lost):.2f} s (bound: lost_s + 1 heartbeat, {args.lost + agent_group.HEARTBEAT_S:.0f} s)")
    print(f"{args.runs} runs each, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

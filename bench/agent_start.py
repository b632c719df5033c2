"""Agent start: the zipapp (zipimport compiles every module at every start) beside the same build unpacked
next to its hash with bytecode cached (what gputui runs), same run, same interpreter.

Run: python bench/agent_start.py [--runs 15]. Each start is `python3 -S BUILD serve` (as gputui starts it) up
to its hello frame on stdout (stdin then closed: the agent exits). Prints the median and min per build and the ratio. No asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputui.core.deploy.agentproc import AGENT_PYTHON_FLAGS  # noqa: E402
from gputui.core.deploy.bundle import build_bytes, ensure_local_build  # noqa: E402


def start_once(build: Path, state_dir: str) -> float:
    """Seconds from spawn to the agent's first line (its hello)."""
    argv = [sys.executable, *AGENT_PYTHON_FLAGS, str(build), "serve", "--state-dir", state_dir, "--linger", "0"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    took = time.perf_counter() - t0
    proc.stdin.close()
    proc.wait(10)
    if not line:
        raise SystemExit(f"{build.name} printed nothing")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = ensure_local_build(Path(tmp) / "cache")
        zipapp = Path(tmp) / f"{unpacked.name}.pyz"
        zipapp.write_bytes(build_bytes())
        state = str(Path(tmp) / "state")
        start_once(unpacked, state)  # writes the .pyc, as the first start on a host does
        times: dict[str, list[float]] = {"zipapp": [], "unpacked": []}
        for _ in range(args.runs):  # interleaved: both see the same load
            times["zipapp"].append(start_once(zipapp, state))
            times["unpacked"].append(start_once(unpacked, state))
    for name, ts in times.items():
        print(f"{name:9s} median {statistics.median(ts) * 1000:6.1f} ms  min {min(ts) * 1000:6.1f} ms")
    ratio = statistics.median(times["zipapp"]) / statistics.median(times["unpacked"])
    print(
        f"unpacked starts {ratio:.2f}x faster than the zipapp (runs: {args.runs}, load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()

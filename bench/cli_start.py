"""CLI start on the local host: `gputui status --json` and `gputui jobs --json` (0 jobs) beside
`python3 -c pass`, interleaved in the same run, same interpreter.

Run: python bench/cli_start.py [--runs 15]. gputui runs with its bytecode cached, as pip installs it (a first
warm-up run writes it), from a throwaway HOME with one local host. Prints medians and the ratio to
`python3 -c pass`; also the modules of `status --json` that take longest to import. No asserts.
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

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        config = Path(home) / ".config" / "gputui" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home}/state"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "GPUTUI_"))}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(HOME=home, PYTHONPATH=str(ROOT))
        commands = {
            "python3 -c pass": [sys.executable, "-c", "pass"],
            "gputui status --json": [sys.executable, "-m", "gputui", "status", "--json"],
            "gputui jobs --json": [sys.executable, "-m", "gputui", "jobs", "--json"],
        }
        for argv in commands.values():
            timed(argv, env)  # bytecode written, agent unpacked
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(timed(argv, env))
        res = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "gputui", "status", "--json"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    floor = statistics.median(times["python3 -c pass"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:22s} median {med * 1000:6.1f} ms  min {min(ts) * 1000:6.1f} ms  {med / floor:4.1f}x")
    rows = [line.split("|") for line in res.stderr.splitlines() if line.startswith("import time:")]
    cum = {r[2].rstrip(): int(r[1]) for r in rows if r[1].strip().isdigit()}
    top = sorted(
        (us, m.strip()) for m, us in cum.items() if m.startswith("   ") and not m.startswith("     ")
    )
    print(f"import gputui.cli: {cum.get(' gputui.cli', 0) / 1000:.1f} ms; slowest of its imports:")
    print("  " + ", ".join(f"{m} {us / 1000:.1f} ms" for us, m in reversed(top[-6:])))
    print(f"runs: {args.runs}, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""`gputui jobs --json` over many jobs on the local host: every job's log tail in one request (logs.tails,
paged) beside the way before it, a logs.read + logs.times request pair per job, same session, same run.

Run: python bench/jobs_tails.py [--jobs 200] [--kb 600] [--runs 3]. Makes N ended jobs with a realistic
training log of KB each in a temp state dir, then prints the medians of: insights for every job, batched and
per job (on one connected session, no insights cache), and the whole `gputui jobs --json` CLI (start, connect,
list, insights): cold (the user's insights cache removed before each run: every tail read and parsed, then
stored) and warm (the ended jobs' insights from the cache: no tail asked for). No asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from insights import make_log  # noqa: E402
from test_agent_listing import ended_job  # noqa: E402

from gputui.core.insights import timed_parser  # noqa: E402
from gputui.core.jobs import records  # noqa: E402
from gputui.core.session import model as M  # noqa: E402
from gputui.core.session.host import HostSession  # noqa: E402
from gputui.core.transport.base import LocalTransport  # noqa: E402


async def per_job(session: HostSession, job: M.Job) -> object:
    """The way before logs.tails: read the tail chunk by chunk, then ask for its times."""
    start = offset = max(0, job.log_size - records.TAIL_BYTES)
    data = bytearray()
    while True:
        offset, chunk, size = await session.read_log(job.id, offset)
        data += chunk
        offset += len(chunk)
        if not chunk or offset >= size:
            break
    times = await session.log_times(job.id, start, offset)
    parser = timed_parser(bytes(data), start, times)
    parser.flush()
    return parser.snapshot()


async def in_session(state: Path, cache: Path, runs: int) -> dict[str, list[float]]:
    session = HostSession("local", LocalTransport(str(state), cache))
    await session.start()
    out: dict[str, list[float]] = {"batched": [], "per job": []}
    try:
        jobs = await session.list_jobs()
        for _ in range(runs):
            t0 = time.perf_counter()
            await records.with_insights(session, jobs)
            out["batched"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for job in jobs:
                await per_job(session, job)
            out["per job"].append(time.perf_counter() - t0)
    finally:
        await session.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--kb", type=int, default=600)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state, home = Path(tmp) / "state", Path(tmp) / "home"
        log = make_log(args.kb * 1024)
        for i in range(1, args.jobs + 1):
            (ended_job(state, i) / "output.log").write_bytes(log)
        figures = asyncio.run(in_session(state, Path(tmp) / "cache", args.runs))
        (home / ".config" / "gputui").mkdir(parents=True)
        (home / ".config" / "gputui" / "config.toml").write_text(
            f'[hosts.local]\ntransport = "local"\nremote_dir = "{state}"\n'
        )
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
        env.pop("XDG_CONFIG_HOME", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed gputui has its bytecode (pip compiles it)
        cache = home / ".cache" / "gputui" / "insights.cache"
        for name in ("jobs --json, cold", "jobs --json, warm"):
            figures[name] = []
            for _ in range(args.runs):
                if name.endswith("cold"):
                    cache.unlink(missing_ok=True)
                t0 = time.perf_counter()
                res = subprocess.run(
                    [sys.executable, "-m", "gputui", "jobs", "--json"], env=env, capture_output=True
                )
                figures[name].append(time.perf_counter() - t0)
                if res.returncode != 0:
                    raise SystemExit(res.stderr.decode()[-2000:])
        figures["python3 -c pass"] = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            figures["python3 -c pass"].append(time.perf_counter() - t0)
    print(f"{args.jobs} jobs, {args.kb} KB logs, tails of {records.TAIL_BYTES // 1024} KiB, {args.runs} runs")
    for name, ts in figures.items():
        print(f"  {name:20s} median {statistics.median(ts):6.3f} s  min {min(ts):6.3f} s")
    ratio = statistics.median(figures["per job"]) / statistics.median(figures["batched"])
    print(f"batched insights {ratio:.1f}x faster than per-job requests (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()

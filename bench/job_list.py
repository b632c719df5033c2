"""Listing many finished jobs: how long a client waits for the job list of a host with N ended jobs.

    python bench/job_list.py [--jobs 10000] [--argv-kb 0]

Writes N finished job dirs (job.json, pid.json, usage.json, status.json, output.log: what the runner leaves)
into a throwaway state dir, then times, with the real agent as a local subprocess: the first connect (the
agent reads every record from disk and writes the ended-jobs index), a connect to an empty state dir (the
baseline), a connect with a fresh agent (what every CLI command does: records come from the index) and
``list_jobs()`` again on a connected session; medians of ``--runs``.
``--argv-kb`` gives every job a command of that many KB (listings cut it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from gputui.core.session.host import HostSession  # noqa: E402
from gputui.core.transport.base import LocalTransport  # noqa: E402


def write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj))  # no fsync: making 10,000 jobs must not take minutes


def make_jobs(state: Path, n: int, argv_kb: int) -> None:
    now = time.time()
    argv = ["python3", "train.py"] + (["x" * 1000] * argv_kb)
    for i in range(1, n + 1):
        d = state / "jobs" / str(i)
        d.mkdir(parents=True, mode=0o700)
        record = {"id": str(i), "name": f"train {i}", "argv": argv, "cwd": "/tmp", "created_at": now - 100}
        record.update(gpus=None, env={}, tmux_session=f"gputui-{i}", git=None, gpu_inventory=[])
        write_json(d / "job.json", record)
        write_json(d / "pid.json", {"pid": 100000 + i, "runner_pid": 1, "started_at": now - 99})
        write_json(d / "usage.json", {"samples": 3, "gpu_peak_mem_mib": 1.0, "gpu_mean_util": 2.0})
        (d / "output.log").write_bytes(b"epoch 1/1 loss=0.1\n")
        write_json(d / "status.json", {"exit_code": 0, "signal": None, "ended_at": now - 1})


async def connect_and_list(state: Path, cache: Path) -> float:
    session = HostSession("bench", LocalTransport(str(state), cache))
    t0 = time.perf_counter()
    await session.start()  # hello + the full (paged) job list
    took = time.perf_counter() - t0
    await session.close()
    return took


async def measure(state: Path, empty: Path, cache: Path, runs: int) -> list[float]:
    """Seconds: first connect + list (no index yet); then medians of: connect to an empty state dir,
    connect + list with a fresh agent, list again on a connected session."""
    first = await connect_and_list(state, cache)
    bare = [await connect_and_list(empty, cache) for _ in range(runs)]
    fresh = [await connect_and_list(state, cache) for _ in range(runs)]
    session = HostSession("bench", LocalTransport(str(state), cache))
    await session.start()
    again = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jobs = await session.list_jobs()
        again.append(time.perf_counter() - t0)
    await session.close()
    assert len(jobs) == len(list((state / "jobs").glob("[0-9]*"))), "every job listed"
    return [first] + [statistics.median(x) for x in (bare, fresh, again)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--argv-kb", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        t0 = time.perf_counter()
        make_jobs(state, args.jobs, args.argv_kb)
        print(f"made {args.jobs} job dirs in {time.perf_counter() - t0:.1f} s")
        first, bare, fresh, again = asyncio.run(
            measure(state, Path(tmp) / "empty", Path(tmp) / "cache", args.runs)
        )
    print("| jobs | first connect + list (no index yet) | connect, 0 jobs | connect + list | list again |")
    print("|---|---|---|---|---|")
    print(f"| {args.jobs} | {first:.3f} s | {bare:.3f} s | {fresh:.3f} s | {again:.3f} s |")
    print(
        f"listing {args.jobs} jobs on a fresh agent: {fresh - bare:.3f} s; on a connected session: {again:.3f} s"
    )


if __name__ == "__main__":
    main()

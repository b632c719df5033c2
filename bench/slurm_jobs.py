"""A Slurm cluster with 500 jobs in the queue and 64 nodes: how long ``gputui jobs --json`` and ``gputui status
--json`` take, and how many Slurm commands each runs.

    sudo python bench/slurm_jobs.py [--jobs 500] [--nodes 64] [--runs 5]

Starts a real single-node Slurm (tests/slurmctl.py: munged, slurmctld, slurmd on 127.0.0.1; needs root and
Debian's slurm-wlm + munge) whose config adds ``--nodes - 1`` more nodes that never register (DOWN: sinfo lists
them, nothing runs there; one machine cannot run 64 slurmd). Submits ``--jobs`` held jobs (``--hold``: they stay
PENDING) through gputui's own agent code, then times with the real CLI and a local-transport Slurm host:
``jobs --json`` (a fresh agent per command, as every CLI call), ``list_jobs()`` again on a connected session, and
``status --json``; medians of ``--runs``. Every Slurm command is counted through a PATH shim, and ``squeue``
alone (what a user would type) is timed as the peer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from slurmctl import SlurmCluster, slurm_available  # noqa: E402

SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "sacct", "scontrol", "srun")


def shim(bin_dir: Path, log: Path) -> None:
    """Each Slurm command, logged (one line per call) and then run for real."""
    bin_dir.mkdir(parents=True)
    for name in SLURM_COMMANDS:
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec /usr/bin/{name} "$@"\n')
        path.chmod(0o755)


def counted(log: Path) -> dict[str, int]:
    calls = log.read_text().split() if log.exists() else []
    log.write_text("")
    return {name: calls.count(name) for name in SLURM_COMMANDS if name in calls}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=True)
    return time.perf_counter() - t0, res.stdout


async def session_relist(env: dict[str, str], config: Path, runs: int, log: Path) -> tuple[float, float]:
    """list_jobs() on a connected session, once a second; (median seconds, Slurm commands per second): the
    agent's own once-a-second watch pass and these listings share one squeue per refresh."""
    os.environ.update(env)
    from gputui.core.config import file as cfg
    from gputui.core.hosts.fleet import Fleet

    fleet = Fleet(cfg.load(str(config)))
    session = fleet.session("hpc")
    await session.start()
    took = []
    counted(log)
    start = time.perf_counter()
    for _ in range(runs):
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        jobs = await session.list_jobs()
        took.append(time.perf_counter() - t0)
    calls = sum(counted(log).values()) / (time.perf_counter() - start)
    await fleet.close()
    assert sum(j.state == "queued" for j in jobs) >= 1
    return statistics.median(took), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    why = slurm_available()
    if why:
        sys.exit(f"cannot run: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = SlurmCluster(root / "slurm", extra_nodes=args.nodes - 1)
        log = root / "calls.log"
        shim(root / "bin", log)
        home = root / "home"
        (home / ".config" / "gputui").mkdir(parents=True)
        config = home / ".config" / "gputui" / "config.toml"
        config.write_text(
            '[hosts.hpc]\ntransport = "local"\nscheduler = "slurm"\n'
            f'[hosts.empty]\ntransport = "local"\nremote_dir = "{root / "empty"}"\n'  # the baseline: no jobs
        )
        env = dict(cluster.env, HOME=str(home), PATH=f"{root / 'bin'}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
        cli = [sys.executable, "-m", "gputui", "--config", str(config)]
        try:
            cluster.start()
            from remote_agent.__main__ import launcher
            from remote_agent.jobs.store import JobStore

            os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
            store = JobStore(str(home / ".gputui"), launcher())
            t0 = time.perf_counter()
            for i in range(args.jobs):
                store.start(["python3", "train.py", f"--seed={i}"], cwd=tmp, slurm={"gpus": 1, "sbatch_args": ["--hold"]})
            submit = time.perf_counter() - t0
            counted(log)
            jobs_runs, status_runs, jobs_calls, status_calls, bare = [], [], [], [], []
            for _ in range(args.runs):
                bare.append(timed([*cli, "jobs", "empty", "--json"], env)[0])
                took, out = timed([*cli, "jobs", "hpc", "--json"], env)
                jobs_runs.append(took)
                jobs_calls.append(counted(log))
                assert sum(j["state"] == "queued" for j in json.loads(out)) == args.jobs
                took, out = timed([*cli, "status", "--json"], env)  # both hosts: the empty one costs little
                status_runs.append(took)
                status_calls.append(counted(log))
                hpc = next(h for h in json.loads(out)["hosts"] if h["name"] == "hpc")
                assert hpc["cluster"]["nodes_total"] == args.nodes
            peer = statistics.median(timed(["squeue", "--states=all"], cluster.env)[0] for _ in range(args.runs))
            relist, relist_calls = asyncio.run(session_relist(env, config, args.runs, log))
        finally:
            cluster.stop()
    jobs_s, status_s, bare_s = (statistics.median(x) for x in (jobs_runs, status_runs, bare))
    print(f"submitted {args.jobs} held jobs with sbatch in {submit:.1f} s ({1000 * submit / args.jobs:.0f} ms each)")
    print("| Slurm queue | jobs --json | same, host with 0 jobs | list again (connected) | status --json | "
          "squeue alone (peer) |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.jobs} jobs, {args.nodes} nodes | {jobs_s:.2f} s | {bare_s:.2f} s | {relist:.3f} s | "
        f"{status_s:.2f} s | {peer:.3f} s |"
    )
    print(f"Slurm commands per `jobs --json`: {jobs_calls}")
    print(f"Slurm commands per `status --json`: {status_calls}")
    print(f"Slurm commands per second on a connected session listing once a second: {relist_calls:.2f}")


if __name__ == "__main__":
    main()

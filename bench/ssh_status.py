"""`gputui status --json` for one SSH host (connect, probe, agent start, answer: the whole command) beside
`ssh HOST nvidia-smi --query-gpu=... --format=csv` (OpenSSH), over the same loopback sshd, interleaved.

    python bench/ssh_status.py [--runs 11]

The sshd and the one-host config come from bench/sshbox.py; the host's PATH starts with the recorded-CSV
stand-in of nvidia-smi the tests use (tests/fixtures/gpu/fake_nvidia_smi.py, an H100 capture), so the agent
and the peer read the same GPU. gputui runs as the installed script's entry point from this tree; its agent is
on the host already (a first run deploys it), as on every start but the first. Then where gputui's time goes,
each phase timed in a fresh process (medians): the imports (asyncssh), the SSH connection (kex, auth, host
key check), the probe (naming the build, its exec), the agent's exec up to its hello and job list, the status op (sample + jobs),
the close; beside OpenSSH's `ssh HOST true` and a bare `python3 -S -c pass` on the host. No asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from sshbox import GPUTUI, smi_stand_in, ssh_box  # noqa: E402

from remote_agent.metrics.smi import CSV_FORMAT, GPU_FIELDS  # noqa: E402

PHASES = ("imports", "connect", "probe", "agent start", "status op", "close")


async def _phases() -> dict[str, float]:
    """Seconds of each phase of `gputui status` for the host ``box``, in this (fresh) process."""
    t = [time.perf_counter()]
    from gputui.core.config import file as cfg
    from gputui.core.hosts.fleet import Fleet
    from gputui.core.transport.ssh import SSHTransport

    t.append(time.perf_counter())
    fleet = Fleet(cfg.load(None))
    session = fleet.session("box")
    transport = session.transport
    assert isinstance(transport, SSHTransport)
    conn = await transport._connection()
    t.append(time.perf_counter())
    transport._agent = await transport._deploy(conn)
    t.append(time.perf_counter())
    await session.start()
    t.append(time.perf_counter())
    await session.sample()
    await session.list_jobs()
    t.append(time.perf_counter())
    await fleet.close()
    t.append(time.perf_counter())
    return {name: b - a for name, a, b in zip(PHASES, t[:-1], t[1:], strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--phases", action="store_true", help=argparse.SUPPRESS)  # one run of the phases, as JSON
    args = ap.parse_args()
    if args.phases:
        print(json.dumps(asyncio.run(_phases())))
        return
    with ssh_box() as box:
        smi_stand_in(box)
        fields = ",".join(f for f, _ in GPU_FIELDS)
        commands = {
            "gputui status --json": [*GPUTUI, "status", "--json"],
            "ssh HOST nvidia-smi --query-gpu": [*box.ssh, "nvidia-smi", f"--query-gpu={fields}", CSV_FORMAT],
            "  ... ssh HOST true": [*box.ssh, "true"],
            "  ... ssh HOST python3 -S -c pass": [*box.ssh, sys.executable, "-S", "-c", "pass"],
        }
        out = subprocess.run(commands["gputui status --json"], env=box.env, capture_output=True, text=True)
        status = json.loads(out.stdout)["hosts"][0]  # the first run deploys the agent
        if status["state"] != "connected" or not status["gpus"]:
            raise SystemExit(f"the host did not answer with its GPU: {out.stdout[-1000:]} {out.stderr[-1000:]}")
        times: dict[str, list[float]] = {name: [] for name in commands}
        phases: dict[str, list[float]] = {name: [] for name in PHASES}
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(box.timed(argv))
            res = subprocess.run([sys.executable, __file__, "--phases"], env=box.env, capture_output=True,
                                 text=True, check=True)
            for name, took in json.loads(res.stdout).items():
                phases[name].append(took)
    peer = statistics.median(times["ssh HOST nvidia-smi --query-gpu"])
    print(f"one SSH host (loopback sshd, {status['gpus'][0].get('name')} stand-in), {args.runs} runs, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:34s} median {med * 1000:6.1f} ms  min {min(ts) * 1000:6.1f} ms  {med / peer:4.2f}x")
    total = sum(statistics.median(ts) for ts in phases.values())
    print("gputui status, phase by phase (fresh process each run):")
    for name, ts in phases.items():
        med = statistics.median(ts)
        print(f"  {name:12s} {med * 1000:6.1f} ms  {100 * med / total:3.0f}%")


if __name__ == "__main__":
    main()

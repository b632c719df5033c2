"""`gputui status --json` answered by the session service (warm: its connection and agent kept) beside the
same command run directly and beside OpenSSH's `ssh HOST nvidia-smi --query-gpu=... --format=csv`, and `gputui
jobs --json` (the SSH host, and the local host of a config-less HOME: served and direct) beside `python3 -c pass`,
over one loopback sshd, interleaved; `jobs --json` of the local host with the service cold (none running: the
command goes direct and starts one) beside the same command direct run just before it, with no service either;
then `watch -n 1 gputui status` for a while: the service's CPU, each command's own CPU, and the SSH connections
the sshd accepted after the first; then `gputui status --watch 1` for as long, served (each round the service's
answer: the watcher's CPU and the service's) and with no service (one process keeping its connection): its CPU
and new connections.

    python bench/service_status.py [--runs 11] [--watch-s 60]

The host is bench/sshbox.py's, its PATH starting with the recorded-CSV stand-in of nvidia-smi the tests use
(an H100 capture), as in bench/ssh_status.py. No asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from sshbox import GPUTUI, smi_stand_in, ssh_box  # noqa: E402

from remote_agent.metrics.smi import CSV_FORMAT, GPU_FIELDS  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def accepted(log: Path) -> int:
    return log.read_text(errors="replace").count("Accepted publickey")


def wait_service(env: dict[str, str], up: bool) -> dict | None:
    """``gputui service --json`` once a service is up (its info), or None once none answers (``up`` False)."""
    for _ in range(600):
        res = subprocess.run([*GPUTUI, "service", "--json"], env=env, capture_output=True, text=True)
        if res.stdout.startswith("{") == up:
            return json.loads(res.stdout) if up else None
        time.sleep(0.05)
    raise SystemExit(f"the session service did not {'come up' if up else 'go'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--watch-s", type=float, default=60.0, help="how long to run status once a second")
    args = ap.parse_args()
    with ssh_box() as box:
        smi_stand_in(box)
        served_env = {k: v for k, v in box.env.items() if k != "GPUTUI_DIRECT"}
        status = [*GPUTUI, "status", "--json"]
        subprocess.run(status, env=box.env, capture_output=True, check=True)  # deploys the agent
        subprocess.run(status, env=served_env, capture_output=True, check=True)  # starts the service
        info = wait_service(served_env, True)
        assert info is not None
        subprocess.run(status, env=served_env, capture_output=True, check=True)  # it connects: warm from here
        local_home = box.root / "local-home"  # no config: the fleet is this machine
        local_home.mkdir()
        local_env = {**served_env, "HOME": str(local_home)}
        local_direct = {**local_env, "GPUTUI_DIRECT": "1"}
        jobs = [*GPUTUI, "jobs", "--json"]
        subprocess.run(jobs, env=local_env, capture_output=True, check=True)  # starts the local host's service
        wait_service(local_env, True)
        subprocess.run(jobs, env=local_env, capture_output=True, check=True)  # warm
        cold: list[float] = []
        cold_direct: list[float] = []  # the same command --direct, each beside a cold run (same moment's load)
        for _ in range(args.runs):  # none running: the command goes direct and starts one for the next
            wait_service(local_env, True)  # (the one the last run started, when it ended)
            subprocess.run([*GPUTUI, "service", "stop"], env=local_env, capture_output=True)
            wait_service(local_env, False)
            for took, env in ((cold_direct, local_direct), (cold, local_env)):  # (the cold one starts one as it ends)
                t = time.perf_counter()
                subprocess.run(jobs, env=env, stdout=subprocess.DEVNULL, check=True)
                took.append(time.perf_counter() - t)
        wait_service(local_env, True)
        subprocess.run(jobs, env=local_env, capture_output=True, check=True)  # warm again
        fields = ",".join(f for f, _ in GPU_FIELDS)
        peer_argv = [*box.ssh, "nvidia-smi", f"--query-gpu={fields}", CSV_FORMAT]
        times: dict[str, list[float]] = {"served": [], "direct": [], "peer": [], "jobs": [], "jobs direct": [],
                                         "local jobs": [], "local jobs direct": [], "python": [], "cold": cold}
        for _ in range(args.runs):
            for name, argv, env in (("served", status, served_env), ("direct", status, box.env),
                                    ("peer", peer_argv, box.env), ("jobs", jobs, served_env),
                                    ("jobs direct", jobs, box.env), ("local jobs", jobs, local_env),
                                    ("local jobs direct", jobs, local_direct),
                                    ("python", [sys.executable, "-c", "pass"], box.env)):
                t = time.perf_counter()
                subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
                times[name].append(time.perf_counter() - t)
        pid, log = int(info["pid"]), box.server.log
        before_cpu, before_conn, children = cpu_s(pid), accepted(log), 0.0
        start = time.monotonic()
        calls = 0
        while time.monotonic() - start < args.watch_s:
            tick = time.monotonic()
            usage = os.times()
            subprocess.run([*GPUTUI, "status"], env=served_env, stdout=subprocess.DEVNULL, check=True)
            after = os.times()
            children += (after.children_user - usage.children_user) + (after.children_system - usage.children_system)
            calls += 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        wall = time.monotonic() - start
        service_pct = 100 * (cpu_s(pid) - before_cpu) / wall
        new_conns = accepted(log) - before_conn
        served_watch = status_watch(served_env, log, args.watch_s, pid)
        subprocess.run([*GPUTUI, "service", "stop"], env=served_env, capture_output=True)
        subprocess.run([*GPUTUI, "service", "stop"], env=local_env, capture_output=True)
        own_pct, own_conns, _ = status_watch(box.env, log, args.watch_s)
    peer = statistics.median(times["peer"])
    cold_direct_s = statistics.median(cold_direct)
    print(f"one SSH host (loopback sshd, H100 stand-in), {args.runs} runs each, interleaved, "
          f"load average {os.getloadavg()[0]:.1f}")
    python = statistics.median(times["python"])
    for name, label, base, of in (
        ("served", "gputui status --json (session service)", peer, "ssh nvidia-smi"),
        ("direct", "gputui status --json --direct", peer, "ssh nvidia-smi"),
        ("peer", "ssh HOST nvidia-smi --query-gpu", peer, "ssh nvidia-smi"),
        ("jobs", "gputui jobs --json (session service)", python, "python3 -c pass"),
        ("jobs direct", "gputui jobs --json --direct", python, "python3 -c pass"),
        ("local jobs", "local host: gputui jobs --json (service)", python, "python3 -c pass"),
        ("local jobs direct", "local host: gputui jobs --json --direct", python, "python3 -c pass"),
        ("cold", "local host: jobs --json, service cold", cold_direct_s, "the same, --direct, beside it"),
        ("python", "python3 -c pass", python, "python3 -c pass"),
    ):
        med = statistics.median(times[name])
        print(f"{label:40s} median {med * 1000:6.1f} ms  min {min(times[name]) * 1000:6.1f} ms  {med / base:5.2f}x {of}")
    print(f"watch -n 1 gputui status, {calls} calls in {wall:.0f} s: the service {service_pct:.2f} % of a core, "
          f"each command {1000 * children / calls:.0f} ms of CPU ({100 * children / wall:.1f} % of a core), "
          f"{new_conns} new SSH connections")
    print(f"gputui status --watch 1 for {args.watch_s:.0f} s, no service: {own_pct:.2f} % of a core, {own_conns} new SSH "
          "connections after its first round")
    print(f"gputui status --watch 1 for {args.watch_s:.0f} s, served: the watcher {served_watch[0]:.2f} % of a core, the "
          f"service {served_watch[2]:.2f} %, {served_watch[1]} new SSH connections")


def status_watch(env: dict[str, str], log: Path, seconds: float, service: int | None = None) -> tuple[float, int, float]:
    """``gputui status --watch 1`` for ``seconds`` after its first round: its CPU and the service's (% of a core),
    and the SSH connections the sshd accepted meanwhile."""
    watcher = subprocess.Popen([*GPUTUI, "status", "--watch", "1"], env=env, stdout=subprocess.PIPE)
    assert watcher.stdout is not None
    watcher.stdout.readline()  # its first round is out: connected
    threading.Thread(target=watcher.stdout.read, daemon=True).start()  # the rest, read as it comes
    before = cpu_s(watcher.pid), cpu_s(service) if service else 0.0, accepted(log), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - before[3]
    own_pct = 100 * (cpu_s(watcher.pid) - before[0]) / wall
    service_pct = 100 * (cpu_s(service) - before[1]) / wall if service else 0.0
    conns = accepted(log) - before[2]
    watcher.terminate()
    watcher.wait()
    return own_pct, conns, service_pct


if __name__ == "__main__":
    main()

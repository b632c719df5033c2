"""CPU and wall time of one metrics sample in the remote agent, per source (medians over N samples);
NVML calls per GPU per second on an 8-GPU box; the agent's CPU share at 1 Hz with many finished jobs.

    python bench/agent_sample.py [--samples N] [--nvidia-smi PATH] [--slow-interval S] [--jobs 200]
                                 [--cpu-seconds 30]

Rows: host only (/proc + statvfs); with a GPU, the NVML sample of every GPU and one
``nvidia-smi --query-gpu`` subprocess call, and their ratio measured in the same run. CPU time counts this
process plus its children (the nvidia-smi subprocess).

NVML calls: the agent's sampler at 1 Hz for 10 simulated minutes against the pynvml double fed by the
recorded 8 x A100 ``nvidia-smi -q`` (tests/fixtures/gpu, every call counted), plus 8 one-GPU jobs' runners:
with an agent sampling they read its ring (no call), without one each reads its own GPU every 5 s.

Agent CPU: the real agent (local transport) with ``--jobs`` finished jobs, metrics pushed at 1 Hz, its
utime + stime over ``--cpu-seconds``. No asserts: machines are noisy, read the medians.
"""

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "fixtures", "gpu")]

from remote_agent.host.stats import HostStats  # noqa: E402
from remote_agent.jobs.usage import EVERY_S  # noqa: E402
from remote_agent.metrics import nvml as gpu_nvml  # noqa: E402
from remote_agent.metrics import smi as gpu_smi  # noqa: E402
from remote_agent.metrics.sampler import MetricsSampler  # noqa: E402

A100_X8 = os.path.join(ROOT, "tests", "fixtures", "gpu", "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt")


def nvml_calls(seconds=600):
    """(agent's calls per GPU per second at 1 Hz, 8 runners' own calls per GPU per second) on the double."""
    from nvml_double import NvmlDouble

    clock = [1000.0]
    real = gpu_nvml.time.monotonic
    gpu_nvml.time.monotonic = lambda: clock[0]
    try:
        with open(A100_X8) as f:
            recording = f.read()
        agent_nv = NvmlDouble(recording)
        agent = MetricsSampler(tempfile.gettempdir(), nvml=agent_nv)
        runner_nvs = [NvmlDouble(recording) for _ in range(8)]
        runners = [
            MetricsSampler(tempfile.gettempdir(), nvml=nv, only=[str(i)]) for i, nv in enumerate(runner_nvs)
        ]
        for nv in [agent_nv, *runner_nvs]:
            nv.calls.clear()  # start-up (init, facts) is once per process, not per second
        for tick in range(seconds):
            clock[0] += 1.0
            agent.sample(lambda pid: None)
            if tick % int(EVERY_S) == 0:
                for r in runners:
                    r.sample(lambda pid: None)
        agent_rate = sum(agent_nv.calls.values()) / 8 / seconds
        runner_rate = sum(sum(nv.calls.values()) for nv in runner_nvs) / 8 / seconds
        return agent_rate, runner_rate
    finally:
        gpu_nvml.time.monotonic = real


def _cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _agent_cpu(state, cache, seconds):
    from gputui.core.session.host import HostSession
    from gputui.core.transport.base import LocalTransport

    session = HostSession("local", LocalTransport(state, cache), metrics_interval=1.0)
    await session.start()
    try:
        pid = session.snapshot.facts["agent_pid"]
        await asyncio.sleep(3)  # past start-up
        c0, t0 = _cpu_s(pid), time.monotonic()
        await asyncio.sleep(seconds)
        return (_cpu_s(pid) - c0) / (time.monotonic() - t0), len(session.history)
    finally:
        await session.close()


def agent_cpu(jobs, seconds):
    """The agent's share of a core at 1 Hz with ``jobs`` finished jobs, and the samples it pushed."""
    from pathlib import Path

    from test_agent_listing import ended_job

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        for i in range(1, jobs + 1):
            ended_job(state, i)
        return asyncio.run(_agent_cpu(str(state), Path(tmp) / "cache", seconds))


def cpu_now():
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def measure(fn, samples):
    """(median CPU ms, median wall ms) of fn() over ``samples`` calls, after one warm-up call."""
    fn()
    cpu, wall = [], []
    for _ in range(samples):
        c0, w0 = cpu_now(), time.perf_counter()
        fn()
        cpu.append((cpu_now() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--nvidia-smi", default="nvidia-smi")
    ap.add_argument(
        "--slow-interval",
        type=float,
        default=gpu_nvml.SLOW_INTERVAL_S,
        help="NVML slow-field cache (0: read all)",
    )
    ap.add_argument("--jobs", type=int, default=200, help="finished jobs in the agent's state dir")
    ap.add_argument("--cpu-seconds", type=float, default=30.0, help="how long the agent's CPU is measured")
    args = ap.parse_args()

    rows = []
    host = HostStats(tempfile.gettempdir())
    rows.append(("host only (/proc, statvfs)",) + measure(host.sample, args.samples))

    notes = []
    nvml = smi = None
    try:
        nvml = gpu_nvml.NvmlSource(slow_interval=args.slow_interval)
        n = len(nvml.handles)
        rows.append(
            (f"NVML, {n} GPU(s), slow every {args.slow_interval:g} s",) + measure(nvml.sample, args.samples)
        )
    except gpu_nvml.NvmlUnavailable as e:
        notes.append(f"NVML skipped: {e}")
    try:
        smi = gpu_smi.SmiSource(args.nvidia_smi)
        fields = ",".join(f for f, _ in gpu_smi.GPU_FIELDS)
        argv = [args.nvidia_smi, "--query-gpu=" + fields, gpu_smi.CSV_FORMAT]
        rows.append(
            ("nvidia-smi --query-gpu (1 subprocess)",) + measure(lambda: gpu_smi.run(argv, 30), args.samples)
        )
    except gpu_smi.SmiUnavailable as e:
        notes.append(f"nvidia-smi skipped: {e}")

    print(f"median of {args.samples} samples")
    print("{:<44} {:>10} {:>10}".format("source", "CPU ms", "wall ms"))
    for name, cpu, wall in rows:
        print(f"{name:<44} {cpu:>10.3f} {wall:>10.3f}")
    if nvml is not None and smi is not None:
        _, nv_cpu, nv_wall = rows[1]
        _, smi_cpu, smi_wall = rows[2]
        print(
            f"nvidia-smi / NVML: {smi_cpu / max(nv_cpu, 1e-6):.1f}x CPU, {smi_wall / max(nv_wall, 1e-6):.1f}x wall"
        )
    for note in notes:
        print(note)
    agent_rate, runner_rate = nvml_calls()
    print("NVML calls per GPU per second, 8 x A100 (recorded), 8 one-GPU jobs (target: at most 5):")
    print(f"  agent at 1 Hz + runners reading its ring  {agent_rate:6.2f}")
    print(f"  runners alone (no agent), own GPU each    {runner_rate:6.2f}")
    share, samples = agent_cpu(args.jobs, args.cpu_seconds)
    print(
        f"agent at 1 Hz with {args.jobs} finished jobs: {share * 100:.2f}% of a core over {args.cpu_seconds:g} s "
        f"({samples} samples pushed; target under 0.5%)"
    )
    if nvml is not None:
        nvml.close()


if __name__ == "__main__":
    main()

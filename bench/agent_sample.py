"""CPU and wall time of one metrics sample in the remote agent, per source (medians over N samples).

    python bench/agent_sample.py [--samples N] [--nvidia-smi PATH] [--slow-interval S]

Rows: host only (/proc + statvfs); with a GPU, the NVML sample of every GPU and one
``nvidia-smi --query-gpu`` subprocess call, and their ratio measured in the same run. CPU time counts this
process plus its children (the nvidia-smi subprocess). No asserts: machines are noisy, read the medians.
"""

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from remote_agent import gpu_nvml, gpu_smi  # noqa: E402
from remote_agent.hoststats import HostStats  # noqa: E402


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
    ap.add_argument("--slow-interval", type=float, default=5.0, help="NVML slow-field cache (0: read all)")
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
    if nvml is not None:
        nvml.close()


if __name__ == "__main__":
    main()

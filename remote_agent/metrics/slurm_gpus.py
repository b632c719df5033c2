"""The GPUs of the Slurm nodes running our jobs: ``gpu-stream`` runs on each node inside the job's allocation
(``srun --overlap``) and prints one JSON line per interval from the agent's own sampler; ``NodeGpus`` keeps one
such stream per running job and adds the nodes' cards to the login node's samples. Stdlib only, Python 3.8+.
"""

import os
import subprocess
import threading
import time
from typing import Any, Dict, List

from .. import protocol as P
from ..jobs.slurm import _text

#: Seconds between two readings a node streams; a node silent for 3 of them is dropped from the samples.
NODE_INTERVAL_S = 2.0
#: A job's stream that ended (its step refused, the job ending) is started again after this long at the earliest.
RESTART_S = 30.0
#: Running jobs whose nodes stream at once (the oldest ones): never one srun per job of a big sweep on a shared
#: login node.
MAX_NODE_STREAMS = 16
#: Node GPU cards one sample carries at most (a sample must stay well inside one frame).
MAX_NODE_GPUS = 512
MAX_LINE = 1024 * 1024


def gpu_stream(state_dir: str, nvidia_smi: str, interval: float) -> int:
    """``gpu-stream``: run on a job's node inside its allocation (srun --overlap); one JSON line per interval
    with this node's GPUs, from the agent's own sampler (NVML, else nvidia-smi)."""
    import json
    import socket
    import sys

    from .sampler import MetricsSampler

    sampler = MetricsSampler(state_dir, nvidia_smi=nvidia_smi)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]  # Slurm's name for it
    try:
        while True:
            s = sampler.sample(lambda pid: None)
            line = {"node": node, "job": os.environ.get("SLURM_JOB_ID"), "t": s["t"], "gpus": s["gpus"],
                    "gpu_source": s.get("gpu_source"), "gpu_error": s.get("gpu_error")}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
            time.sleep(interval)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        sampler.close()


class _Stream:
    """One running job's ``srun --overlap`` streaming its nodes' GPUs; the latest reading of each node."""

    def __init__(self, argv: List[str]) -> None:
        self.latest: Dict[str, Dict[str, Any]] = {}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        import json

        assert self.proc.stdout is not None
        for line in iter(lambda: self.proc.stdout.readline(MAX_LINE), b""):  # type: ignore[union-attr]
            try:
                reading = json.loads(line.decode("utf-8"))
                if isinstance(reading, dict) and isinstance(reading.get("gpus"), list):
                    reading["seen"] = time.monotonic()
                    self.latest[_text(str(reading.get("node")))] = reading
            except ValueError:
                continue  # a line cut at MAX_LINE, or srun's own words

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # srun passes it to the step, whose end is Slurm's business
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class NodeGpus:
    """The GPUs of the nodes where this user's Slurm jobs run, as GPU cards of the login node's samples: one
    long-lived ``srun --jobid=ID --overlap`` per running job runs ``gpu-stream`` on each of its nodes (never a
    process per reading). Each GPU is named ``node: model`` and its processes belong to that job."""

    def __init__(self, launcher: List[str], state_dir: str, nvidia_smi: str) -> None:
        self.launcher, self.state_dir, self.nvidia_smi = launcher, state_dir, nvidia_smi
        self._streams: Dict[str, _Stream] = {}
        self._lock = threading.Lock()

    def add_to(self, sample: Dict[str, Any], jobs: List[Dict[str, Any]]) -> None:
        """Append the running Slurm jobs' node GPUs to ``sample["gpus"]`` (indices after the host's own)."""
        running = {j["id"]: (j.get("slurm") or {}).get("job_id") for j in jobs
                   if j.get("scheduler") == "slurm" and j.get("state") == P.JOB_RUNNING}
        nodes = {j["id"]: (j.get("slurm") or {}).get("nodes_count") for j in jobs if j["id"] in running}
        running = dict(sorted(running.items(), key=lambda kv: int(kv[0]))[:MAX_NODE_STREAMS])
        with self._lock:
            for job_id in list(self._streams):
                if job_id not in running:
                    self._streams.pop(job_id).stop()
            for job_id, slurm_id in running.items():
                stream = self._streams.get(job_id)
                if slurm_id and (stream is None or (stream.proc.poll() is not None
                                                    and time.monotonic() - stream.started > RESTART_S)):
                    self._streams[job_id] = _Stream(self._argv(str(slurm_id), nodes.get(job_id)))
            streams = sorted(self._streams.items(), key=lambda kv: int(kv[0]))
        gpus = sample.setdefault("gpus", [])
        fresh, room = time.monotonic() - 3 * NODE_INTERVAL_S, MAX_NODE_GPUS
        for job_id, stream in streams:
            for node, reading in sorted(stream.latest.items()):
                if reading["seen"] < fresh:
                    continue
                for gpu in reading["gpus"][: max(0, room)]:
                    room -= 1
                    gpu = dict(gpu, index=len(gpus), name="%s: %s" % (node, gpu.get("name") or "GPU"))
                    gpu["processes"] = [dict(p, job=job_id) for p in gpu.get("processes") or []]
                    gpus.append(gpu)

    def _argv(self, slurm_id: str, nodes: Any = None) -> List[str]:
        """One task on each of the job's nodes (``nodes``, as asked; srun alone would take one node)."""
        n = nodes if isinstance(nodes, int) and 0 < nodes <= 100000 else 1
        return ["srun", "--jobid=" + slurm_id, "--overlap", "--nodes=%d" % n, "--ntasks=%d" % n,
                "--ntasks-per-node=1", "--quiet", "--job-name=gputui-gpus",
                *self.launcher, "gpu-stream", "--state-dir", self.state_dir, "--nvidia-smi", self.nvidia_smi,
                "--interval", str(NODE_INTERVAL_S)]

    def close(self) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.stop()

"""Host-only path of the metrics sampler on this machine's real /proc."""

import json
import os
import signal
import subprocess
import sys
import time

import pynvml
from conftest import wait_for

from remote_agent.host.procfs import ProcessUse
from remote_agent.host.stats import HostStats, nearest_existing, process_name
from remote_agent.metrics.sampler import MetricsSampler


class NoDriver:
    """nvmlInit fails as on a host without the NVIDIA driver (the real pynvml error class)."""

    NVMLError = pynvml.NVMLError

    def nvmlInit(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_host_only_readings_are_sane(tmp_path):
    state_dir = tmp_path / "not" / "created" / "yet"
    s = MetricsSampler(str(state_dir), nvidia_smi=str(tmp_path / "no-nvidia-smi"), nvml=NoDriver())
    first = s.sample(lambda pid: None)
    busy = time.process_time() + 0.05
    while time.process_time() < busy:
        pass
    second = s.sample(lambda pid: None)
    json.dumps(second)
    assert (second["gpu_source"], second["gpus"]) == (None, [])
    assert second["t"] >= first["t"]
    h = second["host"]
    assert h["cpu_count"] == os.cpu_count()
    assert 0 <= h["cpu_percent"] <= 100
    assert 0 < h["mem_used_mib"] < h["mem_total_mib"]
    assert 0 <= h["disk_free_gib"] <= h["disk_total_gib"] and h["disk_total_gib"] > 0
    assert h["load1"] >= 0 and h["load5"] >= 0 and h["load15"] >= 0
    assert h["uptime_s"] > 0
    assert not state_dir.exists()  # statvfs of the nearest existing parent, nothing created
    s.close()


def test_unreadable_proc_gives_none_not_errors(tmp_path):
    h = HostStats(str(tmp_path), proc=str(tmp_path / "no-proc"))
    out = h.sample()
    assert out["cpu_percent"] is None and out["mem_total_mib"] is None and out["uptime_s"] is None
    assert out["disk_total_gib"] > 0


def test_nearest_existing_parent(tmp_path):
    assert nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)


def test_process_name_and_owner_from_this_process(tmp_path):
    me = os.getpid()
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    assert process_name(me) == comm
    p = MetricsSampler._process({"pid": me, "mem_mib": 12}, {me: "job-3"}.get, ProcessUse().read([me]), [])
    cpu, rss = p.pop("cpu_percent"), p.pop("rss_mib")
    assert p == {"pid": me, "mem_mib": 12, "job": "job-3", "name": comm, "hidden": False, "inferred": False,
                 "children": 0, "children_cpu_percent": 0.0}
    assert isinstance(cpu, float) and cpu >= 0 and isinstance(rss, float) and rss > 10  # a python with pytest

    def broken(pid):
        raise KeyError(pid)

    assert MetricsSampler._process({"pid": me, "mem_mib": None}, broken, {}, [])["job"] is None


def test_a_gpu_processs_workers_and_their_cpu_are_counted(tmp_path):
    """A training process that loads its data in 3 worker processes (as PyTorch's DataLoader starts them): its
    GPU process entry counts them and their CPU together, so a GPU left idle by busy workers shows why."""
    from remote_agent.host.procfs import children

    ready = tmp_path / "ready"
    code = ("import os, sys, time\n"
            "for _ in range(3):\n"
            "    if os.fork() == 0:\n"
            "        while True: pass\n"
            "open(sys.argv[1], 'w').close()\n"
            "time.sleep(120)\n")
    trainer = subprocess.Popen([sys.executable, "-c", code, str(ready)], start_new_session=True)
    try:
        wait_for(ready.exists, what="the trainer's workers")
        kids = children(trainer.pid)
        assert len(kids) == 3 and trainer.pid not in kids
        use = ProcessUse()
        use.read([trainer.pid, *kids])

        def entry() -> dict:
            return MetricsSampler._process({"pid": trainer.pid, "mem_mib": 100}, lambda pid: "7",
                                           use.read([trainer.pid, *kids]), kids)

        p = wait_for(lambda: (p := entry())["children_cpu_percent"] > 0 and p, what="the workers' CPU")
        assert p["children"] == 3 and p["cpu_percent"] < p["children_cpu_percent"]  # the workers do the work
        assert children(2**22 + 1) == []  # a pid not there: none
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()


def test_a_gpu_processs_cpu_share_and_memory_are_read_from_proc(tmp_path):
    """The usual answer to a GPU at 30 %: its process at 100 % of a core (a data loader in the main process).
    CPU % is over the time between two readings of the same process; a new process under a reused pid starts
    over; a pid not in this /proc reads as unknown."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        use = ProcessUse()
        deadline = time.monotonic() + 30
        while True:  # the spinner's share over the last interval nears a whole core (the machine may be busy)
            got = use.read([spin.pid, idle.pid, 2**22 + 1])
            if got[spin.pid][0] is not None and got[spin.pid][0] > 40 or time.monotonic() > deadline:
                break
            busy = time.monotonic() + 0.2
            while time.monotonic() < busy:
                pass
        assert got[spin.pid][0] > 40 and got[idle.pid][0] < 20
        assert got[spin.pid][1] > 1 and got[idle.pid][1] > 1  # resident MiB of a python
        assert got[2**22 + 1] == (None, None)
    finally:
        for p in (spin, idle):
            p.kill()
            p.wait()

    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "uptime").write_text("1000.00 50.00\n")
    ticks = os.sysconf("SC_CLK_TCK")

    def stat(cpu_s, start_s):
        rest = ["S"] + ["0"] * 10 + [str(int(cpu_s * ticks)), "0"] + ["0"] * 6 + [str(int(start_s * ticks)), "0", "256"]
        (proc / "7" / "stat").write_text("7 (py) th)ing) " + " ".join(rest))

    fake = ProcessUse(str(proc))
    stat(450, 100)  # 450 s of CPU in its 900 s of life: half a core on its first reading
    [(cpu, rss)] = fake.read([7]).values()
    assert cpu == 50.0 and rss == round(256 * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    stat(10, 990)  # another process under the same pid: its own life, not the difference
    assert fake.read([7])[7][0] == 100.0

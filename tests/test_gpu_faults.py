"""Issue 39's done-when: an XID on one GPU of four (the recorded 8x A100's first four GPUs, read through the NVML
double as the agent reads them) shows on that GPU's card, in ``status --json`` and ``status --short``, as a
``gpu_fault`` notification from the watchdog with no client, and in the run's record, while the other three
GPUs keep reporting. The XID is the one real reports show for a GPU that left the bus: 79, after which every
read of that GPU fails with "GPU is lost"."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_notify import T, checked, notify_config

from gputui.core.jobs.records import run_faults
from gputui.core.session import model as M
from gputui.tables import _state_cell, status_line
from remote_agent.jobs.usage import UsageRecorder
from remote_agent.metrics import faults as fault_watch
from remote_agent.metrics import sampler as sampler_module
from remote_agent.metrics.sampler import MetricsSampler
from remote_agent.watchdog import daemon

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
sys.path.insert(0, str(FIXTURES))
from nvml_double import NvmlDouble  # noqa: E402

A100_X8 = (FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt").read_text()


@pytest.fixture(autouse=True)
def read_events_at_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "FAULTS_EVERY_S", 0.0)  # (every 5 s on a host)


def fell_off_the_bus(tmp_path: Path) -> tuple[NvmlDouble, MetricsSampler, dict[str, Any]]:
    """Four A100s sampled; XID 79 on GPU 2, which is then lost; the sample after it."""
    double = NvmlDouble(A100_X8, gpus=4)
    sampler = MetricsSampler(str(tmp_path), nvml=double)
    sampler.sample(lambda pid: None)  # the event set is open from the first sample on
    double.xid(2, 79)
    double.lost.add(2)
    return double, sampler, sampler.sample(lambda pid: None)


def test_an_xid_shows_on_its_gpu_and_the_other_three_keep_reporting(tmp_path: Path) -> None:
    _, sampler, wire = fell_off_the_bus(tmp_path)
    sampler.close()
    by_index = {g["index"]: g for g in wire["gpus"]}
    assert sorted(by_index) == [0, 1, 2, 3]
    assert by_index[2]["state"] == "lost" and [f["xid"] for f in by_index[2]["faults"]] == [79]
    for i in (0, 1, 3):  # still read, with no fault
        assert by_index[i]["state"] == "ok" and by_index[i]["util_percent"] is not None and by_index[i]["faults"] == []
    [line] = (tmp_path / fault_watch.FAULTS).read_text().splitlines()
    recorded = json.loads(line)
    assert (recorded["gpu"], recorded["xid"], recorded["meaning"]) == (2, 79, "GPU has fallen off the bus")
    assert recorded["uuid"] == by_index[2]["uuid"] or by_index[2]["uuid"] is None

    snap = M.HostSnapshot("a100", state=M.CONNECTED, metrics=M.MetricsSample.from_wire(wire))
    gpu = snap.gpus[2]
    assert gpu.problems[0] == "lost"
    assert gpu.problems[1].startswith("XID: 79 (GPU has fallen off the bus) ")
    assert "ago: reboot the host; if it comes back, hardware: ask the provider for another instance" in gpu.problems[1]
    assert [g.problems for g in snap.gpus if g.index != 2] == [[], [], []]
    assert status_line(snap).startswith("a100 up · GPU 2 LOST")
    assert snap.to_json()["gpus"][2]["faults"][0]["xid"] == 79


def test_the_watchdog_notifies_a_gpu_fault_with_no_client(tmp_path: Path) -> None:
    """The watchdog's own watcher hears it (no agent runs) and sends ``gpu_fault`` once."""
    marker = tmp_path / "sent"
    double = NvmlDouble(A100_X8, gpus=4)
    watcher = fault_watch.FaultWatcher(str(tmp_path), double)
    assert watcher.poll(0, now=T + 1) == []  # open: listening from now on
    config = notify_config(tmp_path, command=["sh", "-c", f'cat >> "{marker}"; echo " $GPUTUI_NOTIFY_EVENT" >> "{marker}"'],
                           events=["gpu_fault"])
    double.xid(1, 48)
    [fault] = watcher.poll(0, now=T + 2)
    assert (fault["gpu"], fault["kind"], fault["xid"]) == (1, "xid", 48)
    dog = daemon.Watchdog(str(tmp_path))
    jobs = lambda: ({"gpus": []}, [])  # noqa: E731
    checked(dog, config, jobs, 3)
    checked(dog, config, jobs, 30)  # sent once
    assert marker.read_text() == (
        "[gpu1] GPU 1: XID 48 (uncorrectable (double bit) ECC error); reset the GPU or reboot the host (`sudo "
        "nvidia-smi -r -i N`, or ask the provider); if it comes back, ask for another instance gpu_fault\n"
    )
    watcher.close()


def test_one_process_watches_at_a_time_and_the_next_takes_over(tmp_path: Path) -> None:
    double = NvmlDouble(A100_X8, gpus=4)
    first, second = fault_watch.FaultWatcher(str(tmp_path), double), fault_watch.FaultWatcher(str(tmp_path), double)
    first.poll(0)
    second.poll(0)
    assert second.why == "another gputui process watches the GPUs' faults"
    double.xid(0, 13)
    assert len(first.poll(0)) == 1 and second.poll(0) == []
    first.close()
    second._retry_at = 0.0  # (its next try, due RETRY_S later)
    double.xid(3, 94)
    second.poll(0)  # opens now: hears what comes from now on
    double.xid(3, 95)
    assert [f["xid"] for f in second.poll(0)] == [95]
    assert [f["xid"] for f in fault_watch.read(str(tmp_path))] == [13, 95]  # one line per fault: never twice
    second.close()


def test_without_nvml_events_nothing_breaks(tmp_path: Path) -> None:
    watcher = fault_watch.FaultWatcher(str(tmp_path), NvmlDouble(A100_X8, gpus=2, init_error=9))
    assert watcher.poll(0) == [] and watcher.why.startswith("no NVML event set")
    assert fault_watch.read(str(tmp_path)) == [] and fault_watch.by_gpu(str(tmp_path), time.time()) == {}


def test_the_file_is_read_line_by_line_and_kept_bounded(tmp_path: Path) -> None:
    (tmp_path / fault_watch.FAULTS).write_bytes(b'not json\n{"t": "x", "gpu": 0, "kind": "xid"}\n\xff\xfe\n'
                                      b'{"t": 5, "gpu": true, "kind": "xid"}\n')
    assert fault_watch.read(str(tmp_path)) == []
    many = [{"t": float(i), "gpu": i % 4, "kind": "xid", "xid": 13} for i in range(3 * fault_watch.MAX_KEPT)]
    for start in range(0, len(many), 100):
        fault_watch.record(str(tmp_path), many[start : start + 100])
    kept = fault_watch.read(str(tmp_path))
    assert fault_watch.MAX_KEPT <= len(kept) <= 2 * fault_watch.MAX_KEPT and kept[-1]["t"] == many[-1]["t"]


def test_the_runs_record_has_the_xids_of_its_gpus(tmp_path: Path) -> None:
    job_dir = tmp_path / "jobs" / "7"
    job_dir.mkdir(parents=True)
    recorder = UsageRecorder(str(job_dir), 1, "1,2", "nvidia-smi")
    recorder.started = 0.0
    _, sampler, wire = fell_off_the_bus(tmp_path)
    sampler.close()
    recorder.add(wire)
    recorder.add(wire)  # seen again: kept once
    [kept] = recorder.usage["faults"]
    assert (kept["gpu"], kept["xid"]) == (2, 79)
    other = UsageRecorder(str(job_dir), 1, "0", "nvidia-smi")
    other.started = 0.0
    other.add(wire)
    assert other.usage["faults"] == []  # GPU 2 is not this job's
    faults = run_faults(recorder.usage)
    assert [(f["gpu"], f["xid"]) for f in faults] == [(2, 79)]
    record = {"state": "failed", "gpu_faults": faults}
    assert _state_cell(record) == "failed XID 79"
    assert run_faults({"faults": [{"t": "x"}, 5, {"t": 1.0, "kind": "xid", "gpu": True}]}) == []


@pytest.mark.parametrize("xid, words", [(79, "GPU has fallen off the bus"), (31, "GPU memory page fault"),
                                        (999, "XID 999 (see NVIDIA's Xid catalog)")])
def test_each_xid_says_what_it_means_and_what_to_do(xid: int, words: str) -> None:
    meaning, fix = fault_watch.describe("xid", xid)
    assert meaning == words and fix


def test_the_doctor_names_a_gpus_recent_xid_and_what_to_do(tmp_path: Path) -> None:
    """A GPU that reported an XID and still answers warns with it (the newest, how long ago, what to do); one
    that fell off the bus fails, naming the XID the driver reported; the others say nothing of XIDs."""
    from remote_agent.host import doctor

    double, sampler, _ = fell_off_the_bus(tmp_path)
    double.xid(1, 13)
    wire = sampler.sample(lambda pid: None)
    sampler.close()
    checks = {c["id"]: c for c in doctor.gpu_checks(sampler.facts(), wire, {"nvidia_pci": 4, "module": "550"})}
    assert checks["gpu.1"]["status"] == "warn" and checks["gpu.1"]["detail"].startswith("XID 13 (")
    assert " 0 min ago" in checks["gpu.1"]["detail"] and checks["gpu.1"]["fix"]
    assert checks["gpu.2"]["status"] == "fail" and "the driver reported XID 79 (GPU has fallen off the bus)" in checks["gpu.2"]["detail"]
    assert [checks[f"gpu.{i}"]["detail"] for i in (0, 3)] == ["persistence mode off"] * 2  # (as recorded)

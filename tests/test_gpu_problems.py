"""The GPU you pay for, when it is slowed or failing: the readings of a recorded 8x A100 (``nvidia-smi -q``,
read through the NVML double as the agent's sampler reads them) with faults written into GPU 3's and GPU 5's
lines as real reports show them (HW Thermal Slowdown engaged at 91 C, DRAM uncorrectable ECC errors, a PCIe link trained at x8 gen3 of x16 gen4, a row remap pending), and what
every surface says: the GPU's problems, ``status --json``, ``status`` and ``status --short``, the app's
health line, card and hosts table; the power cap at full load, normal, is no problem."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from rich.text import Text

from gputui.core.session import model as M
from gputui.tables import print_status, status_line
from remote_agent.metrics.sampler import MetricsSampler

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
sys.path.insert(0, str(FIXTURES))
from nvml_double import NvmlDouble  # noqa: E402

A100_X8 = (FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt").read_text()


def _fault(text: str, gpu: int, old: str, new: str) -> str:
    """``text`` with the first line matching ``old`` (a regex) in GPU ``gpu``'s block replaced by ``new``."""
    blocks = re.split(r"(?m)^(?=GPU [0-9A-F]{8}:)", text)
    head, gpus = blocks[0], blocks[1:]
    gpus[gpu], n = re.subn(old, new, gpus[gpu], count=1, flags=re.M)
    assert n == 1, old
    return head + "".join(gpus)


def faulty_a100s() -> str:
    text = _fault(A100_X8, 3, r"^( +HW Slowdown +): Not Active$", r"\1: Active")
    text = _fault(text, 3, r"^( +HW Thermal Slowdown +): Not Active$", r"\1: Active")
    text = _fault(text, 3, r"^( +GPU Current Temp +): \d+ C$", r"\1: 91 C")
    text = _fault(text, 5, r"^( +DRAM Uncorrectable +): 0$", r"\1: 2")  # the first: Volatile
    text = _fault(text, 7, r"^( +Pending +): No$", r"\1: Yes")  # Remapped Rows: one waits for a GPU reset
    text = _fault(text, 1, r"^( +Current +): 4$", r"\1: 3")  # PCIe Generation (the first "Current")
    text = _fault(text, 1, r"^( +Current +): 16x$", r"\1: 8x")  # Link Width: trained at half its lanes
    return _fault(text, 6, r"^( +SW Power Cap +): Not Active$", r"\1: Active")  # full load: normal


def snapshot(tmp_path: Path) -> M.HostSnapshot:
    sampler = MetricsSampler(str(tmp_path), nvml=NvmlDouble(faulty_a100s()))
    try:
        wire = sampler.sample(lambda pid: None)
    finally:
        sampler.close()
    metrics = M.MetricsSample.from_wire(wire)
    return M.HostSnapshot("a100", state=M.CONNECTED, metrics=metrics)


def test_a_throttled_and_an_ecc_failing_gpu_say_so_the_others_do_not(tmp_path: Path) -> None:
    snap = snapshot(tmp_path)
    problems = {g.index: g.problems for g in snap.gpus}
    assert problems[3] == ["throttled: thermal slowdown (hardware) at 91°C"]
    assert problems[5] == ["ECC: 2 uncorrected errors since the driver loaded (reboot; again after that: ask for "
                           "another instance)"]
    assert "sw_power_cap" in (snap.gpus[6].throttle_reasons or ()) and problems[6] == []  # the power cap: normal
    assert problems[1] == ["PCIe: link x8 of x16, gen3 of gen4 (every transfer to the GPU is slower: ask the provider "
                           "for another instance)"]
    assert problems[7] == ["memory: rows wait to be remapped (reset the GPU or reboot the host to apply)"]
    assert all(problems[i] == [] for i in (0, 2, 4))
    gpus = snap.to_json()["gpus"]
    assert [g["problems"] for g in gpus][3:6] == [problems[3], [], problems[5]]
    assert (gpus[1]["pcie_width"], gpus[1]["pcie_width_max"], gpus[0]["pcie_width"]) == (8, 16, 16)


def test_status_short_and_plain_name_the_gpus(tmp_path: Path, capsys) -> None:
    snap = snapshot(tmp_path)
    line = status_line(snap)
    assert line.startswith("a100 up · GPU 3 throttled · GPU 1 PCIe · GPU 7 memory · GPU 5 ECC · 8 GPU "), line
    print_status([snap])
    out = capsys.readouterr().out
    assert "  gpu3 throttled: thermal slowdown (hardware) at 91°C\n" in out and "  gpu5 ECC: 2 uncorrected" in out
    assert "gpu6 throttled" not in out


def test_the_app_shows_the_problem_on_the_card_the_health_line_and_the_hosts_table(tmp_path: Path) -> None:
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.fleet import gpu_summary, host_row
    from gputui.ui.widgets.host import health_line

    snap = snapshot(tmp_path)
    assert health_line(snap.gpus).splitlines() == [
        "GPU 1 PCIe: link x8 of x16, gen3 of gen4 (every transfer to the GPU is slower: ask the provider for another "
        "instance)",
        "GPU 3 throttled: thermal slowdown (hardware) at 91°C",
        "GPU 5 ECC: 2 uncorrected errors since the driver loaded (reboot; again after that: ask for another "
        "instance)",
        "GPU 7 memory: rows wait to be remapped (reset the GPU or reboot the host to apply)",
    ]
    assert gpu_summary(snap) == "⚠ 4 degraded · 8× A100-SXM4-40GB"
    pal = Palette()
    cell = host_row(snap, pal)[2]
    assert isinstance(cell, Text) and cell.style == pal.warm


def _wire(q_text: str, tmp_path: Path) -> dict:
    sampler = MetricsSampler(str(tmp_path), nvml=NvmlDouble(q_text))
    try:
        return sampler.sample(lambda pid: None)
    finally:
        sampler.close()


def test_a_run_says_what_was_paid_while_its_gpu_idled_or_was_throttled(tmp_path: Path, capsys) -> None:
    """The runner's usage record over recorded readings of GPU 0: two idle (the A100 at rest), one busy but
    thermally throttled (the H100 under load, HW Thermal Slowdown written in), three busy and well: half of the
    run's cost was paid for nothing, and history and compare say so."""
    from fake_nvidia_smi import sections

    from gputui.core.jobs.compare import Run, compare_rows
    from gputui.core.jobs.records import run_record
    from remote_agent.jobs.usage import UsageRecorder

    h100 = sections((FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt").read_text())["load :: query (-q)"]
    hot = _fault(_fault(h100, 0, r"^( +HW Slowdown +): Not Active$", r"\1: Active"), 0,
                 r"^( +HW Thermal Slowdown +): Not Active$", r"\1: Active")
    narrow = _fault(h100, 0, r"^( +Current +): 16x$", r"\1: 8x")  # busy, its link trained at half its lanes
    idle_narrow = _fault(A100_X8, 0, r"^( +Current +): 16x$", r"\1: 8x")  # idle: counted idle only
    recorder = UsageRecorder(str(tmp_path / "jobs" / "7"), 1, "0", "nvidia-smi")
    for text in (A100_X8, idle_narrow, hot, narrow, h100, h100):
        recorder.add(_wire(text, tmp_path))
    usage = recorder.usage
    assert (usage["gpu_samples"], usage["idle_samples"], usage["throttled_samples"]) == (6, 2, 1)
    assert usage["narrow_link_samples"] == 1
    job = M.Job("h100", "7", "train", "succeeded", ("python", "train.py"), exit_code=0, started_at=0.0,
                ended_at=3600.0, record={"usage": usage, "price_per_hour": 12.0})  # type: ignore[typeddict-unknown-key]
    record = run_record(job, None, "USD")
    assert record["cost"] == 12.0 and record["cost_idle_or_throttled"] == 6.0 and record["cost_narrow_link"] == 2.0
    assert (record["idle_fraction"], record["throttled_fraction"], record["narrow_link_fraction"]) == (2 / 6, 1 / 6, 1 / 6)
    runs = [Run(record, {}), Run(dict(record, cost_idle_or_throttled=0.0, cost_narrow_link=0.0), {})]
    [paid] = [r for r in compare_rows(runs) if r.field == "wasted"]
    assert paid.cells == ("6.00", "0.00") and paid.differs
    [slow] = [r for r in compare_rows(runs) if r.field == "narrow PCIe"]
    assert slow.cells == ("2.00", "0.00") and slow.differs
    from gputui.tables import print_history

    print_history([dict(record, host="h100", id="7", name="train", metrics={}, code=None, git=None)])
    assert "12.00 (6.00 wasted, 2.00 on a narrow PCIe link)" in capsys.readouterr().out


def test_the_doctor_says_which_gpu_is_not_the_one_paid_for_and_what_to_do(tmp_path: Path) -> None:
    from remote_agent.host import doctor

    sampler = MetricsSampler(str(tmp_path), nvml=NvmlDouble(faulty_a100s()))
    try:
        checks = {c["id"]: c for c in doctor.gpu_checks(sampler.facts(), sampler.sample(lambda pid: None), {})}
    finally:
        sampler.close()
    # (this recording has persistence mode off on every GPU: a warning of its own, after the GPU's problem)
    assert (checks["gpu.1"]["status"], checks["gpu.1"]["detail"]) == ("warn", "PCIe link x8 of x16; persistence mode off")
    assert "fewer lanes" in checks["gpu.1"]["fix"]
    assert checks["gpu.7"]["detail"] == "memory rows wait to be remapped; persistence mode off"
    assert "sudo nvidia-smi -r -i 7" in checks["gpu.7"]["fix"]
    assert checks["gpu.5"]["status"] == "fail" and checks["gpu.3"]["status"] == "warn"
    assert checks["gpu.0"]["detail"] == "persistence mode off"  # its link at full width: nothing to say


def test_a_run_has_the_energy_its_gpus_drew(tmp_path: Path) -> None:
    """Each run's kWh from its GPUs' power readings (the mean of two readings times the time between them); a
    gap without samples (no sampler ran) counts nothing, and a reading that is not a power counts nothing."""
    from gputui.core.jobs.compare import Run, compare_rows
    from gputui.core.jobs.records import run_record
    from remote_agent.jobs.usage import UsageRecorder

    recorder = UsageRecorder(str(tmp_path / "jobs" / "7"), 1, None, "nvidia-smi")

    def at(t: float, *watts: object) -> dict:
        return {"t": t, "gpus": [{"index": i, "util_percent": 90.0, "power_w": w} for i, w in enumerate(watts)]}

    for sample in (at(0, 300.0, 300.0), at(10, 400.0, 400.0), at(20, 400.0, 400.0),  # 7 kJ + 8 kJ
                   at(3620, 400.0, 400.0),  # an hour without samples: nothing
                   at(3630, 400.0, "n/a"), at(3640, 400.0, 400.0), at(3650, 400.0, 400.0)):  # 8 kJ
        recorder.add(sample)
    assert recorder.usage["energy_j"] == pytest.approx(23_000.0)
    job = M.Job("h100", "7", "train", "succeeded", ("python", "train.py"), exit_code=0, started_at=0.0,
                ended_at=3650.0, record={"usage": recorder.usage})  # type: ignore[typeddict-unknown-key]
    record = run_record(job, None, "USD")
    assert record["energy_kwh"] == pytest.approx(23_000.0 / 3.6e6)
    [kwh] = [r for r in compare_rows([Run(record, {}), Run(dict(record, energy_kwh=None), {})]) if r.field == "GPU kWh"]
    assert kwh.cells == ("0.006", "-")


def _h100_load() -> str:
    from fake_nvidia_smi import sections

    return sections((FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt").read_text())["load :: query (-q)"]


def test_a_gpu_slowed_for_heat_says_how_much_of_the_last_minutes_and_the_run_what_it_cost(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """The H100 under load read every 6 s for 20 minutes: cool for the first 10, then its driver's thermal
    violation counter (``Clocks Event Reasons Counters``, written in as it grows) slowed for heat 14 % of the
    time at 87 C, with no clock-event reason active at the instant of the last reading. The card's problem, the
    short status, the doctor and the run's record all say it; the first minute says nothing (too short to judge)."""
    from gputui.core.jobs.compare import Run, compare_rows
    from gputui.core.jobs.records import run_record
    from remote_agent.host import doctor
    from remote_agent.jobs.usage import UsageRecorder
    from remote_agent.metrics import sampler as metrics

    clock = [1000.0]
    monkeypatch.setattr(metrics.gpu_nvml.time, "monotonic", lambda: clock[0])
    load = _h100_load()
    nv = NvmlDouble(load)
    sampler = MetricsSampler(str(tmp_path), nvml=nv)
    recorder = UsageRecorder(str(tmp_path / "jobs" / "7"), 1, "0", "nvidia-smi")
    seen = {}
    try:
        for k in range(201):
            elapsed = 6.0 * k
            clock[0] = 1000.0 + elapsed
            slowed_us = max(0, round((elapsed - 600.0) * 0.14 * 1e6))
            text = _fault(load, 0, r"^( +SW Thermal Slowdown +): 0 us$", rf"\1: {slowed_us} us")
            if slowed_us:
                text = _fault(text, 0, r"^( +GPU Current Temp +): \d+ C$", r"\1: 87 C")
            nv.feed(text)
            wire = dict(sampler.sample(lambda pid: None), t=elapsed)
            recorder.add(wire)
            seen[elapsed] = wire["gpus"][0]
    finally:
        sampler.close()
    assert (seen[30.0]["thermal_slowdown_percent"], seen[30.0]["thermal_window_s"]) == (None, None)
    assert (seen[600.0]["thermal_slowdown_percent"], seen[600.0]["thermal_window_s"]) == (0.0, 600.0)
    last = seen[1200.0]
    assert last["thermal_violation_ms"] == 84_000.0 and last["throttle_reasons"] == []
    assert last["thermal_slowdown_percent"] == pytest.approx(14.0, abs=0.2) and 600 <= last["thermal_window_s"] < 612
    gpu = M.GpuSample.from_wire(last)
    assert gpu.problems == ["throttled: thermal slowdown at 87°C, 14% of the last 10 min"]
    snap = M.HostSnapshot("h100", state=M.CONNECTED, metrics=M.MetricsSample.from_wire(wire))
    assert "· GPU 0 throttled ·" in status_line(snap)
    [check] = [c for c in doctor.gpu_checks(sampler.facts(), wire, {}) if c["id"] == "gpu.0"]
    assert (check["status"], check["detail"]) == ("warn", "87 C; throttled: sw_thermal (slowed for heat 14% of the last 10 min)")
    usage = recorder.usage
    assert usage["thermal_slowdown_s"] == pytest.approx(84.0) and usage["throttled_samples"] == 100
    job = M.Job("h100", "7", "train", "succeeded", ("python", "train.py"), exit_code=0, started_at=0.0,
                ended_at=1200.0, record={"usage": usage, "price_per_hour": 12.0})  # type: ignore[typeddict-unknown-key]
    record = run_record(job, None, "USD")
    assert record["thermal_slowdown_s"] == pytest.approx(84.0)
    assert record["throttled_fraction"] == pytest.approx(100 / 201)
    [heat] = [r for r in compare_rows([Run(record, {}), Run(dict(record, thermal_slowdown_s=None), {})])
              if r.field == "heat slowdown"]
    assert heat.cells == ("1m24s", "-")


def test_retired_pages_and_a_capped_application_clock_are_named(tmp_path: Path) -> None:
    """The 8x A100 recording with, written in as ``nvidia-smi -q`` prints them: GPU 2's application clock set to
    765 of its default 1095 MHz, GPU 4 with 3 pages retired and one retirement pending, GPU 6 with 62 retired
    (the driver retires at most 64), GPU 3 with 4 uncorrected ECC errors in its life but none since the driver
    loaded. Every surface names them; the other GPUs stay quiet."""
    from remote_agent.host import doctor

    text = _fault(A100_X8, 2, r"^( +Graphics +): 1095 MHz$", r"\1: 765 MHz")  # the first: Applications Clocks
    text = _fault(text, 4, r"^( +Single Bit ECC +): N/A$", r"\1: 2")
    text = _fault(text, 4, r"^( +Double Bit ECC +): N/A$", r"\1: 1")
    text = _fault(text, 4, r"^( +Pending Page Blacklist +): N/A$", r"\1: Yes")
    text = _fault(text, 6, r"^( +Single Bit ECC +): N/A$", r"\1: 40")
    text = _fault(text, 6, r"^( +Double Bit ECC +): N/A$", r"\1: 22")
    text = _fault(text, 6, r"^( +Pending Page Blacklist +): N/A$", r"\1: No")
    text = _fault(text, 3, r"^( +Aggregate\n(?: +[SD]RAM \w+ +: \d+\n){3} +DRAM Uncorrectable +): 0$",
                  r"\1: 4")  # 4 in its life (Volatile, since the driver loaded: still 0)
    sampler = MetricsSampler(str(tmp_path), nvml=NvmlDouble(text))
    try:
        wire = sampler.sample(lambda pid: None)
        checks = {c["id"]: c for c in doctor.gpu_checks(sampler.facts(), wire, {})}
    finally:
        sampler.close()
    gpus = wire["gpus"]
    assert (gpus[2]["app_clock_mhz"], gpus[2]["app_clock_default_mhz"], gpus[2]["sm_clock_max_mhz"]) == (765, 1095, 1410)
    assert (gpus[4]["retired_pages_single"], gpus[4]["retired_pages_double"], gpus[4]["retired_pages_pending"]) == (2, 1, True)
    problems = {g["index"]: M.GpuSample.from_wire(g).problems for g in gpus}
    assert problems[2] == ["clocks: application clock set to 765 of its default 1095 MHz (`sudo nvidia-smi -rac` "
                           "resets it; on a rented host ask the provider)"]
    assert problems[4] == ["memory: a page retirement waits for a reboot (reboot the host to apply)"]
    assert problems[6] == ["memory: 62 pages retired after ECC errors, of the 64 the driver can retire (ask the "
                           "provider for another instance)"]
    assert problems[3] == ["ECC: 4 uncorrected errors in the GPU's life, none since the driver loaded (memory that "
                           "failed before: if they come back, ask for another instance)"]
    assert all(problems[i] == [] for i in (0, 1, 5, 7))
    snap = M.HostSnapshot("a100", state=M.CONNECTED, metrics=M.MetricsSample.from_wire(wire))
    assert status_line(snap).startswith("a100 up · GPU 4,6 memory · GPU 3 ECC · GPU 2 clocks · 8 GPU ")
    assert checks["gpu.3"]["detail"] == "4 uncorrected ECC errors in the GPU's life; persistence mode off"
    assert checks["gpu.2"]["detail"] == "application clock 765 of its default 1095 MHz; persistence mode off"
    assert "nvidia-smi -rac" in checks["gpu.2"]["fix"]
    assert checks["gpu.4"]["detail"].startswith("a memory page retirement waits for a reboot")
    assert (checks["gpu.6"]["status"], checks["gpu.4"]["status"]) == ("fail", "warn")


def test_an_nvlink_link_down_is_named_and_all_up_is_not(tmp_path: Path) -> None:
    """The H200 under load with its ``nvidia-smi nvlink -s`` (18 links at 26.562 GB/s), as recorded, then with
    link 2 down as real reports print it (``Link 2: <inactive>``): the GPU's problem, the short status and the
    doctor say how many links are up; all up is said only by a well GPU's doctor line."""
    from fake_nvidia_smi import sections

    from remote_agent.host import doctor

    capture = sections((FIXTURES / "h200_590.48.01_capture.txt").read_text())
    q, links = capture["load :: query (-q)"], capture["capabilities :: nvlink -s"]
    down = re.sub(r"(?m)^(\s+Link 2): 26\.562 GB/s$", r"\1: <inactive>", links)
    readings = {}
    for name, text in (("up", links), ("down", down)):
        sampler = MetricsSampler(str(tmp_path), nvml=NvmlDouble(q, nvlink=text))
        try:
            wire = sampler.sample(lambda pid: None)
            [check] = [c for c in doctor.gpu_checks(sampler.facts(), wire, {}) if c["id"] == "gpu.0"]
        finally:
            sampler.close()
        readings[name] = (wire, check)
    up, up_check = readings["up"]
    assert (up["gpus"][0]["nvlink_links"], up["gpus"][0]["nvlink_active"]) == (18, 18)
    assert M.GpuSample.from_wire(up["gpus"][0]).problems == [] and "NVLink 18 links up" in up_check["detail"]
    wire, check = readings["down"]
    gpu = M.GpuSample.from_wire(wire["gpus"][0])
    assert (gpu.nvlink_links, gpu.nvlink_active) == (18, 17)
    assert gpu.problems == ["NVLink: 17 of 18 links up (traffic between the GPUs, all-reduce, is slower: ask the "
                            "provider for another instance)"]
    snap = M.HostSnapshot("h200", state=M.CONNECTED, metrics=M.MetricsSample.from_wire(wire))
    assert status_line(snap).startswith("h200 up · GPU 0 NVLink · 1 GPU ")
    assert (check["status"], check["detail"]) == ("warn", "NVLink 17 of 18 links up")
    no_nvlink = MetricsSampler(str(tmp_path), nvml=NvmlDouble(q))  # a GPU without NVLink: nothing, not 0 of 0
    try:
        assert no_nvlink.sample(lambda pid: None)["gpus"][0]["nvlink_links"] is None
    finally:
        no_nvlink.close()

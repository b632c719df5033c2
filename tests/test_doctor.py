"""Doctor: the real CLI on this host, GPU checks on recorded real GPU readings, torch probe limits.

GPU readings come from tests/fixtures/gpu (the nvidia-smi stand-in and the NVML double replaying real
recordings); the torch probe runs the real installed torch in a subprocess.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Home, wait_for
from test_metrics_smi import H100, MISMATCH, RTX4080, NoNvml, fake_smi

from remote_agent.host import doctor
from remote_agent.metrics.sampler import MetricsSampler

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
NO_GPU_HW = {"pci_gpus": 0, "kernel_module": None}
IDS = ["driver", "cuda", "python", "torch", "torch.cuda", "torch.arch", "tmux", "disk", "memory", "shm",
       "container", "engine", "volume"]
HAS_TORCH = importlib.util.find_spec("torch") is not None
HANG_GUARD_S = 120  # a bound on a wait that must end (never a measure of speed)


def by_id(checks: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {c["id"]: c for c in checks}


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def smi_checks(tmp_path: Path, capture: Path, state: str) -> list[dict[str, str]]:
    """gpu_checks on what MetricsSampler read from the stand-in nvidia-smi replaying ``capture``."""
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, capture, state), nvml=NoNvml())
    return doctor.gpu_checks(s.facts(), s.sample(lambda pid: None), NO_GPU_HW)


def no_gpu_sampler(tmp_path: Path) -> MetricsSampler:
    return MetricsSampler(str(tmp_path), nvidia_smi=str(tmp_path / "no-nvidia-smi"), nvml=NoNvml(12))


# --- the real CLI on this host -----------------------------------------------------------------------------
def test_cli_doctor_local_json(home: Home) -> None:
    res = home.cli("doctor", "local", "--json")
    [host] = json.loads(res.stdout)["hosts"]
    checks = by_id(host["checks"])
    assert host["checks"][0]["id"] == "release"  # the client's own check (tests/test_release_provider.py)
    assert [c["id"] for c in host["checks"][1:] if not c["id"].startswith("gpu.")][:-1] == IDS
    assert host["checks"][-1]["id"] == "state_dir"
    for c in host["checks"]:
        assert set(c) == {"id", "title", "status", "detail", "fix"} and c["status"] in (
            "ok",
            "warn",
            "fail",
            "skip",
        )
        assert (c["fix"] == "") == (c["status"] in ("ok", "skip")), c
    assert res.returncode == (1 if any(c["status"] == "fail" for c in host["checks"]) else 0), res.stderr
    assert (
        checks["python"]["status"] == "ok"
        and f"Python {sys.version.split()[0]}" in checks["python"]["detail"]
    )
    assert checks["tmux"] == {
        **checks["tmux"],
        "status": "ok",
        "detail": subprocess.check_output(["tmux", "-V"], text=True).strip(),
    }
    assert checks["state_dir"] == {**checks["state_dir"], "status": "ok", "detail": str(home.state_dir)}
    assert (
        checks["disk"]["status"] in ("ok", "warn", "fail") and str(home.state_dir) in checks["disk"]["detail"]
    )
    if HAS_TORCH:
        import torch

        assert (
            checks["torch"]["status"] == "ok" and f"torch {torch.__version__} " in checks["torch"]["detail"]
        )
    if doctor.nvidia_pci_gpus() == 0 and doctor.kernel_module() is None:  # CI: a host without a GPU
        assert checks["driver"]["status"] == "skip" and checks["driver"]["detail"].startswith("no GPU")
        assert checks["cuda"]["status"] == "skip" and not any(i.startswith("gpu.") for i in checks)
        if HAS_TORCH:
            assert checks["torch.cuda"] == {
                **checks["torch.cuda"],
                "status": "skip",
                "detail": "no GPU: torch.cuda.is_available() is False",
            }
            assert checks["torch.arch"]["status"] == "skip"


def test_cli_plain_text_shows_the_fix_for_missing_torch(home: Home, tmp_path: Path) -> None:
    # The jobs' python without site-packages: a real interpreter on which torch is not importable.
    bare = script(tmp_path, "bare-python", f'exec "{sys.executable}" -S "$@"')
    res = home.cli("doctor", "--python", bare, "--timeout", "20")
    lines = res.stdout.splitlines()
    assert lines[0].startswith("local: ") and " warn" in lines[0]
    [torch_line] = [i for i, line in enumerate(lines) if line.split()[:2] == ["WARN", "torch"]]
    assert f"torch is not installed for {bare}" in lines[torch_line]
    assert lines[torch_line + 1].strip() == (
        f"fix: Install it for this python: `{bare} -m pip install torch` (on a GPU host pick the build "
        "for the driver's CUDA at https://pytorch.org/get-started/locally/)."
    )
    assert any(line.split()[:2] == ["OK", "tmux"] for line in lines)
    # A missing torch is a warning: the exit status is 1 exactly when a check failed, as the summary counts.
    fails = sum(line.split()[:1] == ["FAIL"] for line in lines)
    assert lines[0].startswith(f"local: {fails} fail, ")
    assert res.returncode == (1 if fails else 0), res.stdout


def test_cli_unknown_host_is_a_usage_error(home: Home) -> None:
    res = home.cli("doctor", "nowhere")
    assert res.returncode == 2 and "unknown host 'nowhere'" in res.stderr
    res = home.cli("doctor", "local", "--timeout", "0")
    assert res.returncode == 2 and "--timeout must be between 0 and 600 seconds" in res.stderr


# --- GPU checks on recorded real readings ------------------------------------------------------------------
def test_h100_under_load_is_ok(tmp_path: Path) -> None:
    checks = by_id(smi_checks(tmp_path, H100, "load"))
    assert checks["driver"]["status"] == "ok"
    assert checks["driver"]["detail"].startswith(
        "driver 590.48.01, 1 GPU, read through nvidia-smi (NVML library"
    )
    assert checks["cuda"] == doctor.check(
        "cuda", "driver's CUDA version", "ok", "driver 590.48.01 supports CUDA up to 13.1"
    )
    assert checks["gpu.0"] == doctor.check(
        "gpu.0", "GPU 0: NVIDIA H100 80GB HBM3", "ok",
        "P0, 59 C, 632 W of 700 W, persistence on, no ECC errors, PCIe x16 gen5 (max gen5), SM clock 1980 of 1980 MHz, not throttled",
    )


def test_h100_idle_is_ok_and_idle_is_not_throttling(tmp_path: Path) -> None:
    g = by_id(smi_checks(tmp_path, H100, "idle"))["gpu.0"]
    assert g["status"] == "ok" and re.search(r"persistence on, no ECC errors, PCIe x16 gen\d \(max gen5\), idle$", g["detail"])


def test_rtx_4080_persistence_off_warns_and_cuda_comes_from_the_driver_version(tmp_path: Path) -> None:
    checks = by_id(smi_checks(tmp_path, RTX4080, "idle"))
    # This recording has no `nvidia-smi --version` nor table header: the CUDA version comes from the driver's.
    assert checks["cuda"]["status"] == "ok"
    assert checks["cuda"]["detail"].startswith("driver 595.71.05 supports CUDA 13.2")
    g = checks["gpu.0"]
    assert (g["title"], g["status"], g["detail"]) == (
        "GPU 0: NVIDIA GeForce RTX 4080 SUPER",
        "warn",
        "persistence mode off",
    )
    assert "`sudo nvidia-smi -pm 1`" in g["fix"]


def test_eight_a100s_through_nvml(tmp_path: Path) -> None:
    sys.path.insert(0, str(FIXTURES))
    from nvml_double import NvmlDouble

    text = (FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt").read_text()
    s = MetricsSampler(str(tmp_path), nvml=NvmlDouble(text))
    checks = doctor.gpu_checks(s.facts(), s.sample(lambda pid: None), NO_GPU_HW)
    assert [c["id"] for c in checks] == ["driver", "cuda"] + [f"gpu.{i}" for i in range(8)]
    assert checks[0]["detail"] == "driver 460.32.03, 8 GPUs, read through NVML"
    assert checks[1]["detail"] == "driver 460.32.03 supports CUDA up to 11.2"
    assert {(c["status"], c["detail"]) for c in checks[2:]} == {("warn", "persistence mode off")}


def test_bad_states_on_a_real_reading(tmp_path: Path) -> None:
    """The recorded H100 under load, with one bad value at a time."""
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, H100, "load"), nvml=NoNvml())
    facts, sample = s.facts(), s.sample(lambda pid: None)

    def gpu0(**change: Any) -> dict[str, str]:
        sample["gpus"][0].update(change)
        return doctor.gpu_checks(facts, sample, NO_GPU_HW)[2]

    g = gpu0(ecc_errors_uncorrected=2)
    assert (g["status"], g["detail"]) == ("fail", "2 uncorrected ECC errors") and "nvidia-smi -r -i 0" in g[
        "fix"
    ]
    g = gpu0(ecc_errors_uncorrected=0, temp_c=88, throttle_reasons=["sw_power_cap", "hw_thermal"])
    assert (g["status"], g["detail"]) == ("warn", "88 C; throttled: sw_power_cap, hw_thermal")
    assert "power limit" in g["fix"] and "cooling" in g["fix"]


def test_host_without_gpu_says_no_gpu(tmp_path: Path) -> None:
    s = no_gpu_sampler(tmp_path)
    facts, sample = s.facts(), s.sample(lambda pid: None)
    assert doctor.gpu_checks(facts, sample, NO_GPU_HW) == [
        doctor.check("driver", "NVIDIA driver and NVML", "skip",
                     "no GPU: no NVIDIA driver and nothing NVIDIA on the PCI bus; GPU checks skipped"),
        doctor.check("cuda", "driver's CUDA version", "skip", "no GPU"),
    ]
    # The same readings on a host whose PCI bus shows a GPU, or whose kernel module is loaded: fail, with the fix.
    [drv, _] = doctor.gpu_checks(facts, sample, {"pci_gpus": 1, "kernel_module": None})
    assert (drv["status"], drv["detail"]) == ("fail", "1 NVIDIA GPU on the PCI bus, but no NVIDIA driver")
    assert "lsmod | grep nvidia" in drv["fix"]
    [drv, _] = doctor.gpu_checks(facts, sample, {"pci_gpus": 1, "kernel_module": "570.124.06"})
    assert drv["status"] == "fail" and "docker run --gpus all" in drv["fix"]


def test_driver_library_mismatch_recording_fails_with_reboot_fix(tmp_path: Path) -> None:
    s = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, MISMATCH, "failing"), nvml=NoNvml(18))
    [drv, cuda] = doctor.gpu_checks(
        s.facts(), s.sample(lambda pid: None), {"pci_gpus": 1, "kernel_module": "x"}
    )
    assert drv["status"] == "fail" and "Driver/library version mismatch" in drv["detail"]
    assert drv["fix"].startswith("Reboot the host") and cuda["status"] == "skip"


# --- torch probe -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_probe() -> dict[str, Any]:
    if not HAS_TORCH:
        pytest.skip("torch is not installed")
    probe = doctor.probe_torch(sys.executable, 60)
    assert probe["torch_done"] and probe["python"] == sys.version.split()[0]
    return probe


def on_gpu(
    probe: dict[str, Any], *caps: tuple[int, int], arch_list: list[str] | None = None
) -> dict[str, Any]:
    """The real probe as a host with these GPUs would answer it (capabilities of the recorded GPUs)."""
    import torch

    arch = (probe.get("arch_list") or torch.cuda.get_arch_list()) if arch_list is None else arch_list
    devices = [{"index": i, "name": f"gpu{i}", "capability": list(c)} for i, c in enumerate(caps)]
    return {**probe, "cuda_available": True, "arch_list": arch, "devices": devices}


def test_torch_against_the_recorded_drivers(tmp_path: Path, real_probe: dict[str, Any]) -> None:
    if real_probe["cuda_build"] is None:  # the CPU build the test extras install: answer as a CUDA 12.8 build
        real_probe = {**real_probe, "cuda_build": "12.8", "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90"]}
    build = real_probe["cuda_build"]
    h100 = MetricsSampler(str(tmp_path), nvidia_smi=fake_smi(tmp_path, H100, "idle"), nvml=NoNvml()).facts()
    [t, tc, ta] = doctor.torch_checks(on_gpu(real_probe, (9, 0)), sys.executable, h100, True, True, 60)
    assert (t["status"], tc["status"], ta["status"]) == ("ok", "ok", "ok")
    assert ta["detail"] == "gpu0: sm_90 is in torch's arch list"
    # Ada (RTX 4080 SUPER, 8.9) runs the sm_86 cubins; Kepler (K80, 3.7) is not in a current build.
    arch = ["sm_75", "sm_80", "sm_86", "sm_90"]
    ta = doctor.torch_checks(
        on_gpu(real_probe, (8, 9), arch_list=arch), sys.executable, h100, True, True, 60
    )[2]
    assert (ta["status"], ta["detail"]) == ("ok", "gpu0: sm_89 runs torch's sm_86 kernels")
    ta = doctor.torch_checks(
        on_gpu(real_probe, (3, 7), arch_list=arch), sys.executable, h100, True, True, 60
    )[2]
    assert ta["status"] == "fail" and "sm_37 is not in torch's arch list" in ta["detail"]
    # The A100 host's driver (CUDA 11.2) is older than this torch's CUDA build.
    a100 = {"driver_version": "460.32.03", "cuda_version": "11.2"}
    tc = doctor.torch_checks(on_gpu(real_probe, (8, 0)), sys.executable, a100, True, True, 60)[1]
    assert tc["status"] == "fail" and tc["detail"].startswith(
        f"torch is built for CUDA {build} but the driver supports CUDA 11.2"
    )
    assert "Upgrade the NVIDIA driver" in tc["fix"]
    cpu = {**on_gpu(real_probe, (8, 0)), "cuda_build": None, "cuda_available": False}
    tc = doctor.torch_checks(cpu, sys.executable, h100, True, True, 60)[1]
    assert tc["status"] == "fail" and "CPU-only build on a GPU host" in tc["detail"]


def test_torch_probe_timeout_warns_without_hanging(tmp_path: Path) -> None:
    # A "python" that never answers, and whose child keeps the output pipes open until the gate file exists:
    # a doctor that waited for the pipes to close would never return (the gate opens only after the guard).
    pid_file, gate = tmp_path / "child.pid", tmp_path / "gate"
    child_loop = f'while [ ! -e "{gate}" ]; do sleep 0.05; done'
    sleepy = script(tmp_path, "python", f'({child_loop}) &\necho $! > "{pid_file}"\nwait\necho late')
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        probe = {"python": sleepy, "timeout_s": 1}
        running = pool.submit(doctor.run_doctor, no_gpu_sampler(tmp_path), str(tmp_path / "state"), probe)
        try:
            result = running.result(timeout=HANG_GUARD_S)
        except concurrent.futures.TimeoutError:
            raise AssertionError("run_doctor waits on the torch probe's child (it holds the pipes)") from None
        finally:
            gate.touch()  # frees a doctor that hung, so the pool can end
    checks = by_id(result["checks"])
    assert checks["torch"]["status"] == "warn"
    assert (
        checks["torch"]["detail"]
        == f"the torch probe (`{sleepy} -c 'import torch; ...'`) did not finish within 1 s"
    )
    assert checks["python"] == {
        **checks["python"],
        "status": "warn",
        "detail": f"{sleepy}: did not answer within 1 s",
    }
    assert checks["torch.cuda"]["status"] == checks["torch.arch"]["status"] == "skip"
    child = Path(f"/proc/{int(pid_file.read_text())}")

    def gone() -> bool:
        try:
            return (child / "stat").read_text().split(") ")[-1].startswith("Z")  # a zombie is dead
        except FileNotFoundError:
            return True

    wait_for(gone, timeout=HANG_GUARD_S, what="the probe's child to be killed")


def test_missing_python_and_missing_tmux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = doctor.run_doctor(
        no_gpu_sampler(tmp_path), str(tmp_path / "s"), {"python": str(tmp_path / "nope")}
    )
    checks = by_id(result["checks"])
    assert checks["python"]["status"] == "fail" and checks["torch"]["status"] == "skip"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    t = doctor.tmux_check()
    assert (t["status"], t["fix"]) == (
        "fail",
        "Install it: `sudo apt install tmux` (Debian/Ubuntu) or `sudo dnf install tmux`.",
    )


# --- state dir ---------------------------------------------------------------------------------------------
def test_state_dir_not_writable_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = doctor.state_dir_check(str(blocker / "state"))  # a file where a directory must be
    assert c["status"] == "fail" and c["detail"].startswith(f"cannot write in {blocker / 'state'}: ")
    assert "remote_dir" in c["fix"]
    if os.geteuid() != 0:  # root writes through permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        c = doctor.state_dir_check(str(locked))
        assert (c["status"], c["detail"]) == ("fail", f"cannot write in {locked}: Permission denied")
    ok = doctor.state_dir_check(str(tmp_path / "fresh"))
    assert ok["status"] == "ok" and os.listdir(tmp_path / "fresh") == []


def test_disk_thresholds() -> None:
    assert [doctor.disk_check(f, 100.0, "/s")["status"] for f in (50.0, 9.9, 0.5, None)] == [
        "ok",
        "warn",
        "fail",
        "warn",
    ]


def test_agent_answers_doctor_op(agent: Any, tmp_path: Path) -> None:
    reply = agent.call("doctor", python=shutil.which("true") or "/bin/true", timeout_s=5)
    assert reply["ok"], reply
    assert by_id(reply["result"]["checks"])["state_dir"]["status"] == "ok"
    bad = agent.call("doctor", timeout_s=-1)
    assert not bad["ok"] and bad["error"]["code"] == "bad_args"

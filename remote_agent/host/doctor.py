"""Doctor: checks of a host's GPU stack for PyTorch jobs, each ok / warn / fail / skip with a fix.

Each check is ``{"id", "title", "status", "detail", "fix"}`` (``fix`` is empty when ok). GPU checks read the
agent's MetricsSampler (no second NVML context); torch is probed in a subprocess, with the python the jobs
use and a timeout, so a hung import or driver never hangs the agent. Stdlib only, Python 3.8+.

    run_doctor(agent.sampler, state_dir, {"python": None, "timeout_s": 60})  # {"checks": [...], ...}
"""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from .. import protocol as P
from ..jobs import image
from ..jobs.usage import narrow_link
from . import container
from .stats import GIB, MIB, read_text

OK, WARN, FAIL, SKIP = P.DOCTOR_OK, P.DOCTOR_WARN, P.DOCTOR_FAIL, P.DOCTOR_SKIP
_RANK = {OK: 0, SKIP: 0, WARN: 1, FAIL: 2}

DISK_WARN_GIB, DISK_FAIL_GIB = 10.0, 1.0
MEM_WARN_FRACTION, MEM_WARN_MIB = 0.10, 2048
SHM_WARN_MIB = 1024
HOT_C = 85
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 600.0
PROBE_MARK = "GPUTUI-DOCTOR "

# The CUDA version a driver reports ("CUDA Version" in nvidia-smi's header), for a driver that does not say:
# (oldest driver, CUDA), newest first, from the Linux column of NVIDIA's CUDA Toolkit release notes ("CUDA
# Toolkit and Corresponding Driver Versions"); 525.60.11 already reports 12.0, 450.51(.05) 11.0. 565 reports
# 12.7 (no toolkit of its own); 595 and 610 are the oldest drivers of the corpus that report 13.2 and 13.3
# (../shared/corpus/nvidia-smi). A driver between two rows supports at least the lower row's CUDA.
DRIVER_CUDA = (
    ("610.57.04", "13.3"), ("595.71.05", "13.2"), ("590.44.01", "13.1"), ("580.65.06", "13.0"),
    ("575.51.03", "12.9"), ("570.26", "12.8"), ("565.57.01", "12.7"), ("560.28.03", "12.6"),
    ("555.42.02", "12.5"), ("550.54.14", "12.4"), ("545.23.06", "12.3"), ("535.54.03", "12.2"),
    ("530.30.02", "12.1"), ("525.60.11", "12.0"), ("520.61.05", "11.8"), ("515.43.04", "11.7"),
    ("510.39.01", "11.6"), ("495.29.05", "11.5"), ("470.42.01", "11.4"), ("465.19.01", "11.3"),
    ("460.27.03", "11.2"), ("455.23", "11.1"), ("450.51", "11.0"), ("440.33", "10.2"), ("418.39", "10.1"),
    ("410.48", "10.0"), ("396.26", "9.2"), ("390.46", "9.1"), ("384.81", "9.0"), ("367.48", "8.0"),
    ("352.31", "7.5"), ("346.46", "7.0"),
)

THROTTLE_FIX = {
    "app_clocks": "application clocks are set: `sudo nvidia-smi -rac` resets them",
    "sw_power_cap": "the GPU is at its power limit (normal under full load; `nvidia-smi -q -d POWER` shows it)",
    "hw_slowdown": "hardware slowdown (heat or power): check cooling and the power supply, "
    "`nvidia-smi -q -d PERFORMANCE`",
    "sync_boost": "clocks are held to match other GPUs of a sync-boost group",
    "sw_thermal": "the GPU is too hot: improve cooling/airflow, `nvidia-smi -q -d TEMPERATURE`",
    "hw_thermal": "the GPU is too hot: improve cooling/airflow, `nvidia-smi -q -d TEMPERATURE`",
    "hw_power_brake": "the power supply asserted the power brake: check the PSU and its cables",
    "display_clocks": "clocks are held for a display attached to this GPU",
}

# Runs under the jobs' python (any version, even 2.x): one marked JSON line per stage, flushed at once.
PROBE = r"""
import json, sys
def emit(d):
    sys.stdout.write("GPUTUI-DOCTOR " + json.dumps(d) + "\n")
    sys.stdout.flush()
emit({"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable})
out = {"torch_done": True}
try:
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        out["torch"] = str(torch.__version__)
        out["cuda_build"] = torch.version.cuda
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["arch_list"] = list(torch.cuda.get_arch_list())
        devices = []
        if out["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                devices.append({"index": i, "name": torch.cuda.get_device_name(i), "capability": list(cap)})
        out["devices"] = devices
    out["warnings"] = [str(w.message).strip()[:400] for w in caught][:5]
except ImportError as e:
    out["torch_missing"] = getattr(e, "name", None) == "torch" or str(e) == "No module named torch"
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
emit(out)
"""


def check(cid: str, title: str, status: P.DoctorStatus, detail: str, fix: str = "") -> P.DoctorCheck:
    """One check result; ``fix`` is dropped when the status is ok."""
    return {"id": cid, "title": title, "status": status, "detail": detail, "fix": "" if status == OK else fix}


def worst(statuses: List[str]) -> str:
    return max(statuses, key=lambda s: _RANK[s]) if statuses else OK


def _version_tuple(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


# --- GPU: driver, CUDA, each GPU ---------------------------------------------------------------------------
def nvidia_pci_gpus(root: str = "/sys/bus/pci/devices") -> Optional[int]:
    """NVIDIA display/3D controllers on the PCI bus, or None when the bus cannot be read."""
    try:
        names = os.listdir(root)
    except OSError:
        return None
    count = 0
    for name in names:
        vendor = (read_text(os.path.join(root, name, "vendor")) or "").strip()
        cls = (read_text(os.path.join(root, name, "class")) or "").strip()
        if vendor == "0x10de" and cls.startswith("0x03"):
            count += 1
    return count


def kernel_module(path: str = "/proc/driver/nvidia/version") -> Optional[str]:
    """The loaded nvidia kernel module's version ("loaded" when unparsable), or None when it is not loaded."""
    text = read_text(path)
    if text is None:
        return "loaded" if os.path.isdir("/sys/module/nvidia") else None
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else "loaded"


def hardware() -> Dict[str, Any]:
    return {"pci_gpus": nvidia_pci_gpus(), "kernel_module": kernel_module()}


def cuda_from_driver(driver: Optional[str]) -> Optional[str]:
    """The CUDA version a driver version supports (at least), from DRIVER_CUDA; None when unknown or older."""
    version = _version_tuple(driver)
    if version is None:
        return None
    for minimum, cuda in DRIVER_CUDA:
        if version >= (_version_tuple(minimum) or ()):
            return cuda
    return None


def _driver_check(facts: Dict[str, Any], sample: Dict[str, Any], hw: Dict[str, Any]) -> P.DoctorCheck:
    title = "NVIDIA driver and NVML"
    source, error = facts.get("gpu_source"), facts.get("gpu_error") or ""
    gpus = sample.get("gpus") or []
    if source is not None:
        driver = facts.get("driver_version") or "?"
        sample_error = sample.get("gpu_error") or ""
        if sample_error.startswith("GPU sample failed") or error.startswith("GPU facts unreadable"):
            return check(
                "driver",
                title,
                FAIL,
                "driver %s, but %s" % (driver, sample_error or error),
                "Run `nvidia-smi` on the host and fix what it reports; `sudo dmesg | grep -i -e nvidia -e xid` "
                "shows driver errors.",
            )
        if not gpus:
            return check(
                "driver",
                title,
                FAIL,
                "driver %s is loaded but reports no GPU" % driver,
                "Check `nvidia-smi -L` and `sudo dmesg | grep -i -e nvidia -e xid` (a GPU that fell off "
                "the bus needs a reboot); on a VM check that the GPU is passed through.",
            )
        plural = "" if len(gpus) == 1 else "s"
        if source == "nvml":
            return check(
                "driver", title, OK, "driver %s, %d GPU%s, read through NVML" % (driver, len(gpus), plural)
            )
        why = error.split("; using")[0]  # the sampler works through nvidia-smi: fine, only slower
        return check(
            "driver",
            title,
            OK,
            "driver %s, %d GPU%s, read through nvidia-smi (%s)" % (driver, len(gpus), plural, why),
        )
    if "mismatch" in error:
        return check(
            "driver",
            title,
            FAIL,
            error,
            "Reboot the host so the loaded nvidia kernel module matches the installed driver libraries "
            "(or reload it: `sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`).",
        )
    if "not loaded" in error:
        return check(
            "driver",
            title,
            FAIL,
            error,
            "Load the driver with `sudo modprobe nvidia` and check `lsmod | grep nvidia`; if that fails, "
            "reinstall the driver for the running kernel (`uname -r`), e.g. `sudo ubuntu-drivers install`.",
        )
    if "permission" in error:
        return check(
            "driver",
            title,
            FAIL,
            error,
            "Give this user access to /dev/nvidia* (e.g. `sudo usermod -aG video $USER`, then log in "
            "again), or map the devices into the container.",
        )
    if error.startswith("no NVIDIA driver"):
        module, pci = hw.get("kernel_module"), hw.get("pci_gpus")
        if module:
            return check(
                "driver",
                title,
                FAIL,
                "the nvidia kernel module (%s) is loaded, but nvidia-smi and libnvidia-ml are missing here"
                % module,
                "In a container, start it with GPU access (`docker run --gpus all`, NVIDIA Container "
                "Toolkit); on the host, install the driver's user-space part of the same version "
                "(e.g. `nvidia-utils-<branch>`).",
            )
        if pci:
            return check(
                "driver",
                title,
                FAIL,
                "%d NVIDIA GPU%s on the PCI bus, but no NVIDIA driver" % (pci, "" if pci == 1 else "s"),
                "Install the NVIDIA driver (e.g. `sudo ubuntu-drivers install` or `sudo apt install "
                "nvidia-driver-<branch>`), reboot, then check `lsmod | grep nvidia` and `nvidia-smi`.",
            )
        why = "nothing NVIDIA on the PCI bus" if pci == 0 else "the PCI bus could not be read"
        return check("driver", title, SKIP, "no GPU: no NVIDIA driver and %s; GPU checks skipped" % why)
    return check(
        "driver",
        title,
        FAIL,
        error or "no GPU source",
        "Run `nvidia-smi` on the host and fix what it reports; `lsmod | grep nvidia` shows whether the "
        "driver is loaded.",
    )


def _cuda_check(facts: Dict[str, Any]) -> P.DoctorCheck:
    title = "driver's CUDA version"
    driver, cuda = facts.get("driver_version"), facts.get("cuda_version")
    if cuda:
        return check("cuda", title, OK, "driver %s supports CUDA up to %s" % (driver or "?", cuda))
    derived = cuda_from_driver(driver)
    if derived:
        return check(
            "cuda",
            title,
            OK,
            "driver %s supports CUDA %s (from its version; the driver did not report it)" % (driver, derived),
        )
    return check(
        "cuda",
        title,
        WARN,
        "driver %s did not report its CUDA version" % (driver or "?"),
        "Read `CUDA Version` in the header of `nvidia-smi`; a driver that old may be too old for "
        "current PyTorch wheels.",
    )


def _fault_text(faults: List[Any], now: float) -> Tuple[str, str]:
    """(what, fix) of a GPU's driver faults of the last day: the newest named, how long ago, how many."""
    last = faults[-1]
    what = "XID %s" % last.get("xid") if last.get("xid") is not None else str(last.get("kind"))
    if last.get("meaning"):
        what += " (%s)" % last["meaning"]
    t = last.get("t")
    if isinstance(t, (int, float)):
        what += " %d min ago" % max(0, (now - t) // 60)
    if len(faults) > 1:
        what += " (%d faults in the last day)" % len(faults)
    return what, str(last.get("fix") or "See NVIDIA's Xid catalog for this XID and `sudo dmesg | grep -i xid`.")


def _gpu_check(g: P.Gpu) -> P.DoctorCheck:
    """One GPU's state: a lost GPU, ECC errors or a failed row remap fail; a driver fault (XID) of the last day,
    a remap pending, a narrow PCIe link, persistence off, throttling or heat warn."""
    idx = g.get("index")
    cid, title = "gpu.%s" % idx, "GPU %s: %s" % (idx, g.get("name") or "?")
    faults = [f for f in g.get("faults") or [] if isinstance(f, dict)]
    if g.get("state") == P.GPU_LOST:
        after = "; the driver reported %s" % _fault_text(faults, time.time())[0] if faults else ""
        return check(cid, title, FAIL, "lost: %s%s" % (g.get("error"), after), g.get("fix") or "")
    problems: List[Tuple[str, str, str]] = []  # (status, detail, fix)
    if faults:
        what, fix = _fault_text(faults, time.time())
        problems.append((WARN, what, fix))
    ecc = g.get("ecc_errors_uncorrected")
    if isinstance(ecc, int) and ecc > 0:
        problems.append(
            (
                FAIL,
                "%d uncorrected ECC error%s" % (ecc, "" if ecc == 1 else "s"),
                "Uncorrected ECC errors mean faulty GPU memory: see `nvidia-smi -q -d ECC,PAGE_RETIREMENT`, "
                "reset the GPU (`sudo nvidia-smi -r -i %s`) or reboot; if they return, ask for another host."
                % idx,
            )
        )
    life = g.get("ecc_errors_uncorrected_aggregate")
    if not (isinstance(ecc, int) and ecc > 0) and isinstance(life, int) and life > 0:
        problems.append((WARN, "%d uncorrected ECC error%s in the GPU's life" % (life, "" if life == 1 else "s"),
                         "None since the driver loaded, but this GPU's memory failed before: watch "
                         "`nvidia-smi -q -d ECC`; if they come back, ask for another host."))
    if g.get("remap_failed") is True:
        problems.append((FAIL, "a memory row remap failed (no spare row left)",
                         "This GPU's memory cannot repair itself any more: ask the provider for another host."))
    elif g.get("remap_pending") is True:
        problems.append((WARN, "memory rows wait to be remapped",
                         "Reset the GPU (`sudo nvidia-smi -r -i %s`) or reboot the host to apply the remap; see "
                         "`nvidia-smi -q -d ROW_REMAPPER`." % idx))
    retired = sum(n for n in (g.get("retired_pages_single"), g.get("retired_pages_double")) if isinstance(n, int))
    if retired >= P.RETIRED_PAGES_LIMIT:
        problems.append((FAIL, "%d memory pages retired after ECC errors" % retired,
                         "The driver retires at most 64 pages: this GPU's memory has little left to spare. Ask the "
                         "provider for another host."))
    elif g.get("retired_pages_pending") is True:
        problems.append((WARN, "a memory page retirement waits for a reboot",
                         "Reboot the host (or reload the driver) to retire the page; see "
                         "`nvidia-smi -q -d PAGE_RETIREMENT`."))
    app, default = g.get("app_clock_mhz"), g.get("app_clock_default_mhz")
    if isinstance(app, (int, float)) and isinstance(default, (int, float)) and 0 < app < default:
        problems.append((WARN, "application clock %g of its default %g MHz" % (app, default),
                         "The clocks were capped by a setting: `sudo nvidia-smi -rac` resets them (on a rented "
                         "host, ask the provider)."))
    width, widest = g.get("pcie_width"), g.get("pcie_width_max")
    if narrow_link(g):
        problems.append((WARN, "PCIe link x%d of x%d" % (width, widest),
                         "The link trained at fewer lanes than the GPU and the host allow: every transfer to the GPU "
                         "is slower (a reseat or another slot, on a rented host: another host)."))
    links, up = g.get("nvlink_links"), g.get("nvlink_active")
    if isinstance(links, int) and isinstance(up, int) and 0 < up < links:  # (none up: no bridge, or no peer)
        problems.append((WARN, "NVLink %d of %d links up" % (up, links),
                         "Links between the GPUs are down: all-reduce and other GPU-to-GPU traffic is slower. See "
                         "`nvidia-smi nvlink -s`; on a rented host, ask for another one."))
    temp = g.get("temp_c")
    if isinstance(temp, (int, float)) and temp >= HOT_C:
        problems.append(
            (
                WARN,
                "%g C" % temp,
                "Check the cooling (fans, airflow, `nvidia-smi -q -d TEMPERATURE`): a GPU this hot slows down.",
            )
        )
    reasons = [r for r in g.get("throttle_reasons") or [] if r != "gpu_idle"]
    share, window = g.get("thermal_slowdown_percent"), g.get("thermal_window_s")
    recent = isinstance(share, (int, float)) and isinstance(window, (int, float)) and share >= P.THERMAL_SHARE_PCT
    if recent and "sw_thermal" not in reasons:
        reasons.append("sw_thermal")
    if reasons:
        fixes = []
        for r in reasons:
            fix = THROTTLE_FIX.get(r, "see `nvidia-smi -q -d PERFORMANCE`")
            if fix not in fixes:
                fixes.append(fix)
        what = "throttled: " + ", ".join(reasons)
        if recent:
            what += " (slowed for heat %.0f%% of the last %.0f min)" % (share, window / 60)
        problems.append((WARN, what, "Throttling: " + "; ".join(fixes) + "."))
    if g.get("persistence_mode") is False:
        problems.append(
            (
                WARN,
                "persistence mode off",
                "Run `sudo nvidia-smi -pm 1` (or enable nvidia-persistenced) so the driver stays "
                "initialised between jobs and CUDA starts fast.",
            )
        )
    if problems:
        return check(
            cid,
            title,
            worst([p[0] for p in problems]),
            "; ".join(p[1] for p in problems),
            " ".join(p[2] for p in problems),
        )
    parts = [g.get("pstate"), "%g C" % temp if temp is not None else None]
    if g.get("power_w") is not None:
        limit = g.get("power_limit_w")
        parts.append("%.0f W" % g["power_w"] + (" of %.0f W" % limit if limit else ""))
    parts.append("persistence on" if g.get("persistence_mode") else None)
    parts.append("no ECC errors" if ecc == 0 else None)
    if isinstance(widest, int) and width == widest:
        gen, top = g.get("pcie_gen"), g.get("pcie_gen_max")
        parts.append("PCIe x%d" % width + (" gen%d (max gen%d)" % (gen, top) if gen and top else ""))
    if isinstance(links, int) and links > 0 and up == links:
        parts.append("NVLink %d links up" % links)
    idle = g.get("throttle_reasons") == ["gpu_idle"]
    sm, top = g.get("sm_clock_mhz"), g.get("sm_clock_max_mhz")
    if not idle and isinstance(sm, (int, float)) and isinstance(top, (int, float)) and top > 0:
        parts.append("SM clock %g of %g MHz" % (sm, top))  # (an idle GPU lowers its clocks, by design)
    parts.append("idle" if idle else "not throttled")
    return check(cid, title, OK, ", ".join(p for p in parts if p))


def gpu_checks(
    facts: Dict[str, Any], sample: Dict[str, Any], hw: Optional[Dict[str, Any]] = None
) -> List[P.DoctorCheck]:
    """Driver/NVML, the driver's CUDA, and each GPU, from MetricsSampler.facts() and .sample()."""
    hw = hardware() if hw is None else hw
    driver = _driver_check(facts, sample, hw)
    if driver["status"] == SKIP or not sample.get("gpus"):
        why = "no GPU" if driver["status"] == SKIP else "no working NVIDIA driver"
        return [driver, check("cuda", "driver's CUDA version", SKIP, why)]
    return [driver, _cuda_check(facts)] + [_gpu_check(g) for g in sample["gpus"]]


# --- python and torch --------------------------------------------------------------------------------------
def job_python(explicit: Optional[str] = None) -> Tuple[Optional[str], str]:
    """(path of the python jobs use, note): ``explicit``, else ``python`` on PATH, else ``python3``."""
    if explicit:
        path = os.path.expanduser(explicit)
        found = path if os.sep in path and os.access(path, os.X_OK) else shutil.which(path)
        return found, "" if found else "%s not found" % explicit
    found = shutil.which("python")
    if found:
        return found, ""
    found = shutil.which("python3")
    return found, "`python` is not on PATH" if found else "neither python nor python3 is on PATH"


def probe_torch(python: str, timeout_s: float) -> Dict[str, Any]:
    """Run the probe under ``python`` with a timeout; its process group is killed when it runs over."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [python, "-c", PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as e:
        return {"error": "cannot run %s: %s" % (python, e.strerror or e)}
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            out, err = proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes
            out, err = b"", b""
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
    result: Dict[str, Any] = {"seconds": round(time.monotonic() - start, 2), "timed_out": timed_out}
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith(PROBE_MARK):
            try:
                result.update(json.loads(line[len(PROBE_MARK) :]))
            except ValueError:
                pass
    if not timed_out and not result.get("torch_done"):
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        result["error"] = "%s exited %s: %s" % (python, proc.returncode, " / ".join(tail) or "no output")
    return result


def _python_check(
    python: Optional[str], note: str, probe: Dict[str, Any], timeout_s: float, explicit: Optional[str] = None
) -> P.DoctorCheck:
    title = "python of the jobs"
    if python is None:
        if explicit:
            fix = "Pass an interpreter that exists on the host (`command -v python3` there shows one)."
        else:
            fix = "Install Python 3 (`sudo apt install python3 python-is-python3`) or pass --python."
        return check("python", title, FAIL, note, fix)
    version = probe.get("python")
    if version is None:
        why = "did not answer within %g s" % timeout_s if probe.get("timed_out") else probe.get("error", "?")
        return check(
            "python",
            title,
            WARN,
            "%s: %s" % (python, why),
            "Run `%s -c 'import sys; print(sys.version)'` on the host to see what is wrong." % python,
        )
    detail = "Python %s (%s)" % (version, python)
    if version.startswith("2."):
        return check(
            "python",
            title,
            FAIL,
            detail + ": jobs that run `python` get Python 2",
            "Install python-is-python3 (`sudo apt install python-is-python3`) or run jobs with python3.",
        )
    if note:
        return check(
            "python",
            title,
            WARN,
            "%s; %s: jobs must call python3" % (detail, note),
            "Run jobs as `python3 ...`, or `sudo apt install python-is-python3` so `python` works.",
        )
    return check("python", title, OK, detail)


def _compare_cuda(build: str, driver_cuda: str) -> int:
    """-1/0/1: the torch build's CUDA (major.minor) against the driver's."""
    b, d = _version_tuple(build) or (0,), _version_tuple(driver_cuda) or (0,)
    return (b[:2] > d[:2]) - (b[:2] < d[:2])


def _arch_status(cap: Tuple[int, int], arch_list: List[str]) -> Tuple[str, str]:
    """(status, how this capability runs) given torch's arch list (sm_XY cubins, compute_XY PTX)."""
    want = "sm_%d%d" % cap
    sm, ptx = [], []
    for arch in arch_list:
        m = re.match(r"(sm|compute)_(\d+)([a-z]?)$", arch)
        if not m:
            continue
        num = int(m.group(2))
        major, minor = num // 10, num % 10
        if m.group(3) and (major, minor) != cap:  # sm_90a: that exact GPU only
            continue
        (sm if m.group(1) == "sm" else ptx).append((major, minor))
    if cap in sm:
        return OK, "%s is in torch's arch list" % want
    same = sorted(a for a in sm if a[0] == cap[0] and a[1] <= cap[1])
    if same:
        return OK, "%s runs torch's sm_%d%d kernels" % ((want,) + same[-1])
    if any(a <= cap for a in ptx):
        return WARN, "%s has no prebuilt kernels; torch JIT-compiles its PTX at first use (slow start)" % want
    return FAIL, "%s is not in torch's arch list (%s)" % (want, " ".join(arch_list) or "empty")


def torch_checks(
    probe: Dict[str, Any],
    python: Optional[str],
    facts: Dict[str, Any],
    has_gpu: bool,
    driver_ok: bool,
    timeout_s: float,
) -> List[P.DoctorCheck]:
    """torch installed; its CUDA build against the driver and torch.cuda.is_available(); the GPUs' arch."""
    t_torch, t_cuda, t_arch = "torch", "torch sees the GPU", "GPU architecture in torch's build"
    py = python or "python3"
    if python is None or probe.get("timed_out") or probe.get("error") or probe.get("torch_error"):
        if python is None:
            first = check("torch", t_torch, SKIP, "no python to probe")
        elif probe.get("timed_out"):
            first = check(
                "torch",
                t_torch,
                WARN,
                "the torch probe (`%s -c 'import torch; ...'`) did not finish within %g s" % (py, timeout_s),
                "Run `%s -c 'import torch; print(torch.cuda.is_available())'` on the host to see where it "
                "hangs (a slow network filesystem or a stuck GPU driver, where `nvidia-smi` hangs too); "
                "give a longer --timeout if the disk is just slow." % py,
            )
        elif probe.get("torch_missing"):
            first = check(
                "torch",
                t_torch,
                WARN,
                "torch is not installed for %s" % py,
                "Install it for this python: `%s -m pip install torch` (on a GPU host pick the build "
                "for the driver's CUDA at https://pytorch.org/get-started/locally/)." % py,
            )
        else:
            first = check(
                "torch",
                t_torch,
                FAIL,
                probe.get("torch_error") or probe.get("error") or "?",
                "Reinstall it: `%s -m pip install --force-reinstall torch`." % py,
            )
        why = "torch could not be probed" if first["status"] != SKIP else "no python"
        return [first, check("torch.cuda", t_cuda, SKIP, why), check("torch.arch", t_arch, SKIP, why)]

    build = probe.get("cuda_build")
    first = check(
        "torch",
        t_torch,
        OK,
        "torch %s (%s)" % (probe.get("torch"), "CUDA %s build" % build if build else "CPU-only build"),
    )
    available = probe.get("cuda_available")
    if not has_gpu or not driver_ok:
        why = "no GPU" if not has_gpu else "no working NVIDIA driver"
        note = "torch.cuda.is_available() is %s" % available
        return [
            first,
            check("torch.cuda", t_cuda, SKIP, "%s: %s" % (why, note)),
            check("torch.arch", t_arch, SKIP, why),
        ]

    driver_cuda = facts.get("cuda_version") or cuda_from_driver(facts.get("driver_version"))
    warn_text = "; ".join(probe.get("warnings") or [])
    if not build:
        second = check(
            "torch.cuda",
            t_cuda,
            FAIL,
            "torch %s is a CPU-only build on a GPU host" % probe.get("torch"),
            "Install a CUDA build for CUDA <= %s: `%s -m pip install torch --index-url "
            "https://download.pytorch.org/whl/cuXYZ` (pick XYZ at https://pytorch.org/get-started/locally/)."
            % (driver_cuda or "the driver's", py),
        )
    elif driver_cuda and _compare_cuda(build, driver_cuda) > 0:
        same_major = build.split(".")[0] == driver_cuda.split(".")[0]
        status = WARN if same_major and available else FAIL
        detail = "torch is built for CUDA %s but the driver supports CUDA %s" % (build, driver_cuda)
        if status == WARN:
            detail += " (runs through CUDA minor version compatibility; PTX JIT and newer features may fail)"
        elif not available:
            detail += "; torch.cuda.is_available() is False"
        second = check(
            "torch.cuda",
            t_cuda,
            status,
            detail,
            "Upgrade the NVIDIA driver to one that supports CUDA %s, or install a torch build for CUDA "
            "<= %s (`%s -m pip install torch --index-url https://download.pytorch.org/whl/cuXYZ`)."
            % (build, driver_cuda, py),
        )
    elif not available:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        fix = (
            ("The agent's environment has CUDA_VISIBLE_DEVICES=%r: unset it. " % cvd)
            if cvd is not None
            else ""
        )
        second = check(
            "torch.cuda",
            t_cuda,
            FAIL,
            "torch.cuda.is_available() is False" + (": " + warn_text if warn_text else ""),
            fix + "Run `%s -c 'import torch; torch.cuda.init()'` for the full error, and check that "
            "`nvidia-smi` works for this user." % py,
        )
    else:
        n = len(probe.get("devices") or [])
        second = check(
            "torch.cuda",
            t_cuda,
            OK,
            "torch.cuda.is_available() is True, %d device%s; CUDA %s build, "
            "driver supports %s" % (n, "" if n == 1 else "s", build, driver_cuda or "?"),
        )
    if not available:
        return [first, second, check("torch.arch", t_arch, SKIP, "CUDA is not available to torch")]

    results: List[Tuple[str, str]] = []
    seen = set()
    for dev in probe.get("devices") or []:
        cap = tuple(dev.get("capability") or ())
        if len(cap) != 2 or cap in seen:
            continue
        seen.add(cap)
        status, how = _arch_status((int(cap[0]), int(cap[1])), list(probe.get("arch_list") or []))
        results.append((status, "%s: %s" % (dev.get("name"), how)))
    if not results:
        return [first, second, check("torch.arch", t_arch, SKIP, "torch listed no device")]
    status = worst([s for s, _ in results])
    fix = (
        "Install a torch build whose `torch.cuda.get_arch_list()` includes this GPU's sm_XY (a newer torch "
        "release or CUDA build, see https://pytorch.org/get-started/locally/)."
    )
    return [first, second, check("torch.arch", t_arch, status, "; ".join(d for _, d in results), fix)]


# --- host: tmux, disk, memory, shm, state dir --------------------------------------------------------------
def tmux_check() -> P.DoctorCheck:
    title = "tmux"
    try:
        res = subprocess.run(
            ["tmux", "-V"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=5,
        )
    except OSError:
        return check(
            "tmux",
            title,
            FAIL,
            "tmux is not installed: gputui runs every job inside tmux",
            "Install it: `sudo apt install tmux` (Debian/Ubuntu) or `sudo dnf install tmux`.",
        )
    except subprocess.TimeoutExpired:
        return check("tmux", title, FAIL, "`tmux -V` did not answer within 5 s", "Reinstall tmux.")
    text = (res.stdout or res.stderr).decode("utf-8", "replace").strip()
    if res.returncode != 0:
        return check(
            "tmux",
            title,
            FAIL,
            "`tmux -V` failed: %s" % text,
            "Reinstall tmux: `sudo apt install --reinstall tmux`.",
        )
    return check("tmux", title, OK, text)


def disk_check(free_gib: Optional[float], total_gib: Optional[float], state_dir: str) -> P.DoctorCheck:
    title = "free disk under the state dir"
    if free_gib is None:
        return check(
            "disk",
            title,
            WARN,
            "could not read the free space of %s" % state_dir,
            "Check `df -h %s`." % state_dir,
        )
    detail = "%.1f GiB free of %.1f GiB (%s)" % (free_gib, total_gib or 0.0, state_dir)
    status = FAIL if free_gib < DISK_FAIL_GIB else WARN if free_gib < DISK_WARN_GIB else OK
    return check(
        "disk",
        title,
        status,
        detail,
        "Free space on that filesystem (old logs in %s/jobs, checkpoints, `pip cache purge`) or set "
        "remote_dir to a bigger disk: jobs die with 'No space left on device'." % state_dir,
    )


def memory_check(used_mib: Optional[int], total_mib: Optional[int], scope: str = "host") -> P.DoctorCheck:
    """Available memory; ``scope`` "cgroup": of the container's limit, which is what the OOM killer enforces."""
    in_cgroup = scope == "cgroup"
    title = "container memory (cgroup limit)" if in_cgroup else "host memory"
    if used_mib is None or not total_mib:
        return check("memory", title, WARN, "could not read /proc/meminfo", "Check `free -h`.")
    avail = total_mib - used_mib
    detail = "%.1f GiB available of %.1f GiB" % (avail * MIB / GIB, total_mib * MIB / GIB)
    low = avail < MEM_WARN_MIB or avail < MEM_WARN_FRACTION * total_mib
    fix = "Stop what holds the memory (`ps aux --sort=-rss | head`): the kernel OOM-kills jobs (exit 137)."
    if in_cgroup:
        detail += " (the container's limit, not the machine's RAM)"
        fix += " Or give the container more: `docker run --memory=...`, Kubernetes resources.limits.memory."
    return check("memory", title, WARN if low else OK, detail, fix)


def shm_check(path: str = "/dev/shm", runtime: Optional[str] = None) -> P.DoctorCheck:
    """Size of /dev/shm: Docker gives a container 64 MB unless told otherwise, too small for DataLoader workers."""
    title = "shared memory (/dev/shm)"
    fix = (
        "PyTorch DataLoader workers pass batches through /dev/shm: start the container with `--shm-size=16g` "
        "(or `--ipc=host`), or use DataLoader(num_workers=0)."
    )
    if runtime == "kubernetes":
        fix += " In Kubernetes: mount an emptyDir with medium: Memory at /dev/shm."
    try:
        st = os.statvfs(path)
    except OSError:
        return check("shm", title, WARN, "%s is missing" % path, fix)
    size_mib = st.f_blocks * st.f_frsize / MIB
    free_mib = st.f_bavail * st.f_frsize / MIB
    detail = "%.0f MiB, %.0f MiB free" % (size_mib, free_mib)
    return check("shm", title, WARN if free_mib < SHM_WARN_MIB else OK, detail, fix)


def container_check(info: Dict[str, Any]) -> P.DoctorCheck:
    title = "container"
    if not info.get("in_container"):
        return check("container", title, SKIP, "not in a container")
    runtime = info.get("runtime") or "a container"
    signs = "; ".join(info.get("signs") or [])
    detail = "in %s (%s): GPU processes of other PID namespaces are matched to jobs by their GPUs" % (
        runtime,
        signs,
    )
    return check("container", title, OK, detail)


def engine_check(has_gpu: bool) -> P.DoctorCheck:
    """The container engine of ``run --image``: present, usable by this user, able to give GPUs, its disk."""
    title = "container engine (run --image)"
    try:
        path = image.find_engine("auto")
        info = image.engine_info(path)
    except image.ImageError as exc:
        missing = str(exc).startswith("no ")
        return check("engine", title, SKIP if missing else WARN, str(exc),
                     "Jobs run as bare processes without one." if missing else
                     "Start the engine's daemon (`sudo systemctl start docker`) and check `docker info`.")
    name = os.path.basename(path)
    detail = "%s %s" % (name, info.get("ServerVersion") or "(version unknown)")
    root = info.get("DockerRootDir")
    free_gib = None
    if isinstance(root, str):
        try:
            st = os.statvfs(root)
            free_gib = st.f_bavail * st.f_frsize / GIB
            detail += ", %.1f GiB free under %s" % (free_gib, root)
        except OSError:
            pass
    if has_gpu and not image.nvidia_ready(info):
        return check("engine", title, WARN, detail + "; it cannot give containers GPUs (no NVIDIA runtime or CDI "
                     "spec)", "Install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure "
                     "--runtime=%s` and restart the daemon." % name)
    if free_gib is not None and free_gib < DISK_WARN_GIB:
        return check("engine", title, WARN, detail, "Images need room: `%s system prune` removes what no "
                     "container uses." % name)
    return check("engine", title, OK, detail + ("; GPUs through the NVIDIA runtime" if has_gpu else ""))


def volume_check(state_dir: str, info: Dict[str, Any], proc: str = "/proc") -> P.DoctorCheck:
    """Is the state dir (jobs, logs, records) on a mounted volume, or on the container's writable layer?"""
    title = "state dir survives a pod restart"
    if not info.get("in_container"):
        return check("volume", title, SKIP, "not in a container")
    point, fstype = container.mount_of(state_dir, proc)
    if point is None:
        return check("volume", title, WARN, "could not read the mounts of %s" % state_dir, "Check `df -h`.")
    if fstype == "overlay" or point == "/":
        where = "the container's writable layer" if fstype == "overlay" else "the container's root filesystem"
        return check(
            "volume",
            title,
            WARN,
            "%s is on %s (%s at %s), not on a mounted volume: it is lost when the pod is recreated"
            % (state_dir, where, fstype, point),
            "Set remote_dir to a mounted volume (RunPod: /workspace; Kubernetes: a PersistentVolumeClaim; "
            "docker: `-v host_dir:/data`) so jobs' logs, records and checkpoints outlive the pod.",
        )
    return check("volume", title, OK, "%s is on a mounted volume (%s at %s)" % (state_dir, fstype, point))


def state_dir_check(state_dir: str) -> P.DoctorCheck:
    """Create and remove a temp file in the state dir."""
    title = "state dir writable"
    try:
        os.makedirs(state_dir, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=".doctor-", dir=state_dir)
        os.close(fd)
        os.unlink(path)
    except OSError as e:
        why = {
            errno.EROFS: "it is on a read-only filesystem: set remote_dir to a writable disk.",
            errno.ENOSPC: "the disk is full: free space on it.",
        }.get(e.errno or 0)
        fix = (
            "Make %s a directory this user can write (`sudo chown -R $USER %s`) or set remote_dir in the "
            "config to one." % (state_dir, state_dir)
        )
        return check(
            "state_dir",
            title,
            FAIL,
            "cannot write in %s: %s" % (state_dir, e.strerror or e),
            ("Cannot write there: " + why) if why else fix,
        )
    return check("state_dir", title, OK, state_dir)


# --- all of it ---------------------------------------------------------------------------------------------
def run_doctor(sampler: Any, state_dir: str, args: Optional[Dict[str, Any]] = None) -> P.DoctorResult:
    """Every check, in order; ``args``: ``python`` (the jobs' interpreter) and ``timeout_s`` (torch probe)."""
    args = args or {}
    explicit = args.get("python")
    if explicit is not None and not isinstance(explicit, str):
        raise ValueError("python must be a string")
    timeout_s = float(args.get("timeout_s") or DEFAULT_TIMEOUT_S)
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError("timeout_s must be in (0, %g]" % MAX_TIMEOUT_S)
    facts = sampler.facts()
    sample = sampler.sample(lambda pid: None)
    checks = gpu_checks(facts, sample)
    has_gpu = checks[0]["status"] != SKIP
    driver_ok = checks[0]["status"] != FAIL and bool(sample.get("gpus"))
    python, note = job_python(explicit)
    probe = probe_torch(python, timeout_s) if python else {}
    checks.append(_python_check(python, note, probe, timeout_s, explicit))
    checks.extend(torch_checks(probe, python, facts, has_gpu, driver_ok, timeout_s))
    checks.append(tmux_check())
    host = sample.get("host") or {}
    checks.append(disk_check(host.get("disk_free_gib"), host.get("disk_total_gib"), state_dir))
    info = container.detect()
    checks.append(
        memory_check(host.get("mem_used_mib"), host.get("mem_total_mib"), host.get("mem_scope", "host"))
    )
    checks.append(shm_check(runtime=info.get("runtime")))
    checks.append(container_check(info))
    checks.append(engine_check(has_gpu))
    checks.append(volume_check(state_dir, info))
    checks.append(state_dir_check(state_dir))
    return {
        "checks": checks,
        "python": python,
        "state_dir": state_dir,
        "agent_python": sys.executable,
        "t": time.time(),
    }

"""scripts/gpu_check.py, the GPU machine's check, run here on a recorded GPU (the nvidia-smi stand-in) and on a
machine without one, so that it still runs when a GPU machine is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from test_metrics_smi import FIXTURES, fake_smi

CHECK = ROOT / "scripts" / "gpu_check.py"


def _check(tmp_path: Path, path: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    env = dict(os.environ, PATH=path)
    return subprocess.run([sys.executable, str(CHECK), str(out)], env=env, capture_output=True, text=True,
                          timeout=240), out


def test_the_check_compares_every_field_with_nvidia_smis_own(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi(bin_dir, FIXTURES / "h100-80gb-hbm3_590.48.01_capture.txt", "load")
    done, out = _check(tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (out / "summary.txt").read_text()
    assert "nvidia-smi GPU 0 util_percent: 100 vs nvidia-smi 100" in summary and "MISMATCH" not in summary
    assert "skip      NVML path" in summary  # no libnvidia-ml here: said, not failed
    readings = json.loads((out / "readings.json").read_text())
    assert readings["smi"]["sample"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert [c["id"] for c in readings["doctor"]["checks"]][:1] == ["driver"]
    assert (out / "query-gpu.csv").read_text().startswith("index, uuid, name")


def test_a_machine_without_a_gpu_is_said_and_not_a_failure(tmp_path: Path) -> None:
    done, out = _check(tmp_path, "/usr/bin:/bin")
    assert done.returncode == 0 and "no nvidia-smi: not a GPU machine" in (out / "summary.txt").read_text()

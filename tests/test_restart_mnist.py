"""The shipped MNIST example under a restart policy: killed mid-run, resumed from its newest epoch checkpoint by
the host's watchdog with no client, to the accuracy of an uninterrupted run (CPU, the offline digits set)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AgentProc, stop_host, wait_for
from test_train_mnist import EXAMPLES, _load

from remote_agent.fsutil import read_json

pytest.importorskip("torch")
pytest.importorskip("sklearn")
EPOCHS = 4


def _argv(data: Path, out: Path) -> list[str]:
    return [sys.executable, str(EXAMPLES / "train_mnist.py"), "--data-dir", str(data), "--device", "cpu",
            "--epochs", str(EPOCHS), "--batch-size", "32", "--workers", "0", "--out", str(out)]


def test_the_mnist_example_killed_mid_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    data = tmp_path / "digits"
    _load("mnist_from_digits").build(data)
    plain = subprocess.run(_argv(data, tmp_path / "plain"), capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    expected = json.loads((tmp_path / "plain" / "summary.json").read_text())["test_acc"]

    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        policy = {"policy": "on-failure", "max": 3, "backoff_s": 0, "resume_from": "run/ckpt/*.pt"}
        jid = agent.call("jobs.start", argv=_argv(data, tmp_path / "run"), cwd=str(tmp_path), restart=policy)["result"]["id"]
        agent.close()
        job_dir = state / "jobs" / jid
        wait_for(lambda: (tmp_path / "run" / "ckpt" / "epoch-002.pt").exists(), timeout=240, what="epoch 2")
        os.killpg(read_json(str(job_dir / "pid.json"))["pid"], signal.SIGKILL)  # a crash, not a kill by gputui
        wait_for(lambda: (job_dir / "status.json").exists(), timeout=300, what="the resumed run to end")
        assert read_json(str(job_dir / "status.json"))["exit_code"] == 0
        log = (job_dir / "output.log").read_text()
        assert "── attempt 2 of 3, after exit 137" in log
        resumed = re.search(r"Resumed from (\S+)/run/ckpt/epoch-(\d+)\.pt after epoch (\d+)", log)
        assert resumed and int(resumed.group(2)) >= 1 and resumed.group(2).lstrip("0") == resumed.group(3), log
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["epochs"] == EPOCHS
        assert summary["test_acc"] == pytest.approx(expected, abs=0.03)  # the same run, within noise
    finally:
        agent.close()
        stop_host(state)

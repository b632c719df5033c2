"""Run records and log insights through the real CLI: the MNIST example really trains under gputui."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, AgentProc, Home, kill_tmux, wait_for
from test_metrics_smi import H100, fake_smi

from gputui.core.jobs.headline import headline, ranked
from remote_agent.metrics.sampler import MetricsSampler


def test_mnist_example_trains_under_gputui_and_is_recorded(home: Home, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    data, out = tmp_path / "data", tmp_path / "run"
    subprocess.run([sys.executable, str(ROOT / "examples" / "mnist_from_digits.py"), str(data)], check=True)
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\nprice_per_hour = 1.8\n')
    cmd = [sys.executable, "examples/train_mnist.py", "--data-dir", str(data), "--epochs", "3", "--batch-size", "32"]
    cmd += ["--device", "cpu", "--workers", "0", "--out", str(out)]
    job_id = home.cli("run", "local", "--name", "mnist", "--cwd", str(ROOT), "--", *cmd, check=True).stdout.strip()
    follow = home.cli("logs", "-f", "local", job_id, timeout=300)
    assert follow.returncode == 0, follow.stdout[-2000:]
    assert "Epoch 3/3" in follow.stdout

    [job] = json.loads(home.cli("jobs", "--json", check=True).stdout)
    ins = job["insights"]
    assert (ins["epoch"], ins["total_epochs"]) == (3, 3) and ins["progress"] == pytest.approx(1.0)
    assert ins["metrics"]["test_acc"]["last"] > 0.90 and ins["hints"] == []
    summary = json.loads((out / "summary.json").read_text())
    assert ins["metrics"]["test_acc"]["last"] == pytest.approx(summary["test_acc"], abs=1e-4)

    [rec] = json.loads(home.cli("history", "--json", check=True).stdout)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert rec["git"]["commit"] == head.stdout.strip()
    assert (rec["state"], rec["exit_code"], rec["name"]) == ("succeeded", 0, "mnist")
    assert rec["duration_s"] > 0 and rec["cost"] == pytest.approx(1.8 * rec["duration_s"] / 3600)
    assert rec["metrics"]["test_acc"]["best"] >= rec["metrics"]["test_acc"]["last"] > 0.90
    table = home.cli("history", check=True)
    assert "history" not in table.stderr
    assert table.stdout.splitlines()[1].split()[8].startswith("test_acc=0.9")  # what the run is judged by
    assert "test_acc=0.9" in home.cli("jobs", check=True).stdout


def test_exit_137_gets_the_oom_killer_hint(home: Home) -> None:
    code = "import os, signal; print('allocating', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    job_id = home.cli("run", "local", "--", sys.executable, "-c", code, check=True).stdout.strip()
    assert home.cli("logs", "-f", "local", job_id).returncode == 137
    [rec] = json.loads(home.cli("history", "--json", check=True).stdout)
    assert rec["exit_code"] == 137 and any("137" in h["title"] or "OOM" in h["title"] for h in rec["hints"])


def test_runner_records_gpu_usage_from_recorded_readings(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, H100, "load")
    expected = MetricsSampler(str(tmp_path), nvidia_smi=smi).sample(lambda pid: None)["gpus"][0]["util_percent"]
    state = tmp_path / "state"
    agent = AgentProc(state, "--nvidia-smi", smi)
    try:
        # the job runs until the gate opens, which the test does once the runner wrote its first reading
        gate = tmp_path / "gate"
        wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"
        job_id = agent.call("jobs.start", argv=[sys.executable, "-c", wait], gpus="0")["result"]["id"]
        wait_for(lambda: (state / "jobs" / job_id / "usage.json").exists(), what="the runner's first reading")
        gate.touch()
        agent.call("logs.follow", job=job_id, offset=0)
        agent.wait_event("log_end", job=job_id)
        [job] = agent.call("jobs.list")["result"]["jobs"]
        assert job["usage"]["samples"] >= 1 and job["usage"]["gpu_mean_util"] == expected
        assert job["gpu_inventory"][0]["name"] == "NVIDIA H100 80GB HBM3"
    finally:
        agent.close()
        kill_tmux(state)

def test_metrics_that_matter_come_first() -> None:
    names = ["lr", "time", "loss", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time", "val/top1"]
    assert ranked(dict.fromkeys(names)) == [
        "test_acc", "val/top1", "test_loss", "train_acc", "loss", "train_loss", "lr", "time", "epoch_time"
    ]
    assert ranked(dict.fromkeys(["eval_f1", "eval_loss", "grad_norm", "reward"])) == [
        "eval_f1", "eval_loss", "reward", "grad_norm"
    ]
    assert headline({"lr": {"last": 0.1}, "val_loss": {"last": None}, "loss": {"last": 2}}) == ("loss", 2.0)
    assert headline({}) is None


def test_history_table_leads_with_final_accuracy_in_80_columns(home: Home) -> None:
    lines = [
        "step 10 loss=2.5 lr=0.1 grad_norm=3.2 time=0.5 throughput=1234.5 samples_per_second=99.9",
        "Epoch 1/1 train_loss=0.4 train_acc=0.8 test_loss=0.061 test_acc=0.9812",
    ]
    code = "".join(f"print({line!r});" for line in lines)
    name = "a long run name that does not fit in the table"
    job_id = home.cli(
        "run", "local", "--name", name, "--", sys.executable, "-c", code, check=True
    ).stdout.strip()
    assert home.cli("logs", "-f", "local", job_id).returncode == 0
    home.env["COLUMNS"] = "80"
    out = home.cli("history", check=True).stdout.splitlines()
    assert out[0].split() == ["HOST", "ID", "STATE", "EXIT", "TIME", "COST", "CODE", "NAME", "METRICS"]
    assert all(len(line) <= 80 for line in out), out
    metrics = out[1].split("…", 1)[1].split()  # after the clipped name
    assert metrics[0] == "test_acc=0.9812" and metrics[-1] == "…"  # the rest did not fit
    home.env["COLUMNS"] = "200"
    wide = home.cli("history", check=True).stdout.splitlines()[1]
    assert name in wide and wide.split(name)[1].split() == [
        "test_acc=0.9812", "test_loss=0.061", "train_acc=0.8", "loss=2.5", "train_loss=0.4", "lr=0.1",
        "grad_norm=3.2", "time=0.5",
    ]

"""What the plain CLI prints: the jobs table (progress, ETA, headline metric at 80 columns), doctor's fixes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Home, wait_for

from gputui.core.insights import JobInsights
from gputui.core.session.model import Job
from gputui.tables import print_jobs

#: Lines as train_mnist.py prints them: each epoch's summary, then epoch 3's tqdm bar half way.
EPOCHS = (
    "".join(
        f"print('Epoch {e}/4 train_loss=0.{9 - e}2 test_loss=0.0{9 - e}7 test_acc=0.9{e}12 lr=0.001 time=1.5s');"
        for e in (1, 2)
    )
    + "print('Epoch 3/4:  50%|#####     | 50/100 [00:10<00:12, 5.00it/s, loss=0.3]')"
)


def run(home: Home, name: str, code: str) -> str:
    return home.cli(
        "run", "local", "--name", name, "--", sys.executable, "-c", code, check=True
    ).stdout.strip()


def test_jobs_table_shows_progress_eta_and_the_headline_metric_in_80_columns(
    home: Home, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    wait = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
    running = run(home, "a run whose name is much longer than the table has room for", f"{EPOCHS}\n{wait}")
    done = run(home, "done", "print('Epoch 3/3 loss=0.25 val_acc=0.875')")
    home.env["COLUMNS"] = "80"

    def table() -> str | None:
        out = home.cli("jobs", check=True).stdout
        return out if "ep 3/4" in out and "succeeded" in out else None

    try:
        out = wait_for(table, what="both jobs' progress in the table")
    finally:
        go.touch()
    lines = out.splitlines()
    assert lines[0].split() == ["HOST", "ID", "STATE", "EXIT", "AGE", "PROGRESS", "ETA", "METRIC", "NAME"]
    assert all(len(line) <= 80 for line in lines), out
    rows = {line.split()[1]: line for line in lines[1:]}
    state, exit_, _age, ep, epochs, pct, eta = rows[running].split()[2:9]
    assert (state, exit_, ep, epochs, pct) == ("running", "-", "ep", "3/4", "62%")
    assert re.fullmatch(r"[1-5]?\ds", eta), eta  # under a minute, from tqdm's remaining time and the epochs left
    assert "test_acc=0.9212" in rows[running]  # the metric that matters, not loss, lr or time
    assert rows[running].endswith("…")  # the name is clipped, not the row
    assert "ep 3/3 100%" in rows[done] and "val_acc=0.875" in rows[done] and rows[done].endswith("done")


def test_doctor_with_a_missing_python_does_not_suggest_passing_it(home: Home) -> None:
    res = home.cli("doctor", "local", "--python", "/nope/python", "--timeout", "5")
    assert res.returncode == 1, res.stderr
    lines = [line.strip() for line in res.stdout.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  python of the jobs"))
    assert lines[at].endswith("/nope/python not found") and "pass --python" not in res.stdout
    assert (
        lines[at + 1]
        == "fix: Pass an interpreter that exists on the host (`command -v python3` there shows one)."
    )


def test_jobs_table_survives_non_finite_readings(capsys: pytest.CaptureFixture[str]) -> None:
    ins = JobInsights(
        progress=math.nan, eta_s=math.inf, metrics={"loss": {"last": math.nan, "best": 1, "count": 2}}
    )
    print_jobs([Job("h", "1", "train", "running", ("python",), started_at=time.time(), insights=ins)])
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[5:] == ["-", "-", "loss=nan", "train"]


def test_cli_and_app_write_durations_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.tables import print_history
    from gputui.ui import fmt

    def run_of(seconds: float) -> dict:
        return {"host": "h", "id": "1", "state": "succeeded", "exit_code": 0, "duration_s": seconds,
                "cost": None, "name": "n", "metrics": {}}

    print_history([run_of(42.0), run_of(2 * 86400 + 3600.0)])
    times = [line.split()[4] for line in capsys.readouterr().out.splitlines()[1:]]
    assert times == ["42s", "2d01h"] == [fmt.duration(42.0), fmt.duration(2 * 86400 + 3600.0)]


def test_every_client_file_lives_under_the_xdg_dirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gputui.core import paths
    from gputui.core.config import file as config
    from gputui.core.money import cost
    from gputui.ui import themes

    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var))
    assert config.default_path() == tmp_path / "XDG_CONFIG_HOME/gputui/config.toml"
    assert themes.user_theme_dir() == tmp_path / "XDG_CONFIG_HOME/gputui/themes"
    assert cost.Ledger().path == tmp_path / "XDG_STATE_HOME/gputui/ledger.json"
    assert themes.state_path() == tmp_path / "XDG_STATE_HOME/gputui/ui.json"
    assert paths.cache_dir() == tmp_path / "XDG_CACHE_HOME/gputui"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.state_dir() == tmp_path / "home/.local/state/gputui"
    paths.write_atomic(paths.state_dir() / "x.json", b"{}")  # the dir is made on the way
    assert (paths.state_dir() / "x.json").read_bytes() == b"{}"


def test_status_says_how_long_a_quiet_host_has_been_quiet(home: Home) -> None:
    """A host with no job and no GPU use said "not idle yet" (why not? until when?)."""
    home.write_config(  # a login on the test machine would make it busy
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\ncount_ssh_sessions = false\n'
    )
    out = home.cli("status", check=True).stdout
    cost = next(line for line in out.splitlines() if line.strip().startswith("cost"))
    assert re.search(r"quiet for \d+s, idle once that reaches idle_minutes$", cost), out


def test_status_shows_an_armed_autostop_and_deadline(home: Home) -> None:
    """With autostop_minutes or a deadline set, `gputui status` gave no sign of either (the app and
    `status --json` did): a newcomer could not tell the setting had taken."""
    home.write_config(
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\ncount_ssh_sessions = false\n'
        'release_remote = ["true"]\nautostop_minutes = 60\n'
        f"release_at = {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(time.time() + 7200))}\n"
    )
    out = home.cli("status", check=True).stdout
    cost = next(line for line in out.splitlines() if line.strip().startswith("cost"))
    assert re.search(r"; autostop in (1h|59m\d+s|60m); deadline release in (2h|1h59m)$", cost), cost


def test_logs_to_a_terminal_show_control_sequences_escaped_and_a_pipe_gets_the_bytes(home: Home) -> None:
    """A log's ESC sequences (OSC 52 clipboard write, screen clear, colours), bidi overrides and bad UTF-8
    never reach a terminal raw; line ends and ``\\r`` redraws do. A pipe gets the bytes exactly as written."""
    hostile = b"a\x1b]52;c;aGk=\x07b\x1b[2Jc\x1b[31mred\xe2\x80\xae\xff\xfe \xc3\xa9t\xc3\xa9 50%\r100%\n"
    code = f"import sys; sys.stdout.buffer.write({hostile!r}); sys.stdout.flush()"
    job = run(home, "hostile", code)
    piped = home.cli_bytes("logs", "-f", "local", job)
    assert piped.returncode == 0 and hostile.replace(b"\n", b"\r\n") in piped.stdout, piped  # the job's pty
    master, slave = pty.openpty()
    try:
        res = subprocess.run([sys.executable, "-m", "gputui", "logs", "local", job], env=home.env, stdout=slave,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
        os.close(slave)
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's other side is closed and read
            while chunk := os.read(master, 65536):
                seen += chunk
    finally:
        os.close(master)
    assert res.returncode == 0, res.stderr
    text = seen.decode("utf-8", "replace")
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, text
    assert "a\\x1b]52;c;aGk=\\x07b\\x1b[2Jc\\x1b[31mred\\u202e\\xff\\xfe été 50%\r100%" in text, text


def test_status_reports_a_lost_gpu_and_the_others(home: Home, tmp_path: Path) -> None:
    """A local host whose nvidia-smi replays 4 recorded A100s with GPU 2 failing its handle: `status --json`
    gives each GPU's state (the lost one with the driver's words and the fix), plain `status` a health line."""
    from test_queue import a100s

    home.env["PATH"] = f"{a100s(tmp_path / 'bin', 4)}:{home.env['PATH']}"
    home.env["FAKE_NVIDIA_SMI_NO_HANDLE"] = "2"
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    assert host["gpu_source"] == "nvidia-smi"
    gpus = host["gpus"]
    assert [(g["index"], g["state"], g["error"]) for g in gpus] == [
        (0, "ok", None), (1, "ok", None),
        (2, "lost", "Unable to determine the device handle for GPU 00000003:00:00.0: Unknown Error"), (3, "ok", None),
    ]
    assert gpus[2]["fix"] == "Reboot the host; if the GPU is still lost, ask the provider for another instance."
    assert [g["name"] for g in gpus] == ["A100-SXM4-40GB", "A100-SXM4-40GB", None, "A100-SXM4-40GB"]
    lines = home.cli("status", check=True).stdout.splitlines()
    assert "  gpu2 LOST: Unable to determine the device handle for GPU 00000003:00:00.0: Unknown Error Fix: Reboot " \
        "the host; if the GPU is still lost, ask the provider for another instance." in lines
    assert sum(line.startswith("  gpu") and "A100-SXM4-40GB" in line for line in lines) == 3

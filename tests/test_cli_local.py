"""The CLI end to end on the zero-config local host (real agent subprocess, real tmux)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Home, wait_for


def run_job(home: Home, *cmd: str, extra: tuple[str, ...] = ()) -> str:
    res = home.cli("run", "local", *extra, "--", *cmd, check=True)
    job_id = res.stdout.strip()
    assert job_id.isdigit(), res.stdout
    return job_id


def test_run_then_follow_prints_hi_and_exits_zero(home: Home) -> None:
    job_id = run_job(home, "python3", "-c", "print('hi')")
    res = home.cli("logs", "-f", "local", job_id)
    assert res.returncode == 0, res.stderr
    assert res.stdout.replace("\r\n", "\n") == "hi\n"


def test_follow_exits_with_the_jobs_status(home: Home) -> None:
    job_id = run_job(home, sys.executable, "-c", "import sys; print('bye'); sys.exit(7)")
    res = home.cli("logs", "--follow", "local", job_id)
    assert res.returncode == 7 and "bye" in res.stdout


def test_jobs_json_shape(home: Home, tmp_path) -> None:
    job_id = run_job(
        home, sys.executable, "-c", "print(1)", extra=("--name", "my run", "--cwd", str(tmp_path))
    )
    home.cli("logs", "-f", "local", job_id, check=True)
    jobs = json.loads(home.cli("jobs", "--json", check=True).stdout)
    [job] = jobs
    assert {"host", "id", "name", "state", "exit_code", "command", "started_at", "ended_at"} <= job.keys()
    assert (job["host"], job["id"], job["name"], job["state"], job["exit_code"]) == (
        "local",
        job_id,
        "my run",
        "succeeded",
        0,
    )
    assert job["command"] == [sys.executable, "-c", "print(1)"] and job["cwd"] == str(tmp_path)


def test_local_run_defaults_to_the_callers_directory(home: Home, tmp_path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gputui", "run", "local", "--", "pwd"], env=home.env, cwd=tmp_path,
        capture_output=True, text=True, check=True,
    )
    out = home.cli("logs", "-f", "local", res.stdout.strip(), check=True).stdout
    assert out.strip() == str(tmp_path)


def test_job_survives_client_killed_and_keeps_full_log(home: Home, tmp_path) -> None:
    go = tmp_path / "go"
    code = (
        "import pathlib, time\n"
        "for i in range(5): print('line', i, flush=True)\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
        "for i in range(5, 10): print('line', i, flush=True)\n"
    )
    job_id = run_job(home, sys.executable, "-c", code)
    client = subprocess.Popen(
        [sys.executable, "-m", "gputui", "logs", "-f", "local", job_id],
        env=home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    assert client.stdout
    first = client.stdout.readline()
    assert first.startswith(b"line 0")
    client.send_signal(signal.SIGKILL)
    client.wait()
    go.touch()
    res = home.cli("logs", "-f", "local", job_id)
    assert res.returncode == 0
    assert res.stdout.replace("\r\n", "\n") == "".join(f"line {i}\n" for i in range(10))
    [job] = json.loads(home.cli("jobs", "local", "--json", check=True).stdout)
    assert job["state"] == "succeeded"


def test_status_json_reports_local_host(home: Home) -> None:
    res = home.cli("status", "--json", check=True)
    [host] = json.loads(res.stdout)["hosts"]
    assert host["name"] == "local" and host["state"] == "connected" and host["error"] is None
    assert host["host"]["cpu_count"] == os.cpu_count() and host["host"]["mem_total_mib"] > 0
    assert isinstance(host["gpus"], list) and isinstance(host["jobs"], list)
    if not host["gpus"]:  # CI: no GPU, and it says why
        assert host["gpu_error"]
    for gpu in host["gpus"]:
        assert {
            "index",
            "name",
            "util_percent",
            "mem_used_mib",
            "mem_total_mib",
            "temp_c",
            "power_w",
        } <= gpu.keys()


def test_plain_status_and_tail(home: Home) -> None:
    job_id = run_job(home, sys.executable, "-c", "for i in range(50): print(i)")
    home.cli("logs", "-f", "local", job_id, check=True)
    tail = home.cli("logs", "local", job_id, "--tail", "2", check=True).stdout
    assert tail.split() == ["48", "49"]
    out = home.cli("status", check=True).stdout
    assert out.startswith("local: connected") and "1 total" in out


def test_kill_from_cli(home: Home, tmp_path) -> None:
    marker = tmp_path / "ready"
    code = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"
    job_id = run_job(home, sys.executable, "-c", code)
    wait_for(marker.exists, what="job start")
    res = home.cli("kill", "local", job_id, "--grace", "2", check=True)
    assert "killed" in res.stdout
    [job] = json.loads(home.cli("jobs", "--json", check=True).stdout)
    assert job["state"] == "killed" and job["exit_code"] == 130


def test_an_ended_job_has_no_eta_in_jobs_json(home: Home, tmp_path: Path) -> None:
    """A killed job's `insights.eta_s` stayed what its last progress line implied (the table showed `-`)."""
    marker = tmp_path / "third"
    code = (
        "import pathlib, time\n"
        "for e in range(1, 11):\n"
        "    print(f'epoch {e}/10 loss={1 / e:.3f}', flush=True)\n"
        f"    if e == 3: pathlib.Path({str(marker)!r}).touch()\n"
        "    time.sleep(1.1 if e < 3 else 60)\n"  # the runner times the log by the second
    )
    job_id = run_job(home, sys.executable, "-c", code)
    wait_for(marker.exists, what="third epoch")

    def insights() -> dict:
        [job] = json.loads(home.cli("jobs", "--json", check=True).stdout)
        return job["insights"]

    assert insights()["eta_s"] is not None  # while it runs
    home.cli("kill", "local", job_id, "--grace", "2", check=True)
    ended = insights()
    assert ended["progress"] == 0.3 and ended["eta_s"] is None


def test_kill_on_a_terminal_names_the_job_before_asking(home: Home, tmp_path: Path) -> None:
    """The question was "Kill job 7 on local?" whatever 7 was, asked even for a job that does not exist or had
    ended: a mistyped id showed only after the yes. Now it names the job, and asks only when there is one."""
    from test_carry_artifacts import _answer_prompts

    marker = tmp_path / "ready"
    job_id = run_job(home, "sh", "-c", f"touch {marker}; sleep 60", extra=("--name", "train-llama"))
    wait_for(marker.exists, what="job start")
    code, out = _answer_prompts(home, ["kill", "local", job_id], {"[y/N]": "n"})  # type: ignore[arg-type]
    assert f"Kill job {job_id} (train-llama, running) on local (SIGINT" in out and code == 1, out
    assert "not killed" in out
    [job] = json.loads(home.cli("jobs", "--json", check=True).stdout)
    assert job["state"] == "running"
    code, out = _answer_prompts(home, ["kill", "local", "99"], {"[y/N]": "y"})  # type: ignore[arg-type]
    assert code == 5 and "[y/N]" not in out and "no job '99' on local" in out, out
    code, out = _answer_prompts(home, ["kill", "local", job_id], {"[y/N]": "y"})  # type: ignore[arg-type]
    assert code == 0 and "killed (exit" in out, out
    code, out = _answer_prompts(home, ["kill", "local", job_id], {"[y/N]": "y"})  # type: ignore[arg-type]
    assert code == 1 and "[y/N]" not in out and "is not running (killed)" in out, out


def test_errors_are_clear_and_nonzero(home: Home) -> None:
    res = home.cli("logs", "local", "42")
    assert res.returncode == 5 and "no job '42' on local; gputui jobs local lists its jobs" in res.stderr
    res = home.cli("run", "nowhere", "--", "true")
    assert res.returncode == 2 and "unknown host 'nowhere'" in res.stderr and "local" in res.stderr
    res = home.cli("run", "local")
    assert res.returncode == 2 and "nothing to run" in res.stderr
    res = home.cli("run", "local", "--cwd", "/no/such", "--", "true")
    assert res.returncode == 1 and "/no/such does not exist" in res.stderr
    res = home.cli("run", "local", "--env", "NOVALUE", "--", "true")
    assert res.returncode == 2 and "KEY=VALUE" in res.stderr


def test_run_never_splits_the_jobs_command(home: Home) -> None:
    """Without ``--`` the job's own options were read as gputui's (``--name x`` renamed the job and was dropped
    from its argv; ``-c`` was "unrecognized"), and words before ``--`` were dropped: each is refused, with the
    form that works, and no job starts."""
    for args, says in (
        (["ls", "--name", "x"], "put the command after --"),
        (["python3", "-c", "print(1)"], "'print(1)'\" is not an option of gputui run"),
        (["echo", "--", "hi"], "'echo' comes before -- and would be dropped"),
    ):
        res = home.cli("run", "local", *args)
        assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    assert json.loads(home.cli("jobs", "--json", check=True).stdout) == []
    job_id = home.cli("run", "local", "echo", "hi", check=True).stdout.strip()  # a plain one needs no --
    assert home.cli("logs", "-f", "local", job_id, check=True).stdout.strip() == "hi"


def test_every_command_help_says_what_it_does_and_what_each_argument_is(capsys: pytest.CaptureFixture[str]) -> None:
    """`gputui logs --help` listed `host` and `job` with no word on either, `--json` bare, no line on what the
    command does; `gputui run --help` showed `host [command ...]` with no `--` and no example."""
    from gputui.cli import build_parser

    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in sub.choices.items():
        assert parser.description, name
        bare = [a.dest for a in parser._actions if not a.help]
        assert not bare, (name, bare)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: gputui run [OPTIONS] host[,host...] -- CMD [ARG ...]")
    assert "gputui run local -- python train.py" in out


def test_config_flag_works_after_the_command_too(home: Home, tmp_path: Path) -> None:
    """`gputui status --config c.toml` was "unrecognized arguments: --config": only `gputui --config c.toml status`
    worked, and the README's `--config PATH` does not say where it goes."""
    config = tmp_path / "c.toml"
    config.write_text(f'[hosts.mine]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    for args in (["--config", str(config), "jobs", "--json"], ["jobs", "--json", "--config", str(config)]):
        res = home.cli(*args)
        assert res.returncode == 0 and json.loads(res.stdout) == [], (args, res.stderr)
    res = home.cli("status", "--config", str(tmp_path / "none.toml"))
    assert res.returncode == 2 and "none.toml: config file not found" in res.stderr
    res = home.cli("run", "mine", "--config", str(config), "--", "echo", "--config", "x")
    assert res.returncode == 0, res.stderr
    assert home.cli("logs", "-f", "mine", res.stdout.strip(), "--config", str(config)).stdout == "--config x\n"


def test_broken_config_names_file_line_and_field(home: Home) -> None:
    path = home.write_config('[hosts.gpu1]\nhost = "10.0.0.1"\nprot = 22\n')
    res = home.cli("status")
    assert res.returncode == 2
    assert f"{path}:3: hosts.gpu1.prot: unknown setting" in res.stderr
    path = home.write_config('[hosts.gpu1]\nport = "22"\n')
    res = home.cli("jobs")
    assert res.returncode == 2 and f"{path}:2: hosts.gpu1.port: must be a whole number" in res.stderr
    home.write_config("[hosts.gpu1\n")
    res = home.cli("jobs")
    assert res.returncode == 2 and "invalid TOML" in res.stderr and "line 1" in res.stderr


def test_help_lists_every_command(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    """Every subcommand the parser has is one entry with a description in --help and in the command tables
    (README.md and docs/commands.md),
    and answers its own --help."""
    from gputui.cli import build_parser

    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = list(sub.choices)
    assert len(commands) == 22, commands
    out = home.cli("--help", check=True).stdout
    listed = re.findall(r"^    ([a-z]+) {2,}\S", out, re.MULTILINE)
    assert listed == commands, out
    for page in ("README.md", "docs/commands.md"):  # the short table and the manual's
        in_table = re.findall(r"^\| `gputui ([a-z]+)[ `]", (ROOT / page).read_text(), re.MULTILINE)
        assert sorted(in_table) == sorted(commands), (page, in_table)
    for cmd in commands:
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([cmd, "--help"])
        usage = capsys.readouterr().out
        assert exit_.value.code == 0 and usage.startswith(f"usage: gputui {cmd} "), (cmd, usage)


def test_core_does_not_import_textual() -> None:
    code = (
        "import sys, pkgutil, importlib, gputui.core as c\n"
        "for m in pkgutil.walk_packages(c.__path__, 'gputui.core.'):\n"
        "    importlib.import_module(m.name)\n"
        "import gputui.cli\n"
        "assert 'textual' not in sys.modules, [m for m in sys.modules if m.startswith('textual')]\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_status_short_is_one_line_per_host_for_a_status_bar(home: Home, tmp_path: Path) -> None:
    """``status --short``: a host with a lost GPU (the 8x A100 recording, GPU 1 lost) says so first; a host that
    cannot be reached is one line too, its error cut short."""
    from test_metrics_smi import A100_Q, fake_smi

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi(bin_dir, A100_Q, "q")
    home.env.update(PATH=f"{bin_dir}:{home.env['PATH']}", FAKE_NVIDIA_SMI_GPUS="4", FAKE_NVIDIA_SMI_LOST="1")
    home.write_config('[hosts.local]\ntransport = "local"\nprice_per_hour = 12.5\n\n'
                      '[hosts.gone]\nhost = "127.0.0.1"\nport = 1\nconnect_timeout = 3\n')
    res = home.cli("status", "--short", timeout=120)
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout
    assert lines[0].startswith("local up · GPU 1 LOST · 4 GPU 0% · 0 running · 12.50 USD/h"), lines[0]
    assert lines[1].startswith("gone error (") and len(lines[1]) < 90, lines[1]
    assert res.returncode != 0  # a host that did not answer, as plain status says

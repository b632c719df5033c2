"""Bad input at the command line gets a clear error and a usage exit status, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import Home

USAGE = 2


def local_config(home: Home, extra: str = "") -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n{extra}')


def strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("grace", ["inf", "1e9", "nan", "-1", "3601", "soon"])
def test_kill_grace_must_be_a_sane_number(home: Home, grace: str) -> None:
    res = home.cli("kill", "local", "1", f"--grace={grace}", "--yes", timeout=20)
    assert res.returncode == USAGE and "--grace: must be a number from 0 to 3600 seconds" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["autostop", "local", "--snooze=nan"],
            "--snooze: must be a number above 0 and at most 10080 minutes",
        ),
        (["autostop", "local", "--snooze=0"], "--snooze: must be a number above 0"),
        (["autostop", "local", "--snooze=1e9"], "--snooze: must be a number above 0"),
        (["autostop", "local", "--snooze=-inf"], "--snooze: must be a number above 0"),
        (["logs", "local", "1", "--tail=-1"], "--tail: must be a whole number from 0"),
        (["doctor", "--timeout=nan"], "--timeout must be between 0 and 600 seconds"),
    ],
)
def test_numeric_flags_are_validated(home: Home, args: list[str], message: str) -> None:
    res = home.cli(*args, timeout=20)
    assert res.returncode == USAGE and message in res.stderr and "Traceback" not in res.stderr


def test_a_corrupt_ledger_is_set_aside_said_once_and_not_fatal(home: Home) -> None:
    local_config(home)
    ledger = home.root / ".local" / "state" / "gputui" / "ledger.json"
    ledger.parent.mkdir(parents=True)
    ledger.write_text('{"hosts": {"local": {"intervals": [{"start": ')
    res = home.cli("status", "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    [aside] = ledger.parent.glob("ledger.json.bad-*")
    assert "unreadable ledger" in res.stderr and aside.name in res.stderr
    assert aside.read_text().startswith('{"hosts"')
    res = home.cli("status", "--json")
    assert res.returncode == 0 and "ledger" not in res.stderr


@pytest.mark.parametrize(
    "args", [["status", "--json"], ["history", "--json"], ["jobs", "--json"], ["--help"]]
)
def test_a_closed_pipe_ends_quietly(home: Home, args: list[str]) -> None:
    local_config(home)
    home.cli("run", "local", "--", "true", check=True)  # something to list
    read, write = os.pipe()
    os.close(read)  # like `| head` that has already gone
    try:
        res = subprocess.run([sys.executable, "-m", "gputui", *args], env=home.env, stdout=write,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.close(write)
    assert res.stderr == b"" and res.returncode in (0, 141)


def test_following_logs_into_a_closed_pipe_ends_quietly(home: Home) -> None:
    local_config(home)
    code = "import time\nwhile True: print('x' * 100, flush=True); time.sleep(0.01)"
    job = home.cli("run", "local", "--", sys.executable, "-c", code, check=True).stdout.strip()
    read, write = os.pipe()
    os.close(read)
    try:
        res = subprocess.run([sys.executable, "-m", "gputui", "logs", "-f", "local", job], env=home.env,
                             stdout=write, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
    finally:
        os.close(write)
        home.cli("kill", "local", job, "--grace", "1", "--yes")
    assert res.stderr == b"" and res.returncode == 141


def test_json_output_is_strict_even_when_a_log_says_nan(home: Home) -> None:
    local_config(home)
    code = "for i in range(3): print(f'step {i} loss: nan acc: inf', flush=True)"
    job = home.cli("run", "local", "--", sys.executable, "-c", code, check=True).stdout.strip()
    home.cli("logs", "-f", "local", job, check=True)
    for args in (["history", "--json"], ["jobs", "--json"], ["status", "--json"], ["cost", "--json"]):
        strict_json(home.cli(*args, check=True).stdout)


def test_a_bad_dns_name_is_that_hosts_error_only(home: Home) -> None:
    local_config(
        home, '[hosts.bad]\nhost = "gpu..example.com"\n[hosts.long]\nhost = "' + "a" * 64 + '.example.com"\n'
    )
    res = home.cli("status", "--json")  # the others answer; the status is that of the hosts that did not (config: 2)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    hosts = {h["name"]: h for h in json.loads(res.stdout)["hosts"]}
    assert hosts["local"]["state"] == "connected" and hosts["local"]["error"] is None
    for name in ("bad", "long"):
        assert "is not a valid DNS name" in hosts[name]["error"]
    res = home.cli("jobs")
    assert res.returncode == 2 and "bad: host name 'gpu..example.com' is not a valid DNS name" in res.stderr
    assert "Traceback" not in res.stderr

"""Job secrets (``gputui run --secret NAME``) over the real sshd: a job gets each value, and nothing of ours keeps
it: not a file under the host's state dir, not a CLI output, not another process's argv or environment; the host
deletes it as soon as the job can no longer start again (remote_agent/jobs/secrets.py)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import sys
from pathlib import Path

from conftest import AgentProc, Home, SshHome, stop_host, wait_for

from remote_agent.fsutil import read_json

# The job: prints the sha256 of each variable named in its arguments (and its attempt), waits for the file named
# first to exist, then exits with GPUTUI_ATTEMPT's entry in EXIT (attempt 1: first code, ...; default 0).
JOB = """\
import hashlib, os, sys, time
go, names = sys.argv[1], sys.argv[2:]
attempt = os.environ.get("GPUTUI_ATTEMPT", "1")
for name in names:
    print("attempt", attempt, name, hashlib.sha256(os.environ[name].encode()).hexdigest(), flush=True)
while go != "-" and not os.path.exists(go):
    time.sleep(0.05)
codes = os.environ.get("EXIT", "0").split(",")
sys.exit(int(codes[min(int(attempt), len(codes)) - 1]))
"""


def _job_script(tmp_path: Path) -> str:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return str(path)


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _files_holding(root: Path, value: str) -> list[Path]:
    """Every regular file under ``root`` whose bytes hold ``value``."""
    needle = value.encode()
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
            found.append(path)
    return found


def _processes_holding(value: str) -> list[int]:
    """Every process on this machine whose argv or environment holds ``value``."""
    needle = value.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() or needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def _secrets_file(home: Home, text: str, mode: int = 0o600) -> Path:
    path = home.root / ".config" / "gputui" / "secrets.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


class Outputs:
    """The CLI, every output of which is kept (to look for a value in all of them at the end)."""

    def __init__(self, home: SshHome) -> None:
        self.home = home
        self.texts: list[str] = []

    def __call__(self, *args: str, code: int = 0) -> str:
        res = self.home.cli(*args, timeout=120)
        self.texts.append(res.stdout + res.stderr)
        assert res.returncode == code, (args, res.stdout, res.stderr)
        return res.stdout

    def holding(self, value: str) -> list[str]:
        return [text for text in self.texts if value in text]


def test_a_job_gets_its_secrets_and_nothing_of_ours_keeps_them(ssh_home: SshHome, tmp_path: Path) -> None:
    """One value from this machine's environment, one from the 0600 secrets file: the job sees both; while it runs
    only the job's own process holds them (not the runner's argv or environment, nor tmux's, nor the agent's),
    and the host kept them only until the runner read them (no restart policy: one attempt)."""
    token, key = "hf_" + secrets.token_hex(16), "wk-" + secrets.token_hex(16)
    ssh_home.env["HF_TOKEN"] = token
    _secrets_file(ssh_home, f'WANDB_API_KEY = "{key}"\n')
    cli, go = Outputs(ssh_home), tmp_path / "go"
    jid = cli("run", "box", "--secret", "HF_TOKEN", "--secret", "WANDB_API_KEY", "--env", "PLAIN=1", "--",
              "python3", _job_script(tmp_path), str(go), "HF_TOKEN", "WANDB_API_KEY").strip()
    job_dir = ssh_home.remote_job_dir(jid)
    log = job_dir / "output.log"
    wait_for(lambda: log.exists() and log.read_text().count("attempt 1") == 2, timeout=60, what="the job's hashes")
    pid = read_json(str(job_dir / "pid.json"))["pid"]
    assert _processes_holding(token) == [pid] and _processes_holding(key) == [pid]
    assert not (job_dir / "secrets").exists()  # read for its one attempt: gone from the host
    cli("jobs", "box", "--json")
    go.touch()
    assert "WANDB_API_KEY " + _sha(key) in cli("logs", "-f", "box", jid)
    assert f"attempt 1 HF_TOKEN {_sha(token)}" in log.read_text()
    record = read_json(str(job_dir / "job.json"))
    assert record["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"] and record["env"] == {"PLAIN": "1"}
    again = cli("run", "box", "--secret", "HF_TOKEN", "--", "python3", _job_script(tmp_path), "-", "HF_TOKEN").strip()
    cli("logs", "-f", "box", again)
    assert [j["state"] for j in json.loads(cli("jobs", "box", "--json"))] == ["succeeded", "succeeded"]
    for args in (["jobs", "box"], ["history", "box"], ["history", "--json"], ["queue", "box", "--json"],
                 ["compare", f"box:{jid}", f"box:{again}"], ["compare", "--json", f"box:{jid}", f"box:{again}"],
                 ["logs", "box", jid]):
        cli(*args)
    for value in (token, key):
        assert _files_holding(ssh_home.remote_dir, value) == []
        assert cli.holding(value) == []


def test_each_attempt_of_a_restarting_job_gets_its_secret_and_the_last_one_takes_it_away(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    """Attempt 2 gets the secret as attempt 1 did; between attempts the host keeps it (0600 in a 0700 dir, never in
    job.json); after the last attempt it is gone, whether the job succeeded (its runner's end) or gave up (the
    watchdog's)."""
    token = "hf_" + secrets.token_hex(16)
    ssh_home.env["HF_TOKEN"] = token
    ssh_home.configure(restart_backoff_s=0, restart_backoff_max_s=0)
    cli, go, script = Outputs(ssh_home), tmp_path / "go", _job_script(tmp_path)
    succeeds = cli("run", "box", "--restart", "on-failure:3", "--secret", "HF_TOKEN", "--env", "EXIT=1,0", "--",
                   "python3", script, str(go), "HF_TOKEN").strip()
    gives_up = cli("run", "box", "--restart", "on-failure:2", "--secret", "HF_TOKEN", "--env", "EXIT=1,1", "--",
                   "python3", script, "-", "HF_TOKEN").strip()
    kept = ssh_home.remote_job_dir(succeeds) / "secrets"
    wait_for(lambda: (ssh_home.remote_job_dir(succeeds) / "pid.json").exists(), timeout=60, what="attempt 1")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert stat.S_IMODE((kept / "values.json").stat().st_mode) == 0o600
    assert token not in (ssh_home.remote_job_dir(succeeds) / "job.json").read_text()
    go.touch()
    for jid in (succeeds, gives_up):
        wait_for((ssh_home.remote_job_dir(jid) / "status.json").exists, timeout=90, what=f"job {jid}'s end")
    jobs = {j["id"]: j for j in json.loads(cli("jobs", "box", "--json"))}
    assert (jobs[succeeds]["state"], jobs[succeeds]["attempt"]) == ("succeeded", 2)
    assert jobs[gives_up]["state"] == "failed" and jobs[gives_up]["attempt"] == 2
    for jid in (succeeds, gives_up):
        log = (ssh_home.remote_job_dir(jid) / "output.log").read_text()
        assert f"attempt 1 HF_TOKEN {_sha(token)}" in log and f"attempt 2 HF_TOKEN {_sha(token)}" in log
        assert not (ssh_home.remote_job_dir(jid) / "secrets").exists()
    cli("history", "--json")
    assert _files_holding(ssh_home.remote_dir, token) == [] and cli.holding(token) == []


def test_a_queued_job_gets_its_secret_when_it_starts_and_a_cancelled_one_leaves_none(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    token = "hf_" + secrets.token_hex(16)
    ssh_home.env["HF_TOKEN"] = token
    cli, go, script = Outputs(ssh_home), tmp_path / "go", _job_script(tmp_path)
    blocker = cli("run", "box", "--", "python3", script, str(go)).strip()
    queued = cli("run", "box", "--queue", "--secret", "HF_TOKEN", "--", "python3", script, "-", "HF_TOKEN").strip()
    cancelled = cli("run", "box", "--queue", "--secret", "HF_TOKEN", "--", "true").strip()
    wait_for(lambda: (ssh_home.remote_job_dir(blocker) / "pid.json").exists(), timeout=60, what="the blocker")
    for jid in (queued, cancelled):  # they wait with their jobs
        assert (ssh_home.remote_job_dir(jid) / "secrets" / "values.json").exists()
    assert [j["id"] for j in json.loads(cli("queue", "box", "--json"))["jobs"]] == [queued, cancelled]
    cli("kill", "box", cancelled, "--yes")
    assert not (ssh_home.remote_job_dir(cancelled) / "secrets").exists()
    go.touch()
    status = ssh_home.remote_job_dir(queued) / "status.json"
    wait_for(status.exists, timeout=90, what="the queued job to run and end")
    assert read_json(str(status))["exit_code"] == 0
    assert f"attempt 1 HF_TOKEN {_sha(token)}" in (ssh_home.remote_job_dir(queued) / "output.log").read_text()
    assert not (ssh_home.remote_job_dir(queued) / "secrets").exists()
    cli("jobs", "box", "--json")
    assert _files_holding(ssh_home.remote_dir, token) == [] and cli.holding(token) == []


def test_a_secret_without_a_value_or_from_a_file_others_may_read_is_refused_before_anything_starts(home: Home) -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    value = "hf_" + secrets.token_hex(16)
    path = _secrets_file(home, f'HF_TOKEN = "{value}"\n', 0o644)

    def refused(*args: str) -> str:
        res = home.cli("run", "local", *args, "--", "true")
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert value not in res.stdout + res.stderr
        return res.stderr

    assert f"others may read it (mode 644); make it yours alone: chmod 600 {path}" in refused("--secret", "HF_TOKEN")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    assert "belongs to uid 65534, not to you" in refused("--secret", "HF_TOKEN")
    os.chown(path, os.getuid(), os.getgid())
    assert f'--secret NOPE: no value: set $NOPE here, or add NOPE = "..." to {path}' in refused("--secret", "NOPE")
    assert "--secret '1X': a variable name" in refused("--secret", "1X")
    assert "HF_TOKEN: given both as --env and as --secret" in refused("--secret", "HF_TOKEN", "--env", "HF_TOKEN=x")
    path.write_text("HF_TOKEN = 5\n")
    assert "'HF_TOKEN' must be a string" in refused("--secret", "HF_TOKEN")
    path.write_text(f'HF_TOKEN = "{value}\x01"\n')
    assert "not valid TOML (at line 1, column" in refused("--secret", "HF_TOKEN")
    assert not (home.state_dir / "jobs").exists() or not list((home.state_dir / "jobs").iterdir())  # nothing started
    path.chmod(0o644)  # a file the job does not need never blocks it: the value comes from the environment
    home.env["HF_TOKEN"] = value
    jid = home.cli("run", "local", "--secret", "HF_TOKEN", "--", sys.executable, "-c", "", check=True).stdout.strip()
    wait_for((home.job_dir(jid) / "status.json").exists, timeout=30, what="the job to end")
    assert read_json(str(home.job_dir(jid) / "status.json"))["exit_code"] == 0
    assert _files_holding(home.state_dir, value) == []  # (the local agent inherits the variable: not kept either)


def test_a_job_whose_secrets_the_host_lost_never_runs_without_them_and_says_why(tmp_path: Path) -> None:
    state, go, ran = tmp_path / "state", tmp_path / "go", tmp_path / "ran"
    agent = AgentProc(state)
    try:
        blocker = agent.call("jobs.start", argv=[sys.executable, _job_script(tmp_path), str(go)])["result"]["id"]
        queued = agent.call("jobs.start", argv=["touch", str(ran)], secrets={"HF_TOKEN": "v"},
                            queue={"after": [blocker]})["result"]["id"]
        shutil.rmtree(state / "jobs" / queued / "secrets")
        go.touch()
        wait_for((state / "jobs" / queued / "status.json").exists, timeout=60, what="the queued job's end")
        job = agent.call("jobs.get", job=queued)["result"]
        assert job["state"] == "failed" and not ran.exists()
        assert job["error"] == "not started: its secrets HF_TOKEN are no longer on the host: start the job again"
    finally:
        agent.close()
        stop_host(state)

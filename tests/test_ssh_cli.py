"""Every CLI command against a real sshd (the agent really deployed over SSH), and each bad input's message."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import SshHome, wait_for
from sshd import free_port, keygen

CONNECTED_EXIT, UNREACHABLE, REFUSED, USAGE = 0, 3, 4, 2


def run_job(home: SshHome, *cmd: str) -> str:
    res = home.cli("run", "box", "--", *cmd, check=True)
    job_id = res.stdout.strip()
    assert job_id.isdigit(), res.stdout
    return job_id


def test_run_follow_jobs_status_kill_over_ssh(ssh_home: SshHome, tmp_path) -> None:
    job_id = run_job(
        ssh_home, "python3", "-c", "import sys; print('hi from', sys.argv[1]); sys.exit(7)", "a b"
    )
    res = ssh_home.cli_bytes("logs", "-f", "box", job_id)
    assert res.returncode == 7, res.stderr
    assert res.stdout == (ssh_home.remote_job_dir(job_id) / "output.log").read_bytes()
    assert res.stdout.replace(b"\r\n", b"\n") == b"hi from a b\n"
    assert (
        ssh_home.remote_dir.is_dir() and not (ssh_home.root / ".gputui").exists()
    )  # state lives on the host

    [job] = json.loads(ssh_home.cli("jobs", "box", "--json", check=True).stdout)
    assert (job["host"], job["id"], job["state"], job["exit_code"]) == ("box", job_id, "failed", 7)
    assert job["cwd"] == str(ssh_home.sshd.remote_home)  # "~" of the ssh user by default

    marker = tmp_path / "ready"
    sleeper = run_job(
        ssh_home,
        "python3",
        "-c",
        f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)",
    )
    wait_for(marker.exists, what="job start")
    status = json.loads(ssh_home.cli("status", "--json", check=True).stdout)
    [host] = status["hosts"]
    assert host["name"] == "box" and host["state"] == "connected" and host["error"] is None
    assert host["host"]["mem_total_mib"] > 0 and any(
        j["id"] == sleeper and j["state"] == "running" for j in host["jobs"]
    )

    res = ssh_home.cli("kill", "box", sleeper, "--grace", "2", check=True)
    assert "killed" in res.stdout
    jobs = {j["id"]: j for j in json.loads(ssh_home.cli("jobs", "--json", check=True).stdout)}
    assert jobs[sleeper]["state"] == "killed" and jobs[sleeper]["exit_code"] == 130


def test_agent_is_uploaded_once_and_verified(ssh_home: SshHome) -> None:
    run_job(ssh_home, "true")
    [pyz] = (ssh_home.remote_dir / "agent").glob("gputui-agent-*.pyz")
    first = pyz.stat()
    assert oct(first.st_mode & 0o777) == "0o600" and oct(pyz.parent.stat().st_mode & 0o777) == "0o700"
    run_job(ssh_home, "true")
    assert (
        pyz.stat().st_ino == first.st_ino and pyz.stat().st_mtime_ns == first.st_mtime_ns
    )  # not uploaded again
    assert not [p for p in pyz.parent.iterdir() if p.name.startswith(".")]  # no temp files left behind
    assert oct(pyz.with_suffix("").stat().st_mode & 0o777) == "0o700"  # unpacked beside it, private too
    pyz.unlink()  # the host lost it: the next connection uploads it again
    run_job(ssh_home, "true")
    assert pyz.exists()


def test_wrong_port_is_unreachable(ssh_home: SshHome) -> None:
    port = free_port()
    ssh_home.configure(port=port)
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == UNREACHABLE, res.stderr
    assert f"connection refused by [127.0.0.1]:{port}" in res.stderr and "wrong port" in res.stderr


def test_auth_failure_is_refused(ssh_home: SshHome) -> None:
    ssh_home.configure(key="stranger")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert "authentication failed for" in res.stderr and "id_stranger" in res.stderr


def test_unknown_host_key_shows_fingerprint_and_trust_command(ssh_home: SshHome) -> None:
    ssh_home.known_hosts.write_text("")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert "unknown host key" in res.stderr and f"ED25519 key {ssh_home.sshd.fingerprint()}" in res.stderr
    assert "gputui trust box" in res.stderr
    assert not ssh_home.remote_dir.exists()  # nothing ran on the host


def test_changed_host_key_is_refused_loudly(ssh_home: SshHome, tmp_path) -> None:
    other = keygen(tmp_path / "impostor")
    kind, data = (tmp_path / "impostor.pub").read_text().split()[:2]
    ssh_home.known_hosts.write_text(f"[127.0.0.1]:{ssh_home.sshd.port} {kind} {data}\n")
    old_fp = subprocess.run(["ssh-keygen", "-lf", str(other)], capture_output=True, text=True).stdout.split()[
        1
    ]
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert (
        "HOST KEY CHANGED" in res.stderr
        and old_fp in res.stderr
        and ssh_home.sshd.fingerprint() in res.stderr
    )
    assert "ssh-keygen -R" in res.stderr and "gputui trust box" in res.stderr
    res = ssh_home.cli("trust", "box", "--yes")  # trust never papers over a changed key
    assert res.returncode == REFUSED and "CHANGED" in res.stderr


def test_host_without_tmux(ssh_home: SshHome) -> None:
    ssh_home.configure(key="notmux")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert "tmux not found on box" in res.stderr and "apt install tmux" in res.stderr


def test_host_without_python3(ssh_home: SshHome) -> None:
    ssh_home.configure(key="nopython")
    res = ssh_home.cli("status", "--json")
    [host] = json.loads(res.stdout)["hosts"]
    assert host["state"] == "error" and "python3 not found on box" in host["error"]
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert "python3 not found on box" in res.stderr and 'python = "/path/to/python3"' in res.stderr
    ssh_home.configure(python="/opt/no/python3.12")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED and "/opt/no/python3.12 not found on box" in res.stderr


def test_bad_config_names_file_line_and_field(ssh_home: SshHome) -> None:
    path = ssh_home.configure(prot=22)
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == USAGE and f"{path}:8: hosts.box.prot: unknown setting" in res.stderr
    path = ssh_home.configure(port="22")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == USAGE and "hosts.box.port: must be a whole number, not str '22'" in res.stderr
    ssh_home.configure(identity_file="/no/such/key")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == USAGE and "identity_file /no/such/key: no such file" in res.stderr


def test_trust_adds_the_key_then_connects(ssh_home: SshHome) -> None:
    ssh_home.configure(known_hosts=None)  # the default: ~/.ssh/known_hosts of the (isolated) HOME
    default = ssh_home.root / ".ssh" / "known_hosts"
    assert ssh_home.cli("run", "box", "--", "true").returncode == REFUSED

    res = ssh_home.cli("trust", "box")  # no terminal to ask on, no --yes: nothing written
    assert res.returncode == USAGE and "--yes" in res.stderr and not default.exists()

    res = ssh_home.cli("trust", "box", "--yes", check=True)
    assert ssh_home.sshd.fingerprint() in res.stdout and str(default) in res.stdout
    assert default.read_text() == ssh_home.sshd.host_key_line()  # OpenSSH format, [host]:port
    assert (
        oct(default.stat().st_mode & 0o777) == "0o600"
        and oct(default.parent.stat().st_mode & 0o777) == "0o700"
    )
    run_job(ssh_home, "true")
    assert "already trusted" in ssh_home.cli("trust", "box", "--yes", check=True).stdout


def test_trust_hashed_entry_is_understood_by_openssh(ssh_home: SshHome) -> None:
    ssh_home.known_hosts.write_text("")
    ssh_home.cli("trust", "box", "--yes", "--hash", check=True)
    line = ssh_home.known_hosts.read_text()
    assert line.startswith("|1|") and "127.0.0.1" not in line
    found = subprocess.run(
        ["ssh-keygen", "-F", f"[127.0.0.1]:{ssh_home.sshd.port}", "-f", str(ssh_home.known_hosts)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert found.returncode == 0 and "ssh-ed25519" in found.stdout
    run_job(ssh_home, "true")


def test_verify_host_key_false_is_the_only_way_around_and_warns(ssh_home: SshHome) -> None:
    ssh_home.known_hosts.write_text("")
    ssh_home.configure(verify_host_key=False)
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == 0, res.stderr
    assert "NOT checking the host key" in res.stderr


def test_terminal_prefix_is_an_argv(ssh_home: SshHome) -> None:
    code = (
        "from gputui.core import config; from gputui.core.fleet import make_transport\n"
        "c = config.load(); print(make_transport(c.host('box'), c).terminal_prefix())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=ssh_home.env, capture_output=True, text=True, check=True
    )
    argv = eval(out.stdout)  # noqa: S307 - our own repr of a list of str
    assert argv[:2] == ["ssh", "-t"] and argv[-2:] == ["--", "127.0.0.1"]
    assert ["-p", str(ssh_home.sshd.port)] == argv[argv.index("-p") : argv.index("-p") + 2]


def test_ssh_config_alias_is_honoured(ssh_home: SshHome) -> None:
    ssh_config = ssh_home.root / "ssh_config"
    ssh_config.write_text(
        f"Host boxalias\n  HostName 127.0.0.1\n  Port {ssh_home.sshd.port}\n  User {ssh_home.sshd.user}\n"
        f"  IdentityFile {ssh_home.sshd.keys['ok']}\n"
    )
    ssh_home.known_hosts.write_text("")
    ssh_home.write_config(
        f'ssh_config = "{ssh_config}"\n[hosts.box]\nhost = "boxalias"\n'
        f'known_hosts = "{ssh_home.known_hosts}"\nremote_dir = "{ssh_home.remote_dir}"\n'
    )
    res = ssh_home.cli("trust", "box", "--yes", check=True)
    assert f"[127.0.0.1]:{ssh_home.sshd.port}" in res.stdout  # the name OpenSSH would look up, not the alias
    assert ssh_home.known_hosts.read_text() == ssh_home.sshd.host_key_line()
    job_id = run_job(ssh_home, "echo", "via alias")
    assert ssh_home.cli("logs", "-f", "box", job_id, check=True).stdout.strip() == "via alias"

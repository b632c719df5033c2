"""Every CLI command against a real sshd (the agent really deployed over SSH), and each bad input's message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import SshHome, stop_host, wait_for
from sshd import Sshd, free_port, keygen, restricted_bin

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
    )
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
        "from gputui.core.config import file as config; from gputui.core.hosts.fleet import make_transport\n"
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


# --- ssh_config resolved as OpenSSH resolves it ------------------------------------------------------------------
RELAY = (
    "import os, socket, sys, threading\n"
    "open(sys.argv[3], 'a').write(f'{sys.argv[1]}:{sys.argv[2]}\\n')\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
    "def up():\n"
    "    while data := os.read(0, 65536):\n"
    "        s.sendall(data)\n"
    "    s.shutdown(socket.SHUT_WR)\n"
    "threading.Thread(target=up, daemon=True).start()\n"
    "while data := s.recv(65536):\n"
    "    os.write(1, data)\n"
)


@pytest.fixture(params=["ssh -G", "asyncssh"])
def resolver(request: pytest.FixtureRequest, ssh_home: SshHome, tmp_path) -> str:
    """Each test twice: ssh_config resolved by OpenSSH's client, and by asyncssh's parser (no ``ssh`` on PATH)."""
    if request.param == "asyncssh":
        ssh_home.env["PATH"] = str(restricted_bin(tmp_path / "bin-nossh", ("ssh",)))
    return str(request.param)


def _alias_config(ssh_home: SshHome, ssh_config: str) -> None:
    """gputui's config: host ``box`` is the ssh_config alias ``boxalias`` of ``ssh_config`` (its text)."""
    path = ssh_home.root / "ssh_config"
    path.write_text(ssh_config)
    ssh_home.known_hosts.write_text("")
    ssh_home.write_config(
        f'ssh_config = "{path}"\n[hosts.box]\nhost = "boxalias"\n'
        f'known_hosts = "{ssh_home.known_hosts}"\nremote_dir = "{ssh_home.remote_dir}"\n'
    )


def _alias_block(ssh_home: SshHome, extra: str = "") -> str:
    s = ssh_home.sshd
    return (f"Host boxalias\n  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n"
            f"  IdentityFile {s.keys['ok']}\n{extra}")


def test_trust_fetches_the_key_where_the_host_s_own_block_sends_it(ssh_home: SshHome, tmp_path, resolver: str) -> None:
    """Specific hosts first, ``Host *`` defaults last (the common layout): the host's own Port wins."""
    _alias_config(ssh_home, _alias_block(ssh_home) + f"Host *\n  Port {free_port()}\n  User nobody-else\n")
    res = ssh_home.cli("trust", "box", "--yes")
    assert res.returncode == 0, res.stderr
    assert ssh_home.known_hosts.read_text() == ssh_home.sshd.host_key_line()
    run_job(ssh_home, "true")


def test_trust_and_jobs_go_through_the_host_s_proxy_command(ssh_home: SshHome, tmp_path, resolver: str) -> None:
    """The ProxyCommand gets the host's %h and %p (not those of an empty name) and runs as OpenSSH runs it."""
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    seen = tmp_path / "proxied"
    command = f"  ProxyCommand {sys.executable} {relay} %h %p {seen}\n"
    _alias_config(ssh_home, _alias_block(ssh_home, command) + f"Host *\n  Port {free_port()}\n")
    res = ssh_home.cli("trust", "box", "--yes")
    assert res.returncode == 0, res.stderr
    assert ssh_home.known_hosts.read_text() == ssh_home.sshd.host_key_line()
    run_job(ssh_home, "true")
    assert set(seen.read_text().split()) == {f"127.0.0.1:{ssh_home.sshd.port}"}


def test_a_recursive_include_is_a_clear_error(ssh_home: SshHome, resolver: str) -> None:
    path = ssh_home.root / "ssh_config"
    _alias_config(ssh_home, f"Include {path}\n" + _alias_block(ssh_home))
    for args in (("trust", "box", "--yes"), ("jobs", "box")):
        res = ssh_home.cli(*args)
        assert res.returncode == USAGE, res.stderr
        assert "Traceback" not in res.stderr and "include" in res.stderr.lower(), res.stderr


@pytest.mark.parametrize(
    ("jumps", "says"),
    [
        ("Host *\n  ProxyJump jumper\n", "jumper"),  # the jump host's own block sends it through itself
        ("  ProxyJump j1\nHost j1\n  ProxyJump j2\nHost j2\n  ProxyJump j1\n", "boxalias -> j1 -> j2 -> j1"),
    ],
)
def test_a_proxy_jump_loop_is_a_clear_error_naming_it(ssh_home: SshHome, resolver: str, jumps: str, says: str) -> None:
    _alias_config(ssh_home, _alias_block(ssh_home, jumps))
    for args in (("trust", "box", "--yes"), ("jobs", "box")):
        res = ssh_home.cli(*args)
        assert res.returncode == USAGE, res.stderr
        assert "Traceback" not in res.stderr and "loop" in res.stderr and says in res.stderr, res.stderr


def test_trust_and_jobs_go_through_a_proxy_jump_url_hop(ssh_home: SshHome, tmp_path, resolver: str) -> None:
    """``ProxyJump ssh://user@host:port``: the hop read as OpenSSH reads it, resolved by its own block, its key
    checked against its own known_hosts; the host's key is fetched through it."""
    jump = Sshd(tmp_path / "jump", tcp_forwarding="local")
    jump.client_key("ok")
    jump.start()
    try:
        hop_known = tmp_path / "hop_known_hosts"
        hop_known.write_text(jump.host_key_line())
        hop = (f"Host 127.0.0.1\n  IdentityFile {jump.keys['ok']}\n  UserKnownHostsFile {hop_known}\n"
               f"Host *\n  Port {free_port()}\n")
        url = f"  ProxyJump ssh://{jump.user}@127.0.0.1:{jump.port}\n"
        _alias_config(ssh_home, _alias_block(ssh_home, url) + hop)
        res = ssh_home.cli("trust", "box", "--yes")
        assert res.returncode == 0, res.stderr
        assert ssh_home.known_hosts.read_text() == ssh_home.sshd.host_key_line()
        job_id = run_job(ssh_home, "echo", "via jump")
        assert ssh_home.cli("logs", "-f", "box", job_id, check=True).stdout.strip() == "via jump"
        assert "Accepted publickey" in (jump.root / "sshd.log").read_text()  # it went through the hop
    finally:
        stop_host(ssh_home.remote_dir)
        jump.stop()


def test_a_host_ssh_accepts_is_accepted(ssh_home: SshHome, resolver: str, tmp_path) -> None:
    """An end-of-line comment and a missing IdentityFile/CertificateFile (OpenSSH carries on: Teleport's
    generated configs do this), one that is no key or is encrypted, do not refuse the host."""
    s = ssh_home.sshd
    garbage, locked = tmp_path / "not-a-key", tmp_path / "id_locked"
    garbage.write_text("not a key\n")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    _alias_config(ssh_home, (
        f"Host boxalias  # the test box\n  HostName 127.0.0.1 # loopback\n  Port {s.port}\n  User {s.user}\n"
        f"  IdentityFile /no/such/key\n  CertificateFile /no/such/key-cert.pub\n  IdentityFile {garbage}\n"
        f"  IdentityFile {locked}\n  IdentityFile {s.keys['ok']}\n"
    ))
    ssh_home.known_hosts.write_text(s.host_key_line())
    job_id = run_job(ssh_home, "echo", "accepted")
    assert ssh_home.cli("logs", "-f", "box", job_id, check=True).stdout.strip() == "accepted"


def test_an_encrypted_identity_file_says_to_load_it_into_the_agent(ssh_home: SshHome, tmp_path) -> None:
    key = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True)
    ssh_home.configure(identity_file=str(key))
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert "Traceback" not in res.stderr and "ssh-add" in res.stderr


def test_the_identity_agent_of_ssh_config_is_used(ssh_home: SshHome, resolver: str, tmp_path) -> None:
    """``IdentityAgent SOCKET`` (1Password, Secretive...): the key comes from that agent."""
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen([shutil.which("ssh-agent") or "ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, what="the agent's socket")
        env = {**ssh_home.env, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run([shutil.which("ssh-add") or "ssh-add", "-q", str(ssh_home.sshd.keys["ok"])], env=env, check=True, capture_output=True)
        s = ssh_home.sshd
        _alias_config(ssh_home, f"Host boxalias\n  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n"
                                f"  IdentityAgent {sock}\n")
        ssh_home.known_hosts.write_text(s.host_key_line())
        run_job(ssh_home, "true")
    finally:
        agent.terminate()
        agent.wait(10)

"""known_hosts is matched the way OpenSSH matches it, and a changed key is reported truthfully."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import SshHome
from sshd import keygen

REFUSED = 4


def fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def openssh_accepts(home: SshHome, ssh_config: Path) -> bool:
    """Whether the OpenSSH client itself trusts the host with this config (the reference behaviour)."""
    argv = [
        "ssh",
        "-F",
        str(ssh_config),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "box",
        "true",
    ]
    return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=30).returncode == 0


def use_ssh_config(home: SshHome, *known_hosts: Path) -> Path:
    """Host ``box`` via an ssh_config naming these known_hosts files (gputui's own setting left unset)."""
    ssh_config = home.root / "ssh_config"
    ssh_config.write_text(
        f"Host box\n  HostName 127.0.0.1\n  Port {home.sshd.port}\n  User {home.sshd.user}\n"
        f"  IdentityFile {home.sshd.keys['ok']}\n  UserKnownHostsFile {' '.join(map(str, known_hosts))}\n"
    )
    home.write_config(f'ssh_config = "{ssh_config}"\n[hosts.box]\nremote_dir = "{home.remote_dir}"\n')
    return ssh_config


def test_entry_without_port_is_judged_like_openssh(ssh_home: SshHome, tmp_path: Path) -> None:
    ssh_config = use_ssh_config(ssh_home, ssh_home.known_hosts)
    # The very key, recorded for port 22 only: OpenSSH accepts it ("found matching key w/out port"), so do we.
    ssh_home.known_hosts.write_text(ssh_home.sshd.host_key_line("127.0.0.1"))
    assert openssh_accepts(ssh_home, ssh_config)
    assert ssh_home.cli("run", "box", "--", "true").returncode == 0

    # Another key recorded for port 22 (another sshd on that machine): the host on this port is unknown,
    # not changed; OpenSSH refuses it, and trusting it records a [host]:port entry.
    keygen(tmp_path / "port22")
    kind, data = (tmp_path / "port22.pub").read_text().split()[:2]
    ssh_home.known_hosts.write_text(f"127.0.0.1 {kind} {data}\n")
    assert not openssh_accepts(ssh_home, ssh_config)
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    assert (
        f"unknown host key for [127.0.0.1]:{ssh_home.sshd.port}" in res.stderr and "CHANGED" not in res.stderr
    )
    res = ssh_home.cli("trust", "box", "--yes")
    assert res.returncode == 0 and "CHANGED" not in res.stderr, res.stderr
    assert openssh_accepts(ssh_home, ssh_config)
    assert ssh_home.cli("run", "box", "--", "true").returncode == 0


def test_changed_key_message_shows_trusted_and_presented_keys(ssh_home: SshHome, tmp_path: Path) -> None:
    keygen(tmp_path / "old")
    kind, data = (tmp_path / "old.pub").read_text().split()[:2]
    port_less = tmp_path / "known_hosts_a"  # the server's real key, but for port 22
    port_less.write_text(ssh_home.sshd.host_key_line("127.0.0.1"))
    with_port = tmp_path / "known_hosts_b"  # an old key for this port
    with_port.write_text(f"[127.0.0.1]:{ssh_home.sshd.port} {kind} {data}\n")
    ssh_config = use_ssh_config(ssh_home, port_less, with_port)
    assert not openssh_accepts(ssh_home, ssh_config)

    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == REFUSED, res.stderr
    old, new = fingerprint(tmp_path / "old.pub"), ssh_home.sshd.fingerprint()
    assert (
        f"HOST KEY CHANGED for [127.0.0.1]:{ssh_home.sshd.port}: {with_port} trusts ED25519 key {old}, "
        f"but the server now presents ED25519 key {new}"
    ) in res.stderr
    assert res.stderr.count(new) == 1

"""Deploying the agent over a real sshd: damaged builds repaired, login noise ignored, no temp files left."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SshHome

from gputui.core.deploy.bundle import agent_build

HOST_ERROR = 4


def run_job(home: SshHome, *cmd: str) -> str:
    res = home.cli("run", "box", "--", *cmd, check=True)
    assert res.stdout.strip().isdigit(), res.stdout
    return res.stdout.strip()


def agent_dir(home: SshHome) -> Path:
    return home.remote_dir / "agent"


@pytest.fixture
def bashrc(ssh_home: SshHome) -> Iterator[Path]:
    """The remote user's ~/.bashrc (bash reads it for commands run by sshd); removed afterwards."""
    path = ssh_home.sshd.remote_home / ".bashrc"
    yield path
    path.unlink(missing_ok=True)


def test_damaged_agent_build_is_uploaded_again(ssh_home: SshHome) -> None:
    run_job(ssh_home, "true")
    name, data = agent_build()
    pyz = agent_dir(ssh_home) / name
    pyz.write_bytes(pyz.read_bytes()[: len(data) // 2])  # e.g. a disk that filled up during an old upload
    job = run_job(ssh_home, "echo", "repaired")
    assert pyz.read_bytes() == data
    assert ssh_home.cli("logs", "-f", "box", job, check=True).stdout.strip() == "repaired"


@pytest.mark.parametrize("banner", ["Welcome to box", "Welcome\nto box\n", "python /nowhere\ndir /tmp\n"])
def test_login_banner_does_not_break_setup(ssh_home: SshHome, bashrc: Path, banner: str) -> None:
    bashrc.write_text(f"printf {banner!r}\necho 'noise on stderr' >&2\n")
    res = ssh_home.cli("run", "box", "--", "echo", "hello")
    assert res.returncode == 0, res.stderr
    assert (ssh_home.remote_dir / "agent").is_dir()  # the real remote_dir, not one named by the banner
    job = res.stdout.strip()
    res = ssh_home.cli("logs", "-f", "box", job)
    assert res.returncode == 0 and res.stdout.strip() == "hello", res.stderr
    assert "malformed" not in res.stderr


def test_login_shell_that_exits_is_blamed_not_remote_dir(ssh_home: SshHome, bashrc: Path) -> None:
    bashrc.write_text("echo 'this host is closed'\nexit 1\n")
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == HOST_ERROR, res.stderr
    assert "did not run to its end" in res.stderr and "login shell" in res.stderr
    assert "remote_dir" not in res.stderr


def test_failed_upload_leaves_no_temp_file_and_stale_ones_go(ssh_home: SshHome, tmp_path: Path) -> None:
    # An interpreter that fails only when it checks the uploaded temp file: the upload fails half-way.
    python = tmp_path / "python-failing-check"
    python.write_text('#!/bin/sh\ncase "$*" in *"/.gputui-agent-"*) exit 1;; esac\nexec python3 "$@"\n')
    python.chmod(0o755)
    ssh_home.configure(python=str(python))
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == HOST_ERROR and "uploading the agent to box failed" in res.stderr, res.stderr
    assert [p.name for p in agent_dir(ssh_home).iterdir()] == []

    stale = agent_dir(ssh_home) / ".gputui-agent-0123456789abcdef.pyz.4242"  # an upload killed an hour ago
    fresh = agent_dir(ssh_home) / ".gputui-agent-0123456789abcdef.pyz.4343"  # another client's, in progress
    for path in (stale, fresh):
        path.write_bytes(b"half an upload")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    ssh_home.configure()
    run_job(ssh_home, "true")
    name = agent_build()[0]
    assert sorted(p.name for p in agent_dir(ssh_home).iterdir()) == sorted([fresh.name, name, name[: -len(".pyz")]])


def test_agent_runs_unpacked_with_cached_bytecode_and_damage_is_repaired(ssh_home: SshHome) -> None:
    run_job(ssh_home, "true")
    build = agent_dir(ssh_home) / agent_build()[0][: -len(".pyz")]
    assert list(build.glob("remote_agent/__pycache__/server.*.pyc")), "the agent ran without caching bytecode"
    server = build / "remote_agent" / "server.py"
    source = server.read_bytes()
    server.write_bytes(b"raise SystemExit('damaged')\n")  # same folder, wrong bytes: must not run
    (build / "stray.py").write_bytes(b"")
    job = run_job(ssh_home, "echo", "repaired")
    assert server.read_bytes() == source and not (build / "stray.py").exists()
    assert ssh_home.cli("logs", "-f", "box", job, check=True).stdout.strip() == "repaired"


def test_status_on_a_host_with_the_agent_starts_its_python_twice_without_site(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    """One python start checks the version and the state dir (the probe), one runs the agent; both with -S
    (stdlib only: no site-packages, no .pth files to import on every start)."""
    starts = tmp_path / "python-starts"
    python = tmp_path / "python-logged"
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> "{starts}"\nexec python3 "$@"\n')
    python.chmod(0o755)
    ssh_home.configure(python=str(python))
    ssh_home.cli("status", "--json", check=True)  # deploys the agent
    starts.write_text("")
    ssh_home.cli("status", "--json", check=True)
    assert starts.read_text().splitlines() == ["-S", "-S"]


def test_an_old_python_is_named_and_nothing_is_written(ssh_home: SshHome, tmp_path: Path) -> None:
    python = tmp_path / "python3.6"  # as a 3.6 does with the installer: it fails to compile it
    python.write_text('#!/bin/sh\n[ "$1" = -V ] && { echo "Python 3.6.15"; exit 0; }\necho SyntaxError >&2; exit 1\n')
    python.chmod(0o755)
    ssh_home.configure(python=str(python))
    res = ssh_home.cli("run", "box", "--", "true")
    assert res.returncode == HOST_ERROR and "is Python 3.6.15; the agent needs Python >= 3.8" in res.stderr, res.stderr
    assert not ssh_home.remote_dir.exists()


def test_the_installer_does_nothing_on_a_python_older_than_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3.7 compiles the installer: it must still refuse before making or checking any dir."""
    import sys

    from gputui.core.deploy import install as agent_install

    monkeypatch.setattr(sys, "version_info", (3, 7, 17, "final", 0))
    state = tmp_path / "state"
    assert agent_install.main(["prepare", str(state), "a.pyz", "a", "10"]) == 3
    assert not state.exists()


async def test_a_host_with_the_agent_is_started_without_making_the_zipapp(
    ssh_home: SshHome, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe names the build after this machine's checked unpacked copy: the zipapp (tens of ms of
    compression) is made only when the host needs it uploaded or unpacked."""
    from gputui.core.config.file import HostConfig
    from gputui.core.transport import ssh as ssh_transport

    ssh_home.cli("status", "--json", check=True)  # the host gets the agent
    assert ssh_transport.build_name() == agent_build()[0]  # this machine's unpacked copy (made once)

    def made(*_: object) -> None:
        raise AssertionError("the zipapp was made for a host that has the build")

    monkeypatch.setattr(ssh_transport, "agent_build", made)
    transport = ssh_transport.SSHTransport(HostConfig(name="box", **ssh_home.host_settings()))
    try:
        channel = await transport.open_agent()
        assert (await channel.reader.readline()).strip() == b""  # the newline before the agent's hello
        await channel.close()
    finally:
        await transport.close()

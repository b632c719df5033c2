"""Deploying over a real sshd decides ownership and modes before anything is written or run on the host.

Python trusts a ``.pyc`` whose header matches its source's mtime and size, whoever wrote it. A state dir that
is not ours alone (another user's, one writable by others, one below a dir others can write) is refused
before the agent starts; a build holding anything not ours alone (a planted ``__pycache__`` file) is damaged
and unpacked again. The agent's own files are private; a job's files keep the user's umask.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SshHome, stop_host
from test_agent_bad_logs import small_disk
from test_ssh_deploy import HOST_ERROR, agent_dir, run_job

from gputui.core.deploy.bundle import agent_build

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to give files to another user")
OTHER_UID = 4242


def build_dir(home: SshHome) -> Path:
    return agent_dir(home) / agent_build()[0][: -len(".pyz")]


def interpreters() -> list[str]:
    """Every python3 the host's login may find: a planted .pyc for each of their versions."""
    found = {shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3", sys.executable}
    return sorted(p for p in found if p and os.access(p, os.X_OK))


def plant_bytecode(build: Path, marker: Path) -> None:
    """Bytecode that writes ``marker``, valid for the genuine ``protocol.py`` (same mtime and size)."""
    source = build / "remote_agent" / "protocol.py"
    genuine, st = source.read_bytes(), source.stat()
    payload = f"open({str(marker)!r}, 'w').write('ran')\n".encode()
    source.write_bytes(payload + b"#" * (len(genuine) - len(payload) - 1) + b"\n")
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    code = "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)"
    for python in interpreters():
        subprocess.run([python, "-c", code, str(source)], check=True, capture_output=True)
    source.write_bytes(genuine)
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))


def deployed(home: SshHome) -> Path:
    """The build on the host after one job, with every agent and tmux server of it stopped."""
    run_job(home, "true")
    stop_host(home.remote_dir)
    return build_dir(home)


def listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.lstat().st_mtime_ns, p.lstat().st_size) for p in root.rglob("*"))


@needs_root
def test_a_remote_dir_of_another_user_is_refused_before_its_code_runs(ssh_home: SshHome, tmp_path: Path) -> None:
    marker = tmp_path / "planted-code-ran"
    plant_bytecode(deployed(ssh_home), marker)
    for path in [ssh_home.remote_dir, *ssh_home.remote_dir.rglob("*")]:
        os.lchown(path, OTHER_UID, OTHER_UID)
    before = listing(ssh_home.remote_dir)

    res = ssh_home.cli("jobs", "box")
    assert res.returncode == HOST_ERROR, res.stderr
    assert f"belongs to uid {OTHER_UID}, not to you" in res.stderr and "nothing was written or run" in res.stderr
    assert not marker.exists(), "the planted bytecode ran"
    assert listing(ssh_home.remote_dir) == before  # nothing written, nothing removed


def test_a_remote_dir_writable_by_others_is_refused(ssh_home: SshHome, tmp_path: Path) -> None:
    marker = tmp_path / "planted-code-ran"
    plant_bytecode(deployed(ssh_home), marker)
    os.chmod(ssh_home.remote_dir, 0o1777)
    res = ssh_home.cli("jobs", "box")
    assert res.returncode == HOST_ERROR, res.stderr
    assert "writable by others (mode 1777)" in res.stderr and not marker.exists()
    assert stat.S_IMODE(ssh_home.remote_dir.stat().st_mode) == 0o1777  # never chmod'ed


def test_a_remote_dir_below_a_dir_others_can_write_is_refused(ssh_home: SshHome) -> None:
    parent = ssh_home.root.parent / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # anyone may rename what is in it: the state dir could be swapped
    ssh_home.configure(remote_dir=str(parent / "state"))
    res = ssh_home.cli("jobs", "box")
    assert res.returncode == HOST_ERROR, res.stderr
    assert f"{parent} is writable by others (mode 777)" in res.stderr
    assert list(parent.iterdir()) == []  # not even the state dir was made


@needs_root
def test_bytecode_in_the_build_that_is_not_ours_never_runs(ssh_home: SshHome, tmp_path: Path) -> None:
    marker = tmp_path / "planted-code-ran"
    build = deployed(ssh_home)
    plant_bytecode(build, marker)
    for pyc in (build / "remote_agent" / "__pycache__").glob("protocol.*.pyc"):
        os.chown(pyc, OTHER_UID, OTHER_UID)  # as if written by someone else (a former group-writable dir)
    job = run_job(ssh_home, "echo", "clean")
    assert ssh_home.cli("logs", "-f", "box", job, check=True).stdout.strip() == "clean"
    assert not marker.exists(), "the planted bytecode ran"
    owners = {p.lstat().st_uid for p in build.rglob("*")}
    assert owners == {os.getuid()}  # the damaged build was unpacked again


def test_agent_files_are_private_and_a_job_keeps_the_login_umask(ssh_home: SshHome, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    res = ssh_home.cli("run", "box", "--cwd", str(work), "--", "python3", "-c", "open('made', 'w').close()", check=True)
    ssh_home.cli("logs", "-f", "box", res.stdout.strip(), check=True)
    build = build_dir(ssh_home)
    assert list(build.rglob("__pycache__")), "the agent ran without caching bytecode"
    for path in [build, *build.rglob("*")]:
        assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, f"{path} is open to others"
    login_umask = os.umask(0o022)  # the sshd (and so the login) runs with the suite's umask
    os.umask(login_umask)
    assert stat.S_IMODE((work / "made").stat().st_mode) == 0o666 & ~login_umask


def test_the_clients_own_dirs_are_private(home) -> None:  # type: ignore[no-untyped-def]
    home.cli("status", "--json", check=True)
    cache = home.root / ".cache" / "gputui"
    assert cache.is_dir() and stat.S_IMODE(cache.stat().st_mode) == 0o700
    build = next(cache.glob("gputui-agent-*"))
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in [build, *build.rglob("*")])


def test_a_full_disk_during_the_upload_says_so_and_is_no_refusal(ssh_home: SshHome, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    small_disk(disk, "64k")  # smaller than the agent build
    try:
        ssh_home.configure(remote_dir=str(disk / "state"))
        res = ssh_home.cli("jobs", "box")
        assert res.returncode == 1, res.stderr  # a failure the user fixes by freeing space; 4 is "refused us"
        assert "No space left on device" in res.stderr and "free some space" in res.stderr, res.stderr
        assert [p.name for p in (disk / "state" / "agent").iterdir()] == []  # the part upload was removed
    finally:
        subprocess.run(["umount", "-l", str(disk)])

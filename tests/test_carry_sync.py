"""gputui sync and run --sync over the real sshd: what goes, only changes travel, no write escapes the target."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

from conftest import AgentProc, Home, SshHome, stop_host
from faultproxy import FaultProxy

from gputui.core.config import HostConfig
from gputui.core.session import HostSession
from gputui.core.ssh_transport import SSHTransport
from gputui.core.sync import SyncResult, sync
from gputui.core.transport import AgentChannel, LocalTransport
from remote_agent import protocol as P


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_repo(root: Path) -> Path:
    repo = root / "proj"
    (repo / "pkg").mkdir(parents=True)
    (repo / "data").mkdir()
    (repo / "train.py").write_text("print(open('pkg/conf.txt').read().strip())\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(repo / "run.sh", 0o750)
    (repo / "pkg" / "conf.txt").write_text("lr=0.1\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / ".gputuiignore").write_text("data/\n")
    (repo / "debug.log").write_text("ignored by git\n")
    (repo / "data" / "big.bin").write_bytes(b"ignored by .gputuiignore")
    os.symlink("/etc/passwd", repo / "passwd-link")
    _git(repo, "init", "-q")
    _git(repo, "add", "train.py", "run.sh", "pkg/conf.txt", ".gitignore", ".gputuiignore")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "first")
    (repo / "notes.md").write_text("untracked but not ignored: goes\n")
    return repo


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_sync_carries_the_repo_incrementally_and_keeps_writes_inside(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path)
    target = tmp_path / "host" / "proj"
    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    assert res.stdout.strip() == str(target)
    assert "skipped symlink passwd-link" in res.stderr
    assert files_under(target) == {
        "train.py",
        "run.sh",
        "pkg/conf.txt",
        ".gitignore",
        ".gputuiignore",
        "notes.md",
    }
    assert (target / "pkg" / "conf.txt").read_text() == "lr=0.1\n"
    assert os.stat(target / "run.sh").st_mode & 0o777 == 0o750

    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    assert "0 of 6 files sent" in res.stderr  # nothing changed: nothing travels
    (repo / "pkg" / "conf.txt").write_text("lr=0.2\n")
    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    assert "1 of 6 files sent" in res.stderr and (target / "pkg" / "conf.txt").read_text() == "lr=0.2\n"
    (target / "train.py").write_text("edited on the host\n")  # changed there: sent again, not trusted
    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    assert "1 of 6 files sent" in res.stderr and (target / "train.py").read_text().startswith("print(")

    # --delete removes what an earlier sync put there and SRC lost; never a file the host made itself.
    # Directories it leaves empty go too; one that still holds something, or was empty before, stays.
    (repo / "old" / "deep").mkdir(parents=True)
    (repo / "old" / "deep" / "a.txt").write_text("a")
    (repo / "kept").mkdir()
    (repo / "kept" / "b.txt").write_text("b")
    ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    (target / "kept" / "host-made").mkdir()
    (target / "empty-before").mkdir()
    os.unlink(repo / "notes.md")
    shutil.rmtree(repo / "old")
    shutil.rmtree(repo / "kept")
    (target / "host-made.txt").write_text("mine")
    ssh_home.cli("sync", "box", str(repo), "--to", str(target), "--delete", check=True)
    assert not (target / "notes.md").exists() and (target / "host-made.txt").read_text() == "mine"
    assert not (target / "old").exists() and not (target / "kept" / "b.txt").exists()
    assert (target / "kept" / "host-made").is_dir() and (target / "empty-before").is_dir()

    # A symlink planted on the host cannot lead a write out of the target.
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(target / "pkg", tmp_path / "pkg-old")
    os.symlink(outside, target / "pkg")
    (repo / "pkg" / "conf.txt").write_text("lr=0.3\n")
    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target))
    assert res.returncode == 1 and "symlink" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert list(outside.iterdir()) == []


def test_run_sync_runs_in_the_synced_dir_and_records_the_code(ssh_home: SshHome, tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    os.unlink(repo / "notes.md")  # a clean work tree
    target = tmp_path / "host" / "run"
    res = ssh_home.cli(
        "run", "box", "--sync", str(repo), "--cwd", str(target), "--", "python3", "train.py", check=True
    )
    job = res.stdout.strip()
    assert job.isdigit(), res
    assert ssh_home.cli("logs", "-f", "box", job, check=True).stdout.strip() == "lr=0.1"
    record = next(
        r for r in json.loads(ssh_home.cli("history", "box", "--json", check=True).stdout) if r["id"] == job
    )
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    assert record["cwd"] == str(target)
    assert record["code"]["git"] == {"commit": head.strip(), "dirty": False}
    assert len(record["code"]["tree_sha256"]) == 64 and record["code"]["files"] == 5
    (repo / "train.py").write_text("print('changed')\n")
    res = ssh_home.cli(
        "run", "box", "--sync", str(repo), "--cwd", str(target), "--", "python3", "train.py", check=True
    )
    job2 = res.stdout.strip()
    assert ssh_home.cli("logs", "-f", "box", job2, check=True).stdout.strip() == "changed"
    record2 = next(r for r in json.loads(ssh_home.cli("history", "box", "--json").stdout) if r["id"] == job2)
    assert record2["code"]["git"]["dirty"] is True
    assert record2["code"]["tree_sha256"] != record["code"]["tree_sha256"]
    # The history table's CODE column: short tree hash, then the commit with * when dirty.
    rows = {ln.split()[1]: ln for ln in ssh_home.cli("history", "box", check=True).stdout.splitlines()[1:]}
    assert f" {record['code']['tree_sha256'][:8]} {head[:7]} " in rows[job], rows
    assert f" {record2['code']['tree_sha256'][:8]} {head[:7]}* " in rows[job2], rows


def test_agent_write_refuses_paths_outside_the_target(agent: AgentProc, tmp_path: Path) -> None:
    target = tmp_path / "t"
    for rel in ("../escape", "/etc/x", "a/../../escape", "a//b", ""):
        reply = agent.call(
            P.OP_FILES_WRITE, target=str(target), rel=rel, offset=0, b64=P.b64(b"x"), truncate=True
        )
        assert not reply["ok"] and reply["error"]["code"] == P.E_BAD_ARGS, (rel, reply)
    assert not (tmp_path / "escape").exists()
    commit = {"sha256": "0" * 64, "mode": 0o644}
    reply = agent.call(P.OP_FILES_WRITE, target=str(target), rel="f", offset=0, b64=P.b64(b"x"), truncate=True,
                       commit=commit)  # fmt: skip
    assert not reply["ok"] and "sha256" in reply["error"]["message"] and not (target / "f").exists()


def test_sync_of_many_files_into_new_dirs_at_once(home: Home, tmp_path: Path) -> None:
    """Parallel writes create the same new dirs at the same moment on the host: none may fail."""
    src = tmp_path / "many"
    for i in range(400):
        d = src / f"d{i % 20}" / f"e{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(str(i))
    home.write_config('[hosts.here]\ntransport = "local"\n')
    target = tmp_path / "tgt"
    res = home.cli("sync", "here", str(src), "--to", str(target), check=True)
    assert "400 of 400 files sent" in res.stderr
    assert files_under(target) == files_under(src)


def _tree(root: Path, files: int, size: int) -> Path:
    for i in range(files):
        d = root / f"d{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(os.urandom(size))
    return root


def test_sync_through_a_link_reset_ends_identical(ssh_home: SshHome, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", 40, 512 * 1024)
    target = tmp_path / "host" / "tgt"
    proxy = FaultProxy(ssh_home.sshd.port).start()
    with ssh_home.known_hosts.open("a") as f:
        f.write(ssh_home.sshd.host_key_line(f"[127.0.0.1]:{proxy.port}"))
    resets: list[int] = []

    def progress(what: str, done: int, total: int) -> None:
        if not resets and done > total // 3:
            resets.append(done)
            proxy.reset()  # every open connection gets an RST, mid-stream

    async def main() -> SyncResult:
        cfg = HostConfig(name="box", **ssh_home.host_settings(port=proxy.port))
        session = HostSession("box", SSHTransport(cfg))
        await session.start()
        try:
            return await sync(
                session, str(src), str(target), cache_dir=tmp_path / "cache", on_progress=progress
            )
        finally:
            await session.close()

    try:
        res = asyncio.run(main())
    finally:
        proxy.stop()
    assert resets and proxy.accepted >= 2 and res.sent == 40 and not res.notes
    assert files_under(target) == files_under(src)
    assert all((target / rel).read_bytes() == (src / rel).read_bytes() for rel in files_under(src))


class _NoStreams(LocalTransport):
    async def open_agent_stream(self, args: list[str]) -> AgentChannel:
        raise NotImplementedError


def test_sync_without_a_raw_stream_uses_chunked_writes(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", 12, 300 * 1024)
    (src / "empty").write_bytes(b"")
    target = tmp_path / "tgt"
    state = tmp_path / "state"

    async def main() -> SyncResult:
        session = HostSession("here", _NoStreams(str(state), tmp_path / "cache"))
        await session.start()
        try:
            return await sync(session, str(src), str(target), cache_dir=tmp_path / "hcache")
        finally:
            await session.close()

    try:
        res = asyncio.run(main())
    finally:
        stop_host(state)
    assert res.sent == 13 and files_under(target) == files_under(src)
    assert all((target / rel).read_bytes() == (src / rel).read_bytes() for rel in files_under(src))

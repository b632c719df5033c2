"""gputui sync and run --sync over the real sshd: what goes, only changes travel, no write escapes the target."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, Home, SshHome, stop_host
from faultproxy import FaultProxy

from gputui.core.config.file import HostConfig
from gputui.core.files.sync import LocalFile, SyncResult, sync, tree_hash
from gputui.core.session.host import HostSession
from gputui.core.transport.base import AgentChannel, LocalTransport
from gputui.core.transport.ssh import SSHTransport
from remote_agent import protocol as P
from remote_agent.files import sync as agent_sync


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
    there = [LocalFile(rel, "", 0, 0, os.stat(target / rel).st_mode & 0o777,
                       hashlib.sha256((target / rel).read_bytes()).hexdigest()) for rel in files_under(target)]
    assert record["code"]["tree_sha256"] == tree_hash(there)  # the tree on the host, as it arrived
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
                       commit=commit, part="0" * 32)
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


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_sync_never_writes_or_deletes_through_a_target_replaced_by_a_symlink(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    """Between two syncs the target dir, or a dir above it, becomes a symlink (a user's own ``ln -s``): the
    next sync, with --delete too, refuses and leaves the link's destination as it was."""
    repo = make_repo(tmp_path)
    target = tmp_path / "host" / "sub" / "proj"
    ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    data = tmp_path / "data"  # the user's own files, which the link leads to
    (data / "proj" / "pkg").mkdir(parents=True)
    for rel in ("train.py", "notes.md", "pkg/conf.txt", "precious.bin"):
        (data / "proj" / rel).write_text(f"the user's {rel}\n")
    before = _snapshot(data)
    (repo / "train.py").write_text("print('new')\n")
    os.unlink(repo / "notes.md")  # with --delete: notes.md would go

    os.rename(target, tmp_path / "proj-old")  # the target itself is a link now
    os.symlink(data / "proj", target)
    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target), "--delete")
    assert res.returncode == 1 and "symlink" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert _snapshot(data) == before

    os.unlink(target)  # a dir above the target is a link now
    os.rename(tmp_path / "host" / "sub", tmp_path / "sub-old")
    os.symlink(data, tmp_path / "host" / "sub")
    res = ssh_home.cli("sync", "box", str(repo), "--to", str(target), "--delete")
    assert res.returncode == 1 and "symlink" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert _snapshot(data) == before


def test_sync_part_files_never_clobber_a_users_file(ssh_home: SshHome, tmp_path: Path) -> None:
    """A user's file on the host named like gputui's old part files (``.NAME.gputui-part``) stays as it is."""
    repo = make_repo(tmp_path)
    target = tmp_path / "host" / "proj"
    (target / "pkg").mkdir(parents=True)
    mine = {".train.py.gputui-part": b"mine 1", "pkg/.conf.txt.gputui-part": b"mine 2"}
    for rel, body in mine.items():
        (target / rel).write_bytes(body)
    ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    assert {rel: (target / rel).read_bytes() for rel in mine} == mine
    assert (target / "train.py").read_text().startswith("print(")
    left = {p.name for p in target.rglob("*gputui-part")}
    assert left == {".train.py.gputui-part", ".conf.txt.gputui-part"}  # no part file of sync's own left


def test_one_sync_into_a_target_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's receive holds the target's lock (keyed by its real path): while another sync holds it, a
    second one waits its bound, then refuses with a clear error, and writes nothing."""
    state, target = tmp_path / "state", tmp_path / "tgt"
    os.symlink(tmp_path, tmp_path / "alias")  # another name of the same dir: the same lock
    monkeypatch.setattr(agent_sync, "LOCK_WAIT_S", 0.3)
    data = b"hello"
    head = {"rel": "f.txt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mode": 0o644}
    stream = json.dumps(head).encode() + b"\n" + data
    with agent_sync.TargetLock(str(state), str(tmp_path / "alias" / "tgt")):
        out = io.BytesIO()
        assert agent_sync.receive(str(state), str(target), io.BytesIO(stream), out) == 2
    fatal = json.loads(out.getvalue())["fatal"]
    assert fatal.startswith(f"another sync into {target} is under way") and not target.exists(), fatal
    out = io.BytesIO()  # the lock is free again: the same stream goes through
    assert agent_sync.receive(str(state), str(target), io.BytesIO(stream), out) == 0
    assert json.loads(out.getvalue())["ok"] and (target / "f.txt").read_bytes() == data


def test_two_clients_syncing_one_target_at_once_never_mix_versions(home: Home, tmp_path: Path) -> None:
    """Two laptops sync different versions of the same files into one target at the same moment: each file
    ends as one whole version (never half of each), both syncs succeed, and the manifest matches the disk."""
    home.write_config('[hosts.here]\ntransport = "local"\n')
    srcs = []
    for name in ("a", "b"):
        src = tmp_path / name
        for i in range(16):
            (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
            (src / f"d{i % 4}" / f"f{i}.bin").write_bytes(name.encode() * (256 * 1024))
        srcs.append(src)
    target = tmp_path / "tgt"
    cmds = [[sys.executable, "-m", "gputui", "sync", "here", str(src), "--to", str(target)] for src in srcs]
    procs = [subprocess.Popen(c, env=home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in cmds]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for rel in files_under(srcs[0]):
        body = (target / rel).read_bytes()
        assert body in ((srcs[0] / rel).read_bytes(), (srcs[1] / rel).read_bytes()), rel
    assert not list(target.rglob("*gputui-part"))
    # What the host's manifest holds is what is on its disk: a sync of "a" sends exactly the files not "a".
    not_a = sum((target / rel).read_bytes() != (srcs[0] / rel).read_bytes() for rel in files_under(srcs[0]))
    res = home.cli("sync", "here", str(srcs[0]), "--to", str(target), check=True)
    assert f"{not_a} of 16 files sent" in res.stderr, res.stderr


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (as root; skipped elsewhere): a disk that fills up."""
    where = tmp_path / "full"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_sync_into_a_full_host_disk_says_no_space(home: Home, tmp_path: Path, full_disk: Path) -> None:
    home.write_config('[hosts.here]\ntransport = "local"\n')
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (src / "small.txt").write_text("fits")
    res = home.cli("sync", "here", str(src), "--to", str(full_disk / "t"))
    assert res.returncode == 1 and "no space left on device" in res.stderr, res.stderr
    assert "sha256" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert (full_disk / "t" / "small.txt").read_text() == "fits"
    assert sorted(p.name for p in (full_disk / "t").iterdir()) == ["small.txt"]  # no part file left


def test_run_sync_with_a_file_refused_on_the_host_does_not_start(ssh_home: SshHome, tmp_path: Path) -> None:
    """A sync that did not fully arrive (pkg is a symlink on the host) must not start the job on the old code."""
    repo = make_repo(tmp_path)
    target = tmp_path / "host" / "run"
    ssh_home.cli("sync", "box", str(repo), "--to", str(target), check=True)
    os.rename(target / "pkg", tmp_path / "pkg-old")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", target / "pkg")
    (repo / "pkg" / "conf.txt").write_text("lr=0.9\n")
    res = ssh_home.cli("run", "box", "--sync", str(repo), "--cwd", str(target), "--", "python3", "train.py")
    assert res.returncode == 1 and "job not started" in res.stderr and "pkg is a symlink" in res.stderr, res.stderr
    assert res.stdout == "" and json.loads(ssh_home.cli("history", "box", "--json", check=True).stdout) == []
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_sync_in_the_middle_of_another_never_writes_its_part_file(tmp_path: Path) -> None:
    """Chunked writes (no raw stream): sync A has sent half of each file when sync B, another client, sends
    its version of the same files whole. Each sender writes only its own part files: both succeed, every file
    is one whole version (A's, which committed last), none is a mix and none is lost."""
    a, b = tmp_path / "a", tmp_path / "b"
    for src, byte in ((a, b"a"), (b, b"b")):
        src.mkdir()
        for i in range(3):
            (src / f"f{i}.bin").write_bytes(byte * (P.FILE_CHUNK_BYTES + 1000))  # two chunks each
    target, state = tmp_path / "tgt", tmp_path / "state"

    async def one(src: Path, on_progress: Any = None) -> SyncResult:
        session = HostSession("here", _NoStreams(str(state), tmp_path / "cache"))
        await session.start()
        try:
            return await sync(session, str(src), str(target), cache_dir=tmp_path / src.name, on_progress=on_progress)
        finally:
            await session.close()

    other: list[SyncResult] = []

    def progress(what: str, done: int, total: int) -> None:
        if not other and done >= P.FILE_CHUNK_BYTES:  # A is inside its first file: B runs now, whole
            runner = threading.Thread(target=lambda: other.append(asyncio.run(one(b))))
            runner.start()
            runner.join()  # A's loop waits meanwhile: its part files stand half written

    try:
        first = asyncio.run(one(a, progress))
    finally:
        stop_host(state)
    assert other and other[0].sent == 3 and not other[0].notes, other
    assert first.sent == 3 and not first.notes and not first.missing, first
    assert all((target / f"f{i}.bin").read_bytes() == (a / f"f{i}.bin").read_bytes() for i in range(3))
    assert sorted(p.name for p in target.iterdir()) == ["f0.bin", "f1.bin", "f2.bin"]

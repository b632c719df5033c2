"""An unchanged resync of many files is cheap and still exact: the host answers ``same`` (after statting its
files) instead of every manifest entry, the CLI walks the local tree while the host connects, the walk skips
ignored dirs and bounds the files it keeps, and the hash cache is keyed on the inode too."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stop_host
from test_carry_sync_batches import stream_of

from gputui.cli.files import cmd_sync
from gputui.core.files import sync as client_sync
from gputui.core.session.host import HostSession
from gputui.core.transport.base import LocalTransport
from remote_agent import protocol as P
from remote_agent.files import sync as agent_sync


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Recording(HostSession):
    """A session on the local agent that keeps every manifest reply."""

    def __init__(self, root: Path) -> None:
        super().__init__("here", LocalTransport(str(root / "state"), root / "cache"))
        self.replies: list[Any] = []

    async def request(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        reply = await super().request(op, timeout=timeout, **args)
        if op == P.OP_FILES_MANIFEST:
            self.replies.append(reply)
        return reply


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[Path]:
    yield tmp_path
    stop_host(tmp_path / "state")


def make_tree(src: Path, n: int) -> None:
    for i in range(n):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i}.py").write_bytes(os.urandom(100))


async def test_an_unchanged_resync_is_answered_same_and_a_host_side_edit_is_still_seen(root: Path) -> None:
    """Nothing changed: the host answers ``same`` with no entries, and the tree hash is the first sync's. A
    file a user changed on the host since: the host's stat finds it, the answer is the entries, and that
    one file is sent again."""
    src, target = root / "src", root / "tgt"
    make_tree(src, 30)
    session = Recording(root)
    await session.start()
    try:
        first = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        session.replies.clear()
        again = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        assert [(r.get("same"), r["entries"]) for r in session.replies] == [(True, [])]
        assert (again.sent, again.missing, again.tree_sha256) == (0, [], first.tree_sha256)
        (target / "d1" / "f1.py").write_bytes(b"edited on the host")
        session.replies.clear()
        third = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        assert not session.replies[0].get("same") and len(session.replies[0]["entries"]) == 29
        assert (third.sent, third.missing, third.tree_sha256) == (1, [], first.tree_sha256)
        assert (target / "d1" / "f1.py").read_bytes() == (src / "d1" / "f1.py").read_bytes()
    finally:
        await session.close()


async def test_a_host_with_a_file_the_client_lacks_is_not_same_and_delete_removes_it(root: Path) -> None:
    """The host's manifest holds a file the client no longer has: no ``same``, and --delete removes it."""
    src, target = root / "src", root / "tgt"
    make_tree(src, 6)
    session = Recording(root)
    await session.start()
    try:
        await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        os.unlink(src / "d0" / "f0.py")
        session.replies.clear()
        res = await client_sync.sync(session, str(src), str(target), delete=True, cache_dir=root / "hc")
        assert not session.replies[0].get("same") and res.deleted == 1 and not (target / "d0" / "f0.py").exists()
    finally:
        await session.close()


@pytest.mark.parametrize("expect", [7, "abc", "A" * 64, ["x"]])
def test_a_bad_expect_is_refused(tmp_path: Path, expect: Any) -> None:
    with pytest.raises(ValueError, match="expect must be a sha256"):
        agent_sync.manifest_page(str(tmp_path / "state"), {"target": str(tmp_path / "tgt"), "expect": expect})


def test_same_needs_every_entry_and_no_other(tmp_path: Path) -> None:
    """The host's digest is the client's tree hash of exactly its entries: one file more or less on either
    side, or another mode, is not ``same``; a journal line cut by a crash is skipped, the rest still read."""
    state, target = tmp_path / "state", tmp_path / "tgt"
    files = {"a.py": b"a", "sub/b.py": b"b"}
    assert agent_sync.receive(str(state), str(target), io.BufferedReader(io.BytesIO(stream_of(files))), io.BytesIO()) == 0
    mine = [client_sync.LocalFile(rel, "", 1, 0, 0o640, sha(data)) for rel, data in files.items()]

    def same(local: list[client_sync.LocalFile]) -> bool:
        page = agent_sync.manifest_page(str(state), {"target": str(target), "expect": client_sync.tree_hash(local)})
        return page.get("same") is True

    assert same(mine)
    assert not same(mine[:1]) and not same([*mine, mine[0]._replace(rel="c.py")])
    assert not same([mine[0]._replace(mode=0o600), mine[1]])
    with open(agent_sync._manifest_path(str(state), str(target)), "ab") as journal:
        journal.write(b'{"rel": "cut')  # a crash mid-line
    assert same(mine)


async def test_the_cli_walks_the_local_tree_while_the_host_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gputui sync`` begins the walk before the connect is done (the connect here waits until it began)."""
    src, state = tmp_path / "src", tmp_path / "state"
    make_tree(src, 3)
    monkeypatch.setenv("GPUTUI_STATE_DIR", str(state))
    began, seen = threading.Event(), []
    real_walk, real_start = client_sync._ignore_patterns, HostSession.start

    def walk(src: str) -> list[str]:  # the walk's first step
        began.set()
        return real_walk(src)

    async def start(self: HostSession) -> None:
        seen.append(await asyncio.to_thread(began.wait, 10))
        await real_start(self)

    monkeypatch.setattr(client_sync, "_ignore_patterns", walk)
    monkeypatch.setattr(HostSession, "start", start)
    args = argparse.Namespace(host="local", src=str(src), to=str(tmp_path / "tgt"), delete=False, config=None)
    try:
        assert await cmd_sync(args) == 0
    finally:
        stop_host(state)
    assert seen == [True] and (tmp_path / "tgt" / "d2" / "f2.py").read_bytes() == (src / "d2" / "f2.py").read_bytes()


def test_ignore_rules() -> None:
    rules = client_sync.IgnoreRules(["*.pyc", "data/", "/build", "docs/*.md", "#x", "/"])
    cases = {
        "a.pyc": True, "pkg/a.pyc": True, "a.py": False,
        "data/x": True, "pkg/data/x": True, "data": False,  # data/: dirs only
        "build": True, "build/x": True, "pkg/build": False,  # /build: anchored
        "docs/a.md": True, "docs/sub/a.md": True, "docs/a.txt": False, "a.md": False,
    }
    assert {rel: rules(rel) for rel in cases} == cases
    assert {rel: client_sync.ignored(rel, ["*.pyc", "data/", "/build", "docs/*.md"]) for rel in cases} == cases


def test_the_walk_skips_ignored_dirs_and_counts_only_the_files_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ignored dir is never read; its files do not count toward MAX_FILES (a big ignored dataset dir
    beside the code no longer cuts the listing short); more files kept than MAX_FILES is an error."""
    src = tmp_path / "src"
    (src / "a_data").mkdir(parents=True)
    for i in range(15):
        (src / "a_data" / f"x{i}").write_bytes(b"x")
    (src / "b").mkdir()
    for i in range(5):
        (src / "b" / f"f{i}.py").write_bytes(b"y")
    (src / ".gputuiignore").write_text("a_data/\n")
    monkeypatch.setattr(client_sync, "MAX_FILES", 10)
    read: list[str] = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": (read.append(os.fspath(path)), real(path))[1])
    rels = [f.rel for f in client_sync.local_files(str(src), [])]
    assert rels == [".gputuiignore", *(f"b/f{i}.py" for i in range(5))]
    assert not any("a_data" in p for p in read)
    for i in range(5, 10):
        (src / "b" / f"f{i}.py").write_bytes(b"y")
    with pytest.raises(client_sync.SyncError, match="more than 10 files"):
        client_sync.local_files(str(src), [])


def test_the_hash_cache_keys_on_the_inode_and_is_written_only_when_it_changed(tmp_path: Path) -> None:
    """A file replaced by another of the same size and mtime (a new inode) is hashed again; a walk with
    nothing changed leaves the cache file as it was."""
    src, cache = tmp_path / "src", tmp_path / "hc.json"
    src.mkdir()
    (src / "a.py").write_bytes(b"old!")

    def hashes() -> list[str]:
        return [f.sha256 for f in client_sync.with_hashes(client_sync.local_files(str(src), []), cache)]

    assert hashes() == [sha(b"old!")]
    written = cache.stat()
    assert hashes() == [sha(b"old!")] and cache.stat().st_ino == written.st_ino
    (src / "new").write_bytes(b"new!")
    os.utime(src / "new", ns=(written.st_mtime_ns, (src / "a.py").stat().st_mtime_ns))
    os.replace(src / "new", src / "a.py")
    assert hashes() == [sha(b"new!")] and list(json.loads(cache.read_text()).values()) == [sha(b"new!")]


async def test_an_unchanged_tree_is_not_hashed_again_until_the_host_differs(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file's stat changed since the last sync: its tree hash comes from the summary of that sync, and
    no file's hash is looked up, unless the host's answer is not ``same`` (then every file is)."""
    src, target = root / "src", root / "tgt"
    make_tree(src, 9)
    calls: list[int] = []
    real = client_sync.with_hashes
    monkeypatch.setattr(client_sync, "with_hashes", lambda files, cache: (calls.append(len(files)), real(files, cache))[1])
    session = Recording(root)
    await session.start()
    try:
        first = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        calls.clear()
        again = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        assert (calls, again.tree_sha256, again.sent) == ([], first.tree_sha256, 0)
        os.unlink(target / "d0" / "f0.py")  # gone on the host: not same, every file's hash wanted
        third = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        assert (calls, third.sent, third.missing, third.tree_sha256) == ([9], 1, [], first.tree_sha256)
        (src / "d1" / "f1.py").write_bytes(b"changed here")
        calls.clear()
        fourth = await client_sync.sync(session, str(src), str(target), cache_dir=root / "hc")
        assert (calls, fourth.sent) == ([9], 1) and fourth.tree_sha256 != first.tree_sha256
    finally:
        await session.close()

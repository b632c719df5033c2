"""Sync of many small files without a round trip, a manifest line or a full manifest read per file: the
host's receive answers and journals in batches, a listing stats each file once, the client asks the
manifest once and opens no stream when nothing changed."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stop_host

from gputui.core.files.sync import sync
from gputui.core.session.host import HostSession
from gputui.core.transport.base import AgentChannel, LocalTransport
from remote_agent import protocol as P
from remote_agent.files import sync as agent_sync


def stream_of(files: dict[str, bytes], end: bool = True) -> bytes:
    """A receive stream carrying ``files`` (header line, bytes), with the end line when ``end``."""
    out = bytearray()
    for rel, data in files.items():
        head = {"rel": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mode": 0o640}
        out += json.dumps(head).encode() + b"\n" + data
    return bytes(out + (b'{"end": true}\n' if end else b""))


class CountingOut(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        return super().write(data)


def test_receive_answers_and_journals_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """600 files: a few writes of acknowledgements and of manifest lines, not one per file; each ack carries
    the host's sha256 and mode of the file, and every file is in the manifest when its ack goes out."""
    monkeypatch.setattr(agent_sync, "ACK_HOLD_S", 1e9)  # batches by count only: the figure below is exact
    journals: list[int] = []
    real_journal = agent_sync._journal
    monkeypatch.setattr(agent_sync, "_journal", lambda s, t, e: (journals.append(len(e)), real_journal(s, t, e)))
    files = {f"d{i % 7}/f{i}.py": os.urandom(i % 50) for i in range(600)}
    state, target, out = tmp_path / "state", tmp_path / "tgt", CountingOut()
    assert agent_sync.receive(str(state), str(target), io.BufferedReader(io.BytesIO(stream_of(files))), out) == 0
    acks = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [a["rel"] for a in acks] == list(files) and all(a["ok"] and a["mode"] == 0o640 for a in acks)
    assert all(a["sha256"] == hashlib.sha256(files[a["rel"]]).hexdigest() for a in acks)
    assert out.writes == 3 and journals == [256, 256, 88]  # 600 = 256 + 256 + 88
    assert {rel: (target / rel).read_bytes() for rel in files} == files
    page = agent_sync.manifest_page(str(state), {"target": str(target)})
    assert len(page["entries"]) == 600 and not list(target.rglob("*gputui-part"))


def test_a_stream_cut_mid_file_still_answers_the_files_before(tmp_path: Path) -> None:
    """The acknowledgements held back are written out however the stream ends: the files before the cut are
    in place and acknowledged (a resumed sync skips them), the cut one is not renamed and leaves no part."""
    files = {"a.txt": b"a" * 10, "b.txt": b"b" * 10}
    cut = stream_of(files, end=False)[:-4]
    state, target, out = tmp_path / "state", tmp_path / "tgt", io.BytesIO()
    assert agent_sync.receive(str(state), str(target), io.BufferedReader(io.BytesIO(cut)), out) == 1
    assert [json.loads(line)["rel"] for line in out.getvalue().splitlines()] == ["a.txt"]
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]


def test_the_pages_of_one_listing_stat_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 25-file manifest in pages of 10: each file statted once for the whole listing (not once a page), and
    a write between two pages makes the next page a fresh listing that holds it."""
    monkeypatch.setattr(agent_sync, "MANIFEST_PAGE", 10)
    state, target = tmp_path / "state", tmp_path / "tgt"
    files = {f"f{i:02}": b"x" for i in range(25)}
    assert agent_sync.receive(str(state), str(target), io.BufferedReader(io.BytesIO(stream_of(files))), io.BytesIO()) == 0
    stats: list[str] = []
    real = agent_sync._unchanged
    monkeypatch.setattr(agent_sync, "_unchanged", lambda d, rel, e: (stats.append(rel), real(d, rel, e))[1])
    rels, after = [], ""
    while True:
        page = agent_sync.manifest_page(str(state), {"target": str(target), "after": after})
        rels += [e["rel"] for e in page["entries"]]
        if not page["more"]:
            break
        after = rels[-1]
    assert rels == sorted(files) and sorted(stats) == sorted(files)
    first = agent_sync.manifest_page(str(state), {"target": str(target)})
    new = {"f09x": b"new"}  # sorts after the first page's last entry
    assert agent_sync.receive(str(state), str(target), io.BufferedReader(io.BytesIO(stream_of(new))), io.BytesIO()) == 0
    stats.clear()
    second = agent_sync.manifest_page(str(state), {"target": str(target), "after": first["entries"][-1]["rel"]})
    assert second["entries"][0]["rel"] == "f09x" and len(stats) == 26


class Counting(HostSession):
    """A session on the local agent that counts its manifest requests and the streams it opens."""

    def __init__(self, root: Path) -> None:
        super().__init__("here", LocalTransport(str(root / "state"), root / "cache"))
        self.manifests, self.streams = 0, 0

    async def request(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        self.manifests += op == P.OP_FILES_MANIFEST
        return await super().request(op, timeout=timeout, **args)

    async def open_stream(self, args: list[str]) -> AgentChannel:
        self.streams += 1
        return await super().open_stream(args)


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[Path]:
    yield tmp_path
    stop_host(tmp_path / "state")


async def test_a_sync_asks_the_manifest_once_and_an_unchanged_one_opens_no_stream(root: Path) -> None:
    """The first sync: one manifest request (the host's entries of what it wrote come with the stream's
    acknowledgements), and the same tree hash the host's manifest gives; nothing changed: no stream."""
    src = root / "src"
    for i in range(30):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i}.py").write_bytes(os.urandom(100))
    session = Counting(root)
    await session.start()
    try:
        first = await sync(session, str(src), str(root / "tgt"), cache_dir=root / "hc")
        assert (session.manifests, session.streams, first.sent, first.missing) == (1, 1, 30, [])
        again = await sync(session, str(src), str(root / "tgt"), cache_dir=root / "hc")
        assert (session.manifests, session.streams, again.sent) == (2, 1, 0)
        assert again.tree_sha256 == first.tree_sha256  # the second one's from the host's own manifest
    finally:
        await session.close()

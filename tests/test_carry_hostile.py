"""A hostile or stalled host cannot crash, hang or forge the output of gputui pull and sync.

The host side is the real agent (local transport) except for the one answer or stream under test, which is
what a hostile host would send instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pty
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Home, stop_host

from gputui.cli.common import CliError
from gputui.cli.release import _artifacts_first
from gputui.core.config import file as cfg
from gputui.core.errors import ExitStatus
from gputui.core.files import artifacts as artifact_files
from gputui.core.files import pull as client_pull
from gputui.core.files import sync as client_sync
from gputui.core.files.pull import PullError, part_path, pull
from gputui.core.files.sync import SyncError, sync
from gputui.core.files.wire import WireError
from gputui.core.session.host import HostSession
from gputui.core.transport.base import AgentChannel, LocalTransport
from gputui.core.transport.link import RequestTimeout
from remote_agent import protocol as P


class Sink:
    """The writing end of a fake stream: takes every byte at once, or none ever (``stalled``)."""

    def __init__(self, stalled: bool = False) -> None:
        self.stalled, self.bytes = stalled, 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)

    async def drain(self) -> None:
        if self.stalled:
            await asyncio.Event().wait()


async def _closed() -> None:
    return None


def fake_stream(data: bytes, writer: Sink | None = None) -> AgentChannel:
    """A stream from the host that brings ``data`` and then nothing more (never an EOF: a stall)."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    return AgentChannel(reader, writer or Sink(), _closed)


class Hostile(LocalTransport):
    """The real local agent, but ``cat`` and ``receive`` streams come from ``streams`` (a function of the
    stream's argv) when it gives one; every stream opened is noted in ``opened``."""

    def __init__(self, root: Path, streams: Any = None) -> None:
        super().__init__(str(root / "state"), root / "cache")
        self.streams, self.opened = streams, list[list[str]]()

    async def open_agent_stream(self, args: list[str]) -> AgentChannel:
        self.opened.append(list(args))
        fake = self.streams(args) if self.streams else None
        return fake if fake is not None else await super().open_agent_stream(args)


class Answering(HostSession):
    """A session whose ``answers[op]`` (a value, or a coroutine function of the timeout) replaces the
    agent's reply to that op."""

    def __init__(self, transport: LocalTransport, answers: dict[str, Any]) -> None:
        super().__init__("evil", transport)
        self.answers, self.asked = answers, list[str]()

    async def request(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
        self.asked.append(op)
        if op not in self.answers:
            return await super().request(op, timeout=timeout, **args)
        answer = self.answers[op]
        return await answer(timeout) if callable(answer) else answer


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[Path]:
    yield tmp_path
    stop_host(tmp_path / "state")


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stalls noticed after 0.3 s, links given up after 2 s (the defaults are a minute or two)."""
    monkeypatch.setattr(client_pull, "STALL_S", 0.3)
    monkeypatch.setattr(client_sync, "STALL_S", 0.3)
    monkeypatch.setattr(client_pull, "RECONNECT_WAIT_S", 2.0)
    yield


def entry(**over: Any) -> dict[str, Any]:
    return {"path": "/x/a.pt", "rel": "a.pt", "size": 3, "mtime": 1.0, "mode": 0o644, **over}


BAD_LISTINGS = {
    "string size": {"files": [entry(size="12")], "missing": []},
    "size not a number": {"files": [entry(size="abc")], "missing": []},
    "float mode": {"files": [entry(mode=420.5)], "missing": []},
    "bool size": {"files": [entry(size=True)], "missing": []},
    "negative size": {"files": [entry(size=-1)], "missing": []},
    "NUL in rel": {"files": [entry(rel="a\x00b")], "missing": []},
    "NUL in path": {"files": [entry(path="/x/\x00")], "missing": []},
    "non-string rel": {"files": [entry(rel=123)], "missing": []},
    "relative path": {"files": [entry(path="x/a.pt")], "missing": []},
    "huge mtime": {"files": [entry(mtime=1e300)], "missing": []},
    "NaN mtime": {"files": [entry(mtime=float("nan"))], "missing": []},
    "string mode": {"files": [entry(mode="rw")], "missing": []},
    "missing keys": {"files": [{"path": "/x/a.pt"}], "missing": []},
    "non-dict entry": {"files": ["a.pt"], "missing": []},
    "files not a list": {"files": "a.pt", "missing": []},
    "missing not a list of str": {"files": [], "missing": [1]},
    "non-dict reply": [entry()],
    "null reply": None,
}


@pytest.mark.parametrize("case", list(BAD_LISTINGS))
async def test_a_bad_file_listing_is_a_clear_error_on_every_path(root: Path, case: str) -> None:
    """pull, the artifact check (``release --pull`` and the app) and ``release --yes --pull`` itself: each a
    protocol error naming the host and the op (the release refused), never a crash, nothing written."""
    said = "evil answered files.list with data that does not follow the protocol"
    session = Answering(Hostile(root), {P.OP_FILES_LIST: BAD_LISTINGS[case]})
    host = cfg.parse('[hosts.evil]\ntransport = "local"\nartifacts = ["/x/a.pt"]\n', root / "c.toml").hosts["evil"]
    await session.start()
    try:
        with pytest.raises(WireError, match=said) as err:
            await pull(session, ["/x/a.pt"], str(root / "dest"))
        assert err.value.status == ExitStatus.FAILED
        found = await artifact_files.check(session, host)
        assert not found.unpulled and len(found.problems) == 1 and said in found.problems[0], found.problems
        args = argparse.Namespace(pull=True, yes=True, to=str(root / "dest"), host="evil")
        with pytest.raises(CliError, match="not released: evil's artifacts could not all be checked"):
            await _artifacts_first(args, session, host, print)
    finally:
        await session.close()
    assert not (root / "dest").exists()


BAD_ANSWERS = {  # op: (answer, what the error names); each pulled (read, hash) or synced (manifest)
    "hash not hex": (P.OP_FILES_HASH, {"sha256": "z" * 64, "size": 3, "mtime": 1.0}, "sha256 of"),
    "hash size a string": (P.OP_FILES_HASH, {"sha256": "0" * 64, "size": "3"}, "size of"),
    "read size a float": (P.OP_FILES_READ, {"offset": 0, "size": 3.0, "mtime": 1.0, "b64": "YWJj"}, "size of"),
    "read mtime NaN": (P.OP_FILES_READ, {"offset": 0, "size": 3, "mtime": float("nan"), "b64": "YWJj"}, "mtime of"),
    "read b64 garbage": (P.OP_FILES_READ, {"offset": 0, "size": 3, "mtime": 1.0, "b64": "\x1b[2J"}, "b64 of"),
    "manifest target a list": (P.OP_FILES_MANIFEST, {"target": [], "entries": [], "more": False}, "target is"),
    "manifest mode a string": (P.OP_FILES_MANIFEST, {"target": "/t", "more": False,
                                                     "entries": [{"rel": "f.txt", "sha256": "0" * 64, "mode": "644"}]},
                               "entries[0].mode"),
}


@pytest.mark.parametrize("case", list(BAD_ANSWERS))
async def test_a_bad_read_hash_or_manifest_answer_is_a_protocol_error_naming_the_field(root: Path, case: str) -> None:
    op, answer, field = BAD_ANSWERS[case]
    src = root / "host"
    src.mkdir()
    (src / "f.txt").write_bytes(b"abc")
    session = Answering(Hostile(root), {op: answer})
    await session.start()
    try:
        with pytest.raises(WireError, match=f"evil answered {op} with data that does not follow the protocol") as err:
            if op == P.OP_FILES_MANIFEST:
                await sync(session, str(src), str(root / "tgt"), cache_dir=root / "hc")
            else:
                await pull(session, [str(src / "f.txt")], str(root / "dest") + "/")
    finally:
        await session.close()
    assert field in str(err.value) and "\x1b" not in str(err.value), err.value
    assert not (root / "dest" / "f.txt").exists()


async def test_a_stalled_cat_is_an_error_naming_host_and_file_and_the_pull_resumes(root: Path, quick: None) -> None:
    """The host's ``cat`` sends 1 MiB, then nothing: an error after STALL_S (not a hang), with the part file
    kept; the next pull asks the host for the rest from that very byte and ends byte-identical."""
    src = root / "host" / "model.pt"
    src.parent.mkdir()
    body = os.urandom(client_pull.STREAM_MIN_BYTES + 2 * 1024 * 1024)
    src.write_bytes(body)
    dest = root / "dest"
    reached = 1024 * 1024
    stalling = Hostile(root, lambda args: fake_stream(body[:reached]) if args[0] == "cat" else None)
    session = HostSession("evil", stalling)
    await session.start()
    try:
        with pytest.raises(PullError) as err:
            await pull(session, [str(src)], str(dest) + "/")
    finally:
        await session.close()
    assert "evil" in str(err.value) and str(src) in str(err.value) and "no bytes for 0.3 s" in str(err.value)
    part = Path(part_path(str(dest / "model.pt")))
    assert part.read_bytes() == body[:reached]  # what came is kept

    honest = Hostile(root)
    session = HostSession("box", honest)
    await session.start()
    try:
        outcomes = await pull(session, [str(src)], str(dest) + "/")
    finally:
        await session.close()
    assert [o.status for o in outcomes] == ["resumed"]
    assert honest.opened == [["cat", str(src), str(reached)]]  # from the byte reached, not from 0
    assert (dest / "model.pt").read_bytes() == body and not part.exists()


async def test_a_host_that_never_answers_a_hash_is_an_error_at_once_naming_the_file(root: Path, quick: None) -> None:
    """A host that keeps the link but never answers files.hash: one request, then an error naming the host and
    the file with the status of a host that answers outside the protocol (1, not 3: the host did answer),
    never retried until the link deadline (it is no link problem)."""
    src = root / "host" / "a.pt"
    src.parent.mkdir()
    src.write_bytes(b"abc")
    (root / "dest").mkdir()
    (root / "dest" / "a.pt").write_bytes(b"abd")  # as big: the hashes are compared

    async def never(timeout: float | None) -> Any:
        await asyncio.sleep(timeout or 0)
        raise RequestTimeout(f"agent did not answer {P.OP_FILES_HASH} within {timeout:g} s")

    session = Answering(Hostile(root), {P.OP_FILES_HASH: never})
    await session.start()
    try:
        with pytest.raises(WireError, match=f"evil did not answer files.hash about {src} within") as err:
            await pull(session, [str(src)], str(root / "dest"))
    finally:
        await session.close()
    assert err.value.status == ExitStatus.FAILED and "outside the protocol" in str(err.value)
    assert session.asked.count(P.OP_FILES_HASH) == 1


BAD_ACKS = {
    "not an object": (b"[1]\n", "not an acknowledgement"),
    "a file not sent": (b'{"rel": "other.txt", "ok": true}\n', "not an acknowledgement"),
    "ok not a bool": (b'{"rel": "f.txt", "ok": "yes"}\n', "not an acknowledgement"),
    "not JSON": (b"\x1b[2J garbage\n", "not an acknowledgement"),
    "fatal": (b'{"fatal": "another sync into /t is under way"}\n', "evil: another sync into /t is under way"),
    "silence": (b"", "evil did not acknowledge the files sent within"),
    "a line without end": (b"x" * (client_sync.MAX_ACK_BYTES + 70000), "a line over 65,536 bytes"),
}


@pytest.mark.parametrize("case", list(BAD_ACKS))
async def test_a_bad_or_missing_sync_ack_is_a_clear_error(root: Path, quick: None, case: str) -> None:
    line, message = BAD_ACKS[case]
    src = root / "src"
    src.mkdir()
    (src / "f.txt").write_text("x")
    session = HostSession("evil", Hostile(root, lambda args: fake_stream(line) if args[0] == "receive" else None))
    await session.start()
    try:
        with pytest.raises(SyncError, match=message.replace("[", r"\[")) as err:
            await sync(session, str(src), str(root / "tgt"), cache_dir=root / "hc")
    finally:
        await session.close()
    assert "\x1b" not in str(err.value)


async def test_a_host_that_takes_no_bytes_is_an_error(root: Path, quick: None) -> None:
    src = root / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(3 * client_sync.STREAM_BLOCK))
    sink = Sink(stalled=True)
    session = HostSession("evil", Hostile(root, lambda args: fake_stream(b"", sink) if args[0] == "receive" else None))
    await session.start()
    try:
        with pytest.raises(SyncError, match="evil took no bytes of f.bin for 0.3 s"):
            await sync(session, str(src), str(root / "tgt"), cache_dir=root / "hc")
    finally:
        await session.close()


def test_a_pulled_file_name_cannot_forge_output_lines(home: Home, tmp_path: Path) -> None:
    """A newline (or ESC) in a host's file name is shown escaped: ``pulled:`` stays one line per file."""
    home.write_config('[hosts.here]\ntransport = "local"\n')
    host = tmp_path / "host"
    host.mkdir()
    (host / "a\npulled: passwd (1 bytes)\x1b[2J").write_bytes(b"data")
    res = home.cli("pull", "here", f"{host}/a*", str(tmp_path / "dest"), check=True)
    assert res.stdout.count("\n") == 1 and "\x1b" not in res.stdout, res.stdout
    assert res.stdout.startswith("pulled: ") and "a\\npulled: passwd (1 bytes)\\x1b[2J" in res.stdout


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


@pytest.mark.parametrize("size", [3 * 1024 * 1024, client_pull.STREAM_MIN_BYTES + 1024 * 1024], ids=["chunks", "stream"])
def test_a_pull_into_a_full_disk_fails_at_once_and_removes_its_part(
    home: Home, tmp_path: Path, full_disk: Path, size: int
) -> None:
    home.write_config('[hosts.here]\ntransport = "local"\n')
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(size))
    res = home.cli("pull", "here", str(src), str(full_disk) + "/")
    assert res.returncode == 1 and f"no space left on device ({full_disk})" in res.stderr, res.stderr
    assert list(full_disk.iterdir()) == []  # no part file left filling the disk


def test_a_pull_that_fails_on_a_terminal_restores_the_cursor_and_draws_no_bar_after_the_error(
    home: Home, tmp_path: Path, full_disk: Path
) -> None:
    """Progress on a terminal hides the cursor while the bar is drawn; a pull that fails (here: a full disk)
    shows it again and ends the bar before the error is printed, so the error is the last thing drawn."""
    home.write_config('[hosts.here]\ntransport = "local"\n')
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024))
    master, slave = pty.openpty()
    try:
        res = subprocess.run([sys.executable, "-m", "gputui", "pull", "here", str(src), str(full_disk) + "/"],
                             env=dict(home.env, COLUMNS="100"), stdout=subprocess.PIPE, stderr=slave,
                             stdin=subprocess.DEVNULL, timeout=60)
        os.close(slave)
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's other side is closed and read
            while chunk := os.read(master, 65536):
                seen += chunk
    finally:
        os.close(master)
    text = seen.decode("utf-8", "replace")
    assert res.returncode == 1 and "no space left on device" in text, text
    assert "\x1b[?25l" in text  # the bar was drawn (and hid the cursor) ...
    assert text.rfind("\x1b[?25h") > text.rfind("\x1b[?25l"), repr(text[-300:])  # ... and the cursor is back
    assert "━" not in text[text.index("no space left on device") :], repr(text[-300:])  # no bar after the error

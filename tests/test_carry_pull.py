"""gputui pull over the real sshd: through an injected link reset, resumed from a .part, never over newer files."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, AgentProc, Home, SshHome, stop_host
from faultproxy import FaultProxy

from gputui.core.config.file import HostConfig
from gputui.core.files.pull import PullError, local_target, part_path, pull
from gputui.core.session.host import HostSession
from gputui.core.transport.base import AgentChannel, LocalTransport
from gputui.core.transport.ssh import SSHTransport
from remote_agent import protocol as P
from remote_agent.files import pull as agent_pull


@pytest.fixture
def proxy(proxy: FaultProxy, ssh_home: SshHome) -> FaultProxy:
    """conftest's fault proxy, with the config's host ``box`` going through it."""
    ssh_home.configure(port=proxy.port)
    return proxy


def test_pull_through_a_reset_ends_byte_identical(
    ssh_home: SshHome, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "host" / "ckpt"
    src.mkdir(parents=True)
    big = os.urandom(24 * 1024 * 1024 + 123)  # a raw stream on a channel of its own
    mid = os.urandom(5 * 1024 * 1024 + 5)  # base64 chunks on the agent channel
    (src / "model.pt").write_bytes(big)
    (src / "opt.pt").write_bytes(mid)
    (src / "small.pt").write_bytes(b"tiny")
    dest = tmp_path / "here"
    resets: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        if name != "small.pt" and name not in resets and done > total // 4:
            resets[name] = done
            proxy.reset()  # every open connection gets an RST, mid-transfer

    opened: list[list[str]] = []  # every raw stream asked of the host: cat PATH OFFSET

    class Noting(SSHTransport):
        async def open_agent_stream(self, args: list[str]) -> AgentChannel:
            opened.append(list(args))
            return await super().open_agent_stream(args)

    async def main() -> list[str]:
        cfg = HostConfig(name="box", **ssh_home.host_settings(port=proxy.port))
        session = HostSession("box", Noting(cfg))
        await session.start()
        try:
            outcomes = await pull(session, [f"{src}/*.pt"], str(dest), on_progress=progress)
        finally:
            await session.close()
        return [o.status for o in outcomes]

    assert asyncio.run(main()) == ["pulled", "pulled", "pulled"]
    assert set(resets) == {"model.pt", "opt.pt"} and proxy.accepted >= 3  # both reset; reconnected each time
    # The stream cut by the reset goes on from the byte it reached, never from 0 again.
    offsets = [int(a[2]) for a in opened if a[:2] == ["cat", str(src / "model.pt")]]
    assert offsets[0] == 0 and len(offsets) >= 2 and all(o >= resets["model.pt"] for o in offsets[1:]), offsets
    assert (dest / "model.pt").read_bytes() == big
    assert (dest / "opt.pt").read_bytes() == mid
    assert (dest / "small.pt").read_bytes() == b"tiny"
    assert sorted(p.name for p in dest.iterdir()) == ["model.pt", "opt.pt", "small.pt"]  # no part file left


def gputui_part(home: Home, target: Path) -> Path:
    """The part file a CLI run in ``home`` pulls ``target`` to (its name is keyed by that home's secret)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home.root))
        return Path(part_path(str(target)))


def test_pull_cli_job_paths_resume_verify_and_newer_local(ssh_home: SshHome, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    data = os.urandom(3 * 1024 * 1024 + 7)
    (work / "ckpt" / "a.pt").write_bytes(data)
    job = ssh_home.cli("run", "box", "--cwd", str(work), "--", "true", check=True).stdout.strip()
    dest = tmp_path / "out"
    dest.mkdir()

    # A part file from an earlier, dropped pull: the transfer continues at its end. A user's own
    # a.pt.part, or even .a.pt.gputui-part, is not ours: left alone.
    part = gputui_part(ssh_home, dest / "a.pt")
    part.write_bytes(data[:1_000_000])
    (dest / "a.pt.part").write_bytes(b"the user's")
    (dest / ".a.pt.gputui-part").write_bytes(b"the user's too")
    res = ssh_home.cli("pull", "box", f"{job}:ckpt/*.pt", str(dest), check=True)
    assert res.stdout.startswith("resumed:"), res.stdout
    assert (dest / "a.pt").read_bytes() == data and not part.exists()
    assert (dest / "a.pt.part").read_bytes() == b"the user's"
    assert (dest / ".a.pt.gputui-part").read_bytes() == b"the user's too"

    # A part file of some other content fails the sha256 check and is fetched again from byte 0.
    os.unlink(dest / "a.pt")
    part.write_bytes(b"x" * 2_000_000)
    res = ssh_home.cli("pull", "box", f"{job}:ckpt/a.pt", str(dest), check=True)
    assert res.stdout.startswith("pulled:"), res.stdout
    assert (dest / "a.pt").read_bytes() == data

    # A part file left over beside a file that is now up to date: removed when the pull is redone.
    part.write_bytes(data[:10])
    res = ssh_home.cli("pull", "box", f"{job}:ckpt/a.pt", str(dest), check=True)
    assert res.stdout.startswith("up to date:") and not part.exists(), res.stdout

    assert ssh_home.cli("pull", "box", f"{job}:ckpt", str(dest), check=True).stdout.startswith("pulled:")
    res = ssh_home.cli("pull", "box", f"{job}:ckpt", str(dest), check=True)
    assert res.stdout.startswith("up to date:"), res.stdout

    # A local file newer than the host's is kept unless --force.
    mine = dest / "ckpt" / "a.pt"
    mine.write_bytes(b"my edits")
    future = time.time() + 3600
    os.utime(mine, (future, future))
    res = ssh_home.cli("pull", "box", f"{job}:ckpt", str(dest))
    assert res.returncode == 1 and "newer" in res.stderr and mine.read_bytes() == b"my edits"
    ssh_home.cli("pull", "box", f"{job}:ckpt", str(dest), "--force", check=True)
    assert mine.read_bytes() == data

    res = ssh_home.cli("pull", "box", f"{job}:ckpt", str(tmp_path / "new"), check=True)  # a dir of one file
    assert (tmp_path / "new" / "ckpt" / "a.pt").read_bytes() == data, res.stdout

    res = ssh_home.cli("pull", "box", f"{job}:ckpt/nothing*.pt", str(dest))
    assert res.returncode == 1 and "no such file" in res.stderr and "Traceback" not in res.stderr
    res = ssh_home.cli("pull", "box", f"{job}:ckpt/", str(mine / "sub"))  # a file where a dir must go
    assert res.returncode == 1 and "pull:" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_pull_refuses_names_that_leave_the_destination(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "dest").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "dest" / "link")
    for rel in ("../x", "/etc/passwd", "a/../../x", "link/x"):
        with pytest.raises(PullError):
            local_target(str(tmp_path / "dest"), rel)
    assert local_target(str(tmp_path / "dest"), "a/b.pt") == str(tmp_path / "dest" / "a" / "b.pt")


def test_agent_file_reads_are_bounded_and_refuse_special_files(agent: AgentProc, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "f.bin").write_bytes(b"a" * (P.FILE_CHUNK_BYTES + 10))
    for path in (tmp_path / "fifo", tmp_path):  # a FIFO would hang a read; a dir is no file
        reply = agent.call(P.OP_FILES_READ, path=str(path), offset=0, timeout=10)
        assert not reply["ok"] and "not a regular file" in reply["error"]["message"]
    reply = agent.call(
        P.OP_FILES_READ, path=str(tmp_path / "f.bin"), offset=0, max_bytes=P.FILE_CHUNK_BYTES + 1
    )
    assert not reply["ok"] and reply["error"]["code"] == P.E_BAD_ARGS
    reply = agent.call(P.OP_FILES_READ, path=str(tmp_path / "f.bin"), offset=P.FILE_CHUNK_BYTES)
    assert reply["ok"] and P.unb64(reply["result"]["b64"]) == b"a" * 10
    listing = agent.call(P.OP_FILES_LIST, base=str(tmp_path), patterns=["*"])["result"]
    assert [f["rel"] for f in listing["files"]] == ["f.bin"]  # the FIFO is not listed


def test_agent_cat_streams_from_an_offset_and_refuses_special_files(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"0123456789")
    os.mkfifo(tmp_path / "fifo")
    agent = [sys.executable, "-m", "remote_agent", "cat"]
    res = subprocess.run([*agent, str(tmp_path / "f.bin"), "4"], capture_output=True, cwd=ROOT, timeout=30)
    assert res.returncode == 0 and res.stdout == b"456789"
    res = subprocess.run([*agent, str(tmp_path / "fifo"), "0"], capture_output=True, cwd=ROOT, timeout=30)
    assert res.returncode == 2 and b"not a regular file" in res.stderr and res.stdout == b""


def test_agent_listing_is_bounded(agent: AgentProc, tmp_path: Path) -> None:
    many = tmp_path / "many"
    many.mkdir()
    for i in range(agent_pull.MAX_LIST_FILES + 1):
        (many / f"f{i}").touch()
    reply = agent.call(P.OP_FILES_LIST, base=str(tmp_path), patterns=["many"])
    assert not reply["ok"] and "narrow the pattern" in reply["error"]["message"]


def test_a_local_file_written_during_the_pull_is_never_overwritten(ssh_home: SshHome, tmp_path: Path) -> None:
    """The newer-here check runs before the transfer; a file saved at the target while the bytes come (an
    editor, another pull) is kept, and the pull says so instead of replacing it."""
    src = tmp_path / "host" / "model.pt"
    src.parent.mkdir(parents=True)
    src.write_bytes(os.urandom(9 * 1024 * 1024))
    dest = tmp_path / "here"
    mine = dest / "model.pt"

    def progress(name: str, done: int, total: int) -> None:
        if not mine.exists():
            mine.write_bytes(b"saved here meanwhile")

    async def main() -> None:
        cfg = HostConfig(name="box", **ssh_home.host_settings())
        session = HostSession("box", SSHTransport(cfg))
        await session.start()
        try:
            with pytest.raises(PullError, match="changed here during the pull"):
                await pull(session, [str(src)], str(dest) + "/", on_progress=progress)
        finally:
            await session.close()

    asyncio.run(main())
    assert mine.read_bytes() == b"saved here meanwhile"


def test_a_second_pull_of_the_same_file_never_writes_the_first_ones_part(tmp_path: Path) -> None:
    """Two pulls of one file to one place at once: the part file is held by the first (flock); the second
    refuses instead of writing into it (half of each would fail the sha256 check, or worse, pass it)."""
    src = tmp_path / "host" / "a.pt"
    src.parent.mkdir()
    src.write_bytes(b"host data")
    dest = tmp_path / "here"
    dest.mkdir()
    part = Path(part_path(str(dest / "a.pt")))
    part.write_bytes(b"host")  # the first pull, mid-file, holds its part

    async def main() -> None:
        session = HostSession("box", LocalTransport(str(tmp_path / "state"), tmp_path / "cache"))
        await session.start()
        try:
            with pytest.raises(PullError, match="another pull of this file is under way here"):
                await pull(session, [str(src)], str(dest) + "/")
        finally:
            await session.close()

    with open(part, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            asyncio.run(main())
        finally:
            stop_host(tmp_path / "state")
    assert part.read_bytes() == b"host" and not (dest / "a.pt").exists()


def test_a_host_file_named_like_a_part_file_is_pulled_beside_its_namesake(home: Home, tmp_path: Path) -> None:
    """The host holds ``a.pt`` and ``.a.pt.gputui-part`` (the old part file name): both arrive whole, neither
    is written into the other's place."""
    home.write_config('[hosts.here]\ntransport = "local"\n')
    host = tmp_path / "host" / "ckpt"
    host.mkdir(parents=True)
    files = {"a.pt": os.urandom(3 * 1024 * 1024), ".a.pt.gputui-part": b"a file of the user's, on the host"}
    for name, body in files.items():
        (host / name).write_bytes(body)
    res = home.cli("pull", "here", str(host), str(tmp_path / "dest"), check=True)
    assert res.stdout.count("pulled:") == 2, res.stdout
    assert {p.name: p.read_bytes() for p in (tmp_path / "dest" / "ckpt").iterdir()} == files


def _pull_in_process(ssh_home: SshHome, session_cls: type[HostSession], src: Path, dest: Path,
                     on_progress: Any = None) -> list[Any]:
    async def main() -> list[Any]:
        session = session_cls("box", SSHTransport(HostConfig(name="box", **ssh_home.host_settings())))
        await session.start()
        try:
            return await pull(session, [str(src)], str(dest) + "/", on_progress=on_progress)
        finally:
            await session.close()

    return asyncio.run(main())


def test_the_host_hashes_while_the_stream_runs_and_a_pull_keeps_the_version_it_got(
    ssh_home: SshHome, tmp_path: Path
) -> None:
    """The host's sha256 is asked for as the transfer starts (its read of the file overlaps the stream's),
    and the part file is hashed as it is written, never read back; a file touched on the host while it was
    read (same bytes, new mtime: the hashes alone match) is fetched again and carries the host's new mtime."""
    src = tmp_path / "host" / "big.bin"
    src.parent.mkdir()
    data = os.urandom(9 * 1024 * 1024 + 11)  # a raw stream
    src.write_bytes(data)
    events: list[str] = []

    class Noting(HostSession):
        async def request(self, op: str, timeout: float | None = 30.0, **args: Any) -> Any:
            events.append(op)
            return await super().request(op, timeout=timeout, **args)

        async def open_stream(self, args: list[str]) -> AgentChannel:
            channel = await super().open_stream(args)
            close = channel.close

            async def closed() -> None:
                events.append("stream closed")
                await close()

            channel.close = closed  # type: ignore[method-assign]
            return channel

    read_back: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gputui.core.files.pull.sha256_file", lambda path: read_back.append(path) or "")
        touched: list[float] = []

        def progress(name: str, done: int, total: int) -> None:
            if not touched:  # same bytes, a new mtime: only the host's stat tells
                touched.append(time.time() + 100)
                os.utime(src, (touched[0], touched[0]))

        outcomes = _pull_in_process(ssh_home, Noting, src, tmp_path / "here", progress)
    got = tmp_path / "here" / "big.bin"
    assert [o.status for o in outcomes] == ["pulled"] and got.read_bytes() == data
    assert got.stat().st_mtime == pytest.approx(touched[0]) and outcomes[0].mtime == pytest.approx(touched[0])
    first_close = events.index("stream closed")
    assert P.OP_FILES_HASH in events[:first_close], events  # asked before the stream ended
    assert read_back == []  # the part file was hashed as it was written

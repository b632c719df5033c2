"""gputui pull: files from a host to here, over the agent channel the session already holds.

Each file goes to ``.NAME.gputui-part`` first, in bounded chunks (a few in flight), and is renamed into place
only after its sha256 matches the host's. A dropped link costs nothing: the session reconnects and the transfer
goes on from the byte it reached; a later ``pull`` continues an old part file the same way, and removes one
left over for a file it finds up to date or newer here. What each pull fetched is noted (``pulled.py``).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from remote_agent import protocol as P

from . import pulled
from .errors import GputuiError
from .link import AgentError, LinkClosed
from .paths import sha256_file
from .session import HostSession

#: Chunk requests in flight at once (hides the link's round trip; bounded memory: DEPTH chunks).
DEPTH = 8
#: How long a transfer waits for the link to come back before giving up.
RECONNECT_WAIT_S = 120.0
#: Files at least this big come as a raw stream on a channel of their own; smaller ones in JSON chunks.
STREAM_MIN_BYTES = 8 * 1024 * 1024
STREAM_READ = 1024 * 1024
_JOB_SPEC = re.compile(r"(\d+):(.+)", re.DOTALL)

Progress = Callable[[str, int, int], None]  # (name, bytes done, bytes total)


class PullError(GputuiError):
    """A pull that cannot go on; the message says which file and why."""


class _Changed(Exception):
    """The file changed on the host while it was read."""


@dataclass(frozen=True)
class Remote:
    path: str  # absolute on the host
    rel: str  # where it goes under the destination
    size: int
    mtime: float
    mode: int


@dataclass(frozen=True)
class Outcome:
    rel: str
    target: str
    status: str  # "pulled", "resumed", "up to date", "newer here"
    size: int
    path: str = ""  # on the host
    mtime: float = 0.0  # the host's, of the version pulled


def split_spec(spec: str) -> tuple[str | None, str]:
    """``JOB:PATH`` -> (job, path); a plain path -> (None, path)."""
    m = _JOB_SPEC.fullmatch(spec)
    return (m.group(1), m.group(2)) if m else (None, spec)


async def request_retrying(session: HostSession, op: str, **args: Any) -> Any:
    """One request, retried across link drops until the session reconnects (LinkClosed after
    RECONNECT_WAIT_S without a link). For idempotent requests only."""
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while True:
        try:
            return await session.request(op, timeout=60.0, **args)
        except (LinkClosed, asyncio.TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise LinkClosed(
                    f"link to {session.name} lost and not back within {RECONNECT_WAIT_S:g} s: {exc}"
                ) from None
            await asyncio.sleep(0.2)


async def list_remote(session: HostSession, specs: list[str]) -> list[Remote]:
    """The files ``specs`` name on the host; a spec that matches nothing is an error."""
    groups: dict[str | None, list[str]] = collections.defaultdict(list)
    for spec in specs:
        job, path = split_spec(spec)
        groups[job].append(path)
    files: list[Remote] = []
    for job, patterns in groups.items():
        base = "~"
        if job is not None:
            base = (await request_retrying(session, P.OP_JOBS_GET, job=job)).get("cwd") or "~"
        res = await request_retrying(session, P.OP_FILES_LIST, base=base, patterns=patterns)
        if res.get("missing"):
            where = f"job {job}'s dir {res['base']}" if job else res["base"]
            raise PullError(
                f"no such file on {session.name} (relative to {where}): {', '.join(res['missing'])}"
            )
        files += [
            Remote(f["path"], f["rel"], int(f["size"]), float(f["mtime"]), int(f["mode"]))
            for f in res["files"]
        ]
    return files


def local_target(dest_dir: str, rel: str) -> str:
    """``dest_dir/rel``, refusing a name that climbs out of it or passes through a symlink here."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PullError(f"refusing the host's file name {rel!r}: not a plain relative path")
    path = dest_dir
    for part in parts[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise PullError(f"refusing to write through the symlink {path}")
    target = os.path.join(path, parts[-1])
    if os.path.islink(target):
        raise PullError(f"refusing to overwrite the symlink {target}")
    return target



def part_path(target: str) -> str:
    """Where ``target`` is pulled to before its sha256 is checked: ``.NAME.gputui-part`` beside it (a name
    of gputui's own, never a user's ``NAME.part``)."""
    head, name = os.path.split(target)
    if len(name) > 200:
        name = name[:160] + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(head, f".{name}.gputui-part")


def _drop_part(part: str) -> None:
    """Remove a part file left by an earlier pull of a file now up to date (ours: never a symlink followed)."""
    if os.path.isfile(part) and not os.path.islink(part):
        os.unlink(part)


async def _download(session: HostSession, f: Remote, part: str, on_progress: Progress | None) -> int:
    """Bring ``part`` up to ``f.size`` bytes from where it stops; returns the offset it resumed at."""
    start = os.path.getsize(part) if os.path.exists(part) else 0
    if start > f.size:
        start = 0
    with open(part, "r+b" if os.path.exists(part) else "wb") as out:
        out.truncate(start)
        out.seek(start)
        if f.size - start >= STREAM_MIN_BYTES:
            await _stream(session, f, out, start, on_progress)
        else:
            await _chunks(session, f, out, start, on_progress)
    return start


async def _stream(
    session: HostSession, f: Remote, out: BinaryIO, offset: int, on_progress: Progress | None
) -> None:
    """Raw bytes from the agent build's ``cat`` on a channel of its own (no JSON, no base64); a stream cut
    by a dropped link is opened again at the byte reached once the session is back."""
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while offset < f.size:
        reached, why = offset, "the stream ended early"
        try:
            await session.wait_connected(max(0.1, deadline - time.monotonic()))
            channel = await session.open_stream(["cat", f.path, str(offset)])
            try:
                while offset < f.size and (data := await channel.reader.read(STREAM_READ)):
                    data = data[: f.size - offset]
                    out.write(data)
                    offset += len(data)
                    if on_progress is not None:
                        on_progress(f.rel, offset, f.size)
            finally:
                await channel.close()
        except Exception as exc:  # link lost (OSError, asyncssh errors), reconnect timeout: retried below
            why = str(exc) or type(exc).__name__
        if offset > reached:
            deadline = time.monotonic() + RECONNECT_WAIT_S
            continue
        if time.monotonic() > deadline:
            raise PullError(f"{f.path} on {session.name}: {why}")
        await asyncio.sleep(0.2)
        try:  # no byte came: is the file still there, readable, and as big? (else not a link problem)
            res = await request_retrying(session, P.OP_FILES_READ, path=f.path, offset=offset, max_bytes=0)
        except AgentError as exc:
            raise PullError(f"{f.path} on {session.name}: {exc}") from None
        if int(res["size"]) != f.size:
            raise _Changed()
    out.flush()


async def _chunks(
    session: HostSession, f: Remote, out: BinaryIO, offset: int, on_progress: Progress | None
) -> None:
    """Small files: base64 chunks on the agent channel, a few in flight (no process to start on the host)."""
    pending: collections.deque[tuple[int, asyncio.Task[Any]]] = collections.deque()
    next_off = offset
    try:
        while offset < f.size:
            while len(pending) < DEPTH and next_off < f.size:
                args = {"path": f.path, "offset": next_off, "max_bytes": P.FILE_CHUNK_BYTES}
                pending.append(
                    (next_off, asyncio.ensure_future(request_retrying(session, P.OP_FILES_READ, **args)))
                )
                next_off += P.FILE_CHUNK_BYTES
            at, task = pending.popleft()
            res = await task
            data = P.unb64(res["b64"])
            if int(res["size"]) != f.size or len(data) != min(P.FILE_CHUNK_BYTES, f.size - at):
                raise _Changed()
            out.write(data)
            offset += len(data)
            if on_progress is not None:
                on_progress(f.rel, offset, f.size)
    finally:
        for _, task in pending:
            task.cancel()
        out.flush()


async def _same(session: HostSession, f: Remote, local: str) -> bool:
    """Whether the local file holds exactly the host's file (sha256 on both sides; the host's is as big)."""
    remote = await request_retrying(session, P.OP_FILES_HASH, path=f.path)
    return bool(remote["size"] == f.size and await asyncio.to_thread(sha256_file, local) == remote["sha256"])


async def pull_file(
    session: HostSession, f: Remote, target: str, force: bool = False, on_progress: Progress | None = None
) -> Outcome:
    """One file to ``target`` (resuming its part file); checked by sha256 before it takes the name."""
    part = part_path(target)
    if os.path.exists(target):
        st = os.stat(target)
        if st.st_size == f.size and await _same(session, f, target):
            _drop_part(part)
            return Outcome(f.rel, target, "up to date", f.size, f.path, f.mtime)
        if st.st_mtime > f.mtime and not force:
            _drop_part(part)
            return Outcome(f.rel, target, "newer here", st.st_size, f.path, f.mtime)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    if os.path.islink(part):
        raise PullError(f"refusing to write through the symlink {part}")
    seen = _local_version(target)  # what the checks above judged: replaced only if still that
    for attempt in range(3):
        try:
            resumed = await _download(session, f, part, on_progress)
        except _Changed:
            resumed = -1
        if resumed >= 0 and await _same(session, f, part):
            os.chmod(part, f.mode & 0o777)
            os.utime(part, (f.mtime, f.mtime))
            if _local_version(target) != seen:
                raise PullError(f"{target} changed here during the pull: kept as it is (pull again to decide)")
            os.replace(part, target)
            return Outcome(f.rel, target, "resumed" if resumed else "pulled", f.size, f.path, f.mtime)
        # The file changed on the host (or the old .part was of another version): start over, fresh.
        os.unlink(part)
        if attempt < 2:
            f = await _restat(session, f)
    raise PullError(f"{f.path} keeps changing on {session.name} while it is read; try again when it is still")


def _local_version(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a local file, None when there is none: tells whether it changed."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


async def _restat(session: HostSession, f: Remote) -> Remote:
    res = await request_retrying(session, P.OP_FILES_LIST, base="/", patterns=[f.path])
    new = res["files"][0] if res.get("files") else None
    if new is None:
        raise PullError(f"{f.path} vanished from {session.name} during the pull")
    return Remote(f.path, f.rel, int(new["size"]), float(new["mtime"]), int(new["mode"]))


def plan_targets(files: list[Remote], specs: list[str], dest: str | None) -> list[tuple[Remote, str]]:
    """Where each file goes: into DEST (a directory) under its name, or to DEST itself when one plain file
    is pulled and DEST is not a directory."""
    dest = dest or "."
    single = len(files) == 1 and len(specs) == 1 and "/" not in files[0].rel  # one file named, not a dir's
    single = single and not any(c in specs[0] for c in "*?[")
    if single and not os.path.isdir(dest) and not dest.endswith("/"):
        if os.path.islink(dest):
            raise PullError(f"refusing to overwrite the symlink {dest}")
        return [(files[0], dest)]
    return [(f, local_target(dest, f.rel)) for f in files]


async def pull(
    session: HostSession,
    specs: list[str],
    dest: str | None = None,
    force: bool = False,
    on_progress: Progress | None = None,
) -> list[Outcome]:
    """Pull every file ``specs`` name (``[JOB:]PATH``, globs allowed) into ``dest``; the session reconnects
    by itself while this runs."""
    session.run_in_background()
    files = await list_remote(session, specs)
    return await pull_planned(session, plan_targets(files, specs, dest), force, on_progress)


async def pull_planned(
    session: HostSession, plan: list[tuple[Remote, str]], force: bool = False, on_progress: Progress | None = None
) -> list[Outcome]:
    """Each (host file, local target) in turn; what arrived is noted in the host's pull record, even when a
    later file fails. Two host files bound for one local name are refused before anything is pulled: the
    second would replace the first here while the record called both fetched."""
    taken: dict[str, Remote] = {}
    for f, target in plan:
        other = taken.setdefault(os.path.normpath(target), f)
        if other is not f:
            raise PullError(f"{other.path} and {f.path} on the host would both be pulled to {target}: "
                            "pull them one at a time, each to its own place")  # fmt: skip
    done: list[Outcome] = []
    try:
        for f, target in plan:
            done.append(await pull_file(session, f, target, force, on_progress))
    finally:
        held = [o for o in done if o.status != "newer here"]
        pulled.note(session.name, [(o.path, o.size, o.mtime, os.path.abspath(o.target)) for o in held])
    return done

"""gputui pull: files from a host to here, over the agent channel the session already holds.

Each file goes to a part file beside it first (``.NAME.TAG.gputui-part``, TAG derived from a secret key of
this machine's state dir and the target's path: no user file has that name, no host can make one up), in
bounded chunks (a few in flight), and is renamed into place only after its sha256 matches the host's. A dropped
link costs nothing: the session reconnects and the transfer goes on from the byte it reached; a later ``pull``
continues an old part file the same way, and removes one left over for a file it finds up to date or newer
here. What each pull fetched is noted (``pulled.py``).

Every answer of the host is parsed by ``fileswire`` before it is used, and every wait on it is bounded: a
stream that brings no byte for ``STALL_S``, or a request the host leaves unanswered while its link lives, is
an error naming the host and the file (the part file stays, so the next pull resumes). A full local disk ends
the pull at once and removes the part file.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from gputui.core import paths, safetext
from gputui.core.errors import GputuiError
from gputui.core.files import pulled, wire
from gputui.core.files.wire import Remote, WireError
from gputui.core.paths import sha256_file
from gputui.core.session.host import HostSession
from gputui.core.transport.link import AgentError, LinkClosed, RequestTimeout
from remote_agent import protocol as P

#: Chunk requests in flight at once (hides the link's round trip; bounded memory: DEPTH chunks).
DEPTH = 8
#: How long a transfer waits for the link to come back before giving up.
RECONNECT_WAIT_S = 120.0
#: Files at least this big come as a raw stream on a channel of their own; smaller ones in JSON chunks.
STREAM_MIN_BYTES = 8 * 1024 * 1024
STREAM_READ = 1024 * 1024
#: How long a transfer waits for the host's next byte (or answer) before it is an error.
STALL_S = 60.0
#: Hashing speed a host is granted at least (a files.hash or sync commit of N bytes waits STALL_S + N/rate).
HASH_MIN_RATE = 50 * 1024 * 1024
_JOB_SPEC = re.compile(r"(\d+):(.+)", re.DOTALL)

Progress = Callable[[str, int, int], None]  # (name, bytes done, bytes total)


class PullError(GputuiError):
    """A pull that cannot go on; the message says which file and why."""


class _Changed(Exception):
    """The file changed on the host while it was read."""


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


def hash_timeout(size: int) -> float:
    """How long the host may take to hash (or receive and hash) ``size`` bytes before it is an error."""
    return STALL_S + size / HASH_MIN_RATE


async def request_retrying(
    session: HostSession, op: str, *, timeout: float = STALL_S, about: str = "", **args: Any
) -> Any:
    """One request, retried across link drops until the session reconnects (LinkClosed after
    RECONNECT_WAIT_S without a link). For idempotent requests only. A host that keeps the link but does not
    answer within ``timeout`` answers outside the protocol: a WireError at once naming the host, the op and
    ``about`` (the file asked about), not retried."""
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while True:
        try:
            return await session.request(op, timeout=timeout, **args)
        except RequestTimeout as exc:
            if not session.link or session.link.closed.is_set():  # the link went: retry as below
                await asyncio.sleep(0.2)
                continue
            of = f" about {safetext.clean(about, limit=200)}" if about else ""
            raise WireError(f"{session.name} did not answer {op}{of} within {timeout:g} s, its link up all the "
                            "while (a host that answers outside the protocol)") from exc
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
            cwd = (await session.get_job(job)).cwd
            if cwd is not None and not isinstance(cwd, str):
                raise wire.wire_error(session.name, "its job record", f"job {job}'s cwd is {cwd!r:.80}")
            base = cwd or "~"
        about = ", ".join(patterns)
        res = await request_retrying(session, P.OP_FILES_LIST, base=base, patterns=patterns, about=about)
        listed = wire.listing(session.name, res)
        if listed.missing:
            where = f"job {job}'s dir {listed.base}" if job else listed.base
            raise PullError(
                f"no such file on {session.name} (relative to {safetext.clean(where)}): "
                + ", ".join(safetext.clean(m, limit=200) for m in listed.missing[:20])
            )
        files += listed.files
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



def _part_key() -> bytes:
    """This machine's secret for part file names (made once, 0600, in the state dir); a fresh one per run
    when it cannot be kept (parts are then not resumed by a later pull)."""
    path = paths.state_dir() / "part-key"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    except FileExistsError:
        pass
    except OSError:
        return secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            key = f.read(64)
    except OSError:
        return secrets.token_bytes(32)
    return key if len(key) >= 16 else secrets.token_bytes(32)


def part_path(target: str) -> str:
    """Where ``target`` is pulled to before its sha256 is checked: ``.NAME.TAG.gputui-part`` beside it, TAG
    keyed by this machine's secret and the target's full path: a name no user file has, so a part file is
    always gputui's own (and a later pull of the same target finds it to resume)."""
    head, name = os.path.split(os.path.abspath(target))
    tag = hmac.new(_part_key(), os.path.join(head, name).encode("utf-8", "surrogateescape"), hashlib.sha256)
    if len(name) > 160:
        name = name[:120] + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(head, f".{name}.{tag.hexdigest()[:20]}.gputui-part")


def _drop_part(part: str) -> None:
    """Remove a part file left by an earlier pull of a file now up to date (ours: never a symlink followed)."""
    if os.path.isfile(part) and not os.path.islink(part):
        os.unlink(part)


def _open_part(part: str, size: int) -> tuple[BinaryIO, int]:
    """The part file, opened to go on at its end (one of ours from an earlier pull, never longer than the
    file), or created afresh (O_EXCL: never a file that is there); never through a symlink."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(part, flags)
        except FileNotFoundError:
            fd = os.open(part, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PullError(f"refusing to write through the symlink {part}") from None
        raise
    out = os.fdopen(fd, "r+b")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        out.close()
        raise PullError(f"refusing to write to {part}: not a regular file")
    try:  # held while this pull writes it: a second pull of the same file here never writes it too
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        out.close()
        raise PullError(f"another pull of this file is under way here (it writes {part})") from None
    start = st.st_size if st.st_size <= size else 0
    out.truncate(start)
    out.seek(start)
    return out, start


def _no_space(exc: OSError, part: str) -> bool:
    """Whether a local write failed for lack of room; if so the part file is removed (it only fills the disk)."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return False
    try:
        os.unlink(part)
    except OSError:
        pass
    return True


async def _download(
    session: HostSession, f: Remote, part: str, on_progress: Progress | None
) -> tuple[int, str]:
    """Bring ``part`` up to ``f.size`` bytes from where it stops; (the offset it resumed at, the part's sha256,
    hashed as its bytes were written: the part file is never read back whole)."""
    out, start = _open_part(part, f.size)
    try:
        with out:
            digest = await asyncio.to_thread(_hash_prefix, out, start)
            if f.size - start >= STREAM_MIN_BYTES:
                await _stream(session, f, out, start, on_progress, digest)
            else:
                await _chunks(session, f, out, start, on_progress, digest)
    except OSError as exc:
        if _no_space(exc, part):
            raise PullError(f"no space left on device ({os.path.dirname(part) or '.'})") from None
        raise
    return start, digest.hexdigest()


def _hash_prefix(out: BinaryIO, start: int, block: int = 1024 * 1024) -> Any:
    """A sha256 of the part file's first ``start`` bytes (what an earlier pull left), the file at ``start``."""
    digest = hashlib.sha256()
    out.seek(0)
    while (done := out.tell()) < start and (data := out.read(min(block, start - done))):
        digest.update(data)
    if out.tell() != start:
        raise _Changed()  # the part file shrank under us: fetch afresh
    return digest


class _LocalWrite(Exception):
    """A write to the local part file failed (its OSError is the cause): never taken for a link problem."""


def _write(out: BinaryIO, data: bytes, digest: Any) -> None:
    try:
        out.write(data)
    except OSError as exc:
        raise _LocalWrite() from exc
    digest.update(data)


async def _stream(
    session: HostSession, f: Remote, out: BinaryIO, offset: int, on_progress: Progress | None, digest: Any
) -> None:
    """Raw bytes from the agent build's ``cat`` on a channel of its own (no JSON, no base64); a stream cut
    by a dropped link is opened again at the byte reached once the session is back."""
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while offset < f.size:
        reached, why = offset, "the stream ended early"
        try:
            await session.wait_connected(max(0.1, deadline - time.monotonic()))
            channel = await _stalling(session, f, offset, session.open_stream(["cat", f.path, str(offset)]))
            try:
                while offset < f.size and (
                    data := await _stalling(session, f, offset, channel.reader.read(STREAM_READ))
                ):
                    data = data[: f.size - offset]
                    _write(out, data, digest)
                    offset += len(data)
                    if on_progress is not None:
                        on_progress(f.rel, offset, f.size)
            finally:
                await channel.close()
        except _LocalWrite as exc:
            assert isinstance(exc.__cause__, OSError)
            raise exc.__cause__ from None
        except (PullError, WireError):
            raise
        except Exception as exc:  # link lost (OSError, asyncssh errors), reconnect timeout: retried below
            why = str(exc) or type(exc).__name__
        if offset > reached:
            deadline = time.monotonic() + RECONNECT_WAIT_S
            continue
        if time.monotonic() > deadline:
            raise PullError(f"{f.path} on {session.name}: {why}")
        await asyncio.sleep(0.2)
        try:  # no byte came: is the file still there, readable, and as big? (else not a link problem)
            res = await request_retrying(
                session, P.OP_FILES_READ, path=f.path, offset=offset, max_bytes=0, about=f.path
            )
        except AgentError as exc:
            raise PullError(f"{f.path} on {session.name}: {exc}") from None
        if wire.chunk(session.name, f.path, res, with_data=False).size != f.size:
            raise _Changed()
    out.flush()


async def _stalling(session: HostSession, f: Remote, offset: int, step: Any) -> Any:
    """``await step``, bounded: a host that sends nothing for STALL_S is a PullError naming it and the file
    (the part file keeps what came: the next pull resumes from there)."""
    try:
        return await asyncio.wait_for(step, STALL_S)
    except asyncio.TimeoutError:
        raise PullError(
            f"{safetext.clean(f.path)} on {session.name}: no bytes for {STALL_S:g} s at byte {offset:,} "
            "(the host stalled); pull again to resume"
        ) from None


async def _chunks(
    session: HostSession, f: Remote, out: BinaryIO, offset: int, on_progress: Progress | None, digest: Any
) -> None:
    """Small files: base64 chunks on the agent channel, a few in flight (no process to start on the host)."""
    pending: collections.deque[tuple[int, asyncio.Task[Any]]] = collections.deque()
    next_off = offset
    try:
        while offset < f.size:
            while len(pending) < DEPTH and next_off < f.size:
                args: dict[str, Any] = {"path": f.path, "offset": next_off, "max_bytes": P.FILE_CHUNK_BYTES,
                                        "about": f.path}
                pending.append(
                    (next_off, asyncio.ensure_future(request_retrying(session, P.OP_FILES_READ, **args)))
                )
                next_off += P.FILE_CHUNK_BYTES
            at, task = pending.popleft()
            got = wire.chunk(session.name, f.path, await task)
            data = got.data
            if got.size != f.size or len(data) != min(P.FILE_CHUNK_BYTES, f.size - at):
                raise _Changed()
            out.write(data)
            digest.update(data)
            offset += len(data)
            if on_progress is not None:
                on_progress(f.rel, offset, f.size)
    finally:
        for _, task in pending:
            task.cancel()
        out.flush()


async def _host_sha256(session: HostSession, f: Remote) -> str:
    """The host's sha256 of ``f`` (it must still be ``f.size`` bytes, else _Changed)."""
    res = await request_retrying(session, P.OP_FILES_HASH, path=f.path, timeout=hash_timeout(f.size), about=f.path)
    theirs = wire.digest(session.name, f.path, res)
    if theirs.size != f.size:
        raise _Changed()
    return theirs.sha256


async def _same(session: HostSession, f: Remote, local: str) -> bool:
    """Whether the local file holds exactly the host's file (sha256 on both sides at once; as big)."""
    try:
        ours, theirs = await asyncio.gather(asyncio.to_thread(sha256_file, local), _host_sha256(session, f))
    except _Changed:
        return False
    return ours == theirs


async def _fetch(
    session: HostSession, f: Remote, part: str, on_progress: Progress | None
) -> tuple[int, bool]:
    """Download ``part`` while the host hashes its file (one read of it on each side, at the same time);
    (the offset it resumed at, whether the part holds the host's file). The hashes alone could both miss a
    write that landed during the transfer: the file must also still have the size and mtime it was listed
    with, else it changed and is fetched again."""
    theirs = asyncio.ensure_future(_host_sha256(session, f))
    theirs.add_done_callback(lambda t: t.cancelled() or t.exception())  # an error unawaited is never logged
    try:
        resumed, ours = await _download(session, f, part, on_progress)
        same = ours == await theirs and await _unchanged(session, f)
    except _Changed:
        return -1, False
    finally:
        theirs.cancel()
    return resumed, same


async def _unchanged(session: HostSession, f: Remote) -> bool:
    """Whether the host's file still has the size and mtime it was listed with."""
    try:
        res = await request_retrying(session, P.OP_FILES_READ, path=f.path, offset=0, max_bytes=0, about=f.path)
    except AgentError as exc:
        raise PullError(f"{f.path} on {session.name}: {exc}") from None
    now = wire.chunk(session.name, f.path, res, with_data=False)
    return now.size == f.size and now.mtime == f.mtime


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
    seen = _local_version(target)  # what the checks above judged: replaced only if still that
    for attempt in range(3):
        resumed, same = await _fetch(session, f, part, on_progress)
        if same:
            os.chmod(part, f.mode & 0o777)
            os.utime(part, (f.mtime, f.mtime))
            if _local_version(target) != seen:
                raise PullError(f"{target} changed here during the pull: kept as it is (pull again to decide)")
            os.replace(part, target)
            return Outcome(f.rel, target, "resumed" if resumed else "pulled", f.size, f.path, f.mtime)
        # The file changed on the host (or the old .part was of another version): start over, fresh.
        _drop_part(part)
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
    res = await request_retrying(session, P.OP_FILES_LIST, base="/", patterns=[f.path], about=f.path)
    listed = wire.listing(session.name, res).files
    if not listed:
        raise PullError(f"{f.path} vanished from {session.name} during the pull")
    new = listed[0]
    return Remote(f.path, f.rel, new.size, new.mtime, new.mode)


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
                            "pull them one at a time, each to its own place")
    done: list[Outcome] = []
    try:
        for f, target in plan:
            done.append(await pull_file(session, f, target, force, on_progress))
    finally:
        held = [o for o in done if o.status != "newer here"]
        pulled.note(session.name, [(o.path, o.size, o.mtime, os.path.abspath(o.target)) for o in held])
    return done

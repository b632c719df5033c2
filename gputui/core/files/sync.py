"""gputui sync: a local tree to a directory on the host, over the agent channel the session already holds.

What goes: in a git repo the tracked and untracked-but-not-ignored files (``git ls-files -co
--exclude-standard``), elsewhere every file; minus ``.gputuiignore`` patterns. Only files whose content or
mode differs from the host's manifest (what an earlier sync wrote there, still unchanged) cross the wire,
as one raw stream to the agent build's ``receive`` (chunked ``files.write`` requests where a transport has
no streams). Each file lands in a part file of a random name, is checked by sha256 on the host and renamed
into place. Symlinks are skipped with a note; the host refuses any path that would leave the target dir, and
one sync into a target at a time (a second waits, then refuses). Every answer of the host is checked against
the protocol and every wait on it is bounded. The tree hash a job's record keeps is the host's: the files
that arrived, as the host's manifest holds them.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from gputui.core import safetext
from gputui.core.errors import GputuiError
from gputui.core.files import wire as fileswire
from gputui.core.files.pull import STALL_S, hash_timeout, request_retrying
from gputui.core.paths import make_dirs, sha256_file
from gputui.core.session.host import HostSession
from gputui.core.transport.link import AgentError
from remote_agent import protocol as P

#: Most files one sync carries; a bigger tree is almost surely a mistake (a dataset, a venv).
MAX_FILES = 200_000
#: Files sent at once (each one's chunks go in order).
PARALLEL = 8
IGNORE_FILE = ".gputuiignore"
STREAM_BLOCK = 256 * 1024
#: Longest acknowledgement line the host's upload stream may send.
MAX_ACK_BYTES = 64 * 1024

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (what, bytes sent, bytes to send)


class SyncError(GputuiError):
    """A sync that cannot start or go on; the message says why."""


class LocalFile(NamedTuple):
    rel: str
    path: str
    size: int
    mtime_ns: int
    mode: int
    sha256: str = ""
    ino: int = 0


@dataclass
class LocalTree:
    """The local side of a sync, made without the host (so it can run while the host connects). ``files``
    lack their sha256 until ``hashed`` when the tree hash came from the last sync's summary (no file's
    path, size, mtime, inode or mode changed since)."""

    files: list[LocalFile]
    notes: list[str]
    git: dict[str, Any] | None
    tree_sha256: str
    cache: Path
    is_hashed: bool = True

    def hashed(self) -> list[LocalFile]:
        """The files with their sha256 (from the hash cache, or hashed now)."""
        if not self.is_hashed:
            self.files, self.is_hashed = with_hashes(self.files, self.cache), True
        return self.files


@dataclass
class SyncResult:
    target: str
    files: int = 0
    sent: int = 0
    bytes_sent: int = 0
    deleted: int = 0
    tree_sha256: str = ""
    missing: list[str] = field(default_factory=list)  # files that did not arrive on the host as sent
    git: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def require_complete(self, host: str) -> None:
        """A SyncError when some file did not arrive on the host: a job must not start on stale code."""
        if self.missing:
            shown = ", ".join(safetext.clean(m, limit=100) for m in self.missing[:3])
            raise SyncError(f"{len(self.missing)} of {self.files} files did not arrive on {host} ({shown}"
                            f"{', ...' if len(self.missing) > 3 else ''}): job not started")

    def code(self) -> dict[str, Any]:
        """What the job's record keeps about the code it ran."""
        return {"tree_sha256": self.tree_sha256, "files": self.files, "dir": self.target, "git": self.git}


def _git(src: str, *args: str) -> bytes | None:
    try:
        res = subprocess.run(["git", "-C", src, *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def git_state(src: str, files: list[LocalFile]) -> dict[str, Any] | None:
    """Commit and dirty flag when ``src`` is in a git work tree: dirty when the synced files differ from the
    commit (a tracked file changed or deleted, or an untracked file went along)."""
    commit = _git(src, "rev-parse", "HEAD")
    if commit is None:
        return None
    changed = _git(src, "status", "--porcelain", "--untracked-files=no", "--", ".")
    tracked = set((_git(src, "ls-files", "-z") or b"").decode("utf-8", "surrogateescape").split("\0"))
    dirty = bool(changed and changed.strip()) or any(f.rel not in tracked for f in files)
    return {"commit": commit.decode().strip(), "dirty": dirty}


def _ignore_patterns(src: str) -> list[str]:
    try:
        text = Path(src, IGNORE_FILE).read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _matcher(globs: list[str]) -> Callable[[str], object] | None:
    """One compiled regex for all of ``globs`` (fnmatch syntax, whole string); None for no globs."""
    return re.compile("|".join(fnmatch.translate(g) for g in globs)).match if globs else None


class IgnoreRules:
    """``.gputuiignore`` patterns, gitignore-like, compiled once into four regexes: a pattern with a ``/``
    matches the path (or a leading dir of it), one without matches any component; a trailing ``/`` names
    directories. An ignored dir is never walked into."""

    def __init__(self, patterns: list[str]) -> None:
        dir_path: list[str] = []
        dir_name: list[str] = []
        file_path: list[str] = []
        file_name: list[str] = []
        for pattern in patterns:
            dir_only, pat = pattern.endswith("/"), pattern.strip("/")
            if not pat:
                continue
            anchored = "/" in pattern.rstrip("/")
            (dir_path if anchored else dir_name).append(pat)
            if not dir_only:
                (file_path if anchored else file_name).append(pat)
        self._dir_path, self._dir_name = _matcher(dir_path), _matcher(dir_name)
        self._file_path, self._file_name = _matcher(file_path), _matcher(file_name)
        self._dirs: dict[str, bool] = {}  # dir rel -> ignored (itself or a dir above it)

    def dir(self, rel: str, name: str) -> bool:
        """Whether the directory ``rel`` (last component ``name``) is ignored by a pattern of its own."""
        return bool((self._dir_path and self._dir_path(rel)) or (self._dir_name and self._dir_name(name)))

    def file(self, rel: str, name: str) -> bool:
        """Whether the file ``rel`` (last component ``name``) is ignored by a pattern of its own."""
        return bool((self._file_path and self._file_path(rel)) or (self._file_name and self._file_name(name)))

    def _dir_or_above(self, rel: str) -> bool:
        hit = self._dirs.get(rel)
        if hit is None:
            head, _, name = rel.rpartition("/")
            hit = self._dirs[rel] = bool(head and self._dir_or_above(head)) or self.dir(rel, name)
        return hit

    def __call__(self, rel: str) -> bool:
        """Whether the file ``rel`` is ignored, by its own name or path or by a dir above it."""
        head, _, name = rel.rpartition("/")
        return bool(head and self._dir_or_above(head)) or self.file(rel, name)


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``.gputuiignore`` ``patterns`` ignore the file ``rel`` (see IgnoreRules)."""
    return IgnoreRules(patterns)(rel)


def _git_files(src: str) -> list[str] | None:
    """The names ``git ls-files -co --exclude-standard`` gives when ``src`` is in a git work tree, else None."""
    if _git(src, "rev-parse", "--is-inside-work-tree") is None:
        return None
    out = _git(src, "ls-files", "-co", "--exclude-standard", "-z")
    if out is None:
        raise SyncError(f"git ls-files failed in {src}")
    return sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})


def _too_many(src: str) -> SyncError:
    return SyncError(f"{src} holds more than {MAX_FILES:,} files to sync: add what need not go to {IGNORE_FILE}")


def _file(rel: str, path: str, st: os.stat_result, notes: list[str]) -> LocalFile | None:
    """The LocalFile of a regular file; None (a note for a symlink) for anything else."""
    if stat.S_ISLNK(st.st_mode):
        notes.append(f"skipped symlink {rel}")
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return LocalFile(rel, path, st.st_size, st.st_mtime_ns, st.st_mode & 0o777, "", st.st_ino)


def _listed(src: str, names: list[str], rules: IgnoreRules, notes: list[str]) -> list[LocalFile]:
    """The files of a git listing, minus the ignored ones, each lstat'ed."""
    files = []
    for rel in names:
        if rules(rel):
            continue
        path = os.path.join(src, rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # a tracked file deleted in the work tree
        f = _file(rel, path, st, notes)
        if f is not None:
            files.append(f)
            if len(files) > MAX_FILES:
                raise _too_many(src)
    return files


def _walked(src: str, rules: IgnoreRules, notes: list[str]) -> list[LocalFile]:
    """Every file under ``src`` but ``.git`` dirs and what ``rules`` ignore (an ignored dir is not entered),
    by ``os.scandir``: one lstat per file, none per dir."""
    files: list[LocalFile] = []
    todo = [("", src)]
    while todo:
        below, path = todo.pop()
        try:
            entries = os.scandir(path)
        except OSError as exc:
            if not below:
                raise SyncError(f"cannot read {src}: {exc.strerror or exc}") from None
            notes.append(f"skipped unreadable dir {below.rstrip('/')}")
            continue
        with entries:
            for entry in entries:
                name, rel = entry.name, below + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if name != ".git" and not rules.dir(rel, name):
                            todo.append((rel + "/", entry.path))
                        continue
                    if rules.file(rel, name):
                        continue
                    f = _file(rel, entry.path, entry.stat(follow_symlinks=False), notes)
                except FileNotFoundError:
                    continue  # gone meanwhile
                if f is not None:
                    files.append(f)
                    if len(files) > MAX_FILES:
                        raise _too_many(src)
    return sorted(files)


def local_files(src: str, notes: list[str]) -> list[LocalFile]:
    """The regular files to carry (in path order), with size, mtime, mode and inode; symlinks and the like
    skipped with a note."""
    return _local_files(src, notes)[0]


def _local_files(src: str, notes: list[str]) -> tuple[list[LocalFile], bool]:
    """``local_files`` and whether ``src`` is in a git work tree."""
    rules = IgnoreRules(_ignore_patterns(src))
    names = _git_files(src)
    return (_walked(src, rules, notes), False) if names is None else (_listed(src, names, rules, notes), True)


def _cache_key(f: LocalFile) -> str:
    return f"{f.rel}\0{f.size}:{f.mtime_ns}:{f.ino}"


def with_hashes(files: list[LocalFile], cache_path: Path) -> list[LocalFile]:
    """Each file's sha256, reusing the cache's of a file whose path, size, mtime and inode did not change
    (the cache maps ``rel NUL size:mtime_ns:inode`` to the sha256); written again only when it changed."""
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    cache = cache if isinstance(cache, dict) else {}
    out, changed = [], len(cache) != len(files)
    for f in files:
        sha = cache.get(_cache_key(f))
        if not isinstance(sha, str):
            sha, changed = sha256_file(f.path), True
        out.append(LocalFile(f.rel, f.path, f.size, f.mtime_ns, f.mode, sha, f.ino))
    if changed:
        _write_atomic(cache_path, json.dumps({_cache_key(f): f.sha256 for f in out}))
    return out


def cache_path(src: str, cache_dir: Path | None = None) -> Path:
    """Where the hashes of ``src``'s files are kept between syncs."""
    key = hashlib.sha256(src.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return (cache_dir or Path.home() / ".cache" / "gputui") / "sync" / f"{key}.json"


def local_tree(src: str, cache_dir: Path | None = None) -> LocalTree:
    """The files of ``src`` to carry, hashed, with the git state and the tree hash: all a sync needs of the
    local side, without the host (``start_local`` runs it in a thread while the host connects)."""
    src = os.path.abspath(src)
    if not os.path.isdir(src):
        raise SyncError(f"{src} is not a directory")
    notes: list[str] = []
    files, in_git = _local_files(src, notes)
    git, cache = git_state(src, files) if in_git else None, cache_path(src, cache_dir)
    stats = stat_digest(files)
    known = _summary(cache)
    if known.get("stat") == stats and isinstance(known.get("tree"), str):
        return LocalTree(files, notes, git, known["tree"], cache, is_hashed=False)
    files = with_hashes(files, cache)
    tree = LocalTree(files, notes, git, tree_hash(files), cache)
    _write_atomic(cache.with_suffix(".tree"), json.dumps({"stat": stats, "tree": tree.tree_sha256}))
    return tree


def stat_digest(files: list[LocalFile]) -> str:
    """One sha256 of every file's path, size, mtime, inode and mode: equal to the last sync's, the tree
    hash is the last sync's too (the hash cache would give each file the same sha256)."""
    text = "".join([f"{f.rel}\0{f.size}\0{f.mtime_ns}\0{f.ino}\0{f.mode}\n" for f in files])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _summary(cache: Path) -> dict[str, Any]:
    """The last sync's stat digest and tree hash of this tree ({} when none or unreadable)."""
    try:
        known = json.loads(cache.with_suffix(".tree").read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temp file of its own (two syncs of one tree never share one)."""
    make_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start_local(src: str, cache_dir: Path | None = None) -> asyncio.Future[LocalTree]:
    """``local_tree`` in a thread, begun at once (not at the event loop's next turn): the CLI starts it
    before it connects, so the walk and the hashing overlap the connect and the agent's start."""
    return asyncio.get_running_loop().run_in_executor(None, local_tree, src, cache_dir)


def tree_hash(files: list[LocalFile]) -> str:
    """One sha256 for the whole tree: every path, mode and content hash, in path order."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.rel):
        digest.update(f"{f.rel}\0{f.mode:o}\0{f.sha256}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def host_tree(files: list[LocalFile], there: dict[str, dict[str, Any]]) -> tuple[str, list[str]]:
    """The tree hash of what the host holds of ``files`` (its manifest: content and mode as written there),
    and the files it does not hold as they are here."""
    held = [
        LocalFile(f.rel, f.path, f.size, f.mtime_ns, there[f.rel]["mode"], there[f.rel]["sha256"])
        for f in files if f.rel in there
    ]
    missing = [f.rel for f in files if (there.get(f.rel) or {}).get("sha256") != f.sha256
               or there[f.rel]["mode"] != f.mode]
    return tree_hash(held), missing


def default_target(src: str) -> str:
    return f"~/gputui-work/{os.path.basename(os.path.abspath(src)) or 'root'}"


async def _manifest(
    session: HostSession, target: str, expect: str = ""
) -> tuple[str, dict[str, dict[str, Any]], bool]:
    """The host's manifest of ``target`` (what earlier syncs wrote and is unchanged), page by page:
    (the target's absolute path, the entries, same). With ``expect`` (this side's tree hash) a host whose
    manifest hashes the same answers ``same`` and no entries: nothing to send, nothing to delete."""
    entries: dict[str, dict[str, Any]] = {}
    after, abs_target = "", target
    while True:
        args: dict[str, Any] = {"expect": expect} if expect and not after else {}
        res = await request_retrying(session, P.OP_FILES_MANIFEST, target=target, after=after, about=target, **args)
        page = fileswire.manifest_page(session.name, res)
        abs_target = page.target
        if page.same and args:
            return abs_target, {}, True
        for e in page.entries:
            entries[e["rel"]] = e
        if not page.more or not page.entries or page.entries[-1]["rel"] <= after:
            return abs_target, entries, False
        after = page.entries[-1]["rel"]


async def _send(session: HostSession, target: str, f: LocalFile, sent: Callable[[int], None]) -> None:
    """One file, chunk by chunk; the last chunk commits it (sha256 checked on the host, then renamed)."""
    offset, part = 0, secrets.token_hex(16)  # this sender's own part file: no other sender writes it
    with open(f.path, "rb") as src:
        while True:
            data = src.read(P.FILE_CHUNK_BYTES)
            last = offset + len(data) >= f.size or len(data) < P.FILE_CHUNK_BYTES
            commit = {"sha256": f.sha256, "mode": f.mode, "mtime_ns": f.mtime_ns} if last else None
            await request_retrying(
                session, P.OP_FILES_WRITE, target=target, rel=f.rel, offset=offset, b64=P.b64(data),
                truncate=offset == 0, commit=commit, part=part, about=f.rel,
                timeout=hash_timeout(f.size) if last else STALL_S,
            )
            offset += len(data)
            sent(len(data))
            if last:
                return


async def _send_stream(
    session: HostSession,
    target: str,
    todo: list[LocalFile],
    sent: Callable[[int], None],
    notes: list[str],
    done: dict[str, dict[str, Any] | None],
) -> None:
    """Every file of ``todo`` on one raw upload stream (the agent build's ``receive``: a header line, then
    the bytes; no JSON, no base64), then an end line. Small files go out together, STREAM_BLOCK bytes at a
    time. Each file the host acknowledges goes into ``done``: its manifest entry (sha256, mode) as the host
    wrote it, or None where the host refused it."""
    state_dir = str(session.snapshot.facts.get("state_dir") or "~/.gputui")
    channel = await asyncio.wait_for(session.open_stream(["receive", "--state-dir", state_dir, target]), STALL_S)
    sizes = {f.rel: f.size for f in todo}
    expected = len(done) + len(todo)
    acked = [0]  # bytes of the files acknowledged so far

    lines = _Lines(channel.reader, session.name)

    async def acks() -> None:
        while len(done) < expected:
            line = await lines.next()
            if not line:
                return
            rel, entry, error = _ack(session, line, sizes, done)
            done[rel] = entry
            acked[0] += sizes[rel]
            if error is not None:
                notes.append(f"not sent {rel}: {error}")

    reading = asyncio.ensure_future(acks())
    out = bytearray()

    async def flush(rel: str) -> None:
        channel.writer.write(bytes(out))
        out.clear()
        await _drained(session, channel, rel, reading)

    try:
        for f in todo:
            head = {"rel": f.rel, "size": f.size, "sha256": f.sha256, "mode": f.mode, "mtime_ns": f.mtime_ns}
            out += json.dumps(head).encode() + b"\n"
            left = f.size
            with open(f.path, "rb") as src:
                while left > 0:
                    data = src.read(min(left, STREAM_BLOCK)) or bytes(min(left, STREAM_BLOCK))  # shrank: pad
                    out += data
                    left -= len(data)
                    sent(len(data))
                    if len(out) >= STREAM_BLOCK:
                        await flush(f.rel)
            if reading.done():
                break  # the stream ended early (link lost, agent gone)
        out += b'{"end": true}\n'  # the host writes out the acknowledgements it holds back, and ends
        await flush(todo[-1].rel if todo else "")
        unacked = sum(sizes.values()) - acked[0]
        try:  # the host hashes what it got before it answers: a bound that grows with the bytes
            await asyncio.wait_for(asyncio.shield(reading), hash_timeout(unacked))
        except asyncio.TimeoutError:
            raise SyncError(
                f"{session.name} did not acknowledge the files sent within {hash_timeout(unacked):g} s: "
                "sync again to go on"
            ) from None
    finally:
        reading.cancel()
        await channel.close()


class _Lines:
    """Lines from the host's upload stream, each at most MAX_ACK_BYTES (a longer one is a SyncError, never
    buffered without end); b"" at EOF."""

    def __init__(self, reader: Any, host: str) -> None:
        self.reader, self.host, self.buf = reader, host, bytearray()

    async def next(self) -> bytes:
        while (end := self.buf.find(b"\n")) < 0:
            if len(self.buf) > MAX_ACK_BYTES:
                raise SyncError(f"{self.host} answered the upload with a line over {MAX_ACK_BYTES:,} bytes")
            data = await self.reader.read(65536)
            if not data:
                return b""
            self.buf += data
        line = bytes(self.buf[: end + 1])
        del self.buf[: end + 1]
        return line


async def _drained(session: HostSession, channel: Any, rel: str, reading: asyncio.Future[None]) -> None:
    """Wait for the host to take the bytes written; a host that takes none for STALL_S is an error (and a
    fatal line from the host ends the wait at once)."""
    drain = asyncio.ensure_future(channel.writer.drain())
    try:
        finished, _ = await asyncio.wait({drain, reading}, timeout=STALL_S, return_when=asyncio.FIRST_COMPLETED)
        if drain in finished:
            drain.result()
        elif reading in finished:
            reading.result()  # a SyncError from the host's fatal line, or the stream ended
        else:
            raise SyncError(f"{session.name} took no bytes of {rel} for {STALL_S:g} s: sync again to go on")
    finally:
        drain.cancel()


def _ack(
    session: HostSession, line: bytes, sizes: dict[str, int], done: dict[str, dict[str, Any] | None]
) -> tuple[str, dict[str, Any] | None, str | None]:
    """One acknowledgement line of the upload stream, checked: (rel, the host's manifest entry or None,
    error or None). A ``fatal`` line (the host refused the whole sync, e.g. another sync into the target is
    under way) is a SyncError."""
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if isinstance(reply, dict) and isinstance(reply.get("fatal"), str):
        raise SyncError(f"{session.name}: {safetext.clean(reply['fatal'], limit=500)}")
    rel = reply.get("rel") if isinstance(reply, dict) else None
    if not isinstance(rel, str) or rel not in sizes or rel in done or not isinstance(reply.get("ok"), bool):
        raise SyncError(
            f"{session.name} answered the upload with {safetext.clean(line, limit=120)}: "
            "not an acknowledgement of a file sent"
        )
    if reply["ok"]:
        return rel, fileswire.manifest_entry(session.name, reply, "the upload stream", "the acknowledgement"), None
    return rel, None, safetext.clean(reply.get("error"), limit=500)


async def _send_all(
    session: HostSession, target: str, todo: list[LocalFile], sent: Callable[[int], None], notes: list[str]
) -> dict[str, dict[str, Any]] | None:
    """The raw stream when the transport has one, picking up after a dropped link; else chunked writes.
    The host's manifest entries of the files the stream carried, or None where chunked writes were used."""
    left, done = list(todo), dict[str, dict[str, Any] | None]()
    for _attempt in range(5):
        try:
            await _send_stream(session, target, left, sent, notes, done)
        except NotImplementedError:
            break
        except SyncError:
            raise
        except Exception as exc:  # link lost (OSError, asyncssh errors): go on with what is not acknowledged
            log.info("sync stream to %s broke: %s", session.name, exc)
        left = [f for f in left if f.rel not in done]
        if not left:
            return {rel: entry for rel, entry in done.items() if entry is not None}
        await session.wait_connected(60)
    await _send_chunked(session, target, left, sent, notes)
    return None


async def _send_chunked(
    session: HostSession, target: str, todo: list[LocalFile], sent: Callable[[int], None], notes: list[str]
) -> None:
    gate = asyncio.Semaphore(PARALLEL)

    async def one(f: LocalFile) -> None:
        async with gate:
            try:
                await _send(session, target, f, sent)
            except AgentError as exc:
                if exc.code != P.E_BAD_ARGS:
                    raise
                notes.append(f"not sent {f.rel}: {exc}")  # e.g. a symlink on the host's side

    tasks = [asyncio.ensure_future(one(f)) for f in todo]
    try:
        await asyncio.gather(*tasks)
    finally:  # the first failure ends the sync: stop the other sends
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def sync(
    session: HostSession,
    src: str,
    target: str | None = None,
    delete: bool = False,
    cache_dir: Path | None = None,
    on_progress: Progress | None = None,
    local: Awaitable[LocalTree] | None = None,
) -> SyncResult:
    """Make ``target`` on the host hold ``src``'s files; only changed ones travel. ``local``: the
    ``start_local`` of ``src`` begun earlier (else it is made now)."""
    src = os.path.abspath(src)
    session.run_in_background()
    target = target or default_target(src)
    tree = await (local if local is not None else asyncio.to_thread(local_tree, src, cache_dir))
    result = SyncResult(target=target, files=len(tree.files), tree_sha256=tree.tree_sha256, git=tree.git,
                        notes=list(tree.notes))
    result.target, have, same = await _manifest(session, target, expect=tree.tree_sha256)
    if same:  # the host holds exactly these files, as they are here: nothing to send or delete
        if on_progress is not None:
            on_progress("0 files changed", 0, 0)
        return result
    files = tree.files if tree.is_hashed else await asyncio.to_thread(tree.hashed)
    todo = [
        f for f in files if (have.get(f.rel) or {}).get("sha256") != f.sha256 or have[f.rel]["mode"] != f.mode
    ]
    total = sum(f.size for f in todo)

    def sent(n: int) -> None:
        result.bytes_sent += n
        if on_progress is not None:
            on_progress(f"{len(todo)} files", result.bytes_sent, total)

    landed = await _send_all(session, result.target, todo, sent, result.notes) if todo else {}
    result.sent = len(todo) - sum(n.startswith("not sent") for n in result.notes)
    if landed is None:  # chunked writes: what landed is in the host's manifest
        _, there, _ = await _manifest(session, result.target)
    else:  # the stream's acknowledgements carry the host's entries of the files written
        there = {**have, **landed}
    result.tree_sha256, result.missing = host_tree(files, there)
    if delete:
        local_rels = {f.rel for f in files}
        gone = sorted(rel for rel in have if rel not in local_rels)
        for i in range(0, len(gone), 1000):
            res = await request_retrying(
                session, P.OP_FILES_DELETE, target=result.target, rels=gone[i : i + 1000], about=result.target
            )
            result.deleted += len(fileswire.deleted(session.name, res))
    if on_progress is not None and not todo:
        on_progress("0 files changed", 0, 0)
    return result

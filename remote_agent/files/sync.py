"""What ``gputui sync`` writes on the host: files into a target dir, each through a part file checked by sha256
(``files.write``, or the raw ``receive`` stream), a manifest of what was written (``files.manifest``) and the
deletion of only those files (``files.delete``). No rsync, scp or sftp is needed on the host. Stdlib only,
Python 3.8+.
"""

import bisect
import errno
import hashlib
import json
import os
import re
import stat
import sys
import threading
from typing import Any, Dict, List, Optional

from .. import protocol as P
from ..fsutil import write_atomic
from .pull import HASH_BLOCK

#: Most manifest entries one page carries.
MANIFEST_PAGE = 5000
MAX_DELETE = 1000
#: How long a sync waits for another sync to the same target to finish before it refuses.
LOCK_WAIT_S = 30.0
_manifest_lock = threading.Lock()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The random part of a part file's name: 32 hex digits, chosen by the sender, unknown to anyone else.
_TOKEN = re.compile(r"[0-9a-f]{32}")


class NoSpace(ValueError):
    """The host's disk is full: the file was not written (its part file is removed)."""


def _parts(rel: Any) -> List[str]:
    """The components of a relative path inside the target; ValueError for anything that could leave it."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or rel.startswith("/") or len(rel) > 4096:
        raise ValueError("path must be a relative path inside the target, not %r" % str(rel)[:200])
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError("path %r must not contain empty, '.' or '..' parts" % rel[:200])
    return parts


def target_dir(target: Any) -> str:
    if not isinstance(target, str) or not target or "\x00" in target:
        raise ValueError("target must be a directory path")
    return os.path.abspath(os.path.expanduser(target))


def _key(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _record_path(state_dir: str, target: str) -> str:
    return os.path.join(state_dir, "sync", _key(target) + ".where")


def _real_target(state_dir: str, target: str, record: bool) -> str:
    """``target``'s real path, resolved once: the first sync records where it led, and a later one refuses
    when a symlink on the way (the target itself or a dir above it) now leads somewhere else."""
    real = os.path.realpath(target)
    path = _record_path(state_dir, target)
    try:
        with open(path, "rb") as f:
            was = json.loads(f.read(65536)).get("real")
    except (OSError, ValueError, AttributeError):
        was = None
    if isinstance(was, str) and was != real:
        raise ValueError(
            "refusing to sync into %s: it now leads to %s through a symlink (earlier syncs wrote to %s); "
            "name the dir meant with --to" % (target, real, was)
        )
    if was is None and record:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, json.dumps({"target": target, "real": real}).encode("utf-8", "surrogateescape"))
    return real


def _walk_down(fd: int, names: List[str], create: bool, shown: str) -> int:
    """From the dir ``fd`` (consumed) down through ``names``, never following a symlink; the last dir's fd.
    ``create`` makes missing dirs; a symlink or non-dir on the way is a ValueError naming it."""
    try:
        for i, name in enumerate(names):
            try:
                new = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:  # made meanwhile by a write in another thread
                    pass
                new = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ValueError(
                        "refusing %s: %s is a symlink or not a directory on the host"
                        % (shown, "/".join(names[: i + 1]))
                    ) from None
                raise
            os.close(fd)
            fd = new
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_target(state_dir: str, target: str, create: bool) -> int:
    """An fd of the target dir itself, opened component by component from ``/`` along its real path without
    following a symlink: every write and delete below it is made relative to this fd, so nothing a link
    planted later (on the path or inside) does can lead one outside."""
    real = _real_target(state_dir, target, record=create)
    names = [n for n in real.split("/") if n]
    fd = os.open("/", _DIR_FLAGS)
    try:
        return _walk_down(fd, names, create, real)
    except ValueError:
        raise ValueError("refusing to sync into %s: a dir on its path was replaced by a symlink" % target) from None


def _open_parent(root: int, parts: List[str], create: bool) -> int:
    """An fd of the directory holding ``parts[-1]`` inside the target dir ``root`` (not consumed)."""
    return _walk_down(os.dup(root), parts[:-1], create, "/".join(parts))


class TargetLock:
    """One sync into a target at a time (flock on a file of the state dir keyed by the target's real path):
    a second waits up to ``wait_s``, then refuses with an error that says so."""

    def __init__(self, state_dir: str, target: str, wait_s: Optional[float] = None) -> None:
        import fcntl
        import time

        real = os.path.realpath(target)
        d = os.path.join(state_dir, "sync")
        os.makedirs(d, mode=0o700, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(os.path.join(d, _key(real) + ".lock"), flags, 0o600)
        deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise ValueError(
                        "another sync into %s is under way (from another client?): waited %g s; "
                        "try again when it is done" % (target, LOCK_WAIT_S if wait_s is None else wait_s)
                    ) from None
                time.sleep(0.1)

    def __enter__(self) -> "TargetLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)  # releases the flock


def _regular(fd: int, parts: List[str]) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ValueError("refusing %s: not a regular file on the host" % "/".join(parts))


def _part_name(name: str, token: str) -> str:
    """A part file's name: the sender's random token makes it one no user file has and no other sender
    writes."""
    return ".%s.%s.gputui-part" % (name[:120], token)


def _token(a: Dict[str, Any]) -> str:
    token = a.get("part")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ValueError("part must be 32 lowercase hex digits")
    return token


def _write_all(fd: int, data: bytes, offset: int, where: str) -> None:
    """Every byte of ``data`` at ``offset`` (a short write is continued); a full disk is a NoSpace."""
    view = memoryview(data)
    try:
        while view:
            n = os.pwrite(fd, view, offset)
            if n <= 0:
                raise OSError(errno.ENOSPC, "short write")
            view, offset = view[n:], offset + n
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace("no space left on device on the host (%s)" % where) from None
        raise


def write_file(state_dir: str, a: Dict[str, Any]) -> Dict[str, Any]:
    """Write one chunk of ``rel`` into its part file (``truncate`` starts it afresh: the first chunk creates
    it, never opening a file that exists); with ``commit`` (sha256, mode, mtime_ns) check the whole part's
    sha256 and rename it into place atomically."""
    target = target_dir(a.get("target"))
    parts = _parts(a.get("rel"))
    token = _token(a)
    data = P.unb64(str(a.get("b64") or ""))
    if len(data) > P.FILE_CHUNK_BYTES:
        raise ValueError("chunk of %d bytes exceeds %d" % (len(data), P.FILE_CHUNK_BYTES))
    offset = P.int_arg(a, "offset", 0)
    with TargetLock(state_dir, target):
        root = open_target(state_dir, target, create=True)
        try:
            dfd = _open_parent(root, parts, create=True)
        finally:
            os.close(root)
        try:
            part = _part_name(parts[-1], token)
            if a.get("truncate"):
                fd = _create_part(dfd, part, retry=offset == 0)
            else:
                fd = os.open(part, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            try:
                _regular(fd, parts)
                _write_all(fd, data, offset, "%s/%s" % (target, "/".join(parts)))
            except NoSpace:
                os.close(fd)
                fd = -1
                os.unlink(part, dir_fd=dfd)
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
            commit = a.get("commit")
            if not isinstance(commit, dict):
                return {"written": len(data)}
            return _commit(state_dir, target, parts, dfd, commit, part)
        finally:
            os.close(dfd)


def _create_part(dfd: int, part: str, retry: bool = False) -> int:
    """A new part file (O_EXCL: never an existing file). ``retry``: a first chunk sent again after a dropped
    link finds the part it made already; the random name is the sender's own, so it is started afresh."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(part, flags, 0o600, dir_fd=dfd)
    except FileExistsError:
        if not retry:
            raise
    fd = os.open(part, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    os.ftruncate(fd, 0)
    return fd


def _commit(
    state_dir: str, target: str, parts: List[str], dfd: int, c: Dict[str, Any], part: str
) -> Dict[str, Any]:
    name = parts[-1]
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(part, flags, dir_fd=dfd)
    except FileNotFoundError:  # a commit repeated after a dropped link: done already if the file matches
        fd = os.open(name, flags, dir_fd=dfd)
        part = name
    try:
        _regular(fd, parts)
        digest = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as f:
            for block in iter(lambda: f.read(HASH_BLOCK), b""):
                digest.update(block)
        if digest.hexdigest() != c.get("sha256"):
            if part != name:
                os.unlink(part, dir_fd=dfd)
            raise ValueError("sha256 of %s on the host does not match what was sent" % "/".join(parts))
        os.fchmod(fd, P.int_arg(c, "mode", 0o644, 0, 0o777))
        mtime_ns = P.int_arg(c, "mtime_ns", 0)
        if mtime_ns:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        if part != name:
            os.replace(part, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    entry = {"rel": "/".join(parts), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             "sha256": c["sha256"], "mode": stat.S_IMODE(st.st_mode)}
    _journal(state_dir, target, [entry])
    return entry


def _manifest_path(state_dir: str, target: str) -> str:
    return os.path.join(state_dir, "sync", _key(target) + ".jsonl")


def _journal(state_dir: str, target: str, entries: List[Dict[str, Any]]) -> None:
    path = _manifest_path(state_dir, target)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)
    with _manifest_lock:
        _journal_writes[0] += 1
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)


def _unchanged(dfd: int, name: str, e: Dict[str, Any]) -> bool:
    """Whether ``name`` in the dir ``dfd`` is still the regular file the manifest entry ``e`` wrote."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return stat.S_ISREG(st.st_mode) and st.st_size == e["size"] and st.st_mtime_ns == e["mtime_ns"]
    except (OSError, ValueError, KeyError):
        return False


def _gone(root: int, entries: Dict[str, Dict[str, Any]]) -> List[str]:
    """The entries' paths that are no longer as sync wrote them under the target dir ``root``: each dir
    opened once (never through a symlink), each file statted once in it."""
    by_dir = {}  # type: Dict[str, List[str]]
    for rel in entries:
        by_dir.setdefault(rel.rpartition("/")[0], []).append(rel)
    gone = []  # type: List[str]
    for head, rels in by_dir.items():
        try:
            names = _parts(head) if head else []
            dfd = _walk_down(os.dup(root), names, False, head)
        except (OSError, ValueError):
            gone += rels
            continue
        try:
            for rel in rels:
                name = rel[len(head) + 1 :] if head else rel
                if name in ("", ".", "..") or rel.startswith("/") or not _unchanged(dfd, name, entries[rel]):
                    gone.append(rel)
        finally:
            os.close(dfd)
    return gone


def _read_journal(path: str) -> Any:
    """The journal's entries in the order written, and its line count: one JSON parse of the whole file;
    line by line (skipping a line a crash cut) when that fails."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.count(b"\n")
    if not data.strip():
        return [], lines
    try:
        return json.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]"), lines
    except ValueError:
        pass
    out = []
    for line in data.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash
    return out, lines


def _manifest(state_dir: str, target: str, root: int) -> Dict[str, Dict[str, Any]]:
    """What sync wrote into ``target`` (open as ``root``) and is still there unchanged (size and mtime)."""
    path = _manifest_path(state_dir, target)
    entries = {}  # type: Dict[str, Dict[str, Any]]
    with _manifest_lock:
        try:
            journal, lines = _read_journal(path)
        except FileNotFoundError:
            return {}
        for e in journal:
            if isinstance(e, dict) and isinstance(e.get("rel"), str):
                if e.get("del"):
                    entries.pop(e["rel"], None)
                else:
                    entries[e["rel"]] = e
        for rel in _gone(root, entries):  # changed or removed on the host since: it must be sent again
            del entries[rel]
        if lines > 2 * len(entries) + 100:  # compact the journal
            write_atomic(path, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries.values())
                         .encode("utf-8", "surrogateescape"))
    return entries


#: A sha256 in hex, as a client's ``expect`` names its tree.
_SHA256 = re.compile(r"[0-9a-f]{64}")


def tree_digest(listed: List[Dict[str, Any]]) -> str:
    """The tree hash of manifest entries in path order, the way the client hashes its tree (gputui/core/files/sync.py
    ``tree_hash``): sha256 of ``rel NUL mode-in-octal NUL sha256 LF`` for each; "" when an entry has no
    int mode (it never matches)."""
    try:
        text = "".join(["%s\0%o\0%s\n" % (e["rel"], e["mode"], e["sha256"]) for e in listed])
    except (KeyError, TypeError):  # no mode, or one that is no number
        return ""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def manifest_page(state_dir: str, a: Dict[str, Any]) -> Dict[str, Any]:
    """Entries of the target's manifest after ``after`` (in path order), at most MANIFEST_PAGE of them. With
    ``expect`` (the client's tree hash) on a first page, a manifest that hashes the same is answered
    ``same`` with no entries: every file is there as the client has it, and no other (each still statted)."""
    target = target_dir(a.get("target"))
    after = str(a.get("after") or "")
    expect = a.get("expect")
    if expect is not None and not (isinstance(expect, str) and _SHA256.fullmatch(expect)):
        raise ValueError("expect must be a sha256 in hex (64 digits)")
    try:
        root = open_target(state_dir, target, create=False)
    except FileNotFoundError:  # not made yet: nothing there
        return {"target": target, "entries": [], "more": False}
    try:
        rels, listed = _listing(state_dir, target, root, fresh=not after)
    finally:
        os.close(root)
    if expect and not after and tree_digest(listed) == expect:
        return {"target": target, "entries": [], "more": False, "same": True}
    start = bisect.bisect_right(rels, after) if after else 0
    page = listed[start : start + MANIFEST_PAGE]
    return {"target": target, "entries": page, "more": start + len(page) < len(listed)}


#: The last listing made: the later pages of one listing are cut from it instead of reading the journal and
#: statting every file again. ``_journal_writes`` counts manifest writes: a listing made before one is stale.
_last_listing = {}  # type: Dict[str, Any]
_journal_writes = [0]


def _listing(state_dir: str, target: str, root: int, fresh: bool) -> Any:
    """The target's manifest as (rels, entries), both in path order: made afresh for a listing's first
    page, taken from the last listing for its later ones when no manifest write came since."""
    with _manifest_lock:
        last = dict(_last_listing)
        writes = _journal_writes[0]
    if not fresh and last.get("key") == (state_dir, target, writes):
        return last["rels"], last["entries"]
    entries = _manifest(state_dir, target, root)
    rels = sorted(entries)
    listed = [entries[r] for r in rels]
    with _manifest_lock:
        _last_listing.clear()
        _last_listing.update(key=(state_dir, target, writes), rels=rels, entries=listed)
    return rels, listed


def _remove_empty_parents(root: int, parts: List[str]) -> None:
    """Remove the directories above a deleted file that it left empty, innermost first, never the target
    itself; stops at the first one that still holds something (or is not a plain directory)."""
    for i in range(len(parts) - 1, 0, -1):
        try:
            dfd = _open_parent(root, parts[:i], create=False)
        except (OSError, ValueError):
            return
        try:
            os.rmdir(parts[i - 1], dir_fd=dfd)
        except OSError:
            return
        finally:
            os.close(dfd)


def delete_files(state_dir: str, a: Dict[str, Any]) -> Dict[str, Any]:
    """Remove files sync wrote earlier (only those in the manifest, unchanged since) from the target, and the
    directories that leaves empty."""
    target = target_dir(a.get("target"))
    rels = a.get("rels")
    if not isinstance(rels, list) or len(rels) > MAX_DELETE:
        raise ValueError("rels must be a list of at most %d paths" % MAX_DELETE)
    deleted = []
    with TargetLock(state_dir, target):
        root = open_target(state_dir, target, create=False)
        try:
            known = _manifest(state_dir, target, root)
            for rel in rels:
                parts = _parts(rel)
                if rel not in known:
                    continue  # not ours, or changed on the host since: never deleted
                dfd = _open_parent(root, parts, create=False)
                try:
                    os.unlink(parts[-1], dir_fd=dfd)
                except FileNotFoundError:
                    pass
                finally:
                    os.close(dfd)
                _remove_empty_parents(root, parts)
                deleted.append(rel)
        finally:
            os.close(root)
        _journal(state_dir, target, [{"rel": r, "del": True} for r in deleted])
    return {"deleted": deleted}


def _fatal(out: Any, message: str) -> int:
    """End a receive stream with an error the client shows as is (one JSON line ``{"fatal": ...}``)."""
    out.write(json.dumps({"fatal": message}).encode() + b"\n")
    out.flush()
    return 2


def receive(state_dir: str, target: str, inp: Any, out: Any, block: int = 1024 * 1024) -> int:
    """``gputui sync``'s raw upload stream: a header line (JSON: rel, size, sha256, mode, mtime_ns) then
    exactly ``size`` raw bytes, file after file, until EOF. Each file is written like ``files.write`` does
    (a part file of a fresh random name, sha256 check, rename, manifest) and answered with one JSON line:
    {"rel", "ok"[, "error"]}. A refused file's bytes are read and dropped, so the stream stays in step. One
    sync into a target at a time: the stream holds the target's lock from start to end; a target that
    cannot be used at all ends the stream with one {"fatal": why} line."""
    import secrets

    target = target_dir(target)
    try:
        lock = TargetLock(state_dir, target)
    except (OSError, ValueError) as exc:
        return _fatal(out, str(exc))
    with lock:
        try:
            root = open_target(state_dir, target, create=True)
        except (OSError, ValueError) as exc:
            return _fatal(out, "cannot use %s on the host: %s" % (target, exc))
        try:
            return _receive_files(state_dir, target, root, inp, out, block, secrets.token_hex)
        finally:
            os.close(root)


#: Acknowledgements (and their manifest lines) a receive stream holds back before it writes them out at once.
ACK_BATCH = 256
#: Longest a receive stream holds an acknowledgement back while files keep coming, in seconds.
ACK_HOLD_S = 0.2
#: Most directory fds a receive stream keeps open for the files that follow.
MAX_DIR_FDS = 256


class _Dirs:
    """The directories of a target dir ``root``, opened (never through a symlink) once for all the files
    that land in them, at most MAX_DIR_FDS held; every fd is closed by ``close``."""

    def __init__(self, root: int) -> None:
        self.root, self.fds = root, {}  # type: int, Dict[tuple, int]

    def parent(self, parts: List[str], create: bool) -> int:
        """The fd of the dir holding ``parts[-1]`` (owned by this cache: never closed by the caller)."""
        key = tuple(parts[:-1])
        fd = self.fds.get(key)
        if fd is None:
            if len(self.fds) >= MAX_DIR_FDS:
                self.close()
            fd = self.fds[key] = _open_parent(self.root, parts, create)
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


class _Acks:
    """Acknowledgement lines of a receive stream, written out in batches (ACK_BATCH lines or ACK_HOLD_S,
    and at the end); a committed file's manifest line is journaled before its acknowledgement goes out."""

    def __init__(self, state_dir: str, target: str, out: Any) -> None:
        import time

        self.state_dir, self.target, self.out, self.clock = state_dir, target, out, time.monotonic
        self.lines, self.entries, self.since = [], [], self.clock()  # type: List[bytes], List[Dict[str, Any]], float

    def add(self, reply: Dict[str, Any], entry: Optional[Dict[str, Any]]) -> None:
        if entry is not None:
            self.entries.append(entry)
        self.lines.append(json.dumps(reply).encode() + b"\n")
        if len(self.lines) >= ACK_BATCH or self.clock() - self.since >= ACK_HOLD_S:
            self.flush()

    def flush(self) -> None:
        if self.entries:
            _journal(self.state_dir, self.target, self.entries)
        if self.lines:
            self.out.write(b"".join(self.lines))
            self.out.flush()
        self.lines, self.entries, self.since = [], [], self.clock()


def _receive_files(
    state_dir: str, target: str, root: int, inp: Any, out: Any, block: int, token: Any
) -> int:
    """The files of the stream until EOF or an ``{"end": true}`` line; the acknowledgements of the files
    received are written out before it returns, whichever way it ends."""
    dirs, acks = _Dirs(root), _Acks(state_dir, target, out)
    try:
        while True:
            line = inp.readline(65536)
            if not line:
                return 0
            if not line.endswith(b"\n"):
                sys.stderr.write("gputui-agent: receive: header line too long\n")
                return 2
            try:
                head = json.loads(line)
                if isinstance(head, dict) and head.get("end") is True:
                    return 0
                rel, size = head.get("rel"), P.int_arg(head, "size", 0)
            except (ValueError, AttributeError) as exc:
                sys.stderr.write("gputui-agent: receive: bad header: %s\n" % exc)
                return 2
            result = _receive_one(state_dir, target, dirs, inp, head, rel, size, block, token)
            if result is None:
                return 1  # the client went away mid-file: nothing renamed (its part is removed)
            acks.add(*result)
    finally:
        dirs.close()
        acks.flush()


def _receive_one(
    state_dir: str, target: str, dirs: _Dirs, inp: Any, head: Dict[str, Any], rel: Any, size: int, block: int,
    token: Any,
) -> Optional[tuple]:
    """One file of the stream: its ``size`` bytes into a part file of a fresh random name, hashed as they
    are written, checked, renamed into place. (reply, manifest entry or None); None when the stream ended
    mid-file. A refused file's bytes are read and dropped, so the stream stays in step."""
    reply = {"rel": rel, "ok": True}  # type: Dict[str, Any]
    fd, dfd, part, parts = -1, -1, "", []  # type: int, int, str, List[str]
    digest = hashlib.sha256()
    try:
        parts = _parts(rel)
        dfd = dirs.parent(parts, create=True)
        name = _part_name(parts[-1], token(16))
        fd = _create_part(dfd, name)
        part = name  # ours from here on: removed unless renamed into place
    except (OSError, ValueError) as exc:
        reply = {"rel": rel, "ok": False, "error": str(exc)}
    left, at = size, 0
    try:
        while left > 0:
            data = inp.read(min(block, left))
            if not data:
                return None
            left -= len(data)
            if fd >= 0:
                try:
                    _write_all(fd, data, at, "%s/%s" % (target, rel))
                    digest.update(data)
                except (OSError, ValueError) as exc:  # a full disk: the rest is read and dropped
                    reply = {"rel": rel, "ok": False, "error": str(exc)}
                    os.close(fd)
                    fd = -1
            at += len(data)
        if reply["ok"]:
            entry = _commit_written(fd, dfd, parts, part, digest.hexdigest(), head)
            part = ""
            reply.update(sha256=entry["sha256"], mode=entry["mode"])
            return reply, entry
    except (OSError, ValueError, KeyError) as exc:
        reply = {"rel": rel, "ok": False, "error": str(exc)}
    finally:
        if fd >= 0:
            os.close(fd)
        if part and dfd >= 0:
            try:
                os.unlink(part, dir_fd=dfd)
            except OSError:
                pass
    return reply, None


def _commit_written(fd: int, dfd: int, parts: List[str], part: str, sha256: str, c: Dict[str, Any]) -> Dict[str, Any]:
    """Put the part file just written (open as ``fd``, its bytes hashed as ``sha256`` on the way) in place:
    the hash checked against the sender's, mode and mtime set, renamed over ``parts[-1]``; its manifest
    entry. The caller closes ``fd``; a part that does not match is left for the caller to remove."""
    if sha256 != c.get("sha256"):
        raise ValueError("sha256 of %s on the host does not match what was sent" % "/".join(parts))
    os.fchmod(fd, P.int_arg(c, "mode", 0o644, 0, 0o777))
    mtime_ns = P.int_arg(c, "mtime_ns", 0)
    if mtime_ns:
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    os.replace(part, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
    st = os.fstat(fd)
    return {"rel": "/".join(parts), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256": sha256, "mode": stat.S_IMODE(st.st_mode)}

"""File operations for carrying work to and from the host (gputui pull / sync), over the agent channel.

No rsync, scp or sftp is needed on the host. Everything is bounded: a read returns at most one chunk, a listing
at most ``MAX_LIST_FILES`` entries, a hash streams the file. Reads refuse anything but regular files (a FIFO
would hang the agent).
"""

import errno
import glob
import hashlib
import json
import os
import stat
import sys
import threading
from typing import Any, Dict, List, Optional

from . import protocol as P
from .fsutil import open_regular, write_atomic

#: Most files one listing names; more is an error asking for a narrower pattern.
MAX_LIST_FILES = 20000
#: Most JSON bytes a listing may take (well under the frame limit).
MAX_LIST_BYTES = 3 * 1024 * 1024
#: Most directory entries one listing may look at (a pattern that walks a huge tree stops with an error).
MAX_LIST_SCAN = 200000
HASH_BLOCK = 1024 * 1024


class TooMany(ValueError):
    """A listing outgrew its bound."""


def _entry(path: str, rel: str, st: os.stat_result) -> Dict[str, Any]:
    return {
        "path": path,
        "rel": rel,
        "size": st.st_size,
        "mtime": st.st_mtime,
        "mode": stat.S_IMODE(st.st_mode),
    }


def _walk(top: str, rel_top: str, out: List[Dict[str, Any]], budget: List[int]) -> None:
    """Regular files under ``top`` (symlinks are not followed), with paths relative to ``rel_top``'s parent."""
    for root, dirs, files in os.walk(top):
        dirs.sort()
        budget[0] -= len(dirs) + len(files)
        if budget[0] < 0:
            raise TooMany("more than %d entries under %s: narrow the pattern" % (MAX_LIST_SCAN, top))
        for name in sorted(files):
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                out.append(_entry(path, os.path.join(rel_top, os.path.relpath(path, top)), st))
        if len(out) > MAX_LIST_FILES:
            raise TooMany("more than %d files match: narrow the pattern" % MAX_LIST_FILES)


def list_files(base: str, patterns: List[str]) -> Dict[str, Any]:
    """The regular files the patterns name, relative to ``base`` unless absolute; globs allowed; a directory
    stands for every file under it. ``rel`` is where each goes under the destination: the matched name, and
    below it the path inside a matched directory."""
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError("patterns must be a non-empty list of paths")
    base = os.path.abspath(os.path.expanduser(base or "~"))
    out: List[Dict[str, Any]] = []
    missing: List[str] = []
    budget = [MAX_LIST_SCAN]
    for pattern in patterns:
        full = os.path.join(base, os.path.expanduser(pattern))
        matches = sorted(glob.iglob(full)) if glob.has_magic(full) else [full]
        found = False
        for count, path in enumerate(matches):
            if count > MAX_LIST_SCAN:
                raise TooMany("more than %d paths match %s: narrow the pattern" % (MAX_LIST_SCAN, pattern))
            try:
                st = os.stat(path)
            except OSError:
                continue
            name = os.path.basename(os.path.normpath(path))
            if stat.S_ISDIR(st.st_mode):
                _walk(path, name, out, budget)
                found = True
            elif stat.S_ISREG(st.st_mode):
                out.append(_entry(os.path.abspath(path), name, st))
                found = True
            if len(out) > MAX_LIST_FILES:
                raise TooMany("more than %d files match: narrow the pattern" % MAX_LIST_FILES)
        if not found:
            missing.append(pattern)
    if len(json.dumps(out)) > MAX_LIST_BYTES:
        raise TooMany(
            "the %d matching files make too long a listing for one reply: narrow the pattern" % len(out)
        )
    return {"base": base, "files": out, "missing": missing}


def read_range(path: str, offset: int, max_bytes: int) -> P.Raw:
    """At most ``max_bytes`` of the regular file ``path`` from ``offset``, with its size and mtime now."""
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        data = os.pread(fd, max_bytes, offset) if offset < st.st_size else b""
    finally:
        os.close(fd)
    return P.Raw(
        '{"offset":%d,"size":%d,"mtime":%r,"b64":"%s"}' % (offset, st.st_size, st.st_mtime, P.b64(data))
    )


def cat_file(path: str, offset: int, limit: Optional[int] = None, block: int = 1024 * 1024) -> int:
    """Copy the regular file ``path`` from ``offset`` (at most ``limit`` bytes) to stdout: the raw byte stream
    for big pulls and log catch-ups (no JSON, no base64). Exit status 2 with the reason on stderr when it
    cannot be read."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        sys.stderr.write("gputui-agent: cannot read %s: %s\n" % (path, exc.strerror or exc))
        return 2
    out = sys.stdout.buffer
    try:
        end = None if limit is None else offset + max(0, limit)
        while end is None or offset < end:
            data = os.pread(fd, block if end is None else min(block, end - offset), offset)
            if not data:
                break
            out.write(data)
            offset += len(data)
        out.flush()
    except BrokenPipeError:
        return 1
    finally:
        os.close(fd)
    return 0


def file_hash(path: str) -> Dict[str, Any]:
    """sha256 of the regular file ``path`` (streamed), with the size and mtime it had when hashing began."""
    fd = open_regular(path)
    digest = hashlib.sha256()
    try:
        st = os.fstat(fd)
        with os.fdopen(os.dup(fd), "rb") as f:
            for block in iter(lambda: f.read(HASH_BLOCK), b""):
                digest.update(block)
    finally:
        os.close(fd)
    return {"sha256": digest.hexdigest(), "size": st.st_size, "mtime": st.st_mtime}


# --- sync: files written into a target dir, with a manifest of what was written ---------------------------------
#: Most manifest entries one page carries.
MANIFEST_PAGE = 5000
MAX_DELETE = 1000
_manifest_lock = threading.Lock()


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


def _open_parent(target: str, parts: List[str], create: bool) -> int:
    """An fd of the directory holding ``parts[-1]`` inside ``target``, walked without following a symlink
    (a link planted on the host can never redirect a write out of the target)."""
    if create:
        os.makedirs(target, exist_ok=True)
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                new = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:  # made meanwhile by a write in another thread
                    pass
                new = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ValueError(
                        "refusing %s: %s is a symlink or not a directory on the host"
                        % ("/".join(parts), "/".join(parts[: i + 1]))
                    ) from None
                raise
            os.close(fd)
            fd = new
    except BaseException:
        os.close(fd)
        raise
    return fd


def _regular(fd: int, parts: List[str]) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ValueError("refusing %s: not a regular file on the host" % "/".join(parts))


def _part_name(name: str) -> str:
    return "." + name[:200] + ".gputui-part"


def write_file(state_dir: str, a: Dict[str, Any]) -> Dict[str, Any]:
    """Write one chunk of ``rel`` into its part file (``truncate`` starts it afresh); with ``commit``
    (sha256, mode, mtime_ns) check the whole part's sha256 and rename it into place atomically."""
    target = target_dir(a.get("target"))
    parts = _parts(a.get("rel"))
    data = P.unb64(str(a.get("b64") or ""))
    if len(data) > P.FILE_CHUNK_BYTES:
        raise ValueError("chunk of %d bytes exceeds %d" % (len(data), P.FILE_CHUNK_BYTES))
    offset = P.int_arg(a, "offset", 0)
    dfd = _open_parent(target, parts, create=True)
    try:
        part = _part_name(parts[-1])
        flags = (
            os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if a.get("truncate") else 0)
        )
        fd = os.open(part, flags, 0o600, dir_fd=dfd)
        try:
            if data:
                os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        commit = a.get("commit")
        if not isinstance(commit, dict):
            return {"written": len(data)}
        return _commit(state_dir, target, parts, dfd, commit)
    finally:
        os.close(dfd)


def _commit(state_dir: str, target: str, parts: List[str], dfd: int, c: Dict[str, Any]) -> Dict[str, Any]:
    part, name = _part_name(parts[-1]), parts[-1]
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
             "sha256": c["sha256"], "mode": stat.S_IMODE(st.st_mode)}  # fmt: skip
    _journal(state_dir, target, [entry])
    return entry


def _manifest_path(state_dir: str, target: str) -> str:
    name = hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(state_dir, "sync", name + ".jsonl")


def _journal(state_dir: str, target: str, entries: List[Dict[str, Any]]) -> None:
    path = _manifest_path(state_dir, target)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)
    with _manifest_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)


def _manifest(state_dir: str, target: str) -> Dict[str, Dict[str, Any]]:
    """What sync wrote into ``target`` and is still there unchanged (size and mtime as written)."""
    path = _manifest_path(state_dir, target)
    entries: Dict[str, Dict[str, Any]] = {}
    lines = 0
    with _manifest_lock:
        try:
            with open(path, "rb") as f:
                for line in f:
                    lines += 1
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a crash
                    if isinstance(e, dict) and isinstance(e.get("rel"), str):
                        if e.get("del"):
                            entries.pop(e["rel"], None)
                        else:
                            entries[e["rel"]] = e
        except FileNotFoundError:
            return {}
        for rel, e in list(entries.items()):
            try:
                st = os.lstat(os.path.join(target, rel))
                same = stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (e["size"], e["mtime_ns"])
            except (OSError, KeyError):
                same = False
            if not same:  # changed or removed on the host since: it must be sent again
                del entries[rel]
        if lines > 2 * len(entries) + 100:  # compact the journal
            write_atomic(path, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries.values())
                         .encode("utf-8", "surrogateescape"))  # fmt: skip
    return entries


def manifest_page(state_dir: str, a: Dict[str, Any]) -> Dict[str, Any]:
    """Entries of the target's manifest after ``after`` (in path order), at most MANIFEST_PAGE of them."""
    target = target_dir(a.get("target"))
    after = str(a.get("after") or "")
    entries = _manifest(state_dir, target)
    rels = sorted(r for r in entries if r > after)
    page = rels[:MANIFEST_PAGE]
    return {"target": target, "entries": [entries[r] for r in page], "more": len(rels) > len(page)}


def _remove_empty_parents(target: str, parts: List[str]) -> None:
    """Remove the directories above a deleted file that it left empty, innermost first, never the target
    itself; stops at the first one that still holds something (or is not a plain directory)."""
    for i in range(len(parts) - 1, 0, -1):
        try:
            dfd = _open_parent(target, parts[:i], create=False)
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
    known = _manifest(state_dir, target)
    deleted = []
    for rel in rels:
        parts = _parts(rel)
        if rel not in known:
            continue  # not ours, or changed on the host since: never deleted
        dfd = _open_parent(target, parts, create=False)
        try:
            os.unlink(parts[-1], dir_fd=dfd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)
        _remove_empty_parents(target, parts)
        deleted.append(rel)
    _journal(state_dir, target, [{"rel": r, "del": True} for r in deleted])
    return {"deleted": deleted}


def receive(state_dir: str, target: str, inp: Any, out: Any, block: int = 1024 * 1024) -> int:
    """``gputui sync``'s raw upload stream: a header line (JSON: rel, size, sha256, mode, mtime_ns) then
    exactly ``size`` raw bytes, file after file, until EOF. Each file is written like ``files.write`` does
    (part file, sha256 check, rename, manifest) and answered with one JSON line: {"rel", "ok"[, "error"]}.
    A refused file's bytes are read and dropped, so the stream stays in step."""
    target = target_dir(target)
    while True:
        line = inp.readline(65536)
        if not line:
            return 0
        if not line.endswith(b"\n"):
            sys.stderr.write("gputui-agent: receive: header line too long\n")
            return 2
        try:
            head = json.loads(line)
            rel, size = head.get("rel"), P.int_arg(head, "size", 0)
        except (ValueError, AttributeError) as exc:
            sys.stderr.write("gputui-agent: receive: bad header: %s\n" % exc)
            return 2
        reply: Dict[str, Any] = {"rel": rel, "ok": True}
        fd = dfd = -1
        try:
            parts = _parts(rel)
            dfd = _open_parent(target, parts, create=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(_part_name(parts[-1]), flags, 0o600, dir_fd=dfd)
            _regular(fd, parts)
        except (OSError, ValueError) as exc:
            reply = {"rel": rel, "ok": False, "error": str(exc)}
        left = size
        while left > 0:
            data = inp.read(min(block, left))
            if not data:
                return 1  # the client went away mid-file: the part file stays, nothing renamed
            left -= len(data)
            if fd >= 0:
                os.write(fd, data)
        try:
            if fd >= 0:
                os.close(fd)
                fd = -1
                _commit(state_dir, target, parts, dfd, head)
        except (OSError, ValueError, KeyError) as exc:
            reply = {"rel": rel, "ok": False, "error": str(exc)}
        finally:
            if fd >= 0:
                os.close(fd)
            if dfd >= 0:
                os.close(dfd)
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()

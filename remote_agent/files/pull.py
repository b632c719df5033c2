"""What ``gputui pull`` reads on the host: listings (``files.list``), chunks (``files.read``), hashes
(``files.hash``) and the raw stream of a file (``cat``). Everything is bounded: a read returns at most one chunk, a
listing at most ``MAX_LIST_FILES`` entries, a hash streams the file. Reads refuse anything but regular files (a
FIFO would hang the agent). Stdlib only, Python 3.8+.
"""

import glob
import hashlib
import json
import os
import stat
import sys
from typing import Any, Dict, List, Optional

from .. import protocol as P
from ..fsutil import open_regular

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

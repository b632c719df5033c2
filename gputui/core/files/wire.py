"""The host's answers to the ``files.*`` ops, parsed in one place: every field is checked (type and bounds)
before any code uses it, on every path that asks (``pull``, ``release --pull`` and the app's artifact check,
``sync``). A reply that does not follow the protocol is a :class:`WireError` naming the host, the op and the
field; it exits 1 like any failed operation (the host answered, but not as the protocol says).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gputui.core import safetext
from gputui.core.errors import GputuiError
from remote_agent import protocol as P

#: Bounds of what a host sends about a file.
MAX_SIZE = 2**62
MAX_MTIME = 2.0**36  # about the year 4147: beyond it os.utime overflows on some platforms
MAX_PATH = 4096
_SHA256 = re.compile(r"[0-9a-f]{64}")


class WireError(GputuiError):
    """A host's answer that does not follow the protocol (a field missing, of the wrong type or out of bounds,
    or no answer at all while the link lives)."""


def wire_error(host: str, op: str, what: str) -> WireError:
    """The error for an answer of ``host`` to ``op`` that does not follow the protocol; ``what``: which field."""
    return WireError(f"{host} answered {op} with data that does not follow the protocol: "
                     f"{safetext.clean(what, limit=200)}")


@dataclass(frozen=True)
class Remote:
    """A file on the host as files.list gives it."""

    path: str  # absolute on the host
    rel: str  # where it goes under the destination
    size: int
    mtime: float
    mode: int


@dataclass(frozen=True)
class Listing:
    """A files.list answer: the files found, the patterns that matched nothing, the base they are relative to."""

    files: list[Remote]
    missing: list[str]
    base: str


@dataclass(frozen=True)
class Chunk:
    """A files.read answer: the file's size and mtime now, and the bytes read."""

    size: int
    mtime: float
    data: bytes


@dataclass(frozen=True)
class Digest:
    """A files.hash answer."""

    sha256: str
    size: int


@dataclass(frozen=True)
class ManifestPage:
    """A files.manifest answer: entries ``{"rel", "sha256", "mode"}``; ``same``: the host's tree hashes as asked."""

    target: str
    entries: list[dict[str, Any]]
    more: bool
    same: bool


def _object(host: str, op: str, res: Any) -> dict[str, Any]:
    if not isinstance(res, dict):
        raise wire_error(host, op, f"the reply is {type(res).__name__}, not an object")
    return res


def _text(host: str, op: str, field: str, value: Any) -> str:
    """A non-empty string without NUL, at most MAX_PATH long (a path or a name)."""
    if not isinstance(value, str) or not value or "\0" in value or len(value) > MAX_PATH:
        raise wire_error(host, op, f"{field} is {value!r:.80}")
    return value


def _size(host: str, op: str, field: str, value: Any) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SIZE:
        raise wire_error(host, op, f"{field} is {value!r:.40}")
    return value


def _mtime(host: str, op: str, field: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) \
            or not -MAX_MTIME < value < MAX_MTIME:
        raise wire_error(host, op, f"{field} is {value!r:.40}")
    return float(value)


def _mode(host: str, op: str, field: str, value: Any) -> int:
    if type(value) is not int or not 0 <= value <= 0o7777:
        raise wire_error(host, op, f"{field} is {value!r:.40}")
    return value


def _sha256(host: str, op: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise wire_error(host, op, f"{field} is {value!r:.80}")
    return value


def _list(host: str, op: str, field: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise wire_error(host, op, f"{field} is {type(value).__name__}, not a list")
    return value


def listing(host: str, res: Any) -> Listing:
    """A files.list answer: each file's path (absolute) and rel non-empty strings without NUL, size a whole
    number, mtime a finite number, mode a permission mask; missing a list of strings, base a string."""
    op = P.OP_FILES_LIST
    res = _object(host, op, res)
    got, missing = _list(host, op, "files", res.get("files")), _list(host, op, "missing", res.get("missing", []))
    base = res.get("base", "")
    if not isinstance(base, str):
        raise wire_error(host, op, f"base is {base!r:.80}")
    if not all(isinstance(m, str) for m in missing):
        raise wire_error(host, op, "a missing pattern is no string")
    return Listing([_remote(host, i, f) for i, f in enumerate(got)], missing, base)


def _remote(host: str, i: int, f: Any) -> Remote:
    op, at = P.OP_FILES_LIST, f"files[{i}]"
    if not isinstance(f, dict):
        raise wire_error(host, op, f"{at} is {type(f).__name__}, not an object")
    path = _text(host, op, f"{at}.path", f.get("path"))
    if not path.startswith("/"):
        raise wire_error(host, op, f"{at}.path {path!r:.80} is not absolute")
    of = f"{at}.%s (of {path!r:.80})"
    return Remote(
        path, _text(host, op, of % "rel", f.get("rel")), _size(host, op, of % "size", f.get("size")),
        _mtime(host, op, of % "mtime", f.get("mtime")), _mode(host, op, of % "mode", f.get("mode")),
    )


def chunk(host: str, path: str, res: Any, with_data: bool = True) -> Chunk:
    """A files.read answer of ``path``: size, mtime and (``with_data``: asked for bytes) the base64 bytes."""
    op = P.OP_FILES_READ
    res = _object(host, op, res)
    size = _size(host, op, f"size of {path}", res.get("size"))
    mtime = _mtime(host, op, f"mtime of {path}", res.get("mtime"))
    if not with_data:
        return Chunk(size, mtime, b"")
    try:
        return Chunk(size, mtime, P.unb64(res.get("b64")))
    except (ValueError, AttributeError, TypeError):
        raise wire_error(host, op, f"b64 of {path} is not base64") from None


def digest(host: str, path: str, res: Any) -> Digest:
    """A files.hash answer of ``path``: its sha256 (64 hex digits) and size."""
    op = P.OP_FILES_HASH
    res = _object(host, op, res)
    sha = _sha256(host, op, f"sha256 of {path}", res.get("sha256"))
    return Digest(sha, _size(host, op, f"size of {path}", res.get("size")))


def manifest_page(host: str, res: Any) -> ManifestPage:
    """A files.manifest answer: target a string, entries each ``{"rel", "sha256", "mode"}`` checked, more and
    same true or false."""
    op = P.OP_FILES_MANIFEST
    res = _object(host, op, res)
    target, more, same = res.get("target"), res.get("more", False), res.get("same", False)
    if not isinstance(target, str):
        raise wire_error(host, op, f"target is {target!r:.80}")
    if not isinstance(more, bool) or not isinstance(same, bool):
        raise wire_error(host, op, f"more or same is no bool ({more!r:.20}, {same!r:.20})")
    got = _list(host, op, "entries", res.get("entries"))
    return ManifestPage(target, [manifest_entry(host, e, op, f"entries[{i}]") for i, e in enumerate(got)], more, same)


def manifest_entry(host: str, e: Any, op: str = P.OP_FILES_MANIFEST, at: str = "an entry") -> dict[str, Any]:
    """One manifest entry (of files.manifest, or of the upload stream's acknowledgements, ``op``):
    ``{"rel", "sha256", "mode"}``, each checked."""
    if not isinstance(e, dict):
        raise wire_error(host, op, f"{at} is {type(e).__name__}, not an object")
    rel = _text(host, op, f"{at}.rel", e.get("rel"))
    of = f"{at}.%s (of {rel!r:.80})"
    return {"rel": rel, "sha256": _sha256(host, op, of % "sha256", e.get("sha256")),
            "mode": _mode(host, op, of % "mode", e.get("mode"))}


def deleted(host: str, res: Any) -> list[str]:
    """A files.delete answer: the rels it deleted."""
    op = P.OP_FILES_DELETE
    gone = _list(host, op, "deleted", _object(host, op, res).get("deleted"))
    if not all(isinstance(g, str) for g in gone):
        raise wire_error(host, op, "a deleted rel is no string")
    return gone

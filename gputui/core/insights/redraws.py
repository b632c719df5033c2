"""Runs of tqdm redraws, read in bulk.

A tqdm bar redraws itself with ``\\r`` several times a second, so a log holds long runs of redraws of
one bar that differ only in their count, times and postfix. Once the parser has read one redraw line
by line, :func:`redraw_pattern` names the bar (description, total), and :func:`read_run` takes the run
of its redraws that follows with one regex over all of them and the postfix metrics by column, instead
of a pass per line. The parser applies the result so that its state is the same as if it had read every
redraw on its own (tests/test_insights_speed.py checks this on every fixture and on the bench log).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

from .log_hints import first_hint_key
from .patterns import EPOCH, TABLE_ROW

_SEG_NUM = rb"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# the text before a tqdm count: "{desc}{pct}%|{bar}| " (descriptions over 200 characters are read line by line)
_PREFIX = re.compile(r"(.{0,200}?)[ \t]*\d{1,3}%\|[^|\[\]\x1b]{0,400}\|[ \t]*")
_PCT = re.compile(rb"[ \t]*\d{1,3}%\|")  # how a bar without a description starts
_KEY = re.compile(r"[A-Za-z_][\w./\-]{0,47}")
_EPOCH_STOPS = frozenset(" \t/o([]0123456789")  # characters that an epoch match could run on into


# tqdm's rate ("12.3it/s", "1.2kit/s", "?it/s", "4.56s/it"); lower-case units only, so it holds no hint key
_RATE = rb"(?:\?|\d+(?:\.\d+)?[kMGTP]?)[a-z]{0,12}/s|\d+(?:\.\d+)?s/[a-z]{0,12}"


# one redraw after its description, on a line of its own: "{pct}%|{bar}| {n}/{total} [{el}<{rem}, {rate}, {post}]";
# groups: n, total, elapsed, remaining, rate, postfix


def _tail(keep: str) -> re.Pattern[bytes]:
    """The pattern of one redraw after its description, capturing the fields named in ``keep``."""

    def g(name: str, body: bytes) -> bytes:
        return (b"(" if name in keep else b"(?:") + body + b")"

    return re.compile(
        rb"(?m)^[ \t]*\d{1,3}%\|[^|\[\n]{0,400}\|[ \t]*"
        + g("n", rb"\d+(?:\.\d+)?[kMGTP]?")
        + b"/"
        + g("total", rb"\d+(?:\.\d+)?[kMGTP]?")
        + rb"[A-Za-z]{0,16}[ \t]*\["
        + g("el", rb"\d+(?::\d\d)+")
        + b"(?:<"
        + g("rem", rb"\d+(?::\d\d)+|\?")
        + rb")?,[ \t]*"
        + g("rate", _RATE)
        + rb"(?:,[ \t]*"
        + g("post", rb"[^\[\]\n\x1b]{0,2000}")
        + rb")?\][ \t]*$"
    )


_TAIL = _tail("n total el rem rate post")  # the last redraw of a run: all its fields
_TAIL_POSTS = _tail("total post")  # every redraw of a run


@dataclass(frozen=True)
class Redraws:
    """The bar a run of redraws must belong to; ``poch``/``POCH``: their counts in its description."""

    desc: bytes
    total: bytes
    poch: int
    POCH: int


@dataclass
class Run:
    """Lines ``start..stop`` of a feed: redraws of one bar. ``last`` is empty when they must be read
    line by line; else the last one's n, total, elapsed, remaining, rate and postfix, ``posts`` the
    postfixes that differ from the one before them and ``columns`` the metric values of posts[1:]."""

    stop: int
    last: tuple[bytes, ...] = ()
    last_text: bytes = b""
    posts: list[bytes] = field(default_factory=list)
    columns: list[tuple[str, list[float]]] = field(default_factory=list)


def redraw_pattern(prefix: str, total: str) -> Redraws | None:
    """The bar whose text before its count is ``prefix`` ("Epoch 3/5:  45%|███  | "), with ``total``
    as its total; None when its shape is unusual (then its redraws are read line by line)."""
    m = _PREFIX.fullmatch(prefix)
    if m is None:
        return None
    desc = m.group(1)
    if TABLE_ROW.match(desc) or (
        (desc and desc[-1].isalnum())
        or "[" in desc
        or "pochs" in desc.lower()
        or first_hint_key(desc.encode()) >= 0
    ):
        return None  # a hint, an epoch total or a count that could run on into the varying text
    if "poch" in desc or "POCH" in desc:  # the epoch must be read from the description alone
        e = EPOCH.search(desc)
        if e is None or e.end() >= len(desc) or desc[e.end()] in _EPOCH_STOPS:
            return None
    return Redraws(desc.encode(), total.encode(), desc.count("poch"), desc.count("POCH"))


@lru_cache(maxsize=64)
def _postfix_shape(keys: tuple[str, ...]) -> re.Pattern[bytes]:
    """One postfix per line with exactly these keys in this order, each with a plain number."""
    body = rb",[ \t]*".join(re.escape(k.encode()) + rb"[ \t]*=[ \t]*(" + _SEG_NUM + rb")" for k in keys)
    return re.compile(rb"(?m)^" + body + rb"$")


def _postfix_keys(post: bytes) -> tuple[str, ...] | None:
    """The keys of a postfix made only of "key=number" parts ("loss=0.12, acc=0.9"), else None."""
    keys = []
    for part in post.decode("ascii", "replace").split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key) or re.fullmatch(_SEG_NUM.decode(), value.strip()) is None:
            return None
        keys.append(key)
    names = [k.lower() for k in keys]
    return tuple(keys) if len(set(names)) == len(names) else None


def read_run(r: Redraws, lines: list[bytes], i: int, bar_post: bytes | None) -> Run | None:
    """The redraws of ``r``'s bar in ``lines`` from ``i`` on (None: line ``i`` is not one).

    All of them are left to the line-by-line reading when one does not parse as a redraw of the bar or
    has a postfix that may hold a hint, names an epoch, is not plain numbers or has a non-finite value.
    """
    desc, n, j = r.desc, len(lines), i
    if not lines[i]:
        return None
    if desc:
        while j < n and (lines[j].startswith(desc) or not lines[j]):
            j += 1
    else:
        while j < n and (not lines[j] or _PCT.match(lines[j])):
            j += 1
    segs = lines[i:j]
    count = len(segs) - segs.count(b"")
    if not count:
        return None
    body = b"\n".join(segs)
    if desc:
        body = body.replace(b"\n" + desc, b"\n")[len(desc) :]
    rows = _TAIL_POSTS.findall(body)
    if len(rows) != count or b"poch" in body or b"POCH" in body or {t for t, _ in rows} != {r.total}:
        return Run(j)
    posts: list[bytes] = []
    prev = bar_post
    for _, post in rows:
        post = post.strip()
        if post and post != prev:
            posts.append(post)
            prev = post
    columns = _postfix_columns(posts) if posts else []
    if columns is None:
        return Run(j)
    last = next(line for line in reversed(segs) if line)
    m = _TAIL.match(last[len(desc) :])
    assert m is not None  # it matched above, inside the body
    return Run(j, m.groups(default=b""), last, posts, columns)


def _postfix_columns(posts: list[bytes]) -> list[tuple[str, list[float]]] | None:
    """(metric name, values of posts[1:]) per key of postfixes that all have the same plain-number
    keys; None when they do not, a key may hold a hint or a value is not finite."""
    keys = _postfix_keys(posts[0])
    if keys is None or first_hint_key(",".join(keys).encode()) >= 0:
        return None
    prefix = keys[0].encode() + b"="
    table: list[tuple[float, ...]] = []
    if len(keys) == 1 and all(p.startswith(prefix) for p in posts):  # the usual "loss=0.123"
        try:
            table = [(float(p[len(prefix) :]),) for p in posts]
        except ValueError:
            table = []
    if not table:
        rows = _postfix_shape(keys).findall(b"\n".join(posts))
        if len(rows) != len(posts):
            return None
        table = [(float(v),) for v in rows] if len(keys) == 1 else [tuple(map(float, row)) for row in rows]
    columns = []
    for k, key in enumerate(keys):
        column = [row[k] for row in table]
        if not all(map(math.isfinite, column)):
            return None
        columns.append((key.lower(), column[1:]))
    return columns

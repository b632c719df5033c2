"""Runs of tqdm redraws, read in bulk.

A tqdm bar redraws itself with ``\\r`` several times a second, so a log holds long runs of redraws of
one bar that differ only in their count, times and postfix. Once the parser has read one redraw line
by line, :func:`redraw_pattern` names the bar (description, total), and :func:`read_run` takes the run
of its redraws that follows (and the lines between them that no parsing rule can match) without a
regex per line: neighbouring redraws have the same shape once each digit reads 0, one cached regex
match per shape says where the total and the postfix are, and the postfix metrics are read by column.
The parser applies the result so that its state is the same as if it had read every line on its own
(tests/test_insights_speed.py checks this on every fixture, edge cases and the bench log).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby, islice, takewhile
from operator import methodcaller

from .log_hints import HINT_KEYS, first_hint_key
from .patterns import EPOCH, MAX_LINE, TABLE_ROW

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


_TAIL = _tail("n total el rem rate post")  # a redraw's fields
_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")
_SHAPE_HINT = re.compile(b"|".join(re.escape(key.encode().translate(_DIGITS_AS_0)) for key in HINT_KEYS))


@dataclass(frozen=True)
class Redraws:
    """The bar a run of redraws must belong to; ``poch``/``POCH``: their counts in its description."""

    desc: bytes
    total: bytes
    poch: int
    POCH: int


@dataclass
class Run:
    """Lines ``start..stop`` of a feed: redraws of one bar and lines that can only hold hints. ``last`` is
    empty when they must be read line by line; else the last redraw's n, total, elapsed, remaining, rate
    and postfix, ``posts`` the postfixes that differ from the one before them, ``columns`` the metric
    values of posts[1:] and ``others`` the lines that are no redraws."""

    stop: int
    last: tuple[bytes, ...] = ()
    last_text: bytes = b""
    posts: list[bytes] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    others: list[bytes] = field(default_factory=list)  # the lines between the redraws, in order


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


def read_run(
    r: Redraws,
    lines: list[bytes],
    i: int,
    bar_post: bytes | None,
    needs: Callable[[bytes], int],
    keep: int,
) -> Run | None:
    """The redraws of ``r``'s bar in ``lines`` from line ``i`` on (None: line ``i`` is not one), and the
    lines between them that no parsing rule can match (``needs(line) & 1 == 0``: they may only hold hints);
    ``keep``: how many of each metric's newest values are read (see :class:`Column`).

    All of them are left to the line-by-line reading when one does not parse as a redraw of the bar or
    has a postfix that may hold a hint, names an epoch, is not plain numbers or has a non-finite value.
    """
    desc = r.desc
    if not (lines[i].startswith(desc) if desc else _PCT.match(lines[i])):
        return None
    is_redraw = methodcaller("startswith", desc) if desc else _PCT.match
    reds: list[bytes] = []
    others: list[bytes] = []
    j, n = i, len(lines)
    while True:
        seg = list(takewhile(is_redraw, islice(lines, j, None)))  # no Python loop over the redraws
        reds += seg
        stop = j = j + len(seg)
        gap = j
        while j < n and (not lines[j] or (b"\x1b" not in lines[j] and not needs(lines[j][-MAX_LINE:]) & 1)):
            j += 1
        if j in (gap, n) or not is_redraw(lines[j]):
            break  # the lines after the last redraw are not part of the run
        others += [line for line in lines[gap:j] if line]
    posts = _posts(reds, len(r.desc), r.total)
    if posts is None:
        return Run(stop)
    if posts:  # the changed ones only
        posts = [p for p, before in zip(posts, [bar_post, *posts[:-1]], strict=True) if p != before]
    columns = _postfix_columns(posts, keep) if posts else []
    if columns is None:
        return Run(stop)
    m = _TAIL.match(reds[-1][len(r.desc) :])
    assert m is not None  # it matched above
    return Run(stop, m.groups(default=b""), reds[-1], posts, columns, others)


def _posts(reds: list[bytes], d: int, total: bytes) -> list[bytes] | None:
    """The non-empty postfixes of these redraws (whose description is ``d`` bytes long), stripped; None
    when one is not a plain redraw of a bar of this total.

    Redraws that are equal once each digit reads 0 (most neighbours: only the count, times, rate and
    values change) parse the same way, since no rule tells one digit from another: so one regex match
    per such shape (cached) tells where the total and the postfix are in all of them.
    """
    body = b"\n".join(reds)
    shapes = body.translate(_DIGITS_AS_0).split(b"\n")
    posts: list[bytes] = []
    start = offset = 0
    for shape, group in groupby(shapes):
        k = len(list(group))
        spans = _shape(shape, d)
        if spans is None:
            return None
        t0, p0, p1 = spans
        width = len(shape) + 1  # the lines of a group are as long as their shape
        end = offset + k * width
        for c in range(len(total)):  # the total, one byte column of the group at a time
            if body[offset + t0 + c : end : width] != total[c : c + 1] * k:
                return None
        if p1 > p0:
            posts += [line[p0:p1] for line in reds[start : start + k]]
        start += k
        offset = end
    return posts


@lru_cache(maxsize=256)
def _shape(shape: bytes, d: int) -> tuple[int, int, int] | None:
    """Where the total starts and the stripped postfix starts and ends in redraws of this shape (digits
    read 0) after a description of ``d`` bytes; None when it is no redraw, names an epoch or may hold a hint."""
    tail = shape[d:]
    m = _TAIL.match(tail)
    if m is None or b"poch" in tail or b"POCH" in tail or _SHAPE_HINT.search(tail):
        return None
    p0, p1 = m.span(6)
    post = tail[p0:p1] if p0 >= 0 else b""
    p0 = d + max(p0, 0) + len(post) - len(post.lstrip())
    return d + m.start(2), p0, p0 + len(post.strip())


@dataclass(frozen=True)
class Column:
    """The values of one postfix key over a run: how many, the last, the lowest, the highest and the
    newest ``keep`` of them (all finite; as text, which ``float()`` reads, or as floats)."""

    name: str
    count: int
    last: float
    low: float
    high: float
    newest: list[bytes] | list[float]


def _postfix_columns(posts: list[bytes], keep: int) -> list[Column] | None:
    """One :class:`Column` per key of posts[1:], for postfixes that all have the same plain-number keys;
    None when they do not, a key may hold a hint or a value is not finite."""
    keys = _postfix_keys(posts[0])
    if keys is None or first_hint_key(",".join(keys).encode()) >= 0:
        return None
    values: list[list[bytes]] | list[tuple[bytes, ...]] = []
    if len(keys) == 1:  # the usual "loss=0.123": no regex
        mark = b"\n" + keys[0].encode() + b"="
        blob = b"\n" + b"\n".join(posts)
        if blob.count(mark) == len(posts):
            values = [blob.replace(mark, b"\n")[1:].split(b"\n")]
    if not values:
        rows = _postfix_shape(keys).findall(b"\n".join(posts))
        if len(rows) != len(posts):
            return None
        values = [rows] if len(keys) == 1 else list(zip(*rows, strict=True))
    columns = []
    for key, column in zip(keys, values, strict=True):
        summary = _summary(list(column[1:]), keep)
        if summary is None:
            return None
        if summary:
            columns.append(Column(key.lower(), *summary))
    return columns


_DECIMAL = re.compile(rb"0+(?:\.0*)?|\.0+")  # the shape of a plain unsigned decimal (digits read 0)


def _summary(
    values: list[bytes], keep: int
) -> tuple[int, float, float, float, list[bytes] | list[float]] | tuple[()] | None:
    """(count, last, lowest, highest, newest ``keep``) of numbers as text; () when there are none, None when
    one is not a finite number. Plain decimals of one shape ("0.1234") compare as text, so only the last,
    the lowest and the highest are read as floats."""
    if not values:
        return ()
    shapes = b"\n".join(values).translate(_DIGITS_AS_0) + b"\n"
    first = shapes[: shapes.index(b"\n") + 1]
    if shapes == first * len(values) and _DECIMAL.fullmatch(first, 0, len(first) - 1):
        return len(values), float(values[-1]), float(min(values)), float(max(values)), values[-keep:]
    try:
        floats = list(map(float, values))
    except ValueError:
        return None
    if not all(map(math.isfinite, floats)):
        return None
    return len(floats), floats[-1], min(floats), max(floats), floats[-keep:]

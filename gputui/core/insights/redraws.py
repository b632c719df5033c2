"""Runs of tqdm redraws, read in bulk.

A tqdm bar redraws itself with ``\\r`` several times a second, so a log holds long runs of redraws of one bar
that differ only in their count, times and postfix. Once the parser has read one redraw line by line,
:func:`redraw_pattern` names the bar (description, total), and :func:`read_run` takes the run of its redraws
that follows (and the lines between them that no parsing rule can match) without a regex per line: where
neighbouring redraws have the same shape once each digit reads 0, one cached regex match per shape says where
the total and the postfix are, and the postfix metrics are cut out by column with one cached
:class:`struct.Struct`; where their shapes change every few lines (tqdm writes its own postfix numbers in
varying widths, "0.386" then "0.39", and its bar fills in partial blocks), one pattern made from a redraw
reads them all in one ``findall``. An HF dict line that only adds metric values joins the columns in line
order (:func:`read_run`'s ``absorb``); other lines that must be read on their own (a print) cut the run into
segments: the parser reads them between the segments and goes on in bulk while they change nothing that the
bulk reading assumed. A new epoch's bar (:func:`other_epoch`) starts a run of its own. The parser applies the
result so that its state is the same as if it had read every line on its own
(tests/test_insights_speed.py checks this on every fixture, edge cases and the bench log).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from itertools import chain, compress, count, groupby, repeat
from operator import eq, ne, not_
from struct import Struct
from typing import NamedTuple

from .log_hints import first_hint_key
from .metrics import metric_kind
from .patterns import COLON_COUNT, DIGITS_AS_0, EPOCH, HINT_GATE, INNER, MAX_LINE, TABLE_ROW

_SEG_NUM = rb"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# the text before a tqdm count: "{desc}{pct}%|{bar}| " (descriptions over 200 characters are read line by line)
# (tqdm leaves the "|{bar}|" out where the line has no room for it: "Epoch 0:  97% 1651/1702 [...]")
_PREFIX = re.compile(r"(.{0,200}?)[ \t]*\d{1,3}%(?:\|[^|\[\]\x1b]{0,400}\||(?=[ \t]))[ \t]*")
_PCT = re.compile(rb"[ \t]*\d{1,3}%[| \t]")  # how a bar without a description starts
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
        rb"(?m)^[ \t]*\d{1,3}%(?:\|[^|\[\n]{0,400}\||(?=[ \t]))[ \t]*"
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
# one "key=number" part of a plain postfix ("loss=0.123", " lr = 1e-05")
_PAIR = re.compile(rb"[ \t]*([A-Za-z_][\w./\-]{0,47})[ \t]*=[ \t]*(" + _SEG_NUM + rb")[ \t]*")


Inline = Sequence[tuple[str, float]]  # the metric values of a line read inside a run, in order


class Redraws(NamedTuple):
    """The bar a run of redraws must belong to: its description and total; the epoch it names, and when
    that is all it says of epochs ("Epoch 3/50: ", no count inside the epoch) the total it gives ("50" or
    "") in ``of`` (else None: the parser reads the description's epoch on its own); with an epoch, the
    description's text before its first digit (``lead``) and where its epoch and total are (``at``), which
    are the same in every epoch's bar (see :func:`other_epoch`)."""

    desc: bytes
    total: bytes
    epoch: int | None = None
    of: str | None = None
    lead: bytes = b""
    at: tuple[slice, slice | None] = (slice(0), None)


class Segment(NamedTuple):
    """Redraws of a run up to a line that must be read on its own (a print between two redraws), or to the
    run's end: ``stop`` the line after its last redraw and ``gap`` the line of the next segment's first
    redraw (``stop`` for the last segment); ``last`` the last redraw's n, total, elapsed, remaining and rate,
    ``last_text`` that redraw; ``post`` the last of its postfixes that differ from the one before them (None:
    none does), ``first`` the run's first such postfix when it is in this segment (read on its own),
    ``columns`` the metric values of the other changed postfixes; ``others`` the lines between its redraws
    that may hold a hint (and no more), in order; ``bar`` the bar its redraws are of (one epoch's)."""

    stop: int
    gap: int
    last: tuple[bytes, ...]
    last_text: bytes
    post: bytes | None
    first: bytes | None
    columns: Sequence[Column]
    others: Sequence[bytes]
    bar: Redraws


class Run(NamedTuple):
    """Lines ``start..stop`` of a feed: redraws of one bar and the lines between them, in segments (see
    :class:`Segment`); no segments when they must be read line by line."""

    stop: int
    segments: Sequence[Segment] = ()


GAP_LINES = 8  # lines between two redraws of a run, one of them to be read on its own, at most
MIN_REDRAWS = 2  # redraws that a segment of a run has at least when a line to be read on its own ends it


@lru_cache(maxsize=256)
def redraw_pattern(prefix: str, total: str) -> Redraws | None:
    """The bar whose text before its count is ``prefix`` ("Epoch 3/5:  45%|███  | "), with ``total``
    as its total; None when its shape is unusual (then its redraws are read line by line). Cached: a bar's
    prefix changes once per percent."""
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
    epoch = of = None
    if "poch" in desc or "POCH" in desc:  # the epoch must be read from the description alone
        e = EPOCH.search(desc)
        if e is None or e.end() >= len(desc) or desc[e.end()] in _EPOCH_STOPS:
            return None
        epoch = int(e.group(1))
        if not (e.group(4) or INNER.search(desc, e.end()) or COLON_COUNT.match(desc, e.end())):
            of = e.group(2) or ""
        raw = desc.encode()
        return Redraws(
            raw, total.encode(), epoch, of, raw[: raw.translate(DIGITS_AS_0).find(b"0")], _epoch_at(desc)
        )
    return Redraws(desc.encode(), total.encode())


def other_epoch(r: Redraws, line: bytes) -> Redraws | None:
    """The bar of ``r`` in another epoch when ``line`` starts with ``r``'s description with other digits
    ("Epoch 3/50:" after "Epoch 2/50:"), so that a new epoch's redraws are read in bulk from the first on;
    None otherwise. Whether the rest of the line is a redraw is :func:`read_run`'s to check, as for any run."""
    if r.epoch is None or not line.startswith(r.lead):
        return None
    desc = line[: len(r.desc)]
    if (
        desc == r.desc
        or desc.translate(DIGITS_AS_0) != r.desc.translate(DIGITS_AS_0)
        or first_hint_key(desc) >= 0
    ):
        return None
    # what redraw_pattern says of a description depends on its shape but for a hint's key ("Errno 28") and
    # the numbers it reads, which are where r's are
    epoch, of = r.at
    return r._replace(
        desc=desc, epoch=int(desc[epoch].decode()), of=desc[of].decode() if r.of and of else r.of
    )


def run_start(r: Redraws, line: bytes) -> Redraws | None:
    """The bar whose run of redraws ``line`` may start: ``r``'s when the line starts with its description (a
    bar without one: when it starts like a bar), the next epoch's (see :func:`other_epoch`), else None."""
    if not r.desc:
        return r if _PCT.match(line) else None
    if line.startswith(r.desc):
        return r
    return other_epoch(r, line) if r.epoch is not None and line.startswith(r.lead) else None


def _epoch_at(text: str) -> tuple[slice, slice | None]:
    """Where the epoch and the epochs' total are in a bar's description that names an epoch (bytes)."""
    e = EPOCH.search(text)
    assert e is not None  # (see redraw_pattern)

    def at(group: int) -> slice | None:
        a, b = e.span(group)
        return slice(len(text[:a].encode()), len(text[:b].encode())) if a >= 0 else None

    epoch = at(1)
    assert epoch is not None
    return epoch, at(2)


def _others(lines: list[bytes], j: int, desc: bytes) -> Iterator[int]:
    """The lines from line ``j`` on that are no redraw of a bar of this description (do not start with it, or
    do not look like a bar when it has none), in order: worked out in C a window of lines at a time, each
    twice as long as the one before (so the work stays in proportion to the lines looked at)."""
    size = 8  # (a short run, as in a log whose kinds of line interleave, costs little)
    while j < len(lines):
        window = lines[j : j + size]
        redraws = map(bytes.startswith, window, repeat(desc)) if desc else map(_PCT.match, window)
        yield from compress(count(j), map(not_, redraws))
        j, size = j + size, size * 2


def read_run(
    r: Redraws,
    lines: list[bytes],
    i: int,
    bar_post: bytes | None,
    needs: Callable[[bytes], int],
    keep: int,
    absorb: Callable[[bytes, Redraws], Inline | None] = lambda line, bar: None,
    most: int = 64,
) -> Run | None:
    """The redraws of ``r``'s bar in ``lines`` from line ``i`` on (None: line ``i`` is not one) and the
    lines between them: any number that no parsing rule can match (``needs(line) & 1 == 0``: they may
    only hold hints), or up to :data:`GAP_LINES` lines of which some must be read on their own (a print
    between redraws: the run is cut into segments there, and the parser reads them between its segments);
    ``keep``: how many of each metric's newest values are read (see :class:`Column`). A line to be read
    on its own that ``absorb`` reads (a dict line of metrics that change nothing else) does not cut the run:
    its values join the columns in line order. The run goes on with the bar of the next epoch
    (:func:`other_epoch`) in a segment of its own; it has ``most`` segments at most.

    All of them are left to the line-by-line reading when one does not parse as a redraw of the bar or
    has a postfix that may hold a hint, names an epoch, is not plain numbers or has a non-finite value.
    """
    bar, desc = r, r.desc
    if not (lines[i].startswith(desc) if desc else _PCT.match(lines[i])):
        return None
    lead = r.lead if r.epoch is not None else None  # how another epoch's redraws start (see other_epoch)
    reds: list[bytes] = []
    bars = [r]  # per segment
    others: list[list[bytes]] = [[]]
    inline: list[list[tuple[int, Inline]]] = [[]]  # (the redraws before it, its values) per absorbed line
    cuts: list[tuple[int, int, int]] = []  # per segment but the last: its redraws, stop and gap
    j, n = i, len(lines)
    other = _others(lines, i, desc)
    at = next(other, n)  # the first line from j on that is no redraw of the bar
    while True:
        reds += lines[j:at]
        stop = j = at
        if len(cuts) + 1 >= most:
            break
        read = False  # whether a line of the gap must be read on its own
        redraw = False  # whether the gap ends at a redraw
        after: Redraws | None = None  # the bar of that redraw when it is another epoch's
        absorbed: list[tuple[int, Inline]] = []
        hinted: list[bytes] = []  # the lines that may hold a hint
        while j < n:
            if j != at:  # a redraw: the next stretch of them starts here
                redraw = True
                break
            line = lines[j]
            if lead is not None and line.startswith(lead) and (after := other_epoch(bar, line)) is not None:
                redraw = True
                break
            if not read and line:
                need = 3 if b"\x1b" in line else needs(line[-MAX_LINE:])
                if need & 1:
                    values = absorb(line, bar)
                    if values is None:
                        read = True
                    else:
                        absorbed.append((len(reds), values))
                elif need:
                    hinted.append(line)
            if read and j - stop >= GAP_LINES:
                break
            j += 1
            at = next(other, n)
        if not redraw:
            break  # the lines after the last redraw are not part of the run
        if read and len(reds) - (cuts[-1][0] if cuts else 0) < MIN_REDRAWS:
            break  # a segment of one redraw is read faster line by line: the run ends before the gap
        if read or after is not None:
            cuts.append((len(reds), stop, j))
            bars.append(after or bar)
            others.append([])
            inline.append([])
        else:
            others[-1] += hinted
            inline[-1] += absorbed
        if after is not None:  # the next epoch's redraws from line j on
            bar, lead, other = after, after.lead, _others(lines, j, after.desc)
            at = next(other, n)
    cuts.append((len(reds), stop, stop))
    if len(reds) < MIN_REDRAWS:
        return Run(stop)  # read line by line
    while True:  # when they cannot be read in bulk, the first half of the segments (the parser reads on)
        run = _bulk(reds[: cuts[-1][0]], len(desc), r.total, bar_post, keep, cuts, others, inline, bars)
        if run is not None or len(cuts) == 1:
            return run or Run(cuts[0][1])
        cuts = cuts[: len(cuts) // 2]
        cuts[-1] = (cuts[-1][0], cuts[-1][1], cuts[-1][1])  # the last segment ends the run


class Layout(NamedTuple):
    """Where the fields are in every redraw of one shape (byte offsets in the line): n, total, elapsed,
    remaining and rate; the stripped postfix and its shape; per "key=number" part of a plain postfix (else
    None; () without a postfix) the key's and the number's; the shapes of those numbers; and the
    :mod:`struct` format that cuts a line's total and numbers out of it."""

    fields: tuple[tuple[int, int], ...]
    post: tuple[int, int]
    post_shape: bytes
    pairs: tuple[tuple[int, int, int, int], ...] | None
    numbers: tuple[bytes, ...]
    cut: str
    step: int  # the fields that it cuts per line
    keys: tuple[bytes, ...]  # the postfix's keys (digits read 0)
    digit_keys: tuple[tuple[int, int], ...]  # the index and the offset of each key with a digit


class Column(NamedTuple):
    """One postfix key's values over a run (all finite): how many, the last, the lowest, the highest (only
    the one that the metric's kind keeps as its best: see :func:`_summary`) and the newest ``keep`` of them
    (as text, which ``float()`` reads, or as floats)."""

    name: str
    added: int
    last: float
    low: float
    high: float
    newest: Sequence[bytes | float]


def _cut(spans: Sequence[tuple[int, int]], width: int) -> str:
    """The :mod:`struct` format that reads these byte spans (in order, apart) out of a ``width``-byte line."""
    fmt, at = [], 0
    for a, b in spans:
        fmt.append(f"{a - at}x{b - a}s")
        at = b
    return "".join(fmt) + f"{width - at}x"


CUT_LINES = 64  # lines of one shape that one cached struct cuts at once (so a cached struct stays small)


@lru_cache(maxsize=4096)
def _cutter(fmt: str, lines: int) -> Struct:
    """A :class:`struct.Struct` that cuts ``fmt``'s fields out of ``lines`` lines at once (in C)."""
    return Struct(fmt * lines)


def _cut_block(fmt: str, block: bytes, lines: int) -> tuple[bytes, ...] | list[bytes]:
    """``fmt``'s fields of each of the ``lines`` lines of ``block``, in order."""
    if lines <= CUT_LINES:
        return _cutter(fmt, lines).unpack(block)
    full, rest = divmod(lines, CUT_LINES)  # CUT_LINES lines at a time, then the rest
    at = len(block) // lines * CUT_LINES * full
    out = list(chain.from_iterable(_cutter(fmt, CUT_LINES).iter_unpack(block[:at])))
    return out + list(_cutter(fmt, rest).unpack(block[at:])) if rest else out


@lru_cache(maxsize=256)
def _layout(shape: bytes, d: int, total: bytes) -> Layout | None:
    """The :class:`Layout` of redraws of this shape (digits read 0) after a description of ``d`` bytes, of
    a bar of this total; None when such a line is no redraw, names an epoch or may hold a hint."""
    tail = shape[d:]
    m = _TAIL.match(tail)
    if m is None or b"poch" in tail or b"POCH" in tail or HINT_GATE.search(tail):
        return None
    fields = tuple((d + a, d + b) if a >= 0 else (0, 0) for a, b in (m.span(g) for g in range(1, 6)))
    p0, p1 = m.span(6)
    post = tail[p0:p1] if p0 >= 0 else b""
    p0 = d + max(p0, 0) + len(post) - len(post.lstrip())
    post = post.strip()
    pairs: list[tuple[int, int, int, int]] | None = []
    at = p0
    for part in post.split(b",") if post else ():
        pm = _PAIR.fullmatch(part)
        if pm is None or pairs is None:
            pairs = None
            break
        pairs.append((at + pm.start(1), at + pm.end(1), at + pm.start(2), at + pm.end(2)))
        at += len(part) + 1
    if pairs is not None:
        names = [shape[a:b].lower() for a, b, _, _ in pairs]
        if len(set(names)) != len(names):
            pairs = None  # "loss" twice: only the line-by-line reading knows which wins
    numbers = tuple(shape[v0:v1] for _, _, v0, v1 in pairs) if pairs else ()
    width = len(shape) + 1
    cut = _cut([fields[1]] + [(v0, v1) for _, _, v0, v1 in pairs or ()], width)
    keys = tuple(shape[a:b] for a, b, _, _ in pairs or ())
    digit_keys = tuple((n, a) for n, (a, b, _, _) in enumerate(pairs or ()) if b"0" in shape[a:b])
    return Layout(
        fields,
        (p0, p0 + len(post)),
        post,
        tuple(pairs) if pairs is not None else None,
        numbers,
        cut,
        1 + len(numbers),
        keys,
        digit_keys,
    )


def _same(block: bytes, width: int, at: int, want: bytes) -> bool:
    """Whether every line of a block of lines ``width`` bytes apart (newline included) holds ``want`` at
    ``at``: one byte column of the block at a time, so without a Python loop over its lines."""
    lines = (len(block) + 1) // width
    return all(block[at + c :: width] == want[c : c + 1] * lines for c in range(len(want)))


class _Read(NamedTuple):
    """The postfixes of a run's redraws, as :func:`_by_shape` or :func:`_by_pattern` read them: ``posted``
    (first redraw, redraws) per stretch of redraws with a postfix; ``post_shapes`` the postfixes whose shape
    differs from the one before them; ``keys`` the first postfix's keys; ``columns`` each key's numbers (as
    text), one per postfix; ``numbers`` the shape of each key's numbers when it is the same in every postfix
    (else None); ``fields`` redraw i's n, total, elapsed, remaining and rate; ``post`` its postfix."""

    posted: list[tuple[int, int]]
    post_shapes: list[int]
    keys: list[bytes]
    columns: list[list[bytes]]
    numbers: tuple[bytes, ...] | None
    fields: Callable[[int], tuple[bytes, ...]]
    post: Callable[[int], bytes]


VARIED_SAMPLE = 32  # redraws whose shapes say whether a run is read by shape or by pattern


def _varied(reds: list[bytes]) -> bool:
    """Whether the first redraws of a run change shape at least every fourth line on average (tqdm's own
    postfix numbers, "0.386" then "0.39", and partial blocks do): then matching one pattern over all of them
    costs less than one regex match and one cut per shape."""
    shapes = b"\n".join(reds[: VARIED_SAMPLE + 1]).translate(DIGITS_AS_0).split(b"\n")
    return 4 * sum(map(bool, map(ne, shapes, shapes[1:]))) >= len(shapes)


# tqdm's bar: its unicode blocks (UTF-8 e2 96 88..8f), its ascii fill ("123456789#") and spaces; no letter
_BAR_BYTES = rb"[ #0-9\xe2\x96\x88-\x8f]"
_UNIT = re.compile(rb"(?:\?|\d+(?:\.\d+)?[kMGTP]?)([a-z]{0,12})/s|\d+(?:\.\d+)?s/([a-z]{0,12})")


@lru_cache(maxsize=64)
def _pattern(desc: bytes, to_elapsed: bytes, unit: bytes, template: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """A redraw's pattern (see :func:`_by_pattern`): ``desc`` the description's shape, ``to_elapsed`` the
    text from the total to the "[" before the elapsed time, ``unit`` the rate's, ``template`` the postfix's
    text around its numbers (() for no postfix). Groups: n, elapsed, remaining, rate, then the postfix and
    each number in it."""
    u = re.escape(unit)
    post = b""
    if template:
        numbers = b"".join(b"(" + _SEG_NUM + b")" + re.escape(t) for t in template[1:])
        post = rb",[ \t]*(" + re.escape(template[0]) + numbers + rb")[ \t]*"
    return re.compile(
        rb"(?m)^"
        + re.escape(desc).replace(b"0", rb"\d")
        + rb"[ \t]*\d{1,3}%(?:\|"
        + _BAR_BYTES
        + rb"{0,400}\||(?=[ \t]))[ \t]*(\d+(?:\.\d+)?[kMGTP]?)/"
        + re.escape(to_elapsed)
        + rb"(\d+(?::\d\d)+)(?:<(\d+(?::\d\d)+|\?))?,[ \t]*((?:\?|\d+(?:\.\d+)?[kMGTP]?)"
        + u
        + rb"/s|\d+(?:\.\d+)?s/"
        + u
        + b")"
        + post
        + rb"\][ \t]*\n"
    )


def _by_pattern(reds: list[bytes], d: int, total: bytes) -> _Read | None:
    """The postfixes of these redraws (see :func:`_by_shape`) read by one pattern made from the first with a
    postfix (tqdm's first redraw has none; when the second has none either, from the first, for redraws
    without one): its description with any digits, a bar of bar characters only, its total and the text after
    it, its rate's unit and its postfix's keys and the text between them, any numbers. A redraw that matches
    it parses as that one does, whatever the widths of its numbers: no rule tells one digit from another, and
    its other text is the same or holds no letter. None when one does not match."""
    layouts: list[Layout] = []
    for line in reds[:2]:
        shaped = _layout(line.translate(DIGITS_AS_0), d, total)
        if shaped is None or shaped.pairs is None or line[slice(*shaped.fields[1])] != total:
            return None
        layouts.append(shaped)
        if shaped.pairs:
            break
    lead = len(layouts) - 1 if layouts[-1].pairs else 0  # the redraws before the first with a postfix
    first, layout = reds[lead], layouts[lead]
    pairs = layout.pairs or ()
    (t0, _), (el, _), (r0, r1) = layout.fields[1], layout.fields[2], layout.fields[4]
    unit = _UNIT.fullmatch(first, r0, r1)
    assert unit is not None  # (the rate matched _RATE)
    template, at = [], layout.post[0]
    for _, _, v0, v1 in pairs:
        template.append(first[at:v0])
        at = v1
    if template:
        template.append(first[at : layout.post[1]])
    desc = first[:d].translate(DIGITS_AS_0)
    pattern = _pattern(desc, first[t0:el], unit.group(1) or unit.group(2) or b"", tuple(template))
    found = pattern.findall(b"\n".join(reds[lead:]) + b"\n")
    if len(found) != len(reds) - lead:
        return None

    def fields(i: int) -> tuple[bytes, ...]:
        if i < lead:
            return tuple(reds[i][a:b] for a, b in layouts[i].fields)
        return (found[i - lead][0], total, *found[i - lead][1:4])

    return _Read(
        [(lead, len(found))] if template else [],
        [0] if template else [],
        [first[a:b] for a, b, _, _ in pairs],
        [list(column) for column in zip(*found, strict=True)][5:],
        None,
        fields,
        lambda i: found[i - lead][4],
    )


def _bulk(
    reds: list[bytes],
    d: int,
    total: bytes,
    bar_post: bytes | None,
    keep: int,
    cuts: list[tuple[int, int, int]],
    others: list[list[bytes]],
    inline: list[list[tuple[int, Inline]]],
    bars: list[Redraws],
) -> Run | None:
    """The :class:`Run` of these redraws (after a description of ``d`` bytes) in segments (``cuts``: per
    segment, the redraws up to its end, its stop and its gap; ``others``: its lines that can only hold
    hints; ``inline``: the values of its absorbed lines, see :func:`read_run`; ``bars``: its bar); None
    when they must be read line by line. A segment of a new epoch compares its first postfix with none.

    The postfixes are read by shape (:func:`_by_shape`) or, when the redraws change shape every few lines
    as tqdm's own number formatting and partial blocks make them do, by one pattern (:func:`_by_pattern`).
    """
    read = _by_pattern(reds, d, total) if _varied(reds) else None
    read = read or _by_shape(reds, d, total)
    if read is None:
        return None
    posted, keys, columns = read.posted, read.keys, read.columns
    total_posts = sum(k for _, k in posted)
    ends: list[int] = []  # the postfixes up to the end of each segment
    g = done = 0  # done: the postfixes of the groups before group g
    for end, _, _ in cuts:
        while g < len(posted) and posted[g][0] + posted[g][1] <= end:
            done += posted[g][1]
            g += 1
        ends.append(done + (max(end - posted[g][0], 0) if g < len(posted) else 0))
    fresh = read.post_shapes[1:]  # the postfixes that differ from the one before them in their shape
    for s in range(1, len(cuts)):
        if bars[s].epoch != bars[s - 1].epoch and ends[s - 1] < total_posts:
            fresh.append(ends[s - 1])  # the epoch starts afresh
    same = bool(posted) and read.post(posted[0][0]) == bar_post  # as the one read before
    kept = _changed(columns, fresh, same)
    lasts = ends  # the last postfix up to the end of each segment (+ 1)
    if kept is not None:
        columns = [list(compress(column, kept)) for column in columns]
        lasts = [e - kept[e - 1 :: -1].index(True) if True in kept[:e] else 0 for e in ends]
        ends = [sum(kept[:e]) for e in ends]

    def post(q: int) -> bytes:
        """Postfix ``q`` (counted before the unchanged ones were dropped)."""
        for first, k in posted:
            if q < k:
                return read.post(first + q)
            q -= k
        raise IndexError(q)

    if columns and columns[0] and not all(math.isfinite(float(column[0])) for column in columns):
        return None  # the loss_nan hint of the first changed postfix must cite its line, after the hints before it
    numbers = read.numbers
    decimal = [numbers is not None and _DECIMAL.fullmatch(number) is not None for number in numbers or ()]
    segments: list[Segment] = []
    names = [key.decode().lower() for key in keys]
    lo = 0
    for (end, stop, gap), hi, upto in zip(cuts, ends, lasts, strict=True):
        out: list[Column] = []
        start = max(lo, 1)  # the run's first changed postfix is read on its own
        here = inline[len(segments)]
        merged = _merged(names, columns, start, hi, _at(here, posted, total_posts, kept)) if here else {}
        if merged is None:
            return None
        for n, (name, column) in enumerate(zip(names, columns, strict=True)):
            values = column[start:hi]
            summary = (
                _summary(values, keep, bool(decimal) and decimal[n], metric_kind(name)) if values else None
            )
            if values and summary is None:
                return None
            if name in merged:
                summary = _joined(summary, *merged.pop(name), keep)
            if summary is not None:
                out.append(Column(name, *summary))
        out += [Column(name, *_joined(None, *both, keep)) for name, both in merged.items()]
        segments.append(
            Segment(
                stop,
                gap,
                read.fields(end - 1),
                reds[end - 1],
                post(upto - 1) if hi > lo else None,
                post(kept.index(True) if kept else 0) if lo == 0 < hi else None,
                out,
                others[len(segments)],
                bars[len(segments)],
            )
        )
        lo = hi
    return Run(cuts[-1][1], segments)


def _by_shape(reds: list[bytes], d: int, total: bytes) -> _Read | None:
    """The postfixes of these redraws (after a description of ``d`` bytes, of a bar of this ``total``), read
    by shape; None when one redraw is not one of the bar or must be read on its own.

    Redraws that are equal once each digit reads 0 (most neighbours: only the count, times, rate and
    values change) parse the same way, since no rule tells one digit from another: so one regex match
    per such shape (cached, :func:`_layout`) says where the fields are in all of them, and the postfixes
    and their numbers are cut out of the block of those lines by one cached :class:`struct.Struct`.
    """
    body = b"\n".join(reds)
    shapes = body.translate(DIGITS_AS_0).split(b"\n")
    body += b"\n"  # every line ends in a newline: a group of k lines of one shape is k * width bytes
    post_shapes: list[int] = []  # the postfixes whose shape differs from the one before them
    keys: list[bytes] = []  # the first postfix's keys
    key_shapes: tuple[bytes, ...] | None = None
    columns: list[list[bytes]] = []
    numbers: tuple[bytes, ...] | None = None  # the shapes of each key's numbers, while they are all alike
    posted: list[tuple[int, int]] = []  # (first redraw, redraws) of each group with a postfix
    post_shape: bytes | None = None
    offset = first = total_posts = 0
    for shape, group in groupby(shapes):
        k = len(list(group))
        layout = _layout(shape, d, total)
        if layout is None:
            return None
        width = len(shape) + 1  # the lines of a group are as long as their shape
        start, offset = offset, offset + k * width
        first += k
        cut: Sequence[bytes]
        if k <= CUT_LINES:
            cut = _cutter(layout.cut, k).unpack_from(body, start)
        else:
            cut = _cut_block(layout.cut, body[start:offset], k)
        step = layout.step  # each line's total, then its numbers
        if cut[::step].count(total) != k:  # (the shape reads every total's digits as 0)
            return None
        if not layout.pairs:
            if layout.pairs is None:
                return None
            continue  # no postfix: it neither counts nor changes the last one
        if layout.keys != key_shapes:
            if key_shapes is not None:
                return None  # every redraw has the first one's keys
            key_shapes, numbers = layout.keys, layout.numbers
            keys = [body[start + a : start + b] for a, b, _, _ in layout.pairs]
            columns = [[] for _ in keys]
        for n, a in layout.digit_keys:  # "top1" in every line, not "top5"
            if not _same(body[start:offset], width, a, keys[n]):
                return None
        if layout.numbers != numbers:
            numbers = None
        if layout.post_shape != post_shape:
            post_shape = layout.post_shape
            post_shapes.append(total_posts)
        posted.append((first - k, k))
        total_posts += k
        for n, column in enumerate(columns):
            column += cut[n + 1 :: step]

    def layout_of(i: int) -> Layout:
        found = _layout(shapes[i], d, total)
        assert found is not None  # read above
        return found

    def fields(i: int) -> tuple[bytes, ...]:
        return tuple(reds[i][a:b] for a, b in layout_of(i).fields)

    def post(i: int) -> bytes:
        a, b = layout_of(i).post
        return reds[i][a:b]

    return _Read(posted, post_shapes, keys, columns, numbers, fields, post)


def _changed(columns: list[list[bytes]], fresh: list[int], same: bool) -> list[bool] | None:
    """Whether each postfix differs from the one before it (None: all do), from the ``columns`` of their
    numbers: postfixes of one shape with the same keys (see :func:`_bulk`) differ where a number does.
    ``fresh``: the postfixes that differ anyway (another shape, or a new epoch's first); ``same``: whether
    the first is the postfix read before the run."""
    if not columns:
        return None
    rows: Sequence[object] = columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))
    before: list[object] = [rows[0] if same else None, *rows[:-1]]
    for q in fresh:
        before[q] = None
    if not any(map(eq, rows, before)):
        return None
    return list(map(ne, rows, before))


def _at(
    here: list[tuple[int, Inline]], posted: list[tuple[int, int]], total: int, kept: list[bool] | None
) -> list[tuple[int, Inline]]:
    """Per absorbed line (after how many redraws of the run it came), after how many of the changed
    postfixes it came (``posted``: (first redraw, redraws) per group with a postfix, ``total`` of them;
    ``kept``: which postfixes changed, None: all)."""
    if not posted or total == posted[-1][0] + posted[-1][1]:  # no redraw before the last posted one lacks one
        at = [(min(p, total), values) for p, values in here]
    else:
        at = [(sum(min(k, p - first) for first, k in posted if first < p), values) for p, values in here]
    return at if kept is None else [(sum(kept[:q]), values) for q, values in at]


Values = list[bytes | float]


def _merged(
    names: list[str], columns: list[list[bytes]], start: int, hi: int, at: list[tuple[int, Inline]]
) -> dict[str, tuple[Values, list[float]]] | None:
    """Per metric of a segment's absorbed lines (``at``: per line, the changed postfixes before it and its
    values), all its values in line order (``columns[start:hi]`` among them, for a postfix key) and those of
    the absorbed lines; None when one comes before the run's first changed postfix (read on its own first)."""
    if hi > 0 and at[0][0] < start:  # (``at`` is in line order)
        return None
    extra: dict[str, list[float]] = {}
    for _, values in at:
        for name, value in values:
            extra.setdefault(name, []).append(value)
    out: dict[str, tuple[Values, list[float]]] = {}
    for name, added in extra.items():
        if name not in names:
            out[name] = (list(added), added)
            continue
        column, pos = columns[names.index(name)], start
        ordered: Values = []
        for q, values in at:
            for key, value in values:
                if key == name:
                    if q > pos:
                        ordered += column[pos:q]
                        pos = q
                    ordered.append(value)
        ordered += column[pos:hi]
        out[name] = (ordered, added)
    return out


def _joined(
    summary: tuple[int, float, float, float, Sequence[bytes | float]] | None,
    ordered: Values,
    added: list[float],
    keep: int,
) -> tuple[int, float, float, float, Sequence[bytes | float]]:
    """A column's summary (see :func:`_summary`; None: no postfix values) with the values ``added`` by the
    absorbed lines; ``ordered``: all of them in line order."""
    count, low, high = (summary[0], summary[2], summary[3]) if summary else (0, min(added), max(added))
    return count + len(added), float(ordered[-1]), min(low, *added), max(high, *added), ordered[-keep:]


_DECIMAL = re.compile(rb"0+(?:\.0*)?|\.0+")  # the shape of a plain unsigned decimal (digits read 0)


def _summary(
    values: Sequence[bytes], keep: int, decimal: bool, kind: str | None
) -> tuple[int, float, float, float, Sequence[bytes | float]] | None:
    """(count, last, lowest, highest, newest ``keep``) of numbers as text; None when one is not finite.
    ``decimal``: all are plain decimals of one shape ("0.1234"), which compare as text, so only the last
    and the extreme that a metric of this ``kind`` keeps as its best are sought and read as floats (the
    other one reads as the last)."""
    if decimal:
        last = float(values[-1])
        low = float(min(values)) if kind == "min" else last
        high = float(max(values)) if kind == "max" else last
        return len(values), last, low, high, values[-keep:]
    floats = list(map(float, values))
    if not all(map(math.isfinite, floats)):
        return None
    return len(floats), floats[-1], min(floats), max(floats), floats[-keep:]

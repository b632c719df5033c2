"""How a line of one shape is read, worked out once per shape.

No parsing rule tells one digit from another, so lines that are equal once each digit reads 0 (their
*shape*) take the same branches through the parser's rules and have their matches in the same places.
:func:`line_plan` follows those branches on the shape alone and keeps what they found as a :class:`Read`:
where a tqdm bar's count, times, rate and postfix are, where an epoch and its total are, which rule a plain
line goes to. The parser then reads a line of that shape by slicing its text at those places, without a
regex or a test of its text (see ``LogInsights._read_planned``); what it does with the numbers, which depends
on its state, stays the parser's. Shapes that a plan does not cover (tables, glued prints after a bar,
ascii and rich bars, control sequences) have no :class:`Read` and are read by the rules themselves
(tests/test_insights_speed.py checks that both give the same on every fixture and bench log).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from .metrics import metric_kind, says_its_split
from .patterns import (
    ASCII_BAR,
    COLON_COUNT,
    CONFIG_DUMP,
    DICT_KV,
    DICT_STATE_KEYS,
    EPOCH,
    ETA,
    INNER,
    KERAS3_BAR,
    KV,
    RICH_BAR,
    STEP,
    TABLE_HEAD,
    TOTAL_EPOCHS,
    TOTAL_STEPS,
    TQDM,
    TQDM_COUNT,
    skipped_bar,
)
from .repeats import PlainLayout, plain_layout

Span = tuple[int, int]
TORCHTUNE = re.compile(r"\s*(\d+)\|\d+\|Loss: ")  # a torchtune bar's description
PCT_BAR = re.compile(r"[ \t]*\d{1,3}%(?:\|[^|]*\|)?[ \t]*$")  # the end of a tqdm bar's text before its count
_EVAL_DESCS = ("val", "eval", "test", "class")  # skipped bars that are an evaluation loop


def skipped(desc: str, rate: str) -> str | None:
    """The phase that a redraw of a bar that is not the training run's sets ("eval" for an evaluation loop's,
    else ""), from its description and rate; None for the training run's bar."""
    if "B/s" not in rate and not skipped_bar(desc):
        return None
    return "eval" if desc.lstrip()[:5].lower().startswith(_EVAL_DESCS) else ""


def count_at(text: str, bracket: int) -> re.Match[str] | None:
    """The count of a tqdm bar ("450/1000", "12it") just before its "[" at ``bracket``."""
    head = text[:bracket].rstrip()
    return TQDM_COUNT.fullmatch(head, max(head.rfind(" "), head.rfind("|")) + 1)


def ignored_bar(shape: bytes) -> str | None:
    """What reading a line of this shape (digits read 0) sets the phase to (see :func:`skipped`) when that
    and the last line shown is all it does: a redraw of a bar that is not the training run's, without an
    epoch, not a YOLO "class" bar, outside epoch tables. None otherwise. Every line of one shape does the
    same, since no rule tells one digit from another."""
    text = shape.decode("utf-8", "replace").strip()
    if "[" not in text or "poch" in text or "POCH" in text or (m := TQDM.search(text)) is None:
        return None
    cm = count_at(text, m.start())
    desc = text[: cm.start()] if cm is not None else "class"
    return skipped(desc, m["rate"]) if desc[:5].lower() != "class" else None


class EpochRead(NamedTuple):
    """What ``LogInsights._parse_epoch`` finds in a line: the total of "epochs=5" (``of_all``), the epoch
    and its total (``epoch``, ``of``: None when it has none), and the count inside the epoch (``inner``, (n, total):
    "(3/10)", "200/2983 batches", "epoch 9: 1000 / 2737"), None when there is none."""

    of_all: slice | None
    epoch: slice | None
    of: slice | None
    inner: tuple[Span, Span] | None


Name = str | Span  # a metric's name, or where it is in the line when it holds a digit (read from the line)


class PlainRead(NamedTuple):
    """What ``LogInsights._parse_plain`` finds in a line that is no bar: a step total ("max_steps=100":
    ``steps_of``) or a step count ("step 5/100": ``step``, (n, total)) and whether an iteration's time gives
    an ETA (``per_iteration``); whether it is an evaluation's line ("(val)": ``eval``) or else where its
    "eta:" is (the spans of ETA's match and groups); whether it is a config dump (``config``: no metrics);
    its dict items (key or its span, number) that may be metrics or set state (``items``; None: no dict
    line); its key=value pairs that may be metrics: (split word's span or None, key's, number's, percent
    sign, the name as a plain and as an evaluation's metric or None when the key holds a digit)."""

    steps_of: Span | None
    step: tuple[Span, Span] | None
    per_iteration: bool
    eval: bool
    eta: tuple[Span, ...] | None
    config: bool
    items: tuple[tuple[Name, Span], ...] | None
    pairs: tuple[tuple[Span | None, Span, Span, bool, tuple[str | None, str | None] | None], ...]


def _name(text: str, span: Span) -> Name:
    """A dict key's name as the parser reads it, or its span when it holds a digit."""
    key = text[span[0] : span[1]]
    return span if "0" in key else key.strip().lower().replace(" ", "_")


def kv_name(split: str, key: str, prefix: str) -> str:
    """The metric name of a key=value pair: "valid loss" -> "valid_loss"; ``prefix`` + it unless it
    already says which split it is of (after an evaluation, "train_loss" is still the training's)."""
    name = f"{split}_{key}".lower() if split else key.lower()
    return prefix + name if prefix and not says_its_split(name) else name


def _plain(text: str) -> PlainRead:
    """The :class:`PlainRead` of a line's shape."""
    low = text.lower()
    steps_of: Span | None = None
    step: tuple[Span, Span] | None = None
    if "step" in low or "iter" in low:
        if "total optimization steps" in low or "max_steps" in low or "total_steps" in low:
            m = TOTAL_STEPS.search(text)
            steps_of = m.span(1) if m else None
        elif (m := STEP.search(text)) is not None and m.group(2):
            step = (m.span(1), m.span(2))
    evaluation = "(val)" in text or "(test)" in text
    eta = None
    if not evaluation and ("eta" in text or "ETA" in text) and (e := ETA.search(text)) is not None:
        eta = tuple(e.span(g) for g in range(1 + ETA.groups))
    config = "(" in text and CONFIG_DUMP.search(text) is not None
    items: list[tuple[Name, Span]] | None = None
    if "': " in text or '": ' in text:
        items = []
        for m in DICT_KV.finditer(text):
            key = _name(text, m.span("k"))
            if not isinstance(key, str) or key in DICT_STATE_KEYS or metric_kind(key) is not None:
                items.append((key, m.span("v")))
    pairs = []
    for m in KV.finditer(text):
        split, key = m.group("q") or "", m.group("k")
        names: tuple[str | None, str | None] | None = None
        if "0" not in split and "0" not in key:  # else the name is read from the line
            as_is, as_eval = kv_name(split, key, ""), kv_name(split, key, "eval_")
            names = (as_is if metric_kind(as_is) else None, as_eval if metric_kind(as_eval) else None)
            if names == (None, None):
                continue  # no metric: reading it does nothing
        pairs.append((_span(m, "q"), m.span("k"), m.span("v"), m.group("pct") is not None, names))
    return PlainRead(
        steps_of,
        step,
        "per iteration (ms)" in text,
        evaluation,
        eta,
        config,
        None if items is None else tuple(items),
        tuple(pairs),
    )


def _postfix(text: str, a: int, b: int) -> tuple[tuple[Name, Span], ...]:
    """The "key=number" parts of a tqdm postfix (``text[a:b]``) as ``LogInsights._parse_postfix`` reads them:
    (the key's name or span, the number's span) of the keys that may be metrics."""
    out: list[tuple[Name, Span]] = []
    at = a
    for part in text[a:b].split(","):
        key, sep, value = part.partition("=")
        if sep:
            k = _stripped(text, at, at + len(key))
            v0 = at + len(key) + 1
            v = _stripped(text, v0, v0 + len(value))
            v = (v[0], v[0] + len(text[v[0] : v[1]].rstrip("%s")))
            name = text[k[0] : k[1]].lower()
            if "0" in name:
                out.append((k, v))
            elif metric_kind(name) is not None:
                out.append((name, v))
        at += len(part) + 1
    return tuple(out)


class BarRead(NamedTuple):
    """A tqdm bar's redraw that ends the line: its count and total, elapsed, remaining and rate (None where
    the bar has none), its description's end and label, its stripped postfix (``post``, None: empty) and
    its "key=value" pairs that may be metrics (see :func:`_postfix`; None: keras "- loss: 0.2" text). ``phase``: not None for a bar that
    is not the training run's, the phase its redraws set (see :func:`skipped`); then only that is read."""

    n: slice
    total: slice | None
    elapsed: slice
    remaining: slice | None
    rate: slice
    desc: int
    label: slice
    post: slice | None
    pairs: tuple[tuple[Name, Span], ...] | None
    phase: str | None


class Read(NamedTuple):
    """How ``LogInsights._parse`` reads a line of one shape (outside tables): its epoch (None: the line
    names none), its bar (None: it is no bar, so its text goes to the plain rules, ``plain``), and whether it
    goes through the bar rules at all (``barred``: they reset the text glued after a bar and the bar's label)."""

    epoch: EpochRead | None
    bar: BarRead | None
    barred: bool
    plain: PlainRead | None


class LinePlan(NamedTuple):
    """What the parser needs to know of a line of one shape: its :class:`~.repeats.PlainLayout` (None: its
    lines are not read in bulk), the phase of a skipped bar's redraw when that is all the line is (see
    ``ignored_bar``), and how its text is read (None: by the rules themselves)."""

    layout: PlainLayout | None
    ignored: str | None
    read: Read | None


def _cut(span: Span | None) -> slice | None:
    """A span as the slice that cuts it out of the line."""
    return None if span is None else slice(*span)


def _span(m: re.Match[str], group: int | str) -> Span | None:
    a, b = m.span(group)
    return None if a < 0 else (a, b)


def _stripped(text: str, a: int, b: int, chars: str | None = None) -> Span:
    """The span of ``text[a:b].strip(chars)``."""
    part = text[a:b]
    left = len(part) - len(part.lstrip(chars))
    return (a + left, a + len(part.rstrip(chars))) if left < len(part) else (a, a)


def _epoch(text: str) -> EpochRead:
    """The epoch part of ``LogInsights._parse_epoch`` on a line's shape."""
    of_all = None
    if "pochs" in text or "POCHS" in text:
        m2 = TOTAL_EPOCHS.search(text)
        of_all = _span(m2, 1) if m2 else None
    m = EPOCH.search(text)
    if m is None:
        return EpochRead(_cut(of_all), None, None, None)
    count: tuple[Span, Span] | None = None
    if m.group(4):
        count = (m.span(3), m.span(4))
    elif (inner := INNER.search(text, m.end())) is not None:
        count = (inner.span(1), inner.span(2)) if inner.group(1) else (inner.span(3), inner.span(4))
    elif (colon := COLON_COUNT.match(text, m.end())) is not None:
        count = (colon.span(1), colon.span(2))
    return EpochRead(_cut(of_all), slice(*m.span(1)), _cut(_span(m, 2)), count)


def _bar(text: str) -> BarRead | None | bool:
    """The bar part of ``LogInsights._parse_bar`` on a line's shape: a :class:`BarRead`, None for no bar,
    False when the rules themselves must read it (a bar of another kind, a YOLO or torchtune bar, text
    glued after the bar)."""
    m = TQDM.search(text)
    cm = count_at(text, m.start()) if m is not None else None
    if m is None or cm is None:
        if "•" in text and RICH_BAR.search(text):
            return False
        if "##" in text or "==" in text or ".." in text or "#." in text or KERAS3_BAR in text:
            a = ASCII_BAR.search(text)
            if a is not None and (a.group("pct") is not None or a.group("total") is not None):
                return False
        return None
    desc = text[: cm.start()]
    phase = skipped(desc, m["rate"])
    if phase is not None:
        if desc[:5].lower() == "class":
            return False  # its header names the columns of a table
    elif TORCHTUNE.match(desc) or m.end() < len(text):
        return False
    pct = PCT_BAR.search(desc)
    label = _stripped(text, 0, pct.start() if pct else len(desc), " \t:|")
    post = _span(m, "post")
    if post is not None:
        post = _stripped(text, *post)
        post = post if post[1] > post[0] else None
    pairs = None
    if post is not None and "=" in text[slice(*post)] and ": " not in text[slice(*post)]:
        pairs = _postfix(text, *post)
    return BarRead(
        slice(*cm.span("n")),
        _cut(_span(cm, "total")),
        slice(*m.span("el")),
        _cut(_span(m, "rem")),
        slice(*m.span("rate")),
        cm.start(),
        slice(*label),
        _cut(post),
        pairs,
        phase,
    )


def _read(text: str) -> Read | None:
    """The :class:`Read` of a line of this shape's stripped text (None: read by the rules)."""
    if not text or (text[0] in "Ee" and TABLE_HEAD.match(text)):
        return None
    epoch = _epoch(text) if "poch" in text or "POCH" in text else None
    barred = "[" in text or KERAS3_BAR in text
    bar = _bar(text) if barred else None
    if bar is False:
        return None
    assert bar is None or isinstance(bar, BarRead)
    return Read(epoch, bar, barred, _plain(text) if bar is None else None)


@lru_cache(maxsize=1024)
def line_plan(shape: bytes) -> LinePlan:
    """The :class:`LinePlan` of lines of this shape (digits read 0)."""
    text = shape.decode("utf-8", "replace")
    read = None if "\x1b" in text else _read(text.strip())
    return LinePlan(plain_layout(shape), ignored_bar(shape), read)

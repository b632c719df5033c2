"""Runs of plain lines of one shape, read in bulk: a training loop's print per step or per batch
("step 1200/100000 loss=2.31 lr=3e-04 | epoch 2", "iter 510: loss 2.1234, time 30.12ms").

Lines that are equal once each digit reads 0 go through the same rules in the same order, since no rule
tells one digit from another. :func:`plain_layout` says, per such shape, where the numbers are that only
feed metrics or state that the last line overwrites (a step count, an eta), and which digits must be the
same in every line (epochs, totals, digits in names). The parser then reads the first and the last line
of a run on their own and only the metric numbers of the lines between them, by column
(tests/test_insights_speed.py checks it gives what reading every line gives).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from .metrics import is_train_loss, metric_kind
from .patterns import (
    COLON_COUNT,
    CONFIG_DUMP,
    DICT_KV,
    DICT_STATE_KEYS,
    EPOCH,
    ETA,
    HINT_GATE,
    INNER,
    KERAS3_BAR,
    KV,
    STEP,
    TABLE_HEAD,
    TOTAL_EPOCHS,
    TOTAL_STEPS,
)

Span = tuple[int, int]


class PlainLayout(NamedTuple):
    """Spans (in the raw line) in lines of one shape: per key=value pair its split word (or (0, 0)), key,
    number and percent sign; per metric item of a dict line its key and number; and the positions of the
    digits that must be the same in every line."""

    pairs: tuple[tuple[Span, Span, Span, bool], ...]
    items: tuple[tuple[Span, Span], ...]
    fixed: tuple[int, ...]


_PLAIN = frozenset(range(0x20, 0x7F)) | {0x09}  # printable ASCII and tabs: str and bytes offsets agree


@lru_cache(maxsize=256)
def plain_layout(shape: bytes) -> PlainLayout | None:
    """The :class:`PlainLayout` of plain lines of this shape (digits read 0); None when a line of it is no
    plain line (a bar, a hint, a table, a config dump, control or non-ASCII bytes)."""
    if not shape or not _PLAIN.issuperset(shape) or b"[" in shape or KERAS3_BAR.encode() in shape:
        return None
    lead = len(shape) - len(shape.lstrip())
    text = shape.decode().strip()
    if not text or HINT_GATE.search(shape) or TABLE_HEAD.match(text) or CONFIG_DUMP.search(text):
        return None
    free: set[int] = set()  # positions of numbers that only feed metrics or are overwritten by the next line
    held: set[int] = set()  # positions that set state for good (epochs, totals, dict state keys)
    pairs = []
    for m in KV.finditer(text):
        free.update(range(*m.span("v")))
        split = m.span("q") if m.group("q") else (0, 0)
        pairs.append((split, m.span("k"), m.span("v"), m.group("pct") is not None))
    items = []
    for m in DICT_KV.finditer(text):
        if m.group("k").strip().lower().replace(" ", "_") in DICT_STATE_KEYS:
            held.update(range(*m.span("v")))
        else:
            free.update(range(*m.span("v")))
            items.append((m.span("k"), m.span("v")))
    for m in STEP.finditer(text):
        free.update(range(*m.span(1)))  # the bar's count: the last line's wins
        if m.group(2):
            held.update(range(*m.span(2)))
    for m in ETA.finditer(text):
        free.update(range(*m.span()))
    for m in EPOCH.finditer(text):  # with the count read right after it ("| epoch 2 | 200/2983 batches")
        held.update(range(*m.span()))
        for after in (INNER.search(text, m.end()), COLON_COUNT.match(text, m.end())):
            if after:
                held.update(range(*after.span()))
    for pattern in (TOTAL_EPOCHS, TOTAL_STEPS):
        for m in pattern.finditer(text):
            held.update(range(*m.span()))
    fixed = tuple(lead + p for p, c in enumerate(text) if c == "0" and (p not in free or p in held))

    def raw(span: Span) -> Span:
        return (lead + span[0], lead + span[1]) if span != (0, 0) else span

    return PlainLayout(
        tuple((raw(q), raw(k), raw(v), pct) for q, k, v, pct in pairs),
        tuple((raw(k), raw(v)) for k, v in items),
        fixed,
    )


def same_digits(block: bytes, width: int, first: bytes, fixed: tuple[int, ...]) -> bool:
    """Whether every line of a block of lines ``width`` bytes apart (newline included) has ``first``'s
    digits at these positions (one byte column of the block at a time)."""
    lines = (len(block) + 1) // width
    return all(block[p::width] == first[p : p + 1] * lines for p in fixed)


class DictPlan(NamedTuple):
    """Where the values are in dict lines of one shape whose only effects are metric values and a
    fractional epoch: the metric names, the slices of their numbers in the raw line and then the epoch's
    (when ``epoch``), and which of the names are train losses."""

    names: tuple[str, ...]
    values: tuple[slice, ...]
    epoch: bool
    losses: frozenset[str]


@lru_cache(maxsize=256)
def dict_plan(shape: bytes) -> DictPlan | None:
    """The :class:`DictPlan` of lines of this shape (digits read 0): a plain line (see :func:`plain_layout`)
    that is a dict whose keys hold no digit, name no step or total and no metric twice, with no epoch, step
    or eta for the other rules ("'epoch': 1.5" is a dict key to them, not an epoch); else None."""
    if plain_layout(shape) is None:
        return None
    lead = len(shape) - len(shape.lstrip())
    text = shape.decode().strip()
    low = text.lower()
    if (
        not ("': " in text or '": ' in text)
        or "(" in text
        or "step" in low
        or "iter" in low
        or any(p.search(text) for p in (EPOCH, TOTAL_EPOCHS, ETA))
    ):
        return None
    names: list[str] = []
    values: list[slice] = []
    epoch: slice | None = None
    for m in DICT_KV.finditer(text):
        key = m.group("k").strip().lower().replace(" ", "_")
        span = slice(lead + m.start("v"), lead + m.end("v"))
        if "0" in key or key in names or (key == "epoch" and epoch is not None):
            return None
        if key == "epoch":
            epoch = span
        elif key in DICT_STATE_KEYS:
            return None
        elif metric_kind(key) is not None:
            names.append(key)
            values.append(span)
    if not names:
        return None
    losses = frozenset(filter(is_train_loss, names))
    return DictPlan(tuple(names), (*values, epoch) if epoch else tuple(values), epoch is not None, losses)

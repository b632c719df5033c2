"""The incremental log parser: progress, ETA, epochs, steps and metrics from raw log bytes.

One :class:`LogInsights` per job is fed the raw bytes of the job's output as they arrive (any
chunking; ``\\r`` counts as a line end so tqdm redraws are seen one by one) and
:meth:`LogInsights.snapshot` returns a frozen :class:`JobInsights`.

Every line is capped to :data:`MAX_LINE` bytes (its tail is kept) before any regex runs, each
regex sits behind a cheap substring check, and all state is bounded (metric names, loss
history, hints de-duplicated by code).

A line read on its own is read by its shape's plan (plans.py: which rules apply and where its parts are,
worked out once per shape, since no rule tells one digit from another), so a log whose kind of line changes
every line costs no regex per line; runs of one bar's redraws (redraws.py) and of plain lines of one shape
(repeats.py) are read in bulk.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import lru_cache

from .log_hints import add_line_hints
from .metrics import MAIN_LOSSES, Metric, is_train_loss, metric_kind
from .patterns import (
    ANSI,
    ASCII_BAR,
    COLON_COUNT,
    CONFIG_DUMP,
    DICT_STATE_KEYS,
    DIGITS_AS_0,
    EPOCH,
    ETA,
    INNER,
    KERAS3_BAR,
    MAX_LINE,
    PER_ITERATION,
    RICH_BAR,
    RICH_EPOCH,
    STEP,
    TABLE_HEAD,
    TABLE_ROW,
    TOTAL_EPOCHS,
    TOTAL_STEPS,
    TQDM,
    Found,
    clock,
    dict_items,
    eta_seconds,
    hms,
    kv_pairs,
    line_needs,
    search,
    table_columns,
    to_float,
    tqdm_count,
)
from .plans import PCT_BAR, TORCHTUNE, EpochRead, Name, PlainRead, Read, count_at, kv_name, line_plan, skipped
from .redraws import Inline, Redraws, Run, read_run, redraw_pattern, run_start
from .repeats import PlainLayout, Span, dict_plan, same_digits
from .snapshot import Hint, JobInsights, cap_line

_IGNORED = "\x00ignored"  # _parse_tqdm's answer for bars that are not the training run

MAX_METRICS = 32  # metric names tracked per job; later new names are ignored
LOSS_HISTORY = 200  # loss values kept for the sparkline
MAX_BARS = 4  # progress bars (by total) remembered at once
PLAIN_MAX = 512  # bytes of a line beyond which lines of its shape are not read in bulk
RUN_SEGMENTS = 64  # segments of a run of redraws read in bulk at once, at most
BURST_S = 0.2  # progress changes closer together than this (a log replay) do not start the ETA clock


def _clamp(v: float) -> float:
    return min(max(v, 0.0), 1.0)


class _Bar:
    """The latest state of one progress bar. Kept as text; numbers are parsed only when read,
    which is once per feed for the main bar instead of once per redraw."""

    __slots__ = ("_n", "_total", "_el", "_rem", "_rate")

    def __init__(
        self,
        n: str,
        total: str | None,
        el: str | None = None,
        rem: str | None = None,
        rate: str | None = None,
    ) -> None:
        self._n, self._total, self._el, self._rem, self._rate = n, total, el, rem, rate

    @property
    def n(self) -> float:
        return tqdm_count(self._n)

    @property
    def total(self) -> float | None:
        return (tqdm_count(self._total) or None) if self._total else None

    @property
    def remaining(self) -> float | None:
        return hms(self._rem) if self._rem and self._rem != "?" else None

    @property
    def elapsed(self) -> float | None:
        return hms(self._el) if self._el else None

    @property
    def rate(self) -> str | None:
        rate = (self._rate or "").strip()
        return rate if rate and not rate.startswith("?") else None


# LogInsights fields that reading a progress bar may change (saved around the peek in snapshot()).
_BAR_STATE = (
    "_bars",
    "_label",
    "_phase",
    "_fit_total",
    "_redraws",
    "_bar_post",
    "_epoch",
    "_epoch_float",
    "_epoch_from_text",
    "_epoch_done",
    "_zero_based",
    "_total_epochs",
)


@lru_cache(maxsize=256)
def _names_metrics(label: str) -> bool:
    """Whether a bar's label names metrics ("loss 0.1234": then its redraws are read one by one)."""
    return any(metric_kind(kv_name(q, k, "")) for q, k, _, _ in kv_pairs(label))


def _key(text: str, key: Name) -> str:
    """A dict item's key as the parser names it (see plans.PlainRead)."""
    return key if isinstance(key, str) else text[key[0] : key[1]].strip().lower().replace(" ", "_")


class LogInsights:
    """Incremental parser of one job's log: ``feed()`` raw bytes, read ``snapshot()``; call
    ``flush()`` when the output has ended so an unterminated last line is read too.

    ``clock`` (seconds, monotonic) is read at most once per ``feed`` call and only serves the ETA
    fallback from the elapsed progress rate; inject a fake one for deterministic tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._partial = bytearray()
        self._metrics: dict[str, Metric] = {}
        self._loss_name: str | None = None
        self._loss_history: deque[float | bytes] = deque(maxlen=LOSS_HISTORY)  # bytes: read when shown
        self._hints: dict[str, Hint] = {}
        self._last_line = ""
        self._bars: dict[str | None, _Bar] = {}  # by total; a few at most (nested/eval bars)
        self._bar_post: str | None = None
        self._glued = ""  # text after a tqdm bar on the same line
        self._label = ""  # the description of the tqdm bar just read, without its percentage and bar
        self._bar_label: str | None = None  # the last one read for its metrics
        self._phase: str | None = None
        self._fit_total: str | None = None  # the size of keras fit()'s bars
        self._table: tuple[str, ...] = ()  # the columns of an epoch table after "Epoch" (ultralytics)
        self._table_row: list[str] | tuple[str, ...] = ()
        self._eval_table: tuple[str, ...] = ()  # the columns of a YOLO validation table
        self._redraws: Redraws | None = None  # the last tqdm bar read: its redraws may be read in bulk
        self._most = RUN_SEGMENTS  # segments of the next run of redraws at most
        self._epoch: int | None = None
        self._epoch_from_text = False
        self._epoch_float: float | None = None  # HF-style fractional epochs done (0.3 of epoch 1)
        self._epoch_done = False
        self._zero_based = False
        self._total_epochs: int | None = None
        self._step: int | None = None  # explicit ("step 5/100", {'step': 5}); else the bar's count
        self._total_steps: int | None = None
        self._log_eta: float | None = None
        self._first_point: tuple[float, float] | None = None
        self._epoch_seen: int | None = None  # the epoch at the end of the last feed
        self._epoch_first: tuple[int, float] | None = None  # (epoch, clock) of the first start seen live
        self._epoch_last: tuple[int, float] | None = None  # and of the latest
        self._last_point: tuple[float, float] | None = None
        self._snap: JobInsights | None = None
        self._plan: tuple[bytes, Read | None] = (b"", None)  # a line and its shape's plan, for _line

    # ---- input ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Consume raw log bytes; lines may be split anywhere, ``\\r`` and ``\\n`` end a line."""
        if not data:
            return
        if b"\r" in data:
            data = data.replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._snap = None
        if len(lines) == 1:
            self._extend_partial(data)
            return
        self._extend_partial(lines[0])
        lines[0] = bytes(self._partial)
        self._partial.clear()
        self._extend_partial(lines.pop())
        self._lines(lines)
        self._track_rate()

    def _lines(self, lines: list[bytes]) -> None:
        """Read complete lines; runs of redraws of one tqdm bar in bulk (see redraws.read_run), and
        lines that no rule can match (see patterns.line_needs) only as the last line shown."""
        i, n = 0, len(lines)
        skipped: bytes | None = None  # the newest line passed over, when nothing was read after it
        while i < n:
            raw = lines[i]
            if not raw:
                i += 1
                continue
            bar = self._redraws
            if (
                bar is not None
                and (bar := run_start(bar, raw)) is not None
                # reading at most one segment, a run needs a next redraw right after this one
                and (self._most > 1 or (i + 1 < n and run_start(bar, lines[i + 1]) is not None))
                and (after := self._run(lines, i, bar)) is not None
            ):
                i, skipped = after, None
                continue
            raw = raw[-MAX_LINE:]
            shape = raw.translate(DIGITS_AS_0)
            # (as _needs and _read do; a shape is its own shape)
            needs = 3 if b"\x1b" in raw or self._table or self._eval_table else line_needs(shape)
            if not needs:
                if raw.strip() and (raw.isascii() or raw.decode("utf-8", "replace").strip()):
                    skipped = raw
                i += 1
                continue
            skipped = None
            if len(raw) > PLAIN_MAX:
                self._line(raw, hints=needs > 1)
                i += 1
            elif needs == 1:
                # a plain run needs a next line of the same length (past empty ones), else the line is alone
                j = i + 1
                while j < n and not lines[j]:
                    j += 1
                if j < n and len(lines[j]) == len(raw):
                    i = self._plain_run(lines, i, shape)
                else:
                    self._plain_line(raw, shape)
                    i += 1
            else:
                self._plan = (raw, line_plan(shape).read)
                self._line(raw)
                i += 1
        if skipped is not None:
            self._last_line = skipped.decode("utf-8", "replace").strip()

    def _run(self, lines: list[bytes], i: int, bar: Redraws) -> int | None:
        """Read the run of ``bar``'s redraws from line ``i`` on (see redraws.read_run); the index after the
        lines read, or None when line ``i`` starts none."""
        run = read_run(bar, lines, i, self._run_post(bar), line_needs, LOSS_HISTORY, self._absorb, self._most)
        if run is None:
            return None
        whole = run.stop  # where the lines read in bulk end when the whole run was
        if run.segments:
            i = self._apply_run(run, lines)
        else:
            for raw in lines[i : run.stop]:
                self._line(raw[-MAX_LINE:])
            i, whole = run.stop, -1
        # a run read in bulk in part (a line between two segments changed what the next one assumed) or not
        # at all is read on from there: fewer segments at once next time, so that the work stays in
        # proportion to the lines
        self._most = min(self._most * 2, RUN_SEGMENTS) if i == whole else max(self._most // 2, 1)
        return i

    def _needs(self, raw: bytes) -> int:
        """What reading this (capped) line needs (see patterns.line_needs): everything under a table."""
        return 3 if b"\x1b" in raw or self._table or self._eval_table else line_needs(raw)

    def _read(self, lines: list[bytes], i: int, raw: bytes, needs: int) -> int:
        """Read line ``i`` (``raw``: capped; ``needs``: not 0) and, for a plain line, the lines of its shape
        right after it; the index after them."""
        if needs == 1 and len(raw) <= PLAIN_MAX:
            return self._plain_run(lines, i, raw.translate(DIGITS_AS_0))
        self._line(raw, hints=needs > 1)
        return i + 1

    def _plain_line(self, raw: bytes, shape: bytes) -> None:
        """Read a line of this ``shape`` that no rule for hints needs, on its own (what :meth:`_plain_run`
        does with a line that has no other of its shape after it)."""
        layout, phase, read = line_plan(shape)
        if layout is None and phase is not None and not self._table and not self._eval_table:
            self._glued, self._last_line = "", raw.decode("utf-8", "replace").strip()  # a validation bar's
            self._phase = phase or self._phase
            return
        self._plan = (raw, read)
        self._line(raw, hints=False)

    def _plain_run(self, lines: list[bytes], i: int, shape: bytes) -> int:
        """Read line ``i`` (of this ``shape``) and the lines of its shape right after it (see repeats.py), each
        by its shape's plan (see plans.py); the index after them."""
        first = lines[i]
        layout, phase, read = line_plan(shape)
        self._plan = (first, read)
        if layout is None and phase is not None and not self._table and not self._eval_table:
            self._glued, self._last_line = "", first.decode("utf-8", "replace").strip()  # a validation bar's
            self._phase = phase or self._phase
            return i + 1
        group, j, n, stop = [first], i + 1, len(lines), i + 1
        while layout is not None and j < n:
            line = lines[j]
            if line and (len(line) != len(first) or line.translate(DIGITS_AS_0) != shape):
                break
            if line:
                group.append(line)
                stop = j + 1
            j += 1
        if layout is None or len(group) < 3:
            self._line(first, hints=False)
            return i + 1
        if not same_digits(b"\n".join(group), len(first) + 1, first, layout.fixed):
            for raw in group:
                self._line(raw, hints=False)
            return stop
        self._line(first, hints=False)
        if not self._merge_columns(first, group[1:-1], layout):
            for raw in group[1:-1]:
                self._line(raw, hints=False)
        self._line(group[-1], hints=False)
        return stop

    def _merge_columns(self, first: bytes, lines: list[bytes], layout: PlainLayout) -> bool:
        """Add the metric numbers of ``lines`` (of ``first``'s shape, read just before) column by column;
        False when that is not what reading them one by one does (a name twice, a number not finite)."""
        text = first.decode()
        columns: list[tuple[str, Span, bool]] = []
        if "': " in text or '": ' in text:  # the dict rules come first; key=value only when they find nothing
            for key, value in layout.items:
                name = text[key[0] : key[1]].strip().lower().replace(" ", "_")
                if name in self._metrics:
                    columns.append((name, value, False))
        if not columns:
            prefix = "eval_" if self._phase == "eval" else ""
            for split, key, value, pct in layout.pairs:
                name = kv_name(text[split[0] : split[1]], text[key[0] : key[1]], prefix)
                if name in self._metrics:
                    columns.append((name, value, pct and metric_kind(name) == "max"))
        if len({name for name, _, _ in columns}) != len(columns):
            return False
        merged: list[tuple[Metric, str, list[float]]] = []
        for name, (a, b), pct in columns:
            values = list(map(float, [line[a:b] for line in lines]))
            if pct:
                values = [v / 100.0 for v in values]
            if not all(map(math.isfinite, values)):
                return False
            merged.append((self._metrics[name], name, values))
        for metric, name, values in merged:
            metric.merge(len(values), values[-1], min(values), max(values))
            if name == self._loss_name:
                self._loss_history.extend(values)
        return True

    def flush(self) -> None:
        """Treat the unfinished last line as complete (call once the job's output has ended)."""
        if self._partial:
            self._line(bytes(self._partial[-MAX_LINE:]))
            self._partial.clear()
            self._snap = None
            self._track_rate()

    def _extend_partial(self, chunk: bytes) -> None:
        """Append to the unfinished line, keeping only a bounded tail."""
        if len(chunk) > MAX_LINE:
            self._partial.clear()
            chunk = chunk[-MAX_LINE:]
        self._partial += chunk
        if len(self._partial) > 2 * MAX_LINE:
            del self._partial[:-MAX_LINE]

    def _line(self, raw: bytes, hints: bool = True) -> None:
        """Read one line (``hints=False``: it holds no hint's key): by its shape's plan (see plans.py) when
        it has one, else through every rule."""
        text = raw.decode("utf-8", "replace")
        if "\x1b" in text:
            text = ANSI.sub("", text)
        text = text.strip()
        if not text:
            return
        self._last_line = text
        if hints:
            add_line_hints(text, self._hints)
        plan = self._plan
        if plan[0] is raw:  # the plan that the caller looked up
            read = plan[1]
        else:
            read = line_plan(raw.translate(DIGITS_AS_0)).read if len(raw) <= PLAIN_MAX else None
        if read is None or self._table or self._eval_table:
            self._parse(text)
        else:
            self._read_planned(text, read)

    # ---- parsing --------------------------------------------------------------------------

    def _parse(self, text: str) -> None:
        if self._table and text[0].isdigit():
            self._parse_table_row(text)
        elif text[0] in "Ee" and TABLE_HEAD.match(text):
            self._table = table_columns(text)[1:]
            return
        elif self._eval_table and text.startswith("all "):
            self._parse_eval_row(text)
            return
        epoch = self._parse_epoch(text) if "poch" in text or "POCH" in text else None  # may reset bars
        post = self._parse_bar(text) if "[" in text or KERAS3_BAR in text else None
        if post is None:
            self._parse_plain(text, summary=epoch is False)
            return
        if self._glued:  # a print() right after a bar without a newline: " 45%|...| [..]Epoch 1 loss=.."
            glued = self._glued
            epoch = self._parse_epoch(glued) if "poch" in glued or "POCH" in glued else None
            self._parse_plain(glued, summary=epoch is False)
        if self._label != self._bar_label and post is not _IGNORED:  # set_description(f"loss {loss:.4f}")
            self._bar_label = self._label
            if self._label:
                self._parse_kv(self._label)
        if post is not _IGNORED and post and post != self._bar_post:
            self._bar_post = post  # a redraw's postfix only counts when it changed
            if "=" in post and ": " not in post:
                self._parse_postfix(post)
            else:  # keras: "- ETA: 3s - loss: 0.25 - accuracy: 0.91"
                self._parse_kv(post)
                self._parse_eta(post)

    def _read_planned(self, text: str, read: Read) -> None:
        """:meth:`_parse` outside tables, by the plan of the line's shape: the same steps on the text sliced where
        the plan says its parts are."""
        epoch = self._planned_epoch(text, read.epoch) if read.epoch is not None else None
        if read.barred:
            self._glued = self._label = ""
        bar = read.bar
        if bar is None:
            assert read.plain is not None
            self._planned_plain(text, read.plain, summary=epoch is False)
            return
        if bar.phase is not None:  # a bar that is not the training run's
            if bar.phase:
                self._phase = bar.phase
            return
        total = text[bar.total] if bar.total else None
        rem = text[bar.remaining] if bar.remaining else None
        self._set_bar(_Bar(text[bar.n], total, text[bar.elapsed], rem, text[bar.rate]))
        label = self._label = text[bar.label]
        if total:  # a run of its redraws may be read in bulk, unless its description names metrics
            self._redraws = None if _names_metrics(label) else redraw_pattern(text[: bar.desc], total)
        if label != self._bar_label:  # set_description(f"loss {loss:.4f}")
            self._bar_label = label
            if label and _names_metrics(label):
                self._parse_kv(label)
        if bar.post is not None and (post := text[bar.post]) != self._bar_post:
            self._bar_post = post  # a redraw's postfix only counts when it changed
            if bar.pairs is not None:
                for key, (a, b) in bar.pairs:
                    try:
                        num = float(text[a:b])
                    except ValueError:
                        continue
                    self._add_metric(key if isinstance(key, str) else text[key[0] : key[1]].lower(), num)
            else:  # keras: "- ETA: 3s - loss: 0.25 - accuracy: 0.91"
                self._parse_kv(post)
                self._parse_eta(post)

    def _planned_plain(self, text: str, plain: PlainRead, summary: bool) -> None:
        """:meth:`_parse_plain` by the plan of the line's shape."""
        if plain.steps_of is not None:
            self._total_steps = int(text[slice(*plain.steps_of)].replace(",", "")) or None
        elif plain.step is not None:
            (a, b), (c, d) = plain.step
            self._set_bar(_Bar(text[a:b], text[c:d]))
            summary = False
            if plain.per_iteration:
                self._iteration_eta(text)
        if plain.eval:
            self._phase = "eval"
        elif plain.eta is not None:
            self._log_eta = eta_seconds(Found(text, plain.eta))
        if plain.config:
            return
        found = False
        if plain.items is not None:
            found = self._dict_items(
                [(key if isinstance(key, str) else _key(text, key), text[a:b]) for key, (a, b) in plain.items]
            )
        if not found and plain.pairs:
            evaluation = self._phase == "eval"
            prefix = "eval_" if evaluation else ""
            for q, (c, d), (e, f), pct, names in plain.pairs:
                if names is None:
                    name = kv_name(text[q[0] : q[1]] if q else "", text[c:d], prefix)
                elif (known := names[evaluation]) is not None:
                    name = known
                else:
                    continue
                value = to_float(text[e:f])
                if value is not None and pct and metric_kind(name) == "max":
                    value /= 100.0
                if value is not None and self._add_metric(name, value):
                    found = True
        if found and summary:
            self._epoch_done = True
            self._bars.clear()

    def _planned_epoch(self, text: str, e: EpochRead) -> bool | None:
        """:meth:`_parse_epoch` by the plan of the line's shape."""
        if e.of_all is not None:
            self._total_epochs = int(text[e.of_all]) or None
        if e.epoch is None:
            return None
        self._set_epoch(int(text[e.epoch]), from_text=True)
        if e.of is not None:
            self._total_epochs = int(text[e.of]) or None
        if e.inner is None:
            return False
        (a, b), (c, d) = e.inner
        self._set_bar(_Bar(text[a:b], text[c:d]))
        return True

    def _parse_bar(self, text: str) -> str | None:
        """A tqdm or ascii bar line -> its postfix text; None when the line is no bar."""
        self._glued = self._label = ""
        post = self._parse_tqdm(text)
        if post is None and "•" in text:
            post = self._parse_rich(text)
        if post is None and (
            "##" in text or "==" in text or ".." in text or "#." in text or KERAS3_BAR in text
        ):
            post = self._parse_ascii_bar(text)
        return post

    def _parse_rich(self, text: str) -> str | None:
        """Lightning's RichProgressBar -> its metrics text ("v_num: 0 train/loss: 0.06"); None when the line is
        not one. Its description counts epochs from 0 and names the last one: "Epoch 3/9" is the 4th of 10."""
        m = RICH_BAR.search(text)
        if m is None:
            return None
        desc = text[: m.start()].strip()
        phase = skipped(desc, m["rate"] or "")
        if phase is not None:  # "Validation", "Sanity Checking", "Testing", "Predicting"
            self._phase = phase or self._phase
            return _IGNORED
        epoch = RICH_EPOCH.match(desc)
        if epoch is not None:
            self._set_epoch(int(epoch[1]), from_text=True)
            self._zero_based = True
            if epoch[2] is not None:
                self._total_epochs = int(epoch[2]) + 1 if int(epoch[2]) >= 0 else None  # -1: no limit
        total = m["total"] if m["total"] != "--" else None
        self._set_bar(_Bar(m["n"], total, clock(m["el"]), clock(m["rem"]), m["rate"]))
        return text[m.end() :].strip()

    def _parse_plain(self, text: str, summary: bool) -> None:
        """Non-bar lines: step counts, eta, dict/JSON lines and key=value metrics.

        ``summary``: the line named an epoch without an inner count; with metrics it reports a
        finished epoch ("Epoch 2/5 train_loss=...").
        """
        low = text.lower()
        if ("step" in low or "iter" in low) and self._parse_step(text, low):
            summary = False
            if "per iteration (ms)" in text:
                self._iteration_eta(text)
        if "(val)" not in text and "(test)" not in text:  # mmengine's Epoch(val) eta is the evaluation's
            self._parse_eta(text)
        else:
            self._phase = "eval"
        if "(" in text and search(CONFIG_DUMP, text):
            return  # Namespace(lr=0.1, epochs=14, ...): its totals are read above, the rest are settings
        found = False
        if "': " in text or '": ' in text:
            found = self._parse_dict(text)
        if not found:  # after keras evaluate(): "Loss: 0.45" is the evaluation's, not the training loss
            found = self._parse_kv(text, prefix="eval_" if self._phase == "eval" else "")
        if found and summary:
            self._epoch_done = True
            self._bars.clear()

    def _iteration_eta(self, text: str) -> None:
        """Megatron-LM's "iteration 125/ 250000 | ... | elapsed time per iteration (ms): 89075.2": its ETA."""
        per = search(PER_ITERATION, text)
        bar = self._main_bar()
        if per is not None and bar is not None and bar.total:
            self._log_eta = max(bar.total - bar.n, 0.0) * float(per.group(1)) / 1000

    def _parse_tqdm(self, text: str) -> str | None:
        """tqdm line -> its postfix ("" when none); None when not tqdm; _IGNORED when skipped."""
        m = search(TQDM, text)
        if m is None:
            return None
        cm = count_at(text, m.start())
        if cm is None:
            return None
        el, rem, rate, post = m.groups()
        desc = text[: cm.start()]
        phase = skipped(desc, rate)
        if phase is not None:
            if phase:
                self._phase = phase
            if desc[:5].lower() == "class":  # a YOLO validation bar: its header names the "all" row's columns
                self._eval_table = table_columns(desc[: desc.find("%")].rstrip("0123456789 :"))
            return _IGNORED
        n, total = cm.groups()
        tune = TORCHTUNE.match(desc)
        if tune is not None:  # torchtune: "{epoch}|{step}|Loss: {loss}", epochs from 1
            self._set_epoch(int(tune[1]), from_text=True)
        self._set_bar(_Bar(n, total, el, rem, rate))
        pct = PCT_BAR.search(desc)
        self._label = (desc[: pct.start()] if pct else desc).strip(" \t:|")
        if m.end() < len(text):
            self._glued = text[m.end() :].strip()
        elif total:  # a run of its redraws may be read in bulk, unless its description names metrics
            self._redraws = None if _names_metrics(self._label) else redraw_pattern(desc, total)
        return post.strip() if post else ""

    def _parse_table_row(self, text: str) -> None:
        """A row of an epoch table: "44/1000  6.73G  1.145  0.5266  1.11  6  640: ..." (epoch, total, metrics)."""
        m = TABLE_ROW.match(text)
        values = m.group(3).split() if m else ()
        if m is None or len(values) != len(self._table):
            return
        self._total_epochs = int(m.group(2)) or None
        self._set_epoch(int(m.group(1)), from_text=True)
        if values != self._table_row:  # a redraw counts once per change, like a postfix
            self._table_row = values
            for name, value in zip(self._table, values, strict=True):
                num = to_float(value) if value[-1].isdigit() else None  # "6.73G" is memory, not a metric
                if num is not None:
                    self._add_metric(name, num)

    def _parse_eval_row(self, text: str) -> None:
        """The "all" row under a YOLO validation bar: "all  722  1444  0.992  0.987  0.994  0.671"."""
        values = text.split()
        if len(values) == len(self._eval_table):
            for name, value in zip(self._eval_table[1:], values[1:], strict=True):
                num = to_float(value)
                if num is not None:
                    self._add_metric(name, num)

    def _parse_ascii_bar(self, text: str) -> str | None:
        m = ASCII_BAR.search(text)
        if m is None or (m.group("pct") is None and m.group("total") is None):
            return None
        post = text[m.end() :].strip()
        total = m.group("total")
        if m.group("pct") is not None:  # "Epoch 2/5 [###...] 30%": the 2/5 is not this bar's count
            self._set_bar(_Bar(m.group("pct"), "100"))
        elif self._is_evaluation(total):  # keras model.evaluate() after fit(): not the training run
            self._phase = "eval"
            if post != self._bar_post:
                self._bar_post = post
                self._parse_kv(post, prefix="eval_")
            return _IGNORED
        else:
            self._set_bar(_Bar(m.group("n"), total))
            if self._epoch_from_text:
                self._fit_total = total
        return post

    def _is_evaluation(self, total: str) -> bool:
        """A keras bar of another size than the finished training bars of fit()."""
        fit = self._bars.get(self._fit_total) if self._fit_total else None
        return fit is not None and total != self._fit_total and fit.n >= (fit.total or 0)

    def _set_bar(self, bar: _Bar) -> None:
        self._phase = "train"
        bars = self._bars
        bars.pop(bar._total, None)  # re-insert: the dict order is the recency order
        bars[bar._total] = bar
        if len(bars) > MAX_BARS:
            del bars[next(iter(bars))]

    def _main_bar(self) -> _Bar | None:
        """The bar that tracks the run: the largest unfinished known-total bar, else the newest.

        So an evaluation bar drawn in the middle of a longer training bar does not take over.
        """
        best: _Bar | None = None
        best_total = 0.0
        for bar in self._bars.values():
            total = bar.total
            if total and bar.n < total and total > best_total:
                best, best_total = bar, total
        if best is None and self._bars:
            best = next(reversed(self._bars.values()))
        return best

    def _parse_epoch(self, text: str) -> bool | None:
        """Epoch counters and totals. None: no epoch number; True: it came with an inner "(i/N)"."""
        if "pochs" in text or "POCHS" in text:  # "Num Epochs = 3", "epochs=5"
            m2 = search(TOTAL_EPOCHS, text)
            if m2:
                self._total_epochs = int(m2.group(1)) or None
        m = search(EPOCH, text)
        if m is None:
            return None
        self._set_epoch(int(m.group(1)), from_text=True)
        if m.group(2):
            self._total_epochs = int(m.group(2)) or None
        if m.group(4):
            self._set_bar(_Bar(m.group(3), m.group(4)))
            return True
        inner = search(INNER, text, m.end())  # "| epoch 2 | 200/2983 batches |": in the epoch, not done
        if inner:
            n, total = (
                (inner.group(1), inner.group(2)) if inner.group(1) else (inner.group(3), inner.group(4))
            )
            self._set_bar(_Bar(n, total))
            return True
        colon = search(COLON_COUNT, text, m.end(), anchored=True)  # fairseq "epoch 009:   1000 / 2737"
        if colon:
            self._set_bar(_Bar(colon.group(1), colon.group(2)))
            return True
        return False

    def _set_epoch(self, epoch: int, from_text: bool, fraction: float | None = None) -> None:
        self._epoch_float = fraction
        if epoch == 0:
            self._zero_based = True
        if epoch != self._epoch and from_text:  # per-epoch bars restart; HF's global bar does not
            self._bars.clear()
            self._bar_post = None
            self._epoch_done = False
        self._epoch = epoch
        self._epoch_from_text = self._epoch_from_text or from_text

    def _parse_eta(self, text: str) -> None:
        """detectron2 / mmcv / keras style "eta: 0:05:12", "eta: 1 day, 16:44:26", "ETA: 3s"."""
        if "eta" in text or "ETA" in text:
            m = search(ETA, text)
            if m:
                self._log_eta = eta_seconds(m)

    def _parse_step(self, text: str, low: str) -> bool:
        """Step totals, and "step 50/100" / "Step [50/100]" counts (True: a count was read)."""
        if "total optimization steps" in low or "max_steps" in low or "total_steps" in low:
            m = search(TOTAL_STEPS, text)
            if m:
                self._total_steps = int(m.group(1).replace(",", "")) or None
            return False
        m = search(STEP, text)
        if m and m.group(2):  # only "step i/N" shapes (a bar of its own); a bare "step 5" is ambiguous
            self._set_bar(_Bar(m.group(1), m.group(2)))
            return True
        return False

    def _parse_dict(self, text: str) -> bool:
        """JSON lines / Python dict reprs: epoch, step and metric keys."""
        return self._dict_items((key.strip().lower().replace(" ", "_"), num) for key, num in dict_items(text))

    def _dict_items(self, items: Iterable[tuple[str, str]]) -> bool:
        """A dict line's (key, number) items (keys as the parser names them): epoch, step and metrics."""
        found = False
        for key, num in items:
            try:
                value = float(num)
            except ValueError:
                continue
            if key not in DICT_STATE_KEYS:
                if self._add_metric(key, value):
                    found = True
            elif key == "epoch":
                self._dict_epoch(value)
            elif key in ("step", "global_step"):
                self._step = int(value)
            elif key in ("num_train_epochs", "num_epochs", "epochs", "total_epochs", "max_epochs"):
                self._total_epochs = int(value) or None
            elif key in ("max_steps", "total_steps", "num_training_steps"):
                self._total_steps = int(value) or None
        return found

    def _dict_epoch(self, value: float) -> None:
        """HF logs fractional epochs (0.3 = 30% into epoch 1); count them 1-based (nan and inf: none)."""
        if not math.isfinite(value):
            return
        if value.is_integer():
            self._set_epoch(int(value), from_text=False, fraction=value)
            self._epoch_done = value > 0
        else:
            self._set_epoch(math.floor(value) + 1, from_text=False, fraction=value)

    def _parse_postfix(self, post: str) -> None:
        """tqdm's set_postfix() text: "loss=0.123, acc=0.9" (faster than the generic regex)."""
        for part in post.split(","):
            key, sep, value = part.partition("=")
            if sep:
                num = to_float(value.strip().rstrip("%s"))
                if num is not None:
                    self._add_metric(key.strip().lower(), num)

    def _absorb(self, raw: bytes, bar: Redraws) -> Inline | None:
        """The metric values of a dict line between two redraws of ``bar`` when reading it on its own
        would do no more than add them (see repeats.dict_plan and redraws.read_run): its metrics exist, none
        is a train loss that could become the one shown, its values are finite and its epoch (if it has one)
        is a fraction of the bar's, which the next redraw sets again; else None."""
        plan = dict_plan(raw.translate(DIGITS_AS_0)) if len(raw) <= PLAIN_MAX else None
        if plan is None or bar.epoch is None or self._table or self._eval_table:
            return None
        loss = self._loss_name
        if not self._metrics.keys() >= set(plan.names) or not (loss in MAIN_LOSSES or plan.losses <= {loss}):
            return None
        values = [float(raw[at]) for at in plan.values]
        if not all(map(math.isfinite, values)):
            return None
        if plan.epoch:
            epoch = values.pop()
            if epoch.is_integer() or math.floor(epoch) + 1 != bar.epoch:
                return None
        return list(zip(plan.names, values, strict=True))

    def _run_post(self, bar: Redraws) -> bytes | None:
        """The postfix that the first redraw of a run of ``bar`` is compared with: none when its epoch
        starts afresh."""
        if self._bar_post is None or (bar.epoch is not None and bar.epoch != self._epoch):
            return None
        return self._bar_post.encode()

    def _apply_run(self, run: Run, lines: list[bytes]) -> int:
        """The state after reading the lines of ``run`` one by one (see redraws.read_run); the index of
        the line to read next: ``run.stop``, or the next segment's first redraw when a line read between
        two segments changed what reading its redraws in bulk assumed (then they are read afresh)."""
        for seg in run.segments:
            redraws = self._redraws = seg.bar
            if redraws.of is not None and redraws.epoch is not None:  # what each redraw's epoch says
                self._set_epoch(redraws.epoch, from_text=True)
                if redraws.of:
                    self._total_epochs = int(redraws.of) or None
            elif "poch" in (desc := redraws.desc.decode()) or "POCH" in desc:
                self._parse_epoch(desc)
            self._set_bar(_Bar(*map(bytes.decode, seg.last)))  # n, total, elapsed, remaining and rate
            self._glued = ""
            if seg.post is not None:
                self._bar_post = seg.post.decode()
                if seg.first is not None:
                    self._parse_postfix(seg.first.decode())
            for column in seg.columns:
                metric = self._metrics.get(column.name)
                if metric is not None:
                    metric.merge(column.added, column.last, column.low, column.high)
                    if column.name == self._loss_name:
                        self._loss_history.extend(column.newest)
            for raw in seg.others:  # lines between the redraws that may hold a hint and no more
                add_line_hints(raw[-MAX_LINE:].decode("utf-8", "replace").strip(), self._hints)
            text = seg.last_text.decode("utf-8", "replace")
            self._last_line = (ANSI.sub("", text) if "\x1b" in text else text).strip()
            if seg.gap > seg.stop and not self._read_gap(lines, seg.stop, seg.gap):
                return seg.gap
        return run.stop

    def _read_gap(self, lines: list[bytes], i: int, stop: int) -> bool:
        """Read lines ``i..stop`` (between two segments of a run) as :meth:`_lines` would; False when they
        changed what reading the next segment's redraws in bulk assumed: the bar, its last postfix, the
        epoch, or no table."""
        redraws, post, epoch = self._redraws, self._bar_post, self._epoch
        while i < stop:
            raw = lines[i][-MAX_LINE:]
            needs = self._needs(raw) if raw else 0
            i = self._read(lines, i, raw, needs) if needs else i + 1
        return (
            self._redraws is redraws
            and self._bar_post == post
            and self._epoch == epoch
            and not self._table
            and not self._eval_table
        )

    def _parse_kv(self, text: str, prefix: str = "") -> bool:
        """key=value / key: value / "Loss 0.12" pairs whose key looks like a metric (named ``prefix`` + key,
        unless the name already says it is an evaluation's: "val_loss")."""
        found = False
        for split, key, num, pct in kv_pairs(text):
            value = to_float(num)
            name = kv_name(split, key, prefix)
            if value is not None and pct and metric_kind(name) == "max":
                value /= 100.0  # "74.87%" next to "0.73": one scale
            if value is not None and self._add_metric(name, value):
                found = True
        return found

    def _add_metric(self, name: str, value: float) -> bool:
        metric = self._metrics.get(name)
        if metric is not None:  # (a name is kept only when it is a metric's)
            metric.add(value)
        elif (kind := metric_kind(name)) is None:
            return False
        elif len(self._metrics) < MAX_METRICS:
            self._metrics[name] = Metric(kind, value)
        else:
            return False
        if name != self._loss_name and self._loss_name not in MAIN_LOSSES and is_train_loss(name):
            if self._loss_name is not None and name in MAIN_LOSSES:  # "loss" beats "loss_rpn_cls"
                self._loss_history.clear()
            if self._loss_name is None or name in MAIN_LOSSES:
                self._loss_name = name
        if name == self._loss_name:
            self._loss_history.append(value)
            if not math.isfinite(value) and "loss_nan" not in self._hints:
                self._hints["loss_nan"] = Hint(
                    "loss_nan",
                    "Loss is NaN/inf",
                    "Training diverged. Lower the learning rate or add warmup, clip gradients "
                    "(clip_grad_norm_ 1.0), prefer bf16 over fp16 autocast, and check inputs for NaNs.",
                    cap_line(self._last_line),
                )
        return True

    # ---- output ---------------------------------------------------------------------------

    def _progress(self) -> tuple[float | None, float | None]:
        """(overall progress 0..1, ETA seconds): from the bar, the step count or the epoch count."""
        bar, n_ep, ep = self._main_bar(), self._total_epochs, self._epoch
        if bar is not None and bar.total:
            return self._bar_progress(bar)
        if self._total_steps and self._step is not None:
            return _clamp(self._step / self._total_steps), None
        if n_ep and self._epoch_float is not None:
            return _clamp(self._epoch_float / n_ep), None
        if n_ep and ep is not None:
            done = ep + 1 if self._zero_based else ep
            if not self._epoch_done:
                done -= 1
            per_epoch = self._epoch_seconds()
            return _clamp(done / n_ep), per_epoch * max(n_ep - done, 0) if per_epoch else None
        return None, None

    def _bar_progress(self, bar: _Bar) -> tuple[float, float | None]:
        """A bar inside a known epoch ("Epoch 2/5" + batches) counts as (epoch-1 + fraction)/N."""
        frac = _clamp(bar.n / (bar.total or 1.0))
        n_ep, ep = self._total_epochs, self._epoch
        if (
            not n_ep
            or ep is None
            or not self._epoch_from_text
            or bar.total in (n_ep, self._total_steps)  # an epochs bar or the global step bar
        ):
            return frac, bar.remaining
        idx = min(max(ep if self._zero_based else ep - 1, 0), n_ep - 1)
        eta = None
        per_epoch = self._epoch_seconds()
        if per_epoch:  # epochs as long as they really took, evaluation between them included
            eta = per_epoch * (n_ep - idx - frac)
        elif bar.remaining is not None and bar.elapsed is not None:
            eta = bar.remaining + (n_ep - idx - 1) * (bar.elapsed + bar.remaining)
        return (idx + frac) / n_ep, eta

    def _epoch_seconds(self) -> float | None:
        """Wall time per epoch between the first and the last epoch start seen as it happened."""
        first, last = self._epoch_first, self._epoch_last
        if first is None or last is None or last[0] <= first[0] or last[1] <= first[1]:
            return None
        return (last[1] - first[1]) / (last[0] - first[0])

    def _track_rate(self) -> None:
        """Remember when progress changed, for the ETA from elapsed rate.

        The anchor (first point) follows progress while it moves in a burst (a replayed log arrives
        all at once), so only progress made in real time counts towards the rate.
        """
        now: float | None = None
        epoch = self._epoch if self._epoch_from_text else None
        if epoch is not None and epoch != self._epoch_seen:
            if self._epoch_seen is not None and epoch == self._epoch_seen + 1:  # a start seen as it happened
                now = self._clock()
                if self._epoch_first is None or epoch <= self._epoch_first[0]:
                    self._epoch_first = (epoch, now)
                self._epoch_last = (epoch, now)
            self._epoch_seen = epoch
        progress, _ = self._progress()
        last = self._last_point
        if progress is None or (last is not None and progress == last[1]):
            return
        now = self._clock() if now is None else now
        first = self._first_point
        if first is None or progress < first[1] or (first == last and now - first[0] < BURST_S):
            self._first_point = (now, progress)
        self._last_point = (now, progress)

    def _fallback_eta(self, progress: float | None) -> float | None:
        """ETA without a tqdm estimate: the log's own "eta:", the progress rate, or epoch times."""
        if self._log_eta is not None:
            return self._log_eta
        if progress is None:
            return None
        if progress >= 1.0:
            return 0.0
        if self._first_point and self._last_point:
            (t0, p0), (t1, p1) = self._first_point, self._last_point
            if t1 > t0 and p1 > p0:
                return (t1 - t0) / (p1 - p0) * (1.0 - progress)
        epoch_time = self._metrics.get("time") or self._metrics.get("epoch_time")
        if epoch_time and self._total_epochs and self._epoch is not None and self._epoch_done:
            left = self._total_epochs - (self._epoch + 1 if self._zero_based else self._epoch)
            return max(left, 0) * epoch_time.last
        return None

    def snapshot(self) -> JobInsights:
        """The current state as an immutable :class:`JobInsights` (cached until the next feed).

        tqdm writes ``\\r<bar>``, so its newest state is the unfinished line: a complete-looking bar
        there counts for progress (nothing else of that line does until it ends).
        """
        if self._snap is not None:
            return self._snap
        tail = self._partial_bar_text()
        if not tail:
            self._snap = self._build()
            return self._snap
        saved = {name: getattr(self, name) for name in _BAR_STATE}
        self._bars = dict(self._bars)
        try:
            if "poch" in tail or "POCH" in tail:
                self._parse_epoch(tail)
            self._parse_bar(tail)
            self._snap = self._build()
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
        return self._snap

    def _partial_bar_text(self) -> str:
        """The unfinished line when it ends like a drawn bar ("...]" or "...%..."), else ""."""
        raw = bytes(self._partial[-MAX_LINE:]).rstrip()
        if not raw or b"[" not in raw or not (raw.endswith(b"]") or b"%" in raw):
            return ""
        text = raw.decode("utf-8", "replace")
        if "\x1b" in text:
            text = ANSI.sub("", text)
        return text.strip()

    def _build(self) -> JobInsights:
        progress, eta = self._progress()
        if eta is None:
            eta = self._fallback_eta(progress)
        bar = self._main_bar()
        step, total_steps = self._step, self._total_steps
        if step is None and bar is not None:
            step = int(bar.n)
        if total_steps is None and bar is not None and bar.total:
            total_steps = int(bar.total)
        self._snap = JobInsights(
            progress=progress,
            eta_s=eta,
            rate=bar.rate if bar else None,
            epoch=self._epoch + 1 if self._zero_based and self._epoch is not None else self._epoch,  # from 1
            total_epochs=self._total_epochs,
            step=step,
            total_steps=total_steps,
            metrics={k: {"last": m.last, "best": m.best, "count": m.count} for k, m in self._metrics.items()},
            loss_history=tuple(map(float, self._loss_history)),
            hints=tuple(self._hints.values()),
            last_line=self._last_line,
            phase=self._phase,
        )
        return self._snap

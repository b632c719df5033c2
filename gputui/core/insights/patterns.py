"""The regexes of the log parser and the small text helpers around them (all precompiled, pure). The
parser reads most of them through :func:`search`, :func:`kv_pairs` and :func:`dict_items`, which cache
where the matches are by the line's shape (digits read 0): no rule tells one digit from another."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from .log_hints import HINT_KEYS
from .metrics import METRIC_WORDS, words

MAX_LINE = 4096  # bytes of one line kept (the tail) before parsing
NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|inf|Inf)"
# key=value, key: value, key value (the key is filtered by metric_kind afterwards), with the word that
# says which split a bare key belongs to ("valid loss 4.35", "train Loss: 2.7") and a percent sign
KV = re.compile(
    r"(?<![\w./\-])(?:(?P<q>(?i:train(?:ing)?|val(?:id(?:ation)?)?|eval|test|dev|total|epoch|lm|grad|learning))[ \t]+)?"
    r"(?P<k>[A-Za-z][\w./\-]{0,47})\s*(?:[=:]\s*|\s+)(?P<v>" + NUM + r")(?:(?P<pct>%)|ms\b|s\b)?"
    r"(?![\w.:/\-])"
)
# a count inside an epoch on an epoch's line: "| 200/ 2983 batches |", "Batch 50/225", "iter 3/10"
INNER = re.compile(
    r"(?i)\b(?:batch|iter|step)\s*[:#]?\s*(\d+)\s*/\s*(\d+)|\b(\d+)\s*/\s*(\d+)\s*(?:batch(?:es)?|iters?|steps?)\b"
)
# ultralytics-style epoch tables: a header "Epoch GPU_mem box_loss ... Size", then rows "44/1000 6.73G 1.14 ... 640"
# (the row is a tqdm description when a bar follows it)
TABLE_HEAD = re.compile(r"(?i)^epoch(?:[ \t]+[A-Za-z][\w()/.\-]*){2,}$")
TABLE_ROW = re.compile(
    r"^(\d+)/(\d+)((?:[ \t]+[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[KMGT]?)+)[ \t]*(?::|$)"
)
# fairseq: "| epoch 009:   1000 / 2737 loss=..." (matched right after the epoch number)
COLON_COUNT = re.compile(r"[ \t]*:[ \t]*(\d+)[ \t]*/[ \t]*(\d+)\b")
# a printed argparse Namespace or config object: settings, not metrics
CONFIG_DUMP = re.compile(r"\b(?:Namespace|\w*(?:Config|Arguments|Args))\(\w+=")
# 'key': value / "key": value in JSON lines and Python dict reprs (HF Trainer)
DICT_KV = re.compile(
    r"""(["'])(?P<k>[\w./\-@ ]{1,64})\1\s*:\s*(?:np\.float\d*\(|tensor\()?(?P<v>""" + NUM + r")"
)
# dict keys that set the epoch, the step or their totals (the rest may be metrics)
DICT_STATE_KEYS = frozenset(
    [
        "epoch",
        "step",
        "global_step",
        "num_train_epochs",
        "num_epochs",
        "epochs",
        "total_epochs",
        "max_epochs",
        "max_steps",
        "total_steps",
        "num_training_steps",
    ]
)
ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[@-Z\\-_])")
# "Epoch 2/5", "epoch 3 of 10", "Epoch: [4]", optionally followed by an inner "(996/1926)"
EPOCH = re.compile(
    r"(?i)\bepoch\b(?:\(train\))?[\s:#\[]*(\d+)(?:\s*(?:/|of)\s*(\d+))?\]?"
    r"(?:\s*[(\[]\s*(\d+)\s*/\s*(\d+)\s*[)\]])?"
)
STEP = re.compile(r"(?i)\b(?:global[_ ]step|step|iter|iteration)\b[\s:=#\[]*(\d+)(?:\s*(?:/|of)\s*(\d+))?")
TOTAL_EPOCHS = re.compile(
    r"(?i)\b(?:num[_ ]?(?:train[_ ])?epochs|n_?epochs|max_?epochs|total_?epochs|epochs)\s*[=:]\s*(\d+)\b"
)
TOTAL_STEPS = re.compile(r"(?i)\b(?:total optimization steps|max_?steps|total_?steps)\s*[=:]\s*([\d,]+)")
PER_ITERATION = re.compile(
    r"per iteration \(ms\):\s*(\d+(?:\.\d+)?)"
)  # Megatron-LM: "elapsed time per iteration (ms): 86545.2"
ETA = re.compile(
    r"(?i)\beta\b\s*[:=]?\s*(?:(\d+)\s*days?,\s*)?(\d+(?::\d\d){1,2}|\d+(?:\.\d+)?\s*(?:s|m|h|min)\b)"
)
# tqdm: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}, {postfix}]" (or "{n}it [...]").
# The bracket is searched first (a literal "[" prefix is fast), then the count just before it.
TQDM = re.compile(
    r"\[(?P<el>\d+(?::\d\d)+)(?:<(?P<rem>\d+(?::\d\d)+|\?))?,\s*(?P<rate>[^,\[\]]*)(?:,\s*(?P<post>[^\[\]]*))?\]"
)
TQDM_COUNT = re.compile(r"(?P<n>\d+(?:\.\d+)?[kMGTP]?)(?:/(?P<total>\d+(?:\.\d+)?[kMGTP]?))?[A-Za-z]*")
# ascii bars: "Epoch 2/5 [#####.....] 45%", keras "120/469 [=====>....]" or keras 3 "625/625 ━━━━━━━━━━━━"
ASCII_BAR = re.compile(
    r"(?:(?P<n>\d+)/(?P<total>\d+)\s*)?(?:\[[#=>.\-]{4,}[#=>.\- ]*\]|(?<=\s)━{4,}[━╸╺─ ]*)\s*(?:(?P<pct>\d{1,3})%)?"
)
KERAS3_BAR = "━━"  # the start of a keras 3 bar
# Lightning's RichProgressBar: "{desc} {bar} {n}/{total} {elapsed} • {remaining} {speed}it/s {metrics}", its times
# as Python's timedelta writes them ("0:00:22", "1 day, 2:03:04", "-:--:--"), "--" for an unknown total
_TIMEDELTA = r"(?:\d+ days?, )?\d+:\d\d:\d\d|-:--:--"
RICH_BAR = re.compile(
    rf"(?:^|(?<=\s))[━╸╺╾─]+\s+(?P<n>\d+)/(?P<total>\d+|--)\s+(?P<el>{_TIMEDELTA})\s+•\s+(?P<rem>{_TIMEDELTA})"
    r"(?:\s+(?P<rate>\d+(?:\.\d+)?it/s))?"
)
RICH_EPOCH = re.compile(r"Epoch (\d+)(?:/(-?\d+))?\s*$")  # its description: "Epoch {epoch}/{max_epochs - 1}"

DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")  # a line's shape: rules tell no digit from another
# The pre-filter, over a raw line's shape: a line that does not match can change nothing but the last line
# shown, since every rule needs one of these: a metric word as a token of a name ("val_loss", "top1"), an
# epoch, step or eta, an mmengine "(val)", the start of a tqdm or ascii bar. HINT_GATE: a hint's key.
RULE_GATE = re.compile(
    rb"(?i)(?<![a-z0-9])(?:"
    + b"|".join(
        re.escape(w.encode().translate(DIGITS_AS_0)) for w in sorted(METRIC_WORDS, key=lambda w: (-len(w), w))
    )
    + rb")\d*(?![a-z0-9])|epoch|step|iter|eta|\((?:val|test)\)|\[\d+:\d\d|\[[#=>.\-]{4}|"
    + re.escape(KERAS3_BAR.encode())
)
HINT_GATE = re.compile(b"|".join(re.escape(key.encode().translate(DIGITS_AS_0)) for key in HINT_KEYS))


SHAPED_MAX = 512  # characters of a line beyond which its matches are not cached by shape


@lru_cache(maxsize=1024)
def _spans(pattern: re.Pattern[str], shape: str, groups: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Where the ``groups`` of each match of ``pattern`` are in a line of this shape (digits read 0): no
    rule tells one digit from another, so lines equal once each digit reads 0 have their matches in the
    same places."""
    return tuple(sum((m.span(g) for g in groups), ()) for m in pattern.finditer(shape))


_last_shape: tuple[str, str | None] = ("", None)  # the last call's text and shape: a line is searched often


def _shape(text: str) -> str | None:
    """The shape of a line's text for :func:`_spans` (its ASCII digits read 0; any other character, a bar's
    blocks included, is kept, so offsets in it are offsets in the text); None for long text (not cached)."""
    global _last_shape
    last = _last_shape  # one tuple: threads that parse at once each see a matching pair
    if text is last[0]:
        return last[1]
    shape = None
    if len(text) <= SHAPED_MAX:  # (ASCII digits never occur inside a character's UTF-8 bytes)
        shape = text.encode("utf-8", "surrogatepass").translate(DIGITS_AS_0).decode("utf-8", "surrogatepass")
    _last_shape = (text, shape)
    return shape


@lru_cache(maxsize=2048)
def _first(
    pattern: re.Pattern[str], shape: str, pos: int, anchored: bool
) -> tuple[tuple[int, int], ...] | None:
    """The spans of the first match (``anchored``: at ``pos``) of ``pattern`` and its groups in a line of
    this shape, from ``pos`` on; None when there is none."""
    m = (pattern.match if anchored else pattern.search)(shape, pos)
    return None if m is None else tuple(m.span(g) for g in range(1 + pattern.groups))


class Found:
    """A match read from the cache of :func:`search` (the part of :class:`re.Match` the parser uses)."""

    __slots__ = ("_text", "_spans")

    def __init__(self, text: str, spans: tuple[tuple[int, int], ...]) -> None:
        self._text, self._spans = text, spans

    def group(self, n: int = 0) -> str | Any:  # as re.Match's: None for a group that did not take part
        a, b = self._spans[n]
        return None if a < 0 else self._text[a:b]

    def groups(self) -> tuple[str | Any, ...]:
        return tuple(map(self.group, range(1, len(self._spans))))

    def start(self) -> int:
        return self._spans[0][0]

    def end(self) -> int:
        return self._spans[0][1]


def search(
    pattern: re.Pattern[str], text: str, pos: int = 0, anchored: bool = False
) -> Found | re.Match[str] | None:
    """``pattern.search(text, pos)`` (``anchored``: ``.match``), from a cache by the text's shape."""
    shape = _shape(text)
    if shape is None:
        return (pattern.match if anchored else pattern.search)(text, pos)
    spans = _first(pattern, shape, pos, anchored)
    return None if spans is None else Found(text, spans)


def kv_pairs(text: str) -> list[tuple[str, str, str, str]]:
    """``KV.findall(text)``: (split word or "", key, number, percent sign or "") of each key=value pair."""
    shape = _shape(text)
    if shape is None:
        return KV.findall(text)
    return [
        (text[a:b], text[c:d], text[e:f], text[g:h])
        for a, b, c, d, e, f, g, h in _spans(KV, shape, (1, 2, 3, 4))
    ]


def dict_items(text: str) -> list[tuple[str, str]]:
    """(key, value) of each item of a JSON line or a Python dict repr (see DICT_KV)."""
    shape = _shape(text)
    if shape is None:
        return [(m.group("k"), m.group("v")) for m in DICT_KV.finditer(text)]
    return [(text[a:b], text[c:d]) for a, b, c, d in _spans(DICT_KV, shape, (2, 3))]


@lru_cache(maxsize=1024)
def _shape_needs(shape: bytes) -> int:
    return (RULE_GATE.search(shape) is not None) | (HINT_GATE.search(shape) is not None) << 1


def line_needs(raw: bytes) -> int:
    """What reading a raw line may need: 1 the parsing rules, 2 the hint rules (0: it is shown, no more)."""
    shape = raw.translate(DIGITS_AS_0)
    return _shape_needs(shape) if len(shape) <= 512 else _shape_needs.__wrapped__(shape)


# tqdm bars that are not the training run (their description starts with one of these)
SKIP_BAR_DESCS = tuple(
    sorted(
        words(
            "val eval test predict sanity map filter download load generating token extract resolving class"
        )
    )
) + ("fetching", "saving", "upload", "running tokenizer")
SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def skipped_bar(head: str) -> bool:
    """Whether a bar's description ("Validation DataLoader 0: 12%|...") marks a non-training bar."""
    pct = head.find("%")
    desc = (head[:pct].rstrip("0123456789") if pct >= 0 else head).strip(" :|\t").lower()
    return bool(desc) and desc.startswith(SKIP_BAR_DESCS)


def clock(timedelta: str) -> str | None:
    """Python's timedelta text as "H:MM:SS" ("1 day, 2:03:04" -> "26:03:04"); None for "-:--:--"."""
    if timedelta.startswith("-"):
        return None
    days, _, rest = timedelta.rpartition(", ")
    if not days:
        return rest
    h, _, ms = rest.partition(":")
    return f"{int(days.split()[0]) * 24 + int(h)}:{ms}"


def hms(text: str) -> float:
    """ "01:02" / "1:02:03" -> seconds."""
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + int(part)
    return total


def eta_seconds(m: re.Match[str] | Found) -> float:
    days, val = m.group(1), m.group(2)
    secs = float(days or 0) * 86400
    if ":" in val:
        return secs + hms(val)
    num = float(re.sub(r"[^\d.]", "", val))
    unit = val.rstrip()[-1]
    return secs + num * {"s": 1, "m": 60, "n": 60, "h": 3600}[unit]


def to_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# The log parser
# --------------------------------------------------------------------------------------------


def tqdm_count(text: str) -> float:
    """tqdm counts, possibly unit-scaled: "450" -> 450.0, "1.2k" -> 1200.0."""
    scale = SCALE.get(text[-1])
    return float(text[:-1]) * scale if scale else float(text)


def table_columns(head: str) -> tuple[str, ...]:
    """Metric names of a table header: "Class Images Box(P R mAP50 mAP50-95)" -> ("class", ..., "box_map50", ...)."""
    names: list[str] = []
    group = ""
    for word in head.split():
        word = word.lower()
        if "(" in word:
            group, _, word = word.partition("(")
        closed = word.endswith(")")
        word = word.rstrip("):")
        names.append(f"{group}_{word}" if group else word)
        if closed:
            group = ""
    return tuple(names)

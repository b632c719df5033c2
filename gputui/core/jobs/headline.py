"""Which of a job's metrics matter most: the order tables and the app show them in.

Evaluation scores first (``test_acc``, ``val_f1``), then evaluation losses, then training scores and losses,
then the rest (``lr``, ``time``) in the order the log first printed them. One rule for the CLI and the app.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SPLIT = re.compile(r"[_./\-\s]+")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_EVAL = _words("val valid validation eval test dev")
_SCORE = _words("acc accuracy top f1 auc auroc map iou miou dice bleu rouge rougel score reward r2")
_LOSS = _words("loss nll err error ppl perplexity mse mae rmse wer cer")


def _rank(name: str) -> int:
    """0 eval score, 1 eval loss, 2 training score, 3 training loss, 4 anything else."""
    raw = [t for t in _SPLIT.split(name.lower()) if t]
    tokens = set(raw).union(t.rstrip("0123456789") for t in raw)  # "top1" -> "top", "f1" stays
    kind = 0 if not _SCORE.isdisjoint(tokens) else 1 if not _LOSS.isdisjoint(tokens) else None
    if kind is None:
        return 4
    return kind if not _EVAL.isdisjoint(tokens) else kind + 2


def ranked(metrics: Mapping[str, Any]) -> list[str]:
    """Metric names, most important first (stable: ties keep the log's order)."""
    return sorted(metrics, key=_rank)


def headline(metrics: Mapping[str, Mapping[str, Any]]) -> tuple[str, float] | None:
    """The one metric a job is judged by, with its last value; None when the log printed no metric."""
    for name in ranked(metrics):
        value = metrics[name].get("last")
        if isinstance(value, int | float):
            return name, float(value)
    return None

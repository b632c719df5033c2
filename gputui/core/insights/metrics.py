"""The metric model: which names are metrics, which way is "best", and one metric's running state."""

from __future__ import annotations

import math
import re
from functools import lru_cache


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_LOWER_BETTER = words("loss err error mse mae rmse ppl perplexity wer cer nll")
_HIGHER_BETTER = words(
    "acc accuracy f1 auc auroc precision recall iou miou map bleu rouge rougel psnr ssim dice top score reward r2"
)
# times are per step, per epoch or totals depending on the line: their "best" means nothing
_NEUTRAL = words("lr learning grad norm time runtime seconds secs")
METRIC_WORDS = _LOWER_BETTER | _HIGHER_BETTER | _NEUTRAL  # a metric's name has one of these as a token
_NOT_METRICS = words(
    "epoch epochs step global_step iter iteration batch v_num total_flos num_epochs acc_iter"
)
_CONFIG_TOKENS = words("warmup steps epochs size num workers decay seed")
_TOKEN_SPLIT = re.compile(r"[_./\-]+")


@lru_cache(maxsize=2048)
def metric_kind(name: str) -> str | None:
    """ "min", "max" or "last" (neutral) for a metric-like name, None for anything else."""
    if name in _NOT_METRICS or len(name) > 48:
        return None
    raw = _TOKEN_SPLIT.split(name)
    tokens = set(raw).union(t.rstrip("0123456789") for t in raw)  # "f1" and "top1" -> "top"
    if not _CONFIG_TOKENS.isdisjoint(tokens):  # lr_warmup_steps, batch_size: settings, not metrics
        return None
    if any(t in _LOWER_BETTER for t in tokens):
        return "min"
    if any(t in _HIGHER_BETTER for t in tokens):
        return "max"
    if any(t in _NEUTRAL for t in tokens):
        return "last"
    return None


MAIN_LOSSES = frozenset(["loss", "train_loss", "training_loss", "total_loss", "train/loss"])
_EVAL_TOKENS = frozenset(["val", "valid", "validation", "eval", "test", "dev"])
_TRAIN_TOKENS = frozenset(["train", "training"])


@lru_cache(maxsize=2048)
def is_eval_name(name: str) -> bool:
    """A validation/test/evaluation metric's name ("val_loss", "eval/acc", "test accuracy")."""
    return not _EVAL_TOKENS.isdisjoint(_TOKEN_SPLIT.split(name))


def says_its_split(name: str) -> bool:
    """Whether a metric's name says which split it is of ("val_loss", "train_acc", "training loss")."""
    tokens = _TOKEN_SPLIT.split(name)
    return not (_EVAL_TOKENS.isdisjoint(tokens) and _TRAIN_TOKENS.isdisjoint(tokens))


def is_train_loss(name: str) -> bool:
    """A loss that is not a validation/test loss (those stay out of the sparkline)."""
    return "loss" in name and not is_eval_name(name)


class Metric:
    __slots__ = ("last", "best", "count", "kind")

    def __init__(self, kind: str, value: float) -> None:
        self.kind, self.last, self.best, self.count = kind, value, value, 1

    def add(self, value: float) -> None:
        self.last = value
        self.count += 1
        if value != value:  # nan
            return
        best = self.best
        if best != best or self.kind == "last":
            self.best = value
        elif self.kind == "min":
            if value < best:
                self.best = value
        elif value > best:
            self.best = value

    def merge(self, count: int, last: float, low: float, high: float) -> None:
        """``add()`` ``count`` finite values at once, given the last, the lowest and the highest."""
        self.last = last
        self.count += count
        if self.kind == "last":
            self.best = last
        elif self.kind == "min":
            self.best = low if math.isnan(self.best) else min(self.best, low)
        else:
            self.best = high if math.isnan(self.best) else max(self.best, high)

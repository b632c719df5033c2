"""The fast paths of the parser give what reading each line through every rule gives: the bulk reading of
tqdm redraw runs (insights/redraws.py) and the pre-filter that passes over lines no rule can match
(patterns.line_needs), and the bulk reading of runs of plain lines of one shape (insights/repeats.py)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

from gputui.core.insights import LogInsights, parser, redraws

LOGS = Path(__file__).parent / "fixtures" / "logs"
ROOT = Path(__file__).resolve().parents[1]


def bench_log(size: int, kind: str = "make_log") -> bytes:
    """A log of bench/insights.py: its mixed log (make_log) or tqdm's own output replayed (tqdm_log)."""
    spec = importlib.util.spec_from_file_location("bench_insights", ROOT / "bench" / "insights.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_insights", mod)
    spec.loader.exec_module(mod)
    return getattr(mod, kind)(size)


def parse(data: bytes, chunk: int, bulk: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The snapshot after feeding ``data``; ``bulk=False``: every line read on its own through every rule."""
    with monkeypatch.context() as m:
        if not bulk:
            m.setattr(parser, "read_run", lambda *a: None)
            m.setattr(parser, "line_needs", lambda raw: 3)
        ins = LogInsights(clock=lambda: 0.0)
        for i in range(0, len(data), chunk):
            ins.feed(data[i : i + chunk])
        ins.flush()
        return ins.snapshot().to_json()


REDRAWS = (
    b"Epoch 1/3:  10%|#    | 1/10 [00:01<00:09, 1.00it/s, loss=0.5]\r"
    b"Epoch 1/3:  20%|##   | 2/10 [00:02<00:08, 1.00it/s, loss=0.4]\r"
    b"Epoch 1/3:  20%|##   | 2/10 [00:02<00:08, 1.00it/s, loss=0.4]\r"
    b"Epoch 1/3:  30%|###  | 3/10 [00:03<00:07, 1.00it/s, loss=nan]\n"
    b"a plain line\n"
    b"\xe3\x80\x80\n"
    b"Epoch 1/3:  40%|#### | 4/10 [00:04<00:06, 1.00it/s]\r"
    b"Epoch 1/3:  50%|#####| 5/10 [00:05<00:05, 1.00it/s, loss=0.3, acc=0.8]\r"
    b"Epoch 1/3:  60%|#####| 6/10 [00:06<00:04, 1.00it/s, loss=0.2, acc=0.9]\r"
    b"Epoch 1/3:  70%|#####| 7/10 [00:07<00:03, 1.00it/s, loss=0.2, acc=0.9]\n"
    b"{'loss': 0.25, 'epoch': 1.7}\n"
    b"Epoch 1/3:  80%|#####| 8/10 [00:08<00:02, 1.00it/s, StorageFull=1]\r"
    b"Epoch 1/3:  90%|#####| 9/10 [00:09<00:01, 1.00it/s, loss=0.1]\r\n"
    b"Validation: 50%|###  | 1/2 [00:00<00:00, 9.00it/s]\r"
    b"Epoch 1/3: 100%|#####| 10/10 [00:10<00:00, 1.00it/s, loss=0.1]garbage\r"
    b"Epoch 2/3:  10%|#    | 1/10 [00:01<00:09, 1.00it/s, loss=0.09]\r"
    b"Epoch 2/3:  20%|##   | 2/10 [00:02<00:08, 1.00it/s, loss=0.08]\r"
    b"Downloading data files\n"
    b"Epoch 2/3:  30%|###  | 3/10 [00:03<00:07, 1.00it/s, loss=0.07]\r"
    b"\x1b[1mva\x1b[0ml_lo\x1b[0mss 0.5\n"
    b"Epoch 2/3:  40%|#### | 4/10 [00:04<00:06, 1.00it/s, loss=0.06]\r"
    b"a last plain line\n   \n\xe3\x80\x80\n"
    b"{'epoch': 1.6}\n"
    b"Epoch 2/3:  50%|#####| 5/10 [00:05<00:05, 1.00it/s, top1=0.5, acc=0.9]\r"
    b"Epoch 2/3:  60%|#####| 6/10 [00:06<00:04, 1.00it/s, top1=0.6, acc=0.9]\r"
    b"Epoch 2/3:  60%|#####| 6/10 [00:06<00:04, 1.00it/s, top5=0.7, acc=0.9]\r"
    b"Epoch 2/3:  70%|#####| 7/10 [00:07<00:03, 1.00it/s, top1=0.7, acc=0.8]\n"
    b"{'epoch': 1.7}\n"
    b"Epoch 2/3:  70%|#####| 7/10 [00:07<00:03, 1.00it/s, top1=0.7, acc=0.8]\r"
    b"Epoch 2/3:  80%|#####| 8/10 [00:08<00:02, 1.00it/s, top1=0.8, acc=0.8]\r"
    b"Epoch 2/3:  80%|#####| 8/11 [00:08<00:02, 1.00it/s, top1=0.8, acc=0.7]\r"
    b"Epoch 2/3:  90%|#####| 9/10 [00:09<00:01, 1.00it/s, top1=0.9, acc=0.6]\n"
    b"{'epoch': 1.8}\n"
    b"Epoch 2/3:  90%|#####| 9/10 [00:09<00:01, 1.00it/s, top1=0.9, acc=1e999]\r"
    b"Epoch 2/3:  90%|#####| 9/10 [00:09<00:01, 1.00it/s, top1=0.9, acc=0.95]\r"
    b"Epoch 2/3:  90%|#####| 9/10 [00:09<00:01, 1.00it/s, top1=0.9, lr=0.95]\r"  # another key, same place
    b"Epoch 2/3:  90%|#####| 9/10 [00:09<00:01, 1.00it/s, top1=0.8, lr=0.94]\r"
)


def bar(epoch: int, n: int, post: bytes = b"") -> bytes:
    """A redraw of a tqdm bar of 20 batches in epoch ``epoch`` of 3 (``post``: its postfix)."""
    return b"Epoch %d/3:  %2d%%|##   | %d/20 [00:%02d<00:10, 1.00it/s%s]\r" % (epoch, 5 * n, n, n, post)


GAPS = (  # lines to read on their own between redraws of one bar: the run is read in segments around them
    bar(1, 1, b", loss=0.9")
    + bar(1, 2, b", loss=0.8")
    + b"\n{'loss': 0.5, 'learning_rate': 4.5e-05, 'epoch': 0.1}\n"  # the same metric, between two redraws
    + bar(1, 3, b", loss=0.8")  # the postfix did not change: not counted again
    + bar(1, 4, b", loss=0.7")
    + b"\nstep 5/100 loss=0.6\nstep 6/100 loss=0.6\nstep 7/100 loss=0.5\n"  # a plain run between them
    + bar(1, 5, b", loss=0.6")
    + bar(1, 6, b", loss=0.5")
    + b"\nValidation: 50%|###  | 1/2 [00:00<00:00, 9.00it/s]\n"  # another bar
    + bar(1, 7, b", loss=0.4")
    + b"\n\x1b[1mtrain loss\x1b[0m 0.3\nCUDA out of memory.\n   \n\x1b[0m\n"
    + bar(1, 8, b", loss=0.3")
    + bar(1, 9, b", loss=0.3")
    + b"\nEpoch 1/3 train_loss=0.25\n"  # a summary: the bars start afresh
    + bar(1, 10, b", loss=0.2")
    + bar(1, 11, b", loss=0.2")
    + b"\n{'epoch': 2.0}\n"  # the epoch changes under the bar
    + bar(1, 12, b", loss=0.2")
    + bar(1, 13, b", loss=0.1")
    + b"\nTrain:  50%|##   | 1/2 [00:00<00:00, 9.00it/s]\n"  # another bar that may be read in bulk
    + bar(1, 13, b", loss=0.1")
    + bar(1, 14, b", loss=0.05")
    + b"\nNum Epochs = 7\n"
    + bar(1, 15, b", loss_cls=0.1")
    + bar(1, 15, b", loss_cls=0.2")
    + b"\nloss_box 0.4\nloss 0.3\n"  # the main loss comes after another one: the loss history restarts
    + bar(1, 16, b", loss_cls=0.3")
    + bar(1, 17, b", loss_cls=0.4")
    + b"\nEpoch GPU_mem box_loss Instances Size\n"  # a table header: what follows is read line by line
    + bar(1, 18, b", loss_cls=0.5")
    + bar(1, 19, b", loss_cls=inf")
    + b"\nloss 0.25\n"
    + bar(1, 19, b", loss_cls=nan")
    + b"".join(b"\nloss 0.%d\n" % i for i in range(9))  # more lines than a gap holds
    + bar(1, 20, b", loss_cls=0.6")
    + b"\nloss 0.2\n"
    + bar(1, 20, b", loss_cls=0.7")
    + b"\n  5/20  3.2G  1.23  4  640: \n"
    + bar(2, 1, b", loss=0.1")
    + b"\nEpoch 1/3:  10%|#  | 1/7 [00:01<00:09, 1.00it/s, loss=0.5]\n"  # another bar, same description
    + bar(2, 2, b", loss=0.1")
    + bar(2, 3, b", loss=0.05")
)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
def test_bulk_redraws_with_lines_between_them_equal_line_by_line(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines read on their own between the redraws of a run (see redraws.read_run's segments)."""
    for cut in (len(GAPS), GAPS.index(b"\nNum Epochs")):  # with and without the table at the end
        data = GAPS[:cut]
        assert parse(data, chunk, True, monkeypatch) == parse(data, chunk, False, monkeypatch)


def test_bulk_redraws_first_changed_postfix_not_finite(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss_nan hint of a run's first changed postfix cites its redraw, after a hint read before it."""
    data = (
        bar(1, 1, b", loss=0.5")
        + bar(1, 2, b", loss=0.5")
        + b"\nCUDA out of memory.\n"
        + bar(1, 3, b", loss=1e999")
        + bar(1, 4, b", loss=0.4")
    )
    hints = parse(data, 1 << 16, True, monkeypatch)["hints"]
    assert [(h["code"], h["line"][:20]) for h in hints] == [
        ("cuda_oom", "CUDA out of memory."),
        ("loss_nan", "Epoch 1/3:  15%|##  "),
    ]
    assert parse(data, 1 << 16, False, monkeypatch)["hints"] == hints


def test_bulk_redraws_equal_line_by_line_on_a_long_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of redraws of one shape (cut by a struct in pieces, see redraws.CUT_LINES)."""
    line = b"Train: %2d%%|#    | %d/999 [00:%02d<00:10, 1.00it/s, loss=0.%03d, acc=0.%03d]\r"
    data = b"".join(line % (n * 100 // 999, n, n % 60, 999 - n, n % 7) for n in range(100, 400))
    assert parse(data, 1 << 16, True, monkeypatch) == parse(data, 1 << 16, False, monkeypatch)


def plain(line: bytes, n: int, start: int = 0) -> bytes:
    return b"".join(line % ((i,) * line.count(b"%d")) for i in range(start, start + n))


STEPS = b"step %d/100000 loss=0.%d lr=3.0e-04 grad_norm=1.02 tokens/s=31337 | epoch "
PLAIN_RUNS = [  # each: lines of one shape where reading only the first, the last and the metric columns would go wrong
    b"  Num Epochs = 5\n"  # an epoch changes mid-run, one is 0 (so epochs count from 0)
    + plain(STEPS + b"2\r\n", 30, 10)
    + plain(STEPS + b"3\n", 3, 40)
    + b"step 43/100000 loss=0.43 lr=3.0e-04 grad_norm=1.02 tokens/s=31337 | epoch 0\n"
    + plain(STEPS + b"3\n", 3, 44),
    plain(b"iter %d: loss %de308\n", 5, 1) + b"step 47/100000 loss=nan | epoch 3\n",  # inf mid-run
    plain(b"loss %d loss 1%d\n", 4, 1),  # a name twice in a line
    plain(b"top1=0.%d acc: 9%d.0%% | valid loss 0.%d\n", 6, 1),  # percent accuracies
    plain(b"iter %d: loss %d.5, time 30.%dms, mfu 12.%d%%\n", 12, 10)
    + plain(b"{'loss': 0.%d, 'learning_rate': 4.5e-05, 'epoch': 1.%d}\n", 12, 10)
    + plain(b"{'loss': 0.%d, 'learning_rate': 4.5e-05, 'epoch': %d.0}\n", 4, 1)
    + plain(b"Epoch %d/9 train_loss=0.%d test_acc=0.9%d lr=0.001 time=12.%ds\n", 9, 1)
    + plain(b"Epoch(val) [%d][10/10] accuracy/top1: 7%d.0 eta: 0:00:0%d\n", 5, 1)
    + plain(b"loss %d loss 1%d\n", 4, 1)  # after an evaluation: eval_loss
    + plain(b"total_steps = %d00\n", 4, 1),
]


@pytest.mark.parametrize("log", range(len(PLAIN_RUNS)))
@pytest.mark.parametrize("chunk", [7, 1 << 16])
def test_bulk_plain_runs_equal_line_by_line(log: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines of one shape (a step print) read in bulk give what reading each line gives (repeats.py)."""
    data = PLAIN_RUNS[log]
    assert parse(data, chunk, True, monkeypatch) == parse(data, chunk, False, monkeypatch)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
def test_bulk_redraws_equal_line_by_line_on_edge_cases(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse(REDRAWS, chunk, True, monkeypatch) == parse(REDRAWS, chunk, False, monkeypatch)


@pytest.mark.parametrize("kind", ["make_log", "tqdm_log"])
def test_bulk_redraws_equal_line_by_line_on_the_bench_log(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = bench_log(300_000, kind)
    want = parse(data, 1 << 16, False, monkeypatch)
    assert want["progress"] and want["metrics"]["loss"]["count"] > 1000
    for chunk in (1 << 16, 4093, random.Random(1).randint(100, 999)):
        assert parse(data, chunk, True, monkeypatch) == want


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_bulk_redraws_equal_line_by_line_on_fixtures(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = (LOGS / name).read_bytes()
    assert parse(data, 1 << 16, True, monkeypatch) == parse(data, 1 << 16, False, monkeypatch)


def test_the_app_parses_every_line_of_a_flood() -> None:
    """No flood cap: a 4 MiB batch of output reaches the insights parser whole (it used to read 16 KiB)."""
    from gputui.core.session import model as M
    from gputui.ui.logstream import LogStream

    job = M.Job(host="h", id="1", name="1", state=M.JOB_RUNNING, command=("python",))
    stream = LogStream(session=None, job=job, max_lines=100)
    lines = [b"step %d/100000 loss=%.4f\n" % (i, 1 / (i + 1)) for i in range(150_000)]
    stream._on_data(b"".join(lines))
    assert stream.drain()
    snap = stream.snapshot()
    assert snap.metrics["loss"]["count"] == 150_000 and snap.step == 149_999


def test_matches_cached_by_shape_equal_the_regexes() -> None:
    """The parser's regexes read through the cache by line shape (patterns.search, kv_pairs, dict_items) find
    what the regexes themselves find, on every line of every fixture log and of the bench log."""
    from gputui.core.insights import patterns as p

    data = b"".join(path.read_bytes() for path in sorted(LOGS.glob("*.log"))) + bench_log(100_000)
    texts = {line.decode("utf-8", "replace").strip() for line in data.replace(b"\r", b"\n").split(b"\n")}
    texts |= {"epoch 9:  1000 / 2737", "Epoch 10/20 Step [3/7] eta: 1 day, 2:03:04 loss 9.5e-3 top1=99.5%"}
    searched = (p.EPOCH, p.INNER, p.STEP, p.ETA, p.TQDM, p.TOTAL_EPOCHS, p.TOTAL_STEPS, p.CONFIG_DUMP)
    for text in texts:
        for pattern in searched:
            for pos in (0, 5):
                for anchored in (False, True):
                    want = (pattern.match if anchored else pattern.search)(text, pos)
                    got = p.search(pattern, text, pos, anchored)
                    assert (got is None) == (want is None), (pattern.pattern, text)
                    if want is not None and got is not None:
                        assert (got.start(), got.end(), got.groups()) == (
                            want.start(),
                            want.end(),
                            want.groups(),
                        )
        assert p.kv_pairs(text) == p.KV.findall(text), text
        assert p.dict_items(text) == [(m.group("k"), m.group("v")) for m in p.DICT_KV.finditer(text)], text


def hf(loss: bytes, epoch: bytes = b"1.5", more: bytes = b", 'learning_rate': 4.5e-05") -> bytes:
    """An HF Trainer dict line between redraws."""
    return b"\n{'loss': %s%s, 'epoch': %s}\n" % (loss, more, epoch)


PRELUDE = bar(1, 1, b", loss=0.9") + hf(b"0.95", b"0.5") + bar(1, 2, b", loss=0.8") + hf(b"0.85", b"0.5")
INSIDE = {  # lines between redraws of a run, each read with them only when they just add metric values
    "plain": hf(b"0.75", b"0.5"),
    "two": hf(b"0.75", b"0.5") + hf(b"0.7", b"0.5", b""),
    "nan": hf(b"nan", b"0.5"),
    "inf epoch": hf(b"0.7", b"inf"),
    "whole epoch": hf(b"0.7", b"1.0"),  # the epoch ended
    "epoch 0": hf(b"0.7", b"0.0"),  # epochs count from 0
    "other epoch": hf(b"0.7", b"2.5"),
    "new metric": hf(b"0.7", b"0.5", b", 'grad_norm': 1.5"),
    "step": hf(b"0.7", b"0.5", b", 'step': 9"),
    "digit key": hf(b"0.7", b"0.5", b", 'top1': 0.5"),
    "other loss": hf(b"0.7", b"0.5", b", 'loss_rpn': 0.1"),
    "epoch text": hf(b"0.7", b"0.5", b", 'msg': 'epoch 3'"),
    "step text": hf(b"0.7", b"0.5", b", 'msg': 'step 5/100'"),
}
RUNS = {  # whole logs: dict lines where a run starts or its keys change, a new epoch's redraws
    "before the first change": bar(1, 1, b", loss=0.9")
    + bar(1, 1, b", loss=0.9")
    + hf(b"0.92", b"0.5", b"")
    + bar(1, 2, b", loss=0.8")
    + bar(1, 3, b", loss=0.7"),
    "no postfix": PRELUDE + bar(1, 3) + hf(b"0.7", b"0.5") + bar(1, 4) + hf(b"0.6", b"0.5") + bar(1, 5),
    "keys change": PRELUDE + bar(1, 3, b", acc=0.2") + hf(b"0.7", b"0.5") + bar(1, 4, b", acc=0.3"),
    "new epochs": PRELUDE
    + b"".join(bar(2, n, b", loss=0.0%d" % n) + hf(b"0.0%d" % n, b"1.5") for n in range(1, 12))
    + bar(3, 1, b", loss=0.009")  # right after the last redraw
    + hf(b"0.008", b"2.5")
    + bar(3, 2, b", loss=0.007")
    + b"\nEpoch 3/3:7  5%|#  | 1/20 [00:01<00:10, 1.00it/s]\r"  # the description's shape, not a redraw
    + bar(3, 3, b", loss=0.006")
    + b"\nEpoch 10/30:  5%|##   | 1/20 [00:01<00:10, 1.00it/s, loss=0.5]\r"  # another shape
    + b"Epoch 11/30:  10%|##   | 2/20 [00:02<00:10, 1.00it/s, loss=0.4]\r"
    + b"Epoch 12/30:  15%|##   | 3/20 [00:03<00:10, 1.00it/s, loss=0.3]",
}
RUNS["epochs in one run"] = (  # the next epoch's first postfix counts even when it did not change
    PRELUDE
    + bar(1, 3, b", loss=0.5")
    + b"\nEpoch 1/3 train_loss=0.5\n"
    + bar(2, 1, b", loss=0.5")
    + bar(2, 2, b", loss=0.5")
    + bar(3, 1, b", loss=0.5")  # no line between the epochs
    + b"\n  \nCUDA out of memory. Tried\n"
    + b"Epoch 3/4:  10%|##   | 2/20 [00:02<00:10, 1.00it/s, loss=0.5]\r"  # the same epoch of another total
    + bar(1, 2, b", loss=0.5")  # an epoch back
    + bar(1, 3, b", loss=0.4")
)
ERRNO = b"Errno 2%d Epoch %d/3:  %2d%%|##   | %d/20 [00:%02d<00:10, 1.00it/s, loss=0.%d]\r"
RUNS["a hint in the next epoch's description"] = b"".join(  # "Errno 28" (no space left) is a hint's key
    ERRNO % (errno, epoch, 5 * n, n, n, n) for errno, epoch in ((7, 1), (7, 2), (8, 3)) for n in range(1, 4)
)
RUNS |= {  # the redraw after the line has the same postfix: it counts again when the line reset the bar
    name: PRELUDE + bar(1, 3, b", loss=0.7") + line + bar(1, 4, b", loss=0.7") + bar(1, 5, b", loss=0.5")
    for name, line in INSIDE.items()
}
# postfixes that differ in their text around the same numbers, or in one number of two; bars of other shapes
SAME, MORE, SPACED = b", loss=0.5, acc=0.1", b", loss=0.5, acc=0.2", b", loss = 0.5, acc=0.2"
POSTS = (SAME,) * 5 + (MORE, SPACED, SPACED, MORE, b", loss=0.4, acc=0.2")
RUNS["postfix shapes"] = b"".join(bar(1, n, post) for n, post in enumerate(POSTS, 6))
RUNS["no description"] = b"".join(  # redraws found by their shape, in windows of lines (see redraws._others)
    b"%3d%%|##   | %d/200 [00:%02d<00:10, 1.00it/s, loss=0.%d]\r" % (n // 2, n, n % 60, n)
    + (hf(b"0.%d" % n, b"0.5") if n % 7 == 0 else b"\nNCCL INFO ring %d\n" % n if n % 11 == 0 else b"")
    for n in range(1, 200)
)
UNKNOWN_TIME = b"Epoch 1/3:  %d%%|#  | %d/20 [00:0%d<?, 1.00it/s, loss=0.%d]\r"  # the ETA is the log's
RUNS["eta text"] = b"".join(
    UNKNOWN_TIME % (5 * n, n, n, n) + hf(b"0.%d" % n, b"0.5", b", 'msg': 'eta %ds'" % n) for n in range(1, 5)
) + UNKNOWN_TIME % (25, 5, 5, 5)


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("chunk", [1, 64, 1 << 16])
def test_bulk_redraws_with_dict_lines_and_new_epochs_equal_line_by_line(
    name: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dict lines read with the redraws around them, and a new epoch's redraws read in bulk from its first."""
    data = RUNS[name]
    assert parse(data, chunk, True, monkeypatch) == parse(data, chunk, False, monkeypatch)


def test_dict_lines_and_new_epochs_are_read_with_the_redraws(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is taken: HF dict lines between redraws do not cut the run, the next epoch's bar goes on
    in it (one run of one segment per epoch)."""
    runs = []
    read_run = parser.read_run
    monkeypatch.setattr(parser, "read_run", lambda *a: runs.append(read_run(*a)) or runs[-1])
    data = b"".join(
        bar(e, n, b", loss=0.%d" % n) + hf(b"0.%d" % n, b"%d.5" % (e - 1))
        for e in (1, 2, 3)
        for n in range(1, 9)
    )
    ins = LogInsights(clock=lambda: 0.0)
    ins.feed(data)
    assert [[seg.bar.epoch for seg in run.segments] for run in runs] == [[1, 2, 3]]
    assert ins.snapshot().metrics["loss"]["count"] == 48


def zero_epoch(k: int, post: bytes) -> bytes:
    return b"Epoch 0/3:  %2d%%|##   | %d/20 [00:%02d<00:10, 1.00it/s, %s]\r" % (k % 100, k % 20, k % 60, post)


CUT_SHORT = {  # runs of redraws that their bulk reading cannot read whole, again and again
    # each HF dict line's epoch is not the bar's (0-based): the segment after it is read again
    "dict epochs": b"".join(
        zero_epoch(k, b"loss=0.%d" % (k % 7))
        + zero_epoch(k + 1, b"loss=0.%d" % (k % 5))
        + b"\n{'epoch': 0.5}\n"
        for k in range(2000)
    ),
    # a value that is not finite in each segment: they are read line by line
    "not finite": b"".join(
        zero_epoch(k, b"loss=0.%d" % (k % 9))
        + zero_epoch(k + 1, b"loss=inf")
        + b"\nstep %d/100 loss=0.5\n" % k
        for k in range(2000)
    ),
}


@pytest.mark.parametrize("name", sorted(CUT_SHORT))
def test_runs_cut_short_again_and_again_are_read_in_linear_work(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose bulk reading stops early is read on from there: the runs read at once get shorter, so the
    lines read in bulk stay in proportion to the log (they grew with its square: 7-40 s for these 8,000 lines)."""
    data = CUT_SHORT[name]
    bulk, read = [], redraws._bulk
    monkeypatch.setattr(redraws, "_bulk", lambda *a: bulk.append(len(a[0])) or read(*a))
    assert parse(data, len(data), True, monkeypatch) == parse(data, len(data), False, monkeypatch)
    assert 0 < sum(bulk) < 2 * 4000


def tqdm_redraw(n: int, post: bytes, bar: bytes = b"", rate: bytes = b" 3.50it/s", total: int = 240) -> bytes:
    """A redraw as tqdm writes it to a file: unicode blocks with a partial one, its postfix numbers in its own
    widths ("0.386", "0.39", "1.2e-05")."""
    fill = bar or "█".encode() * (n * 10 // total) + "▏▎▍▌▋▊▉".encode()[3 * (n % 7) : 3 * (n % 7) + 3]
    return b"Epoch 1/2: %3d%%|%s| %d/%d [00:%02d<00:10, %s%s]\r" % (
        n * 100 // total,
        fill.ljust(10),
        n,
        total,
        n % 60,
        rate,
        post and b", " + post,
    )


def widths(n: int) -> bytes:
    values = (0.386, 0.39, 0.0999, 1.2e-05, 0.4, 12.5, 0.3861)
    return b"%.3g" % values[n % len(values)]


NO_ROOM = (
    b"".join(  # tqdm leaves "|{bar}|" out where the line has no room for it (Lightning, narrow terminals)
        b"Epoch 0:  %2d%% %d/1702 [13:01<00:24,  2.11it/s, loss=0.158, v_num=0, train_loss=%s]\r"
        % (n * 100 // 1702, n, widths(n))
        for n in range(1600, 1640)
    )
)
VARIED = {  # runs of redraws whose numbers change width: read by one pattern where that parses as line by line
    "widths": b"".join(tqdm_redraw(n, b"acc=%s, loss=%s" % (widths(n), widths(n + 3))) for n in range(1, 60)),
    "first without postfix": tqdm_redraw(0, b"")
    + b"".join(tqdm_redraw(n, b"loss=%s" % widths(n)) for n in range(1, 30)),
    "rate unit flips": b"".join(
        tqdm_redraw(n, b"loss=%s" % widths(n), rate=b" 3.50it/s" if n < 20 else b" 1.20s/it")
        for n in range(1, 40)
    ),
    "a key changes": b"".join(
        tqdm_redraw(n, b"%s=%s" % (b"loss" if n < 20 else b"lr", widths(n))) for n in range(1, 40)
    ),
    "not finite": b"".join(
        tqdm_redraw(n, b"loss=%s" % (b"nan" if n == 20 else widths(n))) for n in range(1, 40)
    ),
    "a hint key": b"".join(tqdm_redraw(n, b"loss=%s" % widths(n)) for n in range(1, 20))
    + tqdm_redraw(20, b"loss=0.5, NCCL=1")
    + b"".join(tqdm_redraw(n, b"loss=%s" % widths(n)) for n in range(21, 40)),
    "a letter in the bar": b"".join(
        tqdm_redraw(n, b"loss=%s" % widths(n), bar=b"Killed" if n == 20 else b"") for n in range(1, 40)
    ),
    "another total": b"".join(
        tqdm_redraw(n, b"loss=%s" % widths(n), total=240 + (n == 20)) for n in range(1, 40)
    ),
    "signs and padding": b"".join(
        tqdm_redraw(n, b"loss=%s" % (b"-0.5", b"1e+03  ", b"0.25 ")[n % 3]) for n in range(1, 40)
    ),
    "no postfix (HF Trainer)": b"".join(
        tqdm_redraw(n, b"", rate=b" %.2fit/s" % (3 + n % 9 / 7))
        + (b"\n{'loss': 0.25, 'epoch': 0.5}\n" if n % 10 == 0 else b"")
        for n in range(0, 40)
    ),
    "no room for the bar": NO_ROOM
    + b"Epoch 0:  96% 1640/1702 done\r"
    + b" 50% 2/4 [00:01<00:01,  2.00it/s]\r 75% 3/4 [00:02<00:00,  2.00it/s]\r100% of it\r",
    "metrics in the description": b"".join(  # set_description(f"loss {loss:.4f} Epoch {e}") once an epoch
        b"loss 0.%04d Epoch %d: %3d%%|#         | %d/40 [00:%02d<00:10,  3.50it/s]\r"
        % (999 - e, e, 10 * n // 4, n, n)
        for e in (1, 2, 3)
        for n in range(0, 41, 4)
    ),
    "a dict line between": b"".join(
        tqdm_redraw(n, b"loss=%s" % widths(n)) + (b"\n{'loss': 0.25, 'epoch': 0.5}\n" if n % 10 == 0 else b"")
        for n in range(1, 40)
    ),
}


@pytest.mark.parametrize("name", sorted(VARIED))
@pytest.mark.parametrize("chunk", [7, 1 << 16])
def test_redraws_of_varied_widths_equal_line_by_line(
    name: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = VARIED[name] + b"\nEpoch 1/2 done\n"
    assert parse(data, chunk, True, monkeypatch) == parse(data, chunk, False, monkeypatch)


def test_reading_by_pattern_gives_what_reading_by_shape_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run that both read (tqdm's own output recorded, the varied runs above, every fixture): the same
    postfixes, keys, numbers and fields; and tqdm's own training runs are read by pattern, not line by line."""
    runs: list[tuple[list[bytes], int, bytes]] = []
    read = redraws._bulk
    monkeypatch.setattr(
        redraws, "_bulk", lambda reds, d, total, *a: runs.append((reds, d, total)) or read(reds, d, total, *a)
    )
    LogInsights(clock=lambda: 0.0).feed((LOGS / "tqdm_recorded.log").read_bytes())
    recorded = list(runs)
    for data in (*VARIED.values(), *(p.read_bytes() for p in sorted(LOGS.glob("*.log")))):
        LogInsights(clock=lambda: 0.0).feed(data)
    both = 0
    for reds, d, total in runs:
        by_pattern, by_shape = redraws._by_pattern(reds, d, total), redraws._by_shape(reds, d, total)
        if by_pattern is None or by_shape is None:
            assert not (by_pattern is not None and by_shape is None), reds[:3]
            continue
        both += 1
        posted = [i for first, k in by_shape.posted for i in range(first, first + k)]
        assert [i for first, k in by_pattern.posted for i in range(first, first + k)] == posted
        assert (by_pattern.keys, by_pattern.columns) == (by_shape.keys, by_shape.columns)
        assert [by_pattern.fields(i) for i in range(len(reds))] == [
            by_shape.fields(i) for i in range(len(reds))
        ]
        assert [by_pattern.post(i) for i in posted] == [by_shape.post(i) for i in posted]
    assert both >= 10
    training = [run for run in recorded if run[0][0].startswith(b"Epoch")]
    assert training and all(redraws._by_pattern(*run) is not None for run in training)


OTHER_BARS = (  # bars that are not the training run's: read by their shape, as line by line
    b"Epoch 1/2:  50%|#####     | 1/2 [00:01<00:01,  1.00it/s, loss=0.5]\r"
    b"Validation:  50%|#####     | 1/2 [00:00<00:00,  9.00it/s]\r"
    b"Validation DataLoader 0: 100%|##########| 2/2 [00:00<00:00,  9.00it/s]\n"
    b"Epoch 1/2 train_loss=0.25 val_loss=0.3\n"
    b"model.safetensors: 100%|##########| 5.2M/5.2M [00:01<00:00, 4.1MB/s]\r"
    b"Downloading: 100%|##########| 5.2M/5.2M [00:01<00:00, 4.1MB/s]\n"
    b"Predicting: 100%|##########| 9/9 [00:01<00:00,  9.00it/s]\n"
    b"loss 0.4\n"
    b"                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95): "
    b"100%|##########| 3/3 [00:01<00:00,  2.10it/s]\n"
    b"                   all         80        120      0.813      0.756      0.802      0.551\n"
)


@pytest.mark.parametrize("chunk", [5, 1 << 16])
def test_bars_of_evaluation_and_downloads_equal_line_by_line(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = parse(OTHER_BARS, chunk, True, monkeypatch)
    assert snap == parse(OTHER_BARS, chunk, False, monkeypatch)
    assert snap["phase"] == "eval" and "box_map50" in snap["metrics"]


def test_redraws_without_room_for_the_bar_are_read_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm leaves "|{bar}|" out when the line has no room for it: such runs are read in bulk too."""
    one_by_one = []
    read = parser.LogInsights._line
    monkeypatch.setattr(
        parser.LogInsights,
        "_line",
        lambda self, raw, hints=True: one_by_one.append(raw) or read(self, raw, hints),
    )
    LogInsights(clock=lambda: 0.0).feed(NO_ROOM)
    assert len(one_by_one) == 1  # the first redraw (the last is unfinished: no line end)

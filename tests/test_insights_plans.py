"""Reading a line by its shape's plan (insights/plans.py) gives what reading it through every rule gives, and a
log whose kind of line changes every line (bench/insights.py's interleaved log) loses none of its lines."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

from gputui.core.insights import LogInsights, parser, plans, redraws

LOGS = Path(__file__).parent / "fixtures" / "logs"
ROOT = Path(__file__).resolve().parents[1]


def bench_log(size: int, kind: str) -> bytes:
    """A log of bench/insights.py (make_log, tqdm_log, interleaved_log)."""
    spec = importlib.util.spec_from_file_location("bench_insights", ROOT / "bench" / "insights.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_insights", mod)
    spec.loader.exec_module(mod)
    return getattr(mod, kind)(size)  # type: ignore[no-any-return]


def parse(data: bytes, chunk: int, planned: bool, monkeypatch: pytest.MonkeyPatch, fast: bool = True) -> list:
    """The snapshots after each feed of ``data`` in ``chunk``-byte pieces and after the flush; ``planned=False``:
    no line is read by its plan (every rule runs); ``fast=False``: nor in bulk (runs of redraws, plain runs)."""
    with monkeypatch.context() as m:
        if not planned:
            real = plans.line_plan
            m.setattr(parser, "line_plan", lambda shape: real(shape)._replace(read=None))
        if not fast:
            m.setattr(parser, "read_run", lambda *a: None)
            m.setattr(parser, "line_needs", lambda raw: 3)
        ins = LogInsights(clock=lambda: 0.0)
        out = []
        for i in range(0, len(data), chunk):
            ins.feed(data[i : i + chunk])
            out.append(ins.snapshot().to_json())
        ins.flush()
        return [*out, ins.snapshot().to_json()]


EDGES = (
    b"Epoch 1/3:  10%|#    | 1/10 [00:01<00:09, 1.00it/s, loss=0.5, top1=0.2, f1=0.3]\n"
    b"\xff\xfe Epoch 2/3: \xe2\x96\x88 50%|\xe2\x96\x88\xe2\x96\x88   | 5/10 [00:05<00:05, 1.00it/s, loss=nan]\n"
    b"{'loss': 0.25, 'epoch': 1.7, 'f1': 0.5, 'top5 acc': 1e999, 'step': 12, 'max_steps': 100}\n"
    b"{'eval_loss': 0.3, 'epoch': 2.0}\n"
    b"step 5/100 loss=2.31 lr=3e-04 f1=0.1 val_acc=74.87% | epoch 2 eta: 1 day, 2:03:04\n"
    b"Epoch 3/5 train_loss=0.1234 test_acc=0.9812\n"
    b"Epoch(val) [3][10/10] eta: 0:00:00 acc=0.5\n"
    b"Namespace(lr=0.1, epochs=14, loss=1.0)\n"
    b"\x1b[1mEpoch 4/5\x1b[0m loss=0.5\n"
    b"Validation:  50%|###  | 1/2 [00:00<00:00, 9.00it/s]\r"
    b"Epoch 4/5:  20%|##   | 2/10 [00:02<00:08, 1.00it/s, loss=0.4]garbage\n"
    b"iteration 125/ 250000 | elapsed time per iteration (ms): 89075.2 | lm loss: 2.5\n"
    b"Total optimization steps = 1,000\n"
    b"Epoch 5/5: 100%|#####| 10/10 [00:10<00:00, 1.00it/s, - loss: 0.25 - ETA: 3s]\n"
    b"\x00\x07 loss=\x01 0.5 \x7f\n" + b"loss=0.1 " * 600 + b"\n"
)


def fixture_mixes(seed: int, count: int) -> list[bytes]:
    """Lines of three fixture logs interleaved at random, ``count`` times."""
    rnd = random.Random(seed)
    logs = [path.read_bytes() for path in sorted(LOGS.glob("*.log"))]
    out = []
    for _ in range(count):
        parts = [log.split(b"\n") for log in rnd.sample(logs, 3)]
        lines = []
        while any(parts):
            lines.append(rnd.choice([p for p in parts if p]).pop(0))
        out.append(b"\n".join(lines))
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_plans_read_as_every_rule_does_on_fixtures(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = (LOGS / name).read_bytes()
    for fast in (True, False):
        assert parse(data, 4093, True, monkeypatch, fast) == parse(data, 4093, False, monkeypatch, fast)


@pytest.mark.parametrize("chunk", [1, 64, 1 << 16])
def test_plans_read_as_every_rule_does_on_edge_cases(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse(EDGES, chunk, True, monkeypatch) == parse(EDGES, chunk, False, monkeypatch)
    snap = parse(EDGES, chunk, True, monkeypatch)[-1]
    assert {"loss", "f1", "val_acc", "top1"} <= snap["metrics"].keys()


def test_plans_read_as_every_rule_does_on_mixed_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    for data in fixture_mixes(seed=3, count=12):
        assert parse(data, 1 << 16, True, monkeypatch) == parse(data, 1 << 16, False, monkeypatch)


@pytest.mark.parametrize("kind", ["make_log", "tqdm_log", "interleaved_log"])
def test_plans_read_as_every_rule_does_on_bench_logs(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = bench_log(200_000, kind)
    assert parse(data, 1 << 16, True, monkeypatch) == parse(data, 1 << 16, False, monkeypatch, fast=False)


def test_an_interleaved_log_loses_no_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tqdm redraw, an HF dict line, a Lightning bar and a plain line, over and over: every loss of the
    redraws and the dict lines counts, and so does every other metric, as if each kind were read alone."""
    data = bench_log(150_000, "interleaved_log")
    lines = [line for line in data.replace(b"\r", b"\n").split(b"\n") if line]
    redraws = sum(b"loss=" in line and not line.startswith(b"Epoch") for line in lines)
    dicts, lightning = (
        sum(line.startswith(b"{") for line in lines),
        sum(line.startswith(b"Epoch") for line in lines),
    )
    assert redraws and dicts and lightning
    want = parse(data, 1 << 16, False, monkeypatch, fast=False)[-1]
    for chunk in (1 << 16, 997):
        snap = parse(data, chunk, True, monkeypatch)[-1]
        assert snap == want
        counts = {name: m["count"] for name, m in snap["metrics"].items()}
        assert counts == {
            "loss": redraws + dicts,  # each redraw's postfix differs from the last bar's (the other bar's)
            "lr": redraws,
            "grad_norm": dicts,
            "learning_rate": dicts,
            "train_loss": lightning,
        }
        assert snap["last_line"] == lines[-1].decode().strip()
        assert snap["step"] == int(
            lines[-4].split(b"/")[0].rsplit(b" ", 1)[1]
        )  # the last tqdm redraw's count


def test_a_bar_redrawn_once_between_lines_read_alone_is_not_read_in_bulk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Lightning bar between HF dict lines whose epoch is not the bar's (each must be read on its own): no
    run of one redraw is read in bulk (each such run cost about ten times reading the line by its plan)."""
    data = b"".join(
        b"\rEpoch 0:  %2d%%|#   | %d/1000 [00:01<00:30, 31.0it/s, v_num=0, train_loss=0.%03d]\n"
        b"{'loss': 0.%03d, 'grad_norm': 1.5, 'epoch': 0.%02d}\n" % (k // 10, k, k, k, k % 100)
        for k in range(1, 400)
    )
    bulk, read = [], redraws._bulk
    monkeypatch.setattr(redraws, "_bulk", lambda *a: bulk.append(len(a[0])) or read(*a))
    snap = parse(data, 1 << 16, True, monkeypatch)
    assert snap == parse(data, 1 << 16, False, monkeypatch, fast=False)
    assert snap[-1]["metrics"]["train_loss"]["count"] == 399 and snap[-1]["metrics"]["loss"]["count"] == 399
    assert bulk == []

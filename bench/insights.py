"""Throughput of LogInsights on a realistic mixed training log, next to bytes.splitlines(); and the
ETA of a cold read (gputui jobs --json, one poll) next to the app's long-lived parser.

Run: python bench/insights.py [--mb 8] [--runs 5] [--parts] [--hostile]. Prints lines/s and MB/s (median of the runs)
for LogInsights.feed() in 64 KiB chunks and, as peers over the same bytes in the same run, the round-1
parser (gputui/core/insights.py at commit ROUND1, read from git history) and a plain
bytes.splitlines(); plus the ratios; for a mixed training log, a log of step prints and tqdm's own output
(its format, numbers in its own widths: see tqdm_log). Times are this process's CPU time, so other work on
a shared machine does not count. Then, for a simulated MNIST-style job (5 epochs of 20 s training
+ 4 s evaluation, an ascii bar and epoch summaries), the ETA at a few moments: the app's parser fed
live, a cold read with the runner's offset -> time index, and one without it. No asserts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tempfile  # noqa: E402

from gputui.core.insights import LogInsights, timed_parser  # noqa: E402
from gputui.core.jobs.records import TAIL_BYTES  # noqa: E402
from remote_agent.jobs.logclock import LogClock, read_times  # noqa: E402

CHUNK = 64 * 1024
ROUND1 = "41e2194"  # main before round 2's insights work; its parser was gputui/core/insights.py


def make_log(
    target_bytes: int, seed: int = 0, dicts: bool = True, plains: bool = True, summaries: bool = True
) -> bytes:
    """tqdm \\r redraws with a loss postfix, epoch summaries, HF dict lines and plain lines (each kind of
    line between the redraws can be left out, to see what it costs: see parts())."""
    rnd = random.Random(seed)
    out: list[str] = []
    size, epoch, total = 0, 0, 469
    plain = [
        "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This "
        "DataLoader will create 8 worker processes in total.",
        "[2024-05-01 12:00:00,123] [INFO] [checkpoint.py:42] Saving checkpoint to runs/x/ckpt.pt",
        "node1:1234:1234 [0] NCCL INFO Using network Socket",
        "Downloading data files: resolving cache path /root/.cache/huggingface/datasets",
    ]
    while size < target_bytes:
        epoch += 1
        for n in range(0, total + 1, 3):
            pct = 100 * n // total
            bar = "█" * (pct // 10) + " " * (10 - pct // 10)
            line = (
                f"\rEpoch {epoch}/50: {pct:3d}%|{bar}| {n}/{total} [00:{n % 60:02d}<00:{(total - n) % 60:02d}, "
                f"{rnd.uniform(50, 70):.1f}batch/s, loss={rnd.uniform(0.05, 0.5):.4f}]"
            )
            out.append(line)
            size += len(line) + 2
            if n % 60 == 0:
                extra = (
                    f"\n{{'loss': {rnd.uniform(0.1, 1):.4f}, 'learning_rate': 4.5e-05, 'epoch': {epoch - 0.5}}}\n"
                    if n % 120 == 0
                    else "\n" + rnd.choice(plain) + "\n"
                )
                if dicts if n % 120 == 0 else plains:
                    out.append(extra)
                    size += len(extra)
        line = (
            f"\nEpoch {epoch}/50 train_loss={rnd.uniform(0.05, 0.3):.4f} test_loss=0.0567 "
            f"test_acc={rnd.uniform(0.9, 0.99):.4f} lr=0.001 time=12.3s\n"
        )
        if summaries:
            out.append(line)
            size += len(line)
    return "".join(out).encode()


def interleaved_log(target_bytes: int, seed: int = 0) -> bytes:
    """A log whose kind of line changes every line: a tqdm redraw with a postfix, an HF Trainer dict line
    (``logging_steps=1``), a Lightning bar, a plain line, over and over (as ranks or loggers interleave)."""
    rnd = random.Random(seed)
    out: list[str] = []
    size, n, total = 0, 0, 10_000
    while size < target_bytes:
        n += 1
        pct = 100 * n // total
        bar = "█" * (pct // 10) + " " * (10 - pct // 10)
        lines = (
            f"\r{pct:3d}%|{bar}| {n}/{total} [01:{n % 60:02d}<02:{(total - n) % 60:02d},  7.{n % 10}1it/s, "
            f"loss={rnd.uniform(0.05, 0.5):.4f}, lr=3e-05]",
            f"\n{{'loss': {rnd.uniform(0.1, 1):.4f}, 'grad_norm': {rnd.uniform(0.5, 3):.3f}, "
            f"'learning_rate': 4.5e-05, 'epoch': {n / 1000:.2f}}}\n",
            f"\rEpoch {n // 1000}: {pct:3d}%|{bar}| {n % 1000}/1000 [00:{n % 60:02d}<00:30, 31.{n % 10}it/s, "
            f"v_num=0, train_loss={rnd.uniform(0.05, 0.5):.3f}]",
            f"\n[rank1]:[W{n % 10}01 12:00:00.000] ProcessGroupNCCL.cpp:1000: step {n} done on rank 1\n",
        )
        for line in lines:
            out.append(line)
            size += len(line)
    return "".join(out).encode()


def round1_parser() -> type | None:
    """LogInsights of the round-1 parser, loaded from git history (None without git or the commit)."""
    try:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ROUND1}:gputui/core/insights.py"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("insights_round1")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, f"{ROUND1}:gputui/core/insights.py", "exec"), mod.__dict__)
    return mod.LogInsights  # type: ignore[no-any-return]


def time_insights(data: bytes, parser: type = LogInsights) -> float:
    ins = parser(clock=lambda: 0.0)
    t0 = time.process_time()
    for i in range(0, len(data), CHUNK):
        ins.feed(data[i : i + CHUNK])
    ins.snapshot()
    return time.process_time() - t0


def time_splitlines(data: bytes) -> float:
    t0 = time.process_time()
    for i in range(0, len(data), CHUNK):
        data[i : i + CHUNK].splitlines()
    return time.process_time() - t0


EPOCHS, TRAIN_S, EVAL_S = 5, 20.0, 4.0


def simulated_job(until: float) -> list[tuple[float, bytes]]:
    """(time, bytes) of an MNIST-style job without tqdm, up to ``until`` seconds."""
    out: list[tuple[float, bytes]] = []
    for epoch in range(1, EPOCHS + 1):
        t0 = (epoch - 1) * (TRAIN_S + EVAL_S)
        for pct in range(101):
            bar = f"\rEpoch {epoch}/{EPOCHS} [{'#' * (pct * 30 // 100):.<30}] {pct:3d}% loss=0.{pct:04d}"
            out.append((t0 + pct * TRAIN_S / 100, bar.encode()))
        out.append(
            (t0 + TRAIN_S + EVAL_S, f"\rEpoch {epoch}/{EPOCHS} train_loss=0.1 test_acc=0.98\n".encode())
        )
    return [(at, data) for at, data in out if at <= until]


def etas(until: float) -> tuple[float | None, float | None, float | None]:
    """ETA from the app's live parser, from jobs --json with the runner's time index, and without it."""
    writes = simulated_job(until)
    now = [0.0]
    app = LogInsights(clock=lambda: now[0])
    with tempfile.TemporaryDirectory() as tmp:
        clock = LogClock(f"{tmp}/output.times", 0, now=lambda: 1.7e9 + now[0])
        for at, data in writes:
            now[0] = at
            app.feed(data)
            clock.wrote(len(data))
        clock.close()
        log = b"".join(data for _, data in writes)
        start = max(0, len(log) - TAIL_BYTES)
        cold = timed_parser(log[start:], start, read_times(f"{tmp}/output.times", start, len(log)))
    blind = timed_parser(log[start:], start, [])
    return app.snapshot().eta_s, cold.snapshot().eta_s, blind.snapshot().eta_s


def eta_table() -> None:
    print(
        f"\nETA of a simulated job ({EPOCHS} epochs of {TRAIN_S:.0f} s training + {EVAL_S:.0f} s evaluation):"
    )
    print(f"{'at s':>6}  {'true':>6}  {'app (live)':>10}  {'jobs --json':>11}  {'no index':>8}  jobs/app")
    for until in (34.0, 58.0, 74.0, 106.0):
        live, cold, blind = etas(until)
        ratio = f"{cold / live:.2f}" if cold and live else "-"
        shown = [f"{v:.1f}" if v is not None else "null" for v in (live, cold, blind)]
        true = EPOCHS * (TRAIN_S + EVAL_S) - until
        print(f"{until:6.0f}  {true:6.0f}  {shown[0]:>10}  {shown[1]:>11}  {shown[2]:>8}  {ratio}")


def step_log(target_bytes: int) -> bytes:
    """A training loop's print per step, as bench/ui_tick.py floods the app with (\\r\\n line ends)."""
    out, size, i = [], 0, 0
    while size < target_bytes:
        line = b"step %d/100000 loss=%.4f lr=3.0e-04 grad_norm=1.02 tokens/s=31337 | epoch 2\r\n" % (
            i,
            2.0 / (1 + i / 1e4),
        )
        out.append(line)
        size += len(line)
        i += 1
    return b"".join(out)


_BLOCKS = " ▏▎▍▌▋▊▉█"  # tqdm's bar: a 10-cell bar fills in eighths


def _interval(seconds: float) -> str:
    """tqdm's format_interval."""
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _num(value: float) -> str:
    """tqdm's format_num of a postfix float ("0.386", "0.39", "1.2e-05")."""
    short = f"{value:.3g}".replace("+0", "+").replace("-0", "-")
    return short if len(short) < len(str(value)) else str(value)


def _redraw(desc: str, n: int, total: int, elapsed: float, rate: float | None, post: str = "") -> str:
    """One redraw as tqdm 4.x's format_meter writes it to a file (unicode blocks, a 10-cell bar)."""
    full, part = divmod(int(n / total * 80), 8)
    bar = _BLOCKS[-1] * full + (_BLOCKS[part] + " " * (9 - full) if full < 10 else "")
    if rate is None:
        times = f"{_interval(elapsed)}<?, ?it/s"
    else:
        speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
        times = f"{_interval(elapsed)}<{_interval((total - n) / rate)}, {speed}"
    return f"{desc}: {100 * n / total:3.0f}%|{bar}| {n}/{total} [{times}{', ' + post if post else ''}]"


def tqdm_log(target_bytes: int, seed: int = 0) -> bytes:
    """What tqdm writes to a log file for a training loop (the format of tests/fixtures/logs/tqdm_recorded.log,
    recorded from tqdm 4.70.1): per epoch 469 redraws with set_postfix floats in tqdm's own widths, a bar that
    fills in partial blocks, a dict line written through tqdm every 100 steps (the bar is cleared and drawn
    again), a 40-step validation bar that is cleared at the end, and an epoch summary."""
    rnd = random.Random(seed)
    out: list[str] = []
    last = 0  # the length of the line on screen: a shorter redraw pads it out with spaces
    loss, clock = 2.3, 0.0

    def draw(line: str) -> None:
        nonlocal last
        out.append("\r" + line + " " * max(last - len(line), 0))
        last = len(line)

    def clear(then: str) -> None:
        nonlocal last
        out.append("\r" + " " * last + "\r" + then)
        last = 0

    def bar(desc: str, total: int, step_s: tuple[float, float], post: bool) -> None:
        nonlocal clock, loss
        start, rate = clock, None
        draw(_redraw(desc, 0, total, 0, None))
        for n in range(1, total + 1):
            step = rnd.uniform(*step_s)
            clock += step
            rate = 1 / step if rate is None else 0.7 * rate + 0.3 / step  # tqdm smooths its rate
            text = ""
            if post:
                loss = min(5.0, max(0.01, loss * rnd.uniform(0.98, 1.0204)))  # a walk, as losses wander
                text = f"acc={_num(min(0.99, 1 - loss / 3 + rnd.uniform(-0.02, 0.02)))}, loss={_num(loss)}"
            draw(line := _redraw(desc, n, total, clock - start, rate, text))
            if post and n % 100 == 0:
                clear(
                    f"{{'loss': {loss:.4f}, 'learning_rate': 4.5e-05, 'epoch': {epoch - 1 + n / total:.2f}}}\n"
                )
                draw(line)

    epoch = 0
    while len(out) * 80 < target_bytes:  # (about 80 bytes a redraw)
        epoch += 1
        bar(f"Epoch {epoch}/500", 469, (0.25, 0.35), post=True)
        out.append("\n")
        last = 0
        bar("Validation", 40, (0.1, 0.2), post=False)
        clear(
            f"Epoch {epoch}/500 train_loss={loss:.4f} val_loss={loss * 1.1:.4f} val_acc={1 - loss / 2.5:.4f}\n"
        )
    return "".join(out).encode()


def throughput(title: str, data: bytes, runs: int, old: type | None) -> None:
    """Lines/s of LogInsights, the round-1 parser and splitlines over ``data`` (interleaved runs, median)."""
    lines = len(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").splitlines())
    mb = len(data) / 1e6
    times: dict[str, list[float]] = {"now": [], "round1": [], "split": []}
    for _ in range(runs):  # interleaved, so a busy machine slows all three alike
        times["now"].append(time_insights(data))
        if old is not None:
            times["round1"].append(time_insights(data, old))
        times["split"].append(time_splitlines(data))
    ins, spl = statistics.median(times["now"]), statistics.median(times["split"])
    print(f"{title}: {mb:.1f} MB, {lines} lines (\\r redraws count as lines), {runs} runs, median")
    print(f"  LogInsights.feed     : {lines / ins:12,.0f} lines/s  {mb / ins:8.1f} MB/s")
    if old is not None:
        r1 = statistics.median(times["round1"])
        print(f"  round-1 parser ({ROUND1}): {lines / r1:8,.0f} lines/s  {mb / r1:8.1f} MB/s")
    print(f"  bytes.splitlines peer: {lines / spl:12,.0f} lines/s  {mb / spl:8.1f} MB/s")
    print(f"  ratio (splitlines / LogInsights): {ins / spl:.0f}x")
    if old is not None:
        print(f"  speed-up over the round-1 parser: {r1 / ins:.1f}x")


def parts(size: int, runs: int) -> None:
    """Where the mixed log's time goes: LogInsights per epoch of it, and without each kind of line between
    the redraws (an HF dict line and a plain line twice an epoch each, one epoch summary), so the difference
    is that kind's cost."""
    print("\nmixed log, per epoch (157 redraws and the lines between them), without each kind of line:")
    full = 0.0
    for title, leave_out in (
        ("everything", {}),
        ("without the 4 HF dict lines", {"dicts": False}),
        ("without the 4 plain lines", {"plains": False}),
        ("without the epoch summary", {"summaries": False}),
        ("redraws alone", {"dicts": False, "plains": False, "summaries": False}),
    ):
        data = make_log(size, **leave_out)
        epochs = data.count(b"| 0/469 [")
        us = statistics.median(time_insights(data) for _ in range(runs)) / epochs * 1e6
        full = full or us
        print(f"  {title:28s}: {us:6.1f} us an epoch ({full - us:5.1f} us less)")


def hostile(runs: int) -> None:
    """CPU time of the logs tests/test_insights.py checks for bounds and results (a test asserts no time):
    one 10 MB line with no newline, whole and in 64 KiB chunks, then a tqdm bar; 200,000 bare \\r redraws."""
    junk = b"0123456789 loss=1 [00:01<00:02, " * (10 * 1024 * 1024 // 32)
    bar = " 50%|█████     | 5/10 [00:01<00:01,  5.0it/s]\n".encode()
    redraws = b"x\r" * 200_000 + b"Epoch 2/5 train_loss=0.1234 test_acc=0.9812\n"

    def fed(data: bytes, chunk: int) -> float:
        ins = LogInsights(clock=lambda: 0.0)
        t0 = time.process_time()
        for i in range(0, len(data), chunk):
            ins.feed(data[i : i + chunk])
        ins.snapshot()
        return time.process_time() - t0

    print("\nhostile logs (median CPU time):")
    for title, data, chunk in (
        ("10 MB line, one feed", junk + bar, len(junk) + len(bar)),
        ("10 MB line, 64 KiB feeds", junk + bar, CHUNK),
        ("200,000 bare \\r redraws", redraws, CHUNK),
    ):
        print(f"  {title:26s}: {statistics.median(fed(data, chunk) for _ in range(runs)):6.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=8.0, help="size of each synthetic log")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--parts", action="store_true", help="also the mixed log's cost per kind of line")
    ap.add_argument("--hostile", action="store_true", help="also a 10 MB line and 200,000 bare redraws")
    args = ap.parse_args()
    size = int(args.mb * 1024 * 1024)
    old = round1_parser()
    throughput("mixed log (tqdm redraws, HF dicts, warnings)", make_log(size), args.runs, old)
    throughput("step prints (bench/ui_tick.py's flood line)", step_log(size), args.runs, old)
    throughput("tqdm's own output (its format, fresh numbers)", tqdm_log(size // 2), args.runs, old)
    throughput("interleaved (tqdm, HF dict, Lightning bar, plain: a new kind every line)",
               interleaved_log(size // 2), args.runs, old)
    if args.parts:
        parts(size, args.runs)
    if args.hostile:
        hostile(args.runs)
    eta_table()


if __name__ == "__main__":
    main()

"""Throughput of LogInsights on a realistic mixed training log, next to bytes.splitlines().

Run: python bench/insights.py [--mb 8] [--runs 5]. Prints lines/s and MB/s (median of the runs)
for LogInsights.feed() in 64 KiB chunks and, as a peer over the same bytes, a plain
bytes.splitlines(); plus the ratio. No asserts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputui.core.insights import LogInsights  # noqa: E402

CHUNK = 64 * 1024


def make_log(target_bytes: int, seed: int = 0) -> bytes:
    """tqdm \\r redraws with a loss postfix, epoch summaries, HF dict lines and plain lines."""
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
                out.append(extra)
                size += len(extra)
        line = (
            f"\nEpoch {epoch}/50 train_loss={rnd.uniform(0.05, 0.3):.4f} test_loss=0.0567 "
            f"test_acc={rnd.uniform(0.9, 0.99):.4f} lr=0.001 time=12.3s\n"
        )
        out.append(line)
        size += len(line)
    return "".join(out).encode()


def time_insights(data: bytes) -> float:
    ins = LogInsights(clock=lambda: 0.0)
    t0 = time.perf_counter()
    for i in range(0, len(data), CHUNK):
        ins.feed(data[i : i + CHUNK])
    ins.snapshot()
    return time.perf_counter() - t0


def time_splitlines(data: bytes) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(data), CHUNK):
        data[i : i + CHUNK].splitlines()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=8.0, help="size of the synthetic log")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    data = make_log(int(args.mb * 1024 * 1024))
    lines = len(data.replace(b"\r", b"\n").splitlines())
    mb = len(data) / 1e6
    ins = statistics.median(time_insights(data) for _ in range(args.runs))
    spl = statistics.median(time_splitlines(data) for _ in range(args.runs))
    print(f"log: {mb:.1f} MB, {lines} lines (\\r redraws count as lines), {args.runs} runs, median")
    print(f"LogInsights.feed     : {lines / ins:12,.0f} lines/s  {mb / ins:8.1f} MB/s")
    print(f"bytes.splitlines peer: {lines / spl:12,.0f} lines/s  {mb / spl:8.1f} MB/s")
    print(f"ratio (splitlines / LogInsights): {ins / spl:.0f}x")


if __name__ == "__main__":
    main()

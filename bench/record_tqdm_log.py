"""Record what real tqdm writes to a log file for a training loop: tests/fixtures/logs/tqdm_recorded.log.

Run: pip install tqdm && python bench/record_tqdm_log.py [--epochs 2 --steps 240 --out PATH]. tqdm is not a
gputui dependency; this script only records its output once (the fixture is committed). A fake clock makes
each step take about 0.3 s, as on a GPU, so the rate, elapsed and remaining fields look like a real run's.
Per epoch: a training bar with tqdm's own postfix formatting (set_postfix of floats: widths vary, "0.386",
"0.39", "0.0999"), partial-block bars, an HF-style dict line written every 100 steps, a validation bar that
is cleared (leave=False) and an epoch summary line.
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path

import tqdm as tqdm_pkg
import tqdm.std as tqdm_std
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]


def record(epochs: int, steps: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    now = [1.7e9]
    tqdm_std.time = lambda: now[0]  # tqdm reads its clock through this name
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", newline="", write_through=True)  # a file: unicode bars
    loss = 2.3
    for epoch in range(1, epochs + 1):
        bar = tqdm(total=steps, desc=f"Epoch {epoch}/{epochs}", file=out, mininterval=0.1)
        for step in range(steps):
            now[0] += rnd.uniform(0.25, 0.35)
            loss = max(0.01, loss * rnd.uniform(0.97, 1.02))
            bar.set_postfix(loss=loss, acc=min(0.99, 1 - loss / 3 + rnd.uniform(-0.02, 0.02)), refresh=False)
            bar.update(1)
            if step % 100 == 99:
                bar.write(
                    f"{{'loss': {loss:.4f}, 'learning_rate': 4.5e-05, 'epoch': {epoch - 1 + step / steps:.2f}}}",
                    file=out,
                )
        bar.close()
        val = tqdm(total=40, desc="Validation", file=out, leave=False, mininterval=0.1)
        for _ in range(40):
            now[0] += rnd.uniform(0.1, 0.2)
            val.update(1)
        val.close()
        out.write(
            f"Epoch {epoch}/{epochs} train_loss={loss:.4f} val_loss={loss * 1.1:.4f} val_acc={1 - loss / 2.5:.4f}\n"
        )
    return raw.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "logs" / "tqdm_recorded.log")
    args = ap.parse_args()
    data = record(args.epochs, args.steps)
    args.out.write_bytes(data)
    print(f"{args.out}: {len(data)} bytes from tqdm {tqdm_pkg.__version__}")


if __name__ == "__main__":
    main()

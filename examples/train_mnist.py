"""Train the classic small CNN on MNIST: gputui's shipped example job.

Two conv layers and two linear layers, Adam and cross-entropy, on MNIST read from its idx files
(downloaded when missing). Per-epoch results go to stdout as one parse-friendly line each::

    Epoch 2/5 train_loss=0.1234 test_loss=0.0567 test_acc=0.9812 lr=0.001 time=12.3s

A progress bar goes to stderr. The out dir receives ``model.pt`` (checkpoint), ``summary.json`` and a
checkpoint per epoch in ``ckpt/epoch-NNN.pt``. Ctrl-C saves what is done, then re-raises KeyboardInterrupt.

Resume: ``--resume PATH``, or ``GPUTUI_RESUME_FROM`` (set by ``gputui run --restart on-failure
--resume-from 'runs/x/ckpt/*.pt'`` on each restart), continues from that epoch checkpoint in its run dir.

Offline: when MNIST can't be downloaded, the script says so and trains on the stand-in that
``mnist_from_digits.py`` builds from scikit-learn's bundled handwritten digits.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import struct
import sys
import time
import urllib.request
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
EXIT_NO_DATA = 2
MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
DOWNLOAD_TIMEOUT_S = 30
IDX_UBYTE = 0x08  # the idx type code of unsigned bytes, the only one MNIST uses


class Net(nn.Module):
    """The classic PyTorch MNIST CNN: conv(32) -> conv(64) -> maxpool -> fc(128) -> fc(10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)  # logits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(description="Train a small CNN on MNIST (gputui example job).")
    p.add_argument(
        "--data-dir", default="./data", help="dataset root; files in DATA_DIR/MNIST/raw (default ./data)"
    )
    p.add_argument("--epochs", type=int, default=3, help="number of epochs (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch size (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument(
        "--amp", action="store_true", help="mixed precision: bf16 on cpu, fp16 + GradScaler on cuda"
    )
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (default 2)")
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default=default_device, help=f"default {default_device}"
    )
    p.add_argument("--out", default=None, help="output dir (default ./runs/mnist-<timestamp>)")
    p.add_argument(
        "--limit-train", type=int, default=None, metavar="N", help="use only the first N train images"
    )
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument(
        "--mirror", action="append", metavar="URL", help="download MNIST from this base URL (repeatable)"
    )
    p.add_argument("--resume", default=os.environ.get("GPUTUI_RESUME_FROM") or None, metavar="PATH",
                   help="continue from this epoch checkpoint (default: $GPUTUI_RESUME_FROM, set by gputui restarts)")
    args = p.parse_args(argv)
    if args.out is None and args.resume:
        args.out = str(Path(args.resume).resolve().parent.parent)  # the run dir the checkpoint belongs to
    if args.out is None:
        args.out = f"./runs/mnist-{datetime.now():%Y%m%d-%H%M%S}"
    return args


class Progress:
    """A progress bar on stderr: tqdm when importable, else a self-drawn ``\\r`` percentage bar."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done, self._shown = max(total, 1), desc, 0, -1
        try:
            from tqdm import tqdm
        except ImportError:
            self._tqdm = None
        else:
            self._tqdm = tqdm(total=total, desc=desc, unit="batch", file=sys.stderr, leave=False)

    def update(self, n: int = 1, loss: float | None = None) -> None:
        self.done += n
        if self._tqdm is not None:
            self._tqdm.update(n)
            if loss is not None:
                self._tqdm.set_postfix(loss=f"{loss:.4f}", refresh=False)
            return
        pct = 100 * self.done // self.total
        if pct == self._shown:  # redraw only when the percentage changes
            return
        self._shown = pct
        filled = pct * 30 // 100
        tail = f" loss={loss:.4f}" if loss is not None else ""
        sys.stderr.write(f"\r{self.desc} [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}%{tail}")
        sys.stderr.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._shown >= 0:
            sys.stderr.write("\r\033[K")  # clear the line so stdout lines stay clean on a terminal
            sys.stderr.flush()


def read_idx(path: Path) -> torch.Tensor:
    """An idx file of unsigned bytes (plain or gzipped) as a uint8 tensor: (N, rows, cols) or (N,)."""
    data = (gzip.decompress if path.suffix == ".gz" else bytes)(path.read_bytes())
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != IDX_UBYTE:
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = data[4 + 4 * ndim :]
    if len(body) != int(torch.Size(dims).numel()):
        raise ValueError(f"{path}: {len(body)} bytes of data for dimensions {dims}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def raw_file(raw: Path, name: str) -> Path | None:
    """``raw/name`` or ``raw/name.gz``, whichever exists."""
    return next((p for p in (raw / name, raw / f"{name}.gz") if p.is_file()), None)


def download(raw: Path, mirrors: tuple[str, ...]) -> None:
    """Fetch the missing ``.gz`` files into ``raw``, trying each mirror in turn; raises OSError when all fail."""
    raw.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        if raw_file(raw, name):
            continue
        errors = []
        for mirror in mirrors:
            url = f"{mirror.rstrip('/')}/{name}.gz"
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
                    data = resp.read()
                gzip.decompress(data)  # a proxy's error page is no data set
            except (OSError, EOFError, ValueError) as exc:
                errors.append(f"{url}: {exc}")
                continue
            part = raw / f"{name}.gz.part"
            part.write_bytes(data)
            part.replace(raw / f"{name}.gz")
            break
        else:
            raise OSError("; ".join(errors))


def as_dataset(raw: Path, split: str) -> TensorDataset:
    """The split's images normalised like MNIST (N, 1, 28, 28) with their labels."""
    images, labels = (
        read_idx(raw_file(raw, n) or raw / n)
        for n in (f"{split}-images-idx3-ubyte", f"{split}-labels-idx1-ubyte")
    )
    if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
        raise ValueError(
            f"{raw}: {split} images {tuple(images.shape)} do not match labels {tuple(labels.shape)}"
        )
    x = (images.float() / 255.0 - MNIST_MEAN) / MNIST_STD
    return TensorDataset(x.unsqueeze(1), labels.long())


def offline_digits(data_dir: str) -> Path:
    """Build (once) the stand-in from scikit-learn's digits under ``data_dir/digits``; its raw dir."""
    target = Path(data_dir) / "digits"
    raw = target / "MNIST" / "raw"
    if not all(raw_file(raw, name) for name in RAW_FILES):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from mnist_from_digits import build

        build(target)
    return raw


def load_mnist(data_dir: str, mirrors: tuple[str, ...]) -> tuple[Dataset, Dataset, str]:
    """MNIST from ``data_dir/MNIST/raw``, downloaded when missing; when that is impossible, the offline
    stand-in (with a message saying so). Returns (train, test, name of the data set)."""
    raw = Path(data_dir) / "MNIST" / "raw"
    name = "mnist"
    if not all(raw_file(raw, f) for f in RAW_FILES):
        print(f"MNIST not found in {raw}; downloading ...", flush=True)
        try:
            download(raw, mirrors)
        except OSError as exc:
            print(
                f"MNIST could not be downloaded ({exc}).\n"
                "Training offline on the stand-in built from scikit-learn's handwritten digits instead "
                f"(1437 train / 360 test images, in {Path(data_dir) / 'digits'}). For the real MNIST, copy "
                f"the four files {', '.join(RAW_FILES)} (or their .gz) into {raw}/ and run again.",
                flush=True,
            )
            try:
                raw, name = offline_digits(data_dir), "digits"
            except ImportError as err:
                print(f"error: no offline data set either: {err} (pip install scikit-learn)", file=sys.stderr)
                sys.exit(EXIT_NO_DATA)
    try:
        return as_dataset(raw, "train"), as_dataset(raw, "t10k"), name
    except (OSError, ValueError) as exc:
        print(f"error: could not load MNIST from {raw}: {exc}", file=sys.stderr)
        sys.exit(EXIT_NO_DATA)


def autocast(device: torch.device, enabled: bool) -> AbstractContextManager[Any]:
    """bf16 autocast on cpu, fp16 on cuda; a no-op when disabled."""
    if not enabled:
        return nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_epoch(
    model: nn.Module,
    loader: DataLoader,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    device: torch.device,
    amp: bool,
    desc: str,
) -> float:
    """One pass over ``loader``; returns the mean training loss."""
    model.train()
    total, count = 0.0, 0
    bar = Progress(len(loader), desc)
    try:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with autocast(device, amp):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            total += loss.item() * len(y)
            count += len(y)
            bar.update(1, loss.item())
    finally:
        bar.close()
    return total / max(count, 1)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, amp: bool) -> tuple[float, float]:
    """Returns (mean loss, accuracy) on ``loader``."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        count += len(y)
    return loss_sum / max(count, 1), correct / max(count, 1)


def save(
    out: Path,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    args: argparse.Namespace,
    device: torch.device,
    history: list[dict[str, float]],
    started: float,
    status: str,
) -> dict[str, Any]:
    """Write ``model.pt`` and ``summary.json`` into ``out``; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    last = history[-1] if history else {}
    summary: dict[str, Any] = {
        "status": status,  # "completed" or "interrupted"
        "epochs": len(history),  # epochs completed
        "epochs_planned": args.epochs,
        "test_acc": last.get("test_acc"),
        "test_loss": last.get("test_loss"),
        "best_acc": max((h["test_acc"] for h in history), default=None),
        "history": history,
        "device": str(device),
        "amp": args.amp,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seconds": round(time.time() - started, 2),
        "torch_version": str(torch.__version__),
        "dataset": args.dataset,
    }
    checkpoint = {
        "model_state": model.state_dict(),
        "optimizer_state": opt.state_dict(),
        "epoch": len(history),
        "status": status,
        "test_acc": summary["test_acc"],
        "args": dict(vars(args)),
        "torch_version": str(torch.__version__),
    }
    torch.save(checkpoint, out / "model.pt")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def save_epoch(out: Path, model: nn.Module, opt: torch.optim.Optimizer, history: list[dict[str, float]]) -> Path:
    """Write this epoch's checkpoint ``out/ckpt/epoch-NNN.pt`` whole (a temp name, then a rename): a restart
    never resumes from a half-written file."""
    ckpt = out / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    path = ckpt / f"epoch-{len(history):03d}.pt"
    tmp = path.with_name(path.name + ".tmp")
    state = {"model_state": model.state_dict(), "optimizer_state": opt.state_dict(), "epoch": len(history),
             "history": history, "rng_state": torch.get_rng_state()}
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def resume(path: str, model: nn.Module, opt: torch.optim.Optimizer) -> list[dict[str, float]]:
    """Load an epoch checkpoint into ``model`` and ``opt``; the history of the epochs it holds."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model_state"])
    opt.load_state_dict(state["optimizer_state"])
    torch.set_rng_state(state["rng_state"])
    return list(state["history"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda requested but CUDA is not available (use --device cpu)", file=sys.stderr)
        return EXIT_NO_DATA
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    out = Path(args.out)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gputui MNIST example: torch {torch.__version__}")
    print(
        f"Device: {device} ({name}){' amp=' + ('fp16' if device.type == 'cuda' else 'bf16') if args.amp else ''}"
    )

    train_set, test_set, args.dataset = load_mnist(args.data_dir, tuple(args.mirror or MIRRORS))
    if args.limit_train is not None:
        train_set = Subset(train_set, range(min(args.limit_train, len(train_set))))
    pin = device.type == "cuda"
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=pin
    )
    test_loader = DataLoader(test_set, batch_size=1000, num_workers=args.workers, pin_memory=pin)
    print(
        f"Data: {len(train_set)} train / {len(test_set)} test images ({args.dataset}) from {args.data_dir}; "
        f"epochs={args.epochs} batch_size={args.batch_size} lr={args.lr:g} out={out}",
        flush=True,
    )

    model = Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and device.type == "cuda")
    history: list[dict[str, float]] = []
    if args.resume:
        history = resume(args.resume, model, opt)
        print(f"Resumed from {args.resume} after epoch {len(history)}", flush=True)
    started = time.time()
    try:
        for epoch in range(len(history) + 1, args.epochs + 1):
            t0 = time.time()
            train_loss = train_epoch(
                model, train_loader, opt, scaler, device, args.amp, f"Epoch {epoch}/{args.epochs}"
            )
            test_loss, test_acc = evaluate(model, test_loader, device, args.amp)
            lr = opt.param_groups[0]["lr"]
            secs = time.time() - t0
            history.append(
                {
                    "epoch": epoch,
                    "train_loss": train_loss,
                    "test_loss": test_loss,
                    "test_acc": test_acc,
                    "lr": lr,
                    "seconds": round(secs, 2),
                }
            )
            print(
                f"Epoch {epoch}/{args.epochs} train_loss={train_loss:.4f} test_loss={test_loss:.4f} "
                f"test_acc={test_acc:.4f} lr={lr:g} time={secs:.1f}s",
                flush=True,
            )
            save_epoch(out, model, opt, history)
    except KeyboardInterrupt:
        save(out, model, opt, args, device, history, started, "interrupted")
        print(
            f"\nInterrupted after {len(history)} epoch(s); checkpoint saved to {out / 'model.pt'}", flush=True
        )
        raise

    summary = save(out, model, opt, args, device, history, started, "completed")
    acc = f"test_acc={summary['test_acc']:.4f} best_acc={summary['best_acc']:.4f} " if history else ""
    print(f"Done: {acc}time={summary['seconds']:.1f}s out={out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build a small MNIST-format data set from scikit-learn's real handwritten digits.

scikit-learn ships 1797 handwritten 8x8 digits (values 0..16) with the package, so no
download is needed. Each image is upscaled to 20x20 by bilinear interpolation, centred
in a 28x28 frame like MNIST and scaled to 0..255 uint8. The result is a deterministic,
stratified 80/20 train/test split written as the four idx files that
MNIST readers (``train_mnist.py``, torchvision) read unchanged from ``<DATA_DIR>/MNIST/raw/``.

Usage: ``python examples/mnist_from_digits.py DATA_DIR``
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

IMAGE_MAGIC = 2051  # idx3-ubyte: unsigned byte, 3 dimensions
LABEL_MAGIC = 2049  # idx1-ubyte: unsigned byte, 1 dimension
SIDE = 28  # MNIST frame size
INNER = 20  # MNIST digits are fitted in a 20x20 box centred in the frame

RAW_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


def _bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """Return the (dst, src) matrix that resamples a 1-D signal bilinearly (pixel centres aligned)."""
    pos = (np.arange(dst) + 0.5) * src / dst - 0.5
    pos = np.clip(pos, 0, src - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, src - 1)
    frac = pos - lo
    m = np.zeros((dst, src))
    m[np.arange(dst), lo] += 1 - frac
    m[np.arange(dst), hi] += frac
    return m


def digits_to_mnist(images: np.ndarray) -> np.ndarray:
    """Turn (N, 8, 8) digits in 0..16 into (N, 28, 28) uint8 MNIST-like images."""
    n, h, w = images.shape
    rows, cols = _bilinear_matrix(h, INNER), _bilinear_matrix(w, INNER)
    scaled = rows @ images.astype(np.float64) @ cols.T  # (N, 20, 20)
    frame = np.zeros((n, SIDE, SIDE))
    off = (SIDE - INNER) // 2
    frame[:, off : off + INNER, off : off + INNER] = scaled
    return np.clip(np.rint(frame * 255.0 / 16.0), 0, 255).astype(np.uint8)


def write_idx_images(path: Path, images: np.ndarray) -> None:
    """Write (N, rows, cols) uint8 images as an idx3-ubyte file (big-endian header)."""
    n, rows, cols = images.shape
    with open(path, "wb") as f:
        f.write(struct.pack(">IIII", IMAGE_MAGIC, n, rows, cols))
        f.write(np.ascontiguousarray(images, dtype=np.uint8).tobytes())


def write_idx_labels(path: Path, labels: np.ndarray) -> None:
    """Write (N,) labels as an idx1-ubyte file (big-endian header)."""
    with open(path, "wb") as f:
        f.write(struct.pack(">II", LABEL_MAGIC, len(labels)))
        f.write(np.asarray(labels, dtype=np.uint8).tobytes())


def build(data_dir: str | Path, test_fraction: float = 0.2, seed: int = 0) -> dict[str, int]:
    """Write the digits data set into ``<data_dir>/MNIST/raw``; return the split sizes."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits_to_mnist(digits.images)
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=test_fraction, stratify=digits.target, random_state=seed
    )
    raw = Path(data_dir) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        write_idx_images(raw / RAW_FILES[(split, "images")], x)
        write_idx_labels(raw / RAW_FILES[(split, "labels")], y)
    return {"train": len(y_train), "test": len(y_test)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="data directory; files go to DATA_DIR/MNIST/raw/")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="share held out for testing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stratified split")
    args = parser.parse_args(argv)

    sizes = build(args.data_dir, args.test_fraction, args.seed)
    raw = Path(args.data_dir) / "MNIST" / "raw"
    print(f"Wrote {sizes['train']} train / {sizes['test']} test digits (28x28) to {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

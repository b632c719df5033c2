"""End-to-end test of the shipped MNIST example on the offline digits data set (CPU only)."""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("sklearn")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EPOCHS = 4
EPOCH_LINE = re.compile(
    r"^Epoch (\d+)/(\d+) train_loss=(\d+\.\d{4}) test_loss=(\d+\.\d{4}) "
    r"test_acc=(\d\.\d{4}) lr=(\S+) time=(\d+\.\d)s$",
    re.MULTILINE,
)


def _load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (examples is not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("digits")
    sizes = _load("mnist_from_digits").build(data_dir)
    assert sizes == {"train": 1437, "test": 360}
    return data_dir


@pytest.mark.parametrize("split,count", [("train", 1437), ("t10k", 360)])
def test_idx_headers(digits_dir: Path, split: str, count: int) -> None:
    raw = digits_dir / "MNIST" / "raw"
    images = (raw / f"{split}-images-idx3-ubyte").read_bytes()
    magic, n, rows, cols = struct.unpack(">IIII", images[:16])
    assert (magic, n, rows, cols) == (2051, count, 28, 28)
    assert len(images) == 16 + n * rows * cols

    labels = (raw / f"{split}-labels-idx1-ubyte").read_bytes()
    magic, n = struct.unpack(">II", labels[:8])
    assert (magic, n) == (2049, count)
    assert len(labels) == 8 + n
    assert set(labels[8:]) == set(range(10))


def test_torchvision_reads_digits(digits_dir: Path) -> None:
    from torchvision.datasets import MNIST

    train = MNIST(str(digits_dir), train=True, download=False)
    test = MNIST(str(digits_dir), train=False, download=False)
    assert tuple(train.data.shape) == (1437, 28, 28) and train.data.dtype == torch.uint8
    assert tuple(test.data.shape) == (360, 28, 28)
    assert sorted(train.targets.unique().tolist()) == list(range(10))
    assert train.data[:, :4].max() == 0 and train.data[:, 24:].max() == 0  # centred like MNIST
    image, label = train[0]
    assert image.size == (28, 28) and 0 <= label <= 9


def test_train_mnist_cpu(digits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(EXAMPLES / "train_mnist.py"),
        *("--data-dir", str(digits_dir), "--device", "cpu", "--epochs", str(EPOCHS)),
        *("--batch-size", "32", "--workers", "0", "--out", str(out)),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    lines = EPOCH_LINE.findall(proc.stdout)
    assert [(int(e), int(n)) for e, n, *_ in lines] == [(e, EPOCHS) for e in range(1, EPOCHS + 1)], (
        proc.stdout
    )
    assert "Device: cpu" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == EPOCHS
    assert summary["test_acc"] > 0.90, summary
    assert summary["best_acc"] >= summary["test_acc"]
    assert len(summary["history"]) == EPOCHS and summary["device"] == "cpu"
    assert summary["test_acc"] == pytest.approx(float(lines[-1][4]), abs=1e-4)
    assert summary["torch_version"] == str(torch.__version__)

    checkpoint = torch.load(out / "model.pt")  # weights_only=True by default
    assert checkpoint["epoch"] == EPOCHS
    _load("train_mnist").Net().load_state_dict(checkpoint["model_state"])

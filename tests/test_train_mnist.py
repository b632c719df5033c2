"""End-to-end test of the shipped MNIST example on the offline digits data set (CPU only)."""

from __future__ import annotations

import functools
import gzip
import http.server
import importlib.util
import json
import re
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from sshd import free_port

torch = pytest.importorskip("torch")
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


def test_the_example_reads_digits(digits_dir: Path) -> None:
    example = _load("train_mnist")
    raw = digits_dir / "MNIST" / "raw"
    images = example.read_idx(raw / "train-images-idx3-ubyte")
    assert tuple(images.shape) == (1437, 28, 28) and images.dtype == torch.uint8
    assert images[:, :4].max() == 0 and images[:, 24:].max() == 0  # centred like MNIST
    train, test = example.as_dataset(raw, "train"), example.as_dataset(raw, "t10k")
    assert (len(train), len(test)) == (1437, 360)
    x, y = train[0]
    assert tuple(x.shape) == (1, 28, 28) and x.dtype == torch.float32 and 0 <= int(y) <= 9
    assert sorted(train.tensors[1].unique().tolist()) == list(range(10))


def test_a_truncated_idx_file_is_refused(tmp_path: Path, digits_dir: Path) -> None:
    data = (digits_dir / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").read_bytes()
    bad = tmp_path / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(gzip.compress(data[:-1]))
    with pytest.raises(ValueError, match="359 bytes of data for dimensions"):
        _load("train_mnist").read_idx(bad)


def train(data_dir: Path, out: Path, *extra: str, epochs: int = EPOCHS) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        str(EXAMPLES / "train_mnist.py"),
        *("--data-dir", str(data_dir), "--device", "cpu", "--epochs", str(epochs)),
        *("--batch-size", "32", "--workers", "0", "--out", str(out), *extra),
    ]
    return subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, timeout=110)


@pytest.fixture
def mirror(digits_dir: Path, tmp_path: Path) -> Iterator[str]:
    """A local HTTP mirror serving the digits set as MNIST's four .gz files."""
    root = tmp_path / "mirror"
    root.mkdir()
    for f in (digits_dir / "MNIST" / "raw").iterdir():
        (root / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes()))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_missing_mnist_is_downloaded_from_the_first_mirror_that_answers(mirror: str, tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "run"
    dead = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    proc = train(data, out, "--mirror", dead, "--mirror", mirror, "--limit-train", "256", epochs=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "downloading" in proc.stdout and "could not be downloaded" not in proc.stdout
    assert sorted(f.name for f in (data / "MNIST" / "raw").iterdir()) == [
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
    ]
    assert json.loads((out / "summary.json").read_text())["dataset"] == "mnist"


def test_without_a_download_it_trains_offline_on_the_bundled_digits(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "run"
    dead = f"http://127.0.0.1:{free_port()}/"
    proc = train(data, out, "--mirror", dead, "--limit-train", "256", epochs=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"MNIST could not be downloaded ({dead}t" in proc.stdout
    assert "Training offline on the stand-in built from scikit-learn's handwritten digits" in proc.stdout
    assert "Data: 256 train / 360 test images (digits)" in proc.stdout
    assert (data / "digits" / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file()
    assert not (data / "MNIST" / "raw").exists() or not any((data / "MNIST" / "raw").iterdir())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "digits" and summary["status"] == "completed"


def test_train_mnist_cpu(digits_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = train(digits_dir, out)
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

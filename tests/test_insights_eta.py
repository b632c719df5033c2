"""The ETA of a cold read (gputui jobs --json) from the runner's offset -> time index (remote_agent/jobs/logclock.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gputui.core.insights import LogInsights, timed_parser
from gputui.core.jobs.records import TAIL_BYTES
from remote_agent.jobs.logclock import DENSITY, MAX_ENTRIES, LogClock, read_times

EPOCHS, TRAIN_S, EVAL_S = 5, 20.0, 4.0  # each epoch: 20 s of batches, then 4 s of evaluation


def mnist_run(until: float) -> list[tuple[float, bytes]]:
    """(time, bytes) as examples/train_mnist.py writes them without tqdm, up to ``until`` seconds."""
    out: list[tuple[float, bytes]] = [(0.0, b"gputui MNIST example: torch 2.x\n")]
    t = 0.0
    for epoch in range(1, EPOCHS + 1):
        for pct in range(0, 101):
            filled = pct * 30 // 100
            bar = f"\rEpoch {epoch}/{EPOCHS} [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}% loss=0.{pct:04d}"
            out.append((t + pct * TRAIN_S / 100, bar.encode()))
        t += TRAIN_S + EVAL_S
        summary = f"\r\x1b[KEpoch {epoch}/{EPOCHS} train_loss=0.1 test_loss=0.05 test_acc=0.98 lr=0.001 time={TRAIN_S + EVAL_S}s\n"
        out.append((t, summary.encode()))
    return [(at, data) for at, data in out if at <= until]


def live(writes: list[tuple[float, bytes]]) -> LogInsights:
    """The app's parser: fed each write when it happens."""
    now = [0.0]
    ins = LogInsights(clock=lambda: now[0])
    for at, data in writes:
        now[0] = at
        ins.feed(data)
    return ins


def recorded(writes: list[tuple[float, bytes]], path: Path) -> bytes:
    """The runner's side: output.log's bytes, and output.times written by the real LogClock."""
    now = [0.0]
    clock = LogClock(str(path), 0, now=lambda: 1.7e9 + now[0])
    log = bytearray()
    for at, data in writes:
        now[0] = at
        log += data
        clock.wrote(len(data))
    clock.close()
    return bytes(log)


@pytest.mark.parametrize("until", [2 * 24 + 10.0, 3 * 24 + 2.0, 4 * 24 + 10.0])
def test_cold_eta_matches_the_live_parser(until: float, tmp_path: Path) -> None:
    writes = mnist_run(until)
    want = live(writes).snapshot()
    log = recorded(writes, tmp_path / "output.times")
    start = max(0, len(log) - TAIL_BYTES)  # jobs --json reads the tail
    cold = timed_parser(
        log[start:], start, read_times(str(tmp_path / "output.times"), start, len(log))
    ).snapshot()
    assert want.eta_s is not None and cold.eta_s is not None
    assert cold.progress == pytest.approx(want.progress)
    assert cold.eta_s == pytest.approx(want.eta_s, rel=0.2)
    true_left = EPOCHS * (TRAIN_S + EVAL_S) - until
    assert want.eta_s == pytest.approx(true_left, rel=0.2)  # evaluation time between epochs included


def test_without_the_index_a_cold_read_has_no_rate(tmp_path: Path) -> None:
    writes = mnist_run(2 * 24 + 10.0)
    log = b"".join(data for _, data in writes)
    assert timed_parser(log, 0, []).snapshot().eta_s is None  # the old behaviour: one burst, no rate


def test_epoch_eta_counts_evaluation_between_bars() -> None:
    # tqdm per epoch: the bar's own estimate knows nothing of the 4 s of evaluation after it
    writes: list[tuple[float, bytes]] = []
    t = 0.0
    for epoch in range(1, 4):
        for n in range(0, 21):
            writes.append(
                (
                    t + n * 1.0,
                    b"\rEpoch %d/10: %3d%%|#   | %d/20 [00:%02d<00:%02d,  1.00it/s]"
                    % (epoch, n * 5, n, n, 20 - n),
                )
            )
        t += 24.0
        writes.append((t - 0.5, b"\n"))
    snap = live(writes).snapshot()
    assert snap.epoch == 3 and snap.progress == pytest.approx(0.3)
    assert snap.eta_s == pytest.approx(7 * 24.0, rel=0.05)  # not 7 * 20 s


def test_log_clock_is_small_and_bounded(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "output.times"
    clock = LogClock(str(path), 100, now=lambda: now[0])
    for i in range(200_000):  # 200k writes over ~55 hours
        now[0] = i * 1.0
        clock.wrote(10)
    clock.close()
    lines = path.read_text().splitlines()
    assert len(lines) < 10 * DENSITY and len(lines) <= MAX_ENTRIES
    first, last = (tuple(map(float, line.split())) for line in (lines[0], lines[-1]))
    assert first == (110, 0.0)  # after the first write: 100 bytes were there, plus 10
    assert last[0] <= 100 + 200_000 * 10
    offsets = [int(line.split()[0]) for line in lines]
    assert offsets == sorted(offsets)
    some = read_times(str(path), 50_000, 60_000, limit=16)
    assert len(some) <= 16 and some[0][0] < 50_000 <= some[1][0] and some[-1][0] <= 60_000
    assert read_times(str(tmp_path / "missing"), 0, 10) == []


def test_runner_writes_the_index(tmp_path: Path) -> None:
    """The real runner (in a pty, no tmux needed) records offsets that match output.log."""
    import json
    import subprocess

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    code = "import time\nfor i in range(3):\n    print('line', i, flush=True); time.sleep(1.1)\n"
    (job_dir / "job.json").write_text(
        json.dumps({"argv": [sys.executable, "-c", code], "cwd": str(tmp_path)})
    )
    (job_dir / "env.json").write_text(json.dumps({"PATH": "/usr/bin:/bin"}))
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(root)!r}); from remote_agent.jobs import runner; runner.run({str(job_dir)!r})",
        ],
        check=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    size = (job_dir / "output.log").stat().st_size
    times = read_times(str(job_dir / "output.times"), 0, size)
    assert 2 <= len(times) <= 5
    assert times[-1][0] == size  # the end gets its time when the runner closes the index
    assert all(b[1] - a[1] >= 1.0 for a, b in zip(times[:-1], times[1:-1], strict=False))


def test_agent_serves_the_index_of_a_real_job(agent) -> None:  # noqa: ANN001 (conftest's AgentProc)
    """jobs --json's path: a job run by the real agent in tmux, then the logs.times op."""
    code = "import time\nfor i in range(4):\n    print('Epoch', i + 1, '/4 loss=0.5', flush=True); time.sleep(1.1)\n"
    rep = agent.call("jobs.start", argv=[sys.executable, "-c", code])
    assert rep["ok"], rep
    job = rep["result"]["id"]
    assert agent.call("logs.follow", job=job, offset=0)["ok"]
    end = agent.wait_event(("log_end",), 60, job=job)["data"]
    times = agent.call("logs.times", job=job, start=0, end=end["offset"])["result"]["times"]
    assert 2 <= len(times) <= 6 and times[-1][0] == end["offset"]
    assert agent.call("logs.times", job=job, start=end["offset"] + 1, end=end["offset"] + 9)["result"][
        "times"
    ] == [times[-1]]
    assert agent.call("logs.times", job="x", start=0, end=1)["ok"] is False

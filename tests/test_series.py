"""Metric series kept on the host beside each job's log (remote_agent/jobs/series.py), served by logs.series
and checked by the client (gputui/core/session/series.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import AgentProc, wait_for

from gputui.core.session.series import X_EPOCH, X_LINE, X_STEP, JobSeries
from remote_agent import protocol as P
from remote_agent.jobs import series as job_series


def _job(tmp_path: Path, log: bytes, name: str = "job") -> Path:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "output.log").write_bytes(log)
    return d


def _wire(d: Path, ended: bool = True) -> JobSeries:
    ex, size = job_series.update(str(d), ended)
    return JobSeries.from_wire("h", "1", json.loads(json.dumps(job_series.result("1", ex, size))))


def test_every_shape_of_metric_line_becomes_points_on_the_step_axis(tmp_path: Path) -> None:
    log = b"".join([
        b"step 1 loss=2.0 lr=0.1\n",
        b"{'loss': 1.5, 'learning_rate': 0.09, 'epoch': 0.5, 'step': 2}\n",
        b"train:  40%|####  | 3/10 [00:01<00:02, loss=1.2]\r",
        b"train:  40%|####  | 3/10 [00:01<00:02, loss=1.1]\r",  # a redraw of the same step: replaces it
        b"train:  50%|####  | 4/10 [00:01<00:02, loss=1.0]\n",
        b"val_loss: 0.9 val_acc: 0.7\n",
        b"batch_size=64 seed=3\n",  # settings, not metrics
    ])
    js = _wire(_job(tmp_path, log))
    loss = js.get("loss")
    assert loss is not None and loss.x_label == X_STEP
    assert loss.xy() == [(1.0, 2.0), (2.0, 1.5), (3.0, 1.1), (4.0, 1.0)]
    assert loss.count == 5 and loss.best == 1.0 and loss.last == 1.0
    val = js.get("val_loss")
    assert val is not None and val.is_eval and val.xy() == [(4.0, 0.9)]
    assert js.get("val_acc") is not None and js.get("val_acc").best == 0.7  # type: ignore[union-attr]
    assert js.get("batch_size") is None and js.get("seed") is None
    assert js.done and not js.partial


def test_without_a_step_the_x_is_the_epoch_else_the_line(tmp_path: Path) -> None:
    js = _wire(_job(tmp_path, b"Epoch 1: 50%|##| 5/10 [00:01, loss=0.5]\nEpoch 2 loss: 0.4\n"))
    assert js.get("loss").x_label == X_EPOCH and js.get("loss").xy() == [(1.5, 0.5), (2.0, 0.4)]  # type: ignore[union-attr]
    js = _wire(_job(tmp_path, b"hello\nloss 0.5 | acc=0.1\nacc=0.2\n", "other"))
    acc = js.get("acc")
    assert acc is not None and acc.x_label == X_LINE and acc.xy() == [(2.0, 0.1), (3.0, 0.2)]


def test_a_long_run_is_bounded_downsampled_and_keeps_its_summary(tmp_path: Path) -> None:
    n = 3 * job_series.MAX_POINTS
    lines = [f"step {i} loss={1000 - i / 10}".encode() for i in range(n)]
    lines += [f"m{i}_loss={i}".encode() for i in range(3 * job_series.MAX_SERIES)]  # more names than are kept
    js = _wire(_job(tmp_path, b"\n".join(lines) + b"\n"))
    loss = js.get("loss")
    assert loss is not None and job_series.MAX_POINTS // 2 <= len(loss.points) <= job_series.MAX_POINTS
    xs = [x for x, _ in loss.xy()]
    assert xs == sorted(xs) and xs[0] == 0.0 and xs[-1] >= n - 8  # evenly thinned over the whole run
    assert loss.count == n and loss.low == 1000 - (n - 1) / 10 and loss.high == 1000
    assert len(js.series) == job_series.MAX_SERIES


def test_an_ended_jobs_series_are_read_once_then_served_from_the_file(tmp_path: Path) -> None:
    d = _job(tmp_path, b"step 1 loss=2.0\nstep 2 loss=1.0\n")
    assert _wire(d, ended=False).get("loss").count == 2  # type: ignore[union-attr]
    (d / "output.log").write_bytes(b"step 1 loss=2.0\nstep 2 loss=1.0\nstep 3 loss=0.5\n")
    ended = _wire(d, ended=True)
    assert ended.done and ended.get("loss").count == 3  # type: ignore[union-attr]  # read on, not again
    (d / "output.log").write_bytes(b"")  # the log gone: the series stay
    again = _wire(d, ended=True)
    assert again.done and again.get("loss").xy() == [(1.0, 2.0), (2.0, 1.0), (3.0, 0.5)]  # type: ignore[union-attr]


def test_a_running_jobs_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    d = _job(tmp_path, b"step 1 loss=2.0\nstep 2 loss=1")
    assert _wire(d, ended=False).get("loss").xy() == [(1.0, 2.0)]  # type: ignore[union-attr]
    with (d / "output.log").open("ab") as f:
        f.write(b".5\n")
    assert _wire(d, ended=False).get("loss").xy() == [(1.0, 2.0), (2.0, 1.5)]  # type: ignore[union-attr]


def test_a_long_log_is_read_a_bounded_stretch_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_series, "READ_BYTES", 64)
    d = _job(tmp_path, b"".join(f"step {i} loss={i}\n".encode() for i in range(40)))
    first = _wire(d)
    assert first.partial and not first.done
    for _ in range(100):
        js = _wire(d)
        if js.done:
            break
    assert js.get("loss").count == 40  # type: ignore[union-attr]


def test_a_hostile_series_file_or_reply_is_never_trusted(tmp_path: Path) -> None:
    d = _job(tmp_path, b"step 1 loss=2.0\n")
    (d / job_series.SERIES_NAME).write_text(json.dumps({"v": 1, "offset": 5, "line": "x", "series": {"a": 1}}))
    assert _wire(d).get("loss").xy() == [(1.0, 2.0)]  # type: ignore[union-attr]  # rebuilt from the log
    raw = {"series": {"\x1b[31m[b]red[/b]": {"points": [[1, None, None, 1.0], [2, True, None, 2], "x", [3, 1, "e", 1]],
                                            "count": 2, "last": 1.0, "low": 1.0, "high": 1.0},
                      "nan": {"points": [], "count": 1, "last": "NaN", "low": 0, "high": 0}},
           "offset": 0, "size": 10, "done": "yes"}
    js = JobSeries.from_wire("h", "1", raw)
    assert [s.name for s in js.series] == ["\\x1b[31m[b]red[/b]"] and not js.done and js.partial
    assert [p.line for p in js.series[0].points] == [1]


def test_the_real_agent_serves_a_running_jobs_series(agent: AgentProc) -> None:
    code = "import time\nfor i in range(3): print(f'step {i} loss={3 - i}', flush=True)\ntime.sleep(300)"
    job = agent.call(P.OP_JOBS_START, argv=[sys.executable, "-c", code])["result"]

    def three() -> dict | None:
        res = agent.call(P.OP_LOGS_SERIES, job=job["id"])["result"]
        return res if len((res["series"].get("loss") or {}).get("points") or []) == 3 else None

    res = wait_for(three, what="three loss points")
    assert not res["done"] and res["series"]["loss"]["low"] == 1.0
    assert agent.call(P.OP_LOGS_SERIES, job="999")["error"]["code"] == "not_found"


def test_the_jobs_runner_keeps_its_series_without_being_asked(agent: AgentProc) -> None:
    code = "import time\nfor i in range(3): print(f'step {i} loss={3 - i}', flush=True)\ntime.sleep(300)"
    job = agent.call(P.OP_JOBS_START, argv=[sys.executable, "-c", code])["result"]
    kept = agent.state_dir / "jobs" / job["id"] / job_series.SERIES_NAME

    def three() -> bool:
        try:
            return json.loads(kept.read_text())["series"]["loss"]["count"] == 3
        except (OSError, ValueError, KeyError):
            return False

    wait_for(three, timeout=4 * job_series.KEEP_S, what="the runner's series.json")  # no logs.series was asked
    agent.call(P.OP_JOBS_KILL, job=job["id"], grace_s=1)


def test_while_another_reads_the_log_the_kept_series_are_served(tmp_path: Path) -> None:
    import fcntl
    import os

    d = _job(tmp_path, b"step 1 loss=2.0\n")
    job_series.update(str(d), ended=False)
    with (d / "output.log").open("ab") as f:
        f.write(b"step 2 loss=1.0\n")
    fd = os.open(d / ".series.lock", os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the runner is reading
        ex, size = job_series.update(str(d), ended=True)
        assert (
            ex.series["loss"].count == 1 and not ex.done and ex.offset < size
        )  # served as kept, not waited on
    finally:
        os.close(fd)
    assert _wire(d).get("loss").count == 2  # type: ignore[union-attr]


def test_redraws_of_a_step_neither_add_points_nor_skew_the_downsampling(tmp_path: Path) -> None:
    n = 3 * job_series.MAX_POINTS
    log = b"".join(
        b"".join(b" 50%%|##| %d/%d [00:01, loss=%d.%d]\r" % (i, n, i, k) for k in range(4)) for i in range(n)
    )
    loss = _wire(_job(tmp_path, log + b"\n")).get("loss")
    assert loss is not None and loss.count == 4 * n
    xs = [int(x) for x, _ in loss.xy()]
    assert len({b - a for a, b in zip(xs, xs[1:], strict=False)}) == 1  # evenly spaced steps
    assert all(abs(y - (x + 0.3)) < 1e-9 for x, y in loss.xy())  # each step's last redraw

"""Stalled jobs: GPUs idle and log silent for ``stall_minutes``, on GPU readings recorded on a real H100."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, stop_host, wait_for
from test_metrics_smi import H100, NoNvml, fake_smi

from remote_agent.fsutil import write_json
from remote_agent.metrics.sampler import MetricsSampler
from remote_agent.watchdog import daemon


def recorded(tmp_path: Path, state: str) -> dict[str, Any]:
    """One sample of the H100 capture in ``state`` (idle: 0 %, no process; load: 100 %, gpu_burn)."""
    (tmp_path / state).mkdir(exist_ok=True)
    smi = fake_smi(tmp_path / state, H100, state)
    return MetricsSampler(str(tmp_path), nvidia_smi=smi, nvml=NoNvml()).sample(lambda pid: None)


def job(jid: str = "1", log_size: int = 10, gpus: str | None = "0") -> dict[str, Any]:
    return {"id": jid, "state": "running", "gpus": gpus, "log_size": log_size}


def armed(tmp_path: Path, **extra: Any) -> tuple[daemon.Watchdog, dict[str, Any], Path]:
    stopped = tmp_path / "stopped"
    config = {"stall_minutes": 1, "autostop_minutes": 1, "armed_at": 0.0, "boot_id": "b", "count_sessions": False,
              "release_remote": ["touch", str(stopped)], **extra}
    write_json(str(tmp_path / daemon.CONFIG), config)
    return daemon.Watchdog(str(tmp_path)), config, stopped


T = 1_000_000.0
FACTS = {"boot_id": "b", "boot_time": 0.0}


def test_a_job_with_idle_gpus_and_a_silent_log_is_stalled_after_the_window(tmp_path: Path) -> None:
    idle = recorded(tmp_path, "idle")
    dog, config, stopped = armed(tmp_path)
    check = lambda jobs, t: dog.check(config, FACTS, lambda: (idle, jobs), now=T + t, mono=t)  # noqa: E731
    assert check([job()], 0)["stalled"] == {}
    assert check([job()], 59)["stalled"] == {}
    state = check([job()], 61)
    assert state["stalled"]["1"]["since"] == T
    assert "GPU 0 below 5% and no log output for 1.0 min" in state["stalled"]["1"]["why"]
    assert state["reasons"] == ["job 1 running"]  # stalled_counts_as_idle is off: it still keeps the host
    assert check([job(log_size=11)], 62)["stalled"] == {}  # the log grew: active again, the window restarts
    log = (tmp_path / daemon.LOG).read_text()
    assert "job 1 stalled: GPU 0 below 5%" in log and "still counts as busy" in log
    assert "job 1 no longer stalled" in log
    assert not stopped.exists()


def test_a_busy_gpu_or_no_gpu_is_never_stalled(tmp_path: Path) -> None:
    idle, load = recorded(tmp_path, "idle"), recorded(tmp_path, "load")
    dog, config, _ = armed(tmp_path)
    samples = iter([(load, [job()]), (load, [job()]), (idle, [job(gpus="none")]), (idle, [job(gpus="none")])])
    for t in (0, 120):  # gpu_burn at 100 % on the job's GPU: busy however silent the log
        assert dog.check(config, FACTS, lambda: next(samples), now=T + t, mono=t)["stalled"] == {}
    for t in (200, 400):  # a job given no GPU cannot be told from a quiet CPU step
        assert dog.check(config, FACTS, lambda: next(samples), now=T + t, mono=t)["stalled"] == {}


def test_stalled_counts_as_idle_lets_autostop_release_but_never_past_a_live_job(tmp_path: Path) -> None:
    idle = recorded(tmp_path, "idle")
    dog, config, stopped = armed(tmp_path, stalled_counts_as_idle=True)
    jobs = [job("1"), job("2", gpus="none")]  # job 2 is never stalled: it keeps the host
    assert dog.check(config, FACTS, lambda: (idle, jobs), now=T, mono=0)["reasons"] == [
        "job 1 running", "job 2 running"
    ]
    for t in (61, 200, 400):
        state = dog.check(config, FACTS, lambda: (idle, jobs), now=T + t, mono=t)
        assert state["reasons"] == ["job 2 running"] and state["action"] is None
    assert list(state["stalled"]) == ["1"] and not stopped.exists()
    for t in (401, 470, 530):  # job 2 ended: only the stalled job is left
        state = dog.check(config, FACTS, lambda: (idle, [job("1")]), now=T + t, mono=t)
    assert state["reasons"] == [] and state["action"] == "released" and stopped.exists()
    log = (tmp_path / daemon.LOG).read_text()
    assert "job 1 stalled" in log and "counts as idle (stalled_counts_as_idle)" in log
    assert "stalled jobs counted as idle: 1" in log


def test_stall_settings_alone_arm_the_watchdog_and_removing_them_disarms_it() -> None:
    assert daemon.disarmed_because({"stall_minutes": 30, "boot_id": "b"}, "b") is None  # no release_remote needed
    assert daemon.disarmed_because({"stall_minutes": None, "boot_id": "b"}, "b") == "nothing to watch"
    assert daemon.disarmed_because({"stall_minutes": 30, "autostop_minutes": 5, "boot_id": "b"}, "b") == (
        "no release_remote command configured"
    )


def test_the_detached_watchdog_marks_a_stalled_job_and_autostop_releases(tmp_path: Path) -> None:
    """The real agent and its detached watchdog read the recorded idle H100; the client goes away."""
    smi = fake_smi(tmp_path, H100, "idle")
    stopped, state = tmp_path / "stopped", tmp_path / "state"
    agent = AgentProc(state, "--nvidia-smi", smi)
    try:
        started = agent.call(
            "jobs.start", argv=[sys.executable, "-c", "import time; time.sleep(120)"], gpus="0"
        )
        jid = started["result"]["id"]
        config = {"stall_minutes": 0.05, "interval": 0.5, "count_sessions": False}
        assert agent.call("watchdog.configure", config=config)["result"]["armed"] is True

        def marked() -> bool:
            [rec] = agent.call("jobs.list")["result"]["jobs"]
            return rec.get("stalled") is True

        pushed = agent.wait_event("job", timeout=60, id=jid, stalled=True)["data"]  # the app learns it live
        assert "GPU 0 below 5%" in pushed["stalled_reason"]
        wait_for(marked, timeout=60, what="job marked stalled")
        rec = agent.call("jobs.get", job=jid)["result"]
        assert rec["stalled"] is True and "GPU 0 below 5% and no log output" in rec["stalled_reason"]
        assert rec["stalled_since"] >= rec["started_at"] - 1
        # now let autostop count it as idle, and go away
        config.update(
            stalled_counts_as_idle=True, autostop_minutes=0.05, release_remote=["touch", str(stopped)]
        )
        assert agent.call("watchdog.configure", config=config)["result"]["armed"] is True

        def reasons() -> list[str]:
            return agent.call("metrics.sample", count_sessions=False)["result"]["activity"]["reasons"]

        assert f"job {jid} running" not in reasons()  # the app sees the host idle, as autostop does
        agent.close()
        wait_for(stopped.exists, timeout=60, what="autostop to release the host of its stalled job")
        log = (state / daemon.LOG).read_text()
        assert f"job {jid} stalled" in log and f"stalled jobs counted as idle: {jid}" in log
    finally:
        agent.close()
        stop_host(state)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("stall_minutes = -1\n", "stall_minutes: must not be negative"),
        ("stalled_counts_as_idle = true\n", "stalled_counts_as_idle: needs stall_minutes"),
        ('stall_minutes = "soon"\n', "stall_minutes: must be"),
    ],
)
def test_bad_stall_settings_are_clear_errors(tmp_path: Path, extra: str, message: str) -> None:
    from gputui.core.config.file import ConfigError, parse

    text = f'[hosts.gpu]\nhost = "h"\n{extra}'
    with pytest.raises(ConfigError, match=message) as err:
        parse(text, tmp_path / "c.toml")
    assert "c.toml:3:" in str(err.value)


def test_the_jobs_table_and_jobs_json_show_a_stalled_job() -> None:
    from gputui.core.session import model as M
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.host import job_row

    wire = {"id": "3", "state": "running", "argv": ["python", "train.py"], "stalled": True,
            "stalled_since": T, "stalled_reason": "GPU 0 below 5% and no log output for 30.0 min"}
    stalled = M.Job.from_wire("gpu", wire)  # type: ignore[arg-type]
    out = stalled.to_json()
    assert (out["stalled"], out["stalled_since"], out["stalled_reason"]) == (True, T, wire["stalled_reason"])
    assert M.Job.from_wire("gpu", {"id": "4", "state": "running"}).to_json()["stalled"] is False
    pal = Palette()
    assert job_row(stalled, None, T, pal)[2].plain == "stalled"
    ended = M.Job.from_wire("gpu", dict(wire, state="failed"))  # type: ignore[arg-type]
    assert job_row(ended, None, T, pal)[2].plain == "failed"  # only a running job is shown as stalled


def test_the_cli_jobs_table_says_stalled(capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.core.session import model as M
    from gputui.tables import print_jobs

    wire = {"id": "3", "state": "running", "argv": ["python", "train.py"], "stalled": True}
    print_jobs([M.Job.from_wire("gpu", wire), M.Job.from_wire("gpu", dict(wire, id="4", state="failed"))])  # type: ignore[arg-type]
    rows = {line.split()[1]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {"3": "stalled", "4": "failed"}

"""SVG snapshots of every screen and state. GPU readings come from recordings of real GPUs (through the real
NVML sampler); snapshots reach the app through the same on_change path the core uses; the clock is fixed.

Update after an intended change: pytest tests/test_ui_snapshots.py --snapshot-update (then look at the report).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input
from ui_fixtures import T0, ReplaySession, job, price, recorded_gpus, snapshot, static_factory

from gputui.core.money.cost import Ledger
from gputui.core.session import model as M
from gputui.ui.app import GpuTuiApp
from gputui.ui.screens.new_job import NewJobScreen
from gputui.ui.widgets.fleet import FleetTable

SIZE = (160, 48)

TRAIN_LOG = b"".join(
    [
        b"Loading checkpoint shards: 100%|##########| 2/2 [00:04<00:00,  2.1s/it]\r\n",
        b"trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622\r\n",
        b"num_train_epochs = 3\r\n",
        *(
            b"{'loss': %.4f, 'learning_rate': 0.0003, 'epoch': %.2f}\r\n" % (2.1 - 0.07 * i, 0.05 * i)
            for i in range(1, 25)
        ),
        b"{'eval_loss': 1.0412, 'eval_accuracy': 0.7731, 'epoch': 1.0}\r\n",
        *(b"\r 41%%|####      | %d/1200 [41:02<58:31,  1.17it/s]" % n for n in range(480, 493)),
    ]
)


def demo_fleet() -> list[M.HostSnapshot]:
    """Six hosts in the states a fleet is usually in."""
    h100, a100 = recorded_gpus("h100"), recorded_gpus("a100x8")
    return [
        snapshot(
            "h100-a",
            h100,
            cost=price(2.49, 7.2),
            loaded_job="7",
            jobs=[
                job("h100-a", "5", "baseline", M.JOB_SUCCEEDED, started=9000, exit_code=0),
                job("h100-a", "6", "smoke test", M.JOB_FAILED, started=8000, exit_code=1),
                job("h100-a", "7", "llama-7b lora r=16", started=2462),
            ],
        ),
        snapshot(
            "a100-busy",
            a100,
            jobs=[job("a100-busy", "3", "sweep lr=3e-4")],
            cost=price(14.32, 3),
            loaded_job="3",
        ),
        snapshot("a100-idle", a100, cost=price(14.32, 30, idle_s=1800)),
        snapshot(
            "spot-1",
            h100,
            state=M.RECONNECTING,
            error="Connection reset by peer",
            detail="attempt 3, next in 2.1 s",
            cost=price(1.9, 2),
            jobs=[job("spot-1", "2", "pretrain")],
        ),
        snapshot(
            "gpu-old",
            state=M.ERROR,
            error="host key for gpu-old (10.0.0.7) is not trusted: SHA256:q3T0bq9Z8x; run: gputui trust gpu-old",
        ),
        snapshot("local", gpu_error="no NVIDIA driver: nvidia-smi not found"),
    ]


def make_app(tmp_path: Path, snaps: list[M.HostSnapshot] | None = None, **kw: Any) -> GpuTuiApp:
    session = kw.pop("session", ReplaySession({"7": TRAIN_LOG}, end=False))
    factory = static_factory(demo_fleet() if snaps is None else snaps, session)
    return GpuTuiApp(source_factory=factory, clock=lambda: T0, state_path=tmp_path / "ui.json", **kw)


async def settle(pilot: Pilot, predicate: Callable[[], Any] = lambda: True, timeout: float = 10) -> None:
    app: GpuTuiApp = pilot.app  # type: ignore[assignment]
    deadline = time.monotonic() + timeout
    while not (all(s.state != M.CONNECTING for s in app.hosts.values()) and predicate() and quiet(app)):
        assert time.monotonic() < deadline, "app did not settle"
        await pilot.pause(0.05)
    await pilot.pause()  # whatever the last flush posted is drawn


def quiet(app: GpuTuiApp) -> bool:
    """Nothing is left to draw: no snapshot or log output waits for a flush, and no flush is due."""
    stream = app.stream
    return not app._pending and app._flush_timer is None and not (stream is not None and stream.pending)


def select(
    host: str, then: Callable[[Pilot], Awaitable[None]] | None = None
) -> Callable[[Pilot], Awaitable[None]]:
    async def run(pilot: Pilot) -> None:
        await settle(pilot)
        app: GpuTuiApp = pilot.app  # type: ignore[assignment]
        app.query_one(FleetTable).select_key(host)

        def ready() -> bool:  # the host shows, and its newest job's log is open (the job timer has fired)
            jobs = app.hosts[host].jobs
            return app.selected_host == host and (
                not jobs or (app.stream is not None and app.stream.job.host == host)
            )

        await settle(pilot, ready)
        if then is not None:
            await then(pilot)

    return run


def log_ready(pilot: Pilot) -> Awaitable[None]:
    app: GpuTuiApp = pilot.app  # type: ignore[assignment]
    return settle(pilot, lambda: app.stream is not None and len(app.stream.buffer) > 20)


def test_main_screen(snap_compare: Any, tmp_path: Path) -> None:
    """Six hosts; the H100 host with a training job whose log, progress and loss show."""
    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=log_ready)


def test_reconnecting_host(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=select("spot-1"))


def test_error_host(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=select("gpu-old"))


def test_host_without_gpus(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=select("local"))


def test_eight_busy_gpus(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=select("a100-busy"))


def test_sixteen_gpus_scroll(snap_compare: Any, tmp_path: Path) -> None:
    a100 = recorded_gpus("a100x8")
    sixteen = a100 + tuple(replace(g, index=g.index + 8) for g in a100)
    snaps = [
        snapshot("dgx-2", sixteen, jobs=[job("dgx-2", "1", "ddp x16")], loaded_job="1", cost=price(32.77))
    ]
    assert snap_compare(make_app(tmp_path, snaps), terminal_size=SIZE, run_before=settle)


def test_long_names(snap_compare: Any, tmp_path: Path) -> None:
    name = "a-really-long-host-name-from-a-cloud-provider-eu-west-4"
    long_job = "finetune " + "--with-a-very-long-argument " * 6
    snaps = [
        snapshot(
            name, recorded_gpus("h100"), loaded_job="12",
            jobs=[job(name, "11", "x" * 200, M.JOB_FAILED, exit_code=137), job(name, "12", long_job)],
        )
    ]
    session = ReplaySession({"12": b"y" * 5000 + b"\r\n" + b"short line\r\n"})
    assert snap_compare(make_app(tmp_path, snaps, session=session), terminal_size=SIZE, run_before=settle)


def test_empty_fleet(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path, []), terminal_size=SIZE, run_before=settle)


def test_full_screen_log_with_search(snap_compare: Any, tmp_path: Path) -> None:
    async def run(pilot: Pilot) -> None:
        await log_ready(pilot)
        await pilot.press("l", "slash")
        search = pilot.app.query_one("#log-search", Input)
        search.cursor_blink = False  # a blinking cursor makes the picture depend on timing
        search.value = "eval"
        await pilot.press("enter")
        await settle(pilot)

    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=run)


def test_new_job_dialog(snap_compare: Any, tmp_path: Path) -> None:
    async def run(pilot: Pilot) -> None:
        await select("a100-busy")(pilot)
        await pilot.press("n")
        for _ in range(400):  # readiness, not a fixed pause: the dialog is up and has its fields
            if isinstance(pilot.app.screen, NewJobScreen) and pilot.app.screen.query("#command"):
                break
            await pilot.pause(0.05)
        command = pilot.app.screen.query_one("#command", Input)
        command.cursor_blink = False  # a blinking cursor makes the picture depend on timing
        command.value = "python train.py --lr 3e-4"
        await pilot.pause()

    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=run)


def test_kill_confirm(snap_compare: Any, tmp_path: Path) -> None:
    async def run(pilot: Pilot) -> None:
        await log_ready(pilot)
        await pilot.press("k")

    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=run)


def test_release_confirm(snap_compare: Any, tmp_path: Path) -> None:
    from gputui.core.config.file import Config, HostConfig

    async def run(pilot: Pilot) -> None:
        await log_ready(pilot)
        await pilot.press("r")

    release = ("vastai", "destroy", "instance", "12345", "--reason", "done for today")
    config = Config(path=None, hosts={"h100-a": HostConfig(name="h100-a", release=release)})

    app = make_app(tmp_path, config=config)
    app.source.ledger = Ledger(tmp_path / "ledger.json")  # type: ignore[attr-defined]  # release is configured
    assert snap_compare(app, terminal_size=SIZE, run_before=run)


def test_help(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, press=["question_mark"], run_before=settle)


@pytest.mark.parametrize("theme", ["gputui-light", "gputui-contrast"])
def test_themes(snap_compare: Any, tmp_path: Path, theme: str) -> None:
    from gputui.core.config.file import Config

    app = make_app(tmp_path, config=Config(path=None, hosts={}, theme=theme))
    assert snap_compare(app, terminal_size=SIZE, run_before=log_ready)


def test_narrow_terminal(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(make_app(tmp_path), terminal_size=(100, 36), run_before=log_ready)

"""Pilot tests of every action path. Against the real local host (agent subprocess, real tmux) where a job
is involved; against recorded snapshots published through the app's snapshot path otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import Home, tmux_socket
from rich.color import Color as RichColor
from rich.style import Style
from textual.command import CommandList, CommandPalette
from textual.containers import VerticalScroll
from textual.drivers.headless_driver import HeadlessDriver
from textual.pilot import Pilot
from textual.widgets import Input
from ui_fixtures import (
    T0,
    ReplaySession,
    four_gpus_one_lost,
    job,
    price,
    recorded_gpus,
    screen_text,
    snapshot,
    static_factory,
    with_load,
)

from gputui.core.config import file as cfg
from gputui.core.hosts.fleet import Fleet
from gputui.core.money.cost import Ledger
from gputui.core.money.release import ReleaseRequest, ReleaseResult, Step
from gputui.core.session import model as M
from gputui.ui import app as app_module
from gputui.ui.app import GpuTuiApp
from gputui.ui.keys import APP_KEYS, LOG_KEYS, key_label
from gputui.ui.logbuffer import MARK
from gputui.ui.palette import Palette
from gputui.ui.screens.confirm import ConfirmScreen
from gputui.ui.screens.help import HelpScreen
from gputui.ui.screens.new_job import NewJobScreen
from gputui.ui.screens.release import ReleaseScreen
from gputui.ui.widgets.fleet import FleetTable
from gputui.ui.widgets.host import GpuCard, JobsTable
from gputui.ui.widgets.log import LogView
from gputui.ui.widgets.textbox import TextBox

SIZE = (160, 48)


async def until(
    pilot: Pilot, predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition"
) -> Any:
    """Let the app run until ``predicate()`` is truthy (readiness, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


@pytest.fixture
def local(home: Home, monkeypatch: pytest.MonkeyPatch) -> cfg.Config:
    """A config with only the local host, its state dir and everything else inside a throwaway HOME."""
    monkeypatch.setenv("HOME", str(home.root))
    for key in list(os.environ):
        if key.startswith(("XDG_", "GPUTUI_")):
            monkeypatch.delenv(key)
    host = cfg.HostConfig(name="local", transport="local", remote_dir=str(home.state_dir))
    return cfg.Config(path=None, hosts={"local": host})


def local_app(config: cfg.Config, tmp_path: Path, **kw: Any) -> GpuTuiApp:
    return GpuTuiApp(config, state_path=tmp_path / "ui.json", **kw)


def py(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


async def connected(pilot: Pilot) -> None:
    app: GpuTuiApp = pilot.app  # type: ignore[assignment]
    await until(
        pilot, lambda: app.hosts["local"].state == M.CONNECTED and app.hosts["local"].metrics, what="local"
    )


async def start_from_dialog(pilot: Pilot, command: str, name: str = "") -> M.Job:
    app: GpuTuiApp = pilot.app  # type: ignore[assignment]
    before = {j.id for j in app.hosts["local"].jobs}
    await pilot.press("n")
    dialog = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")
    dialog.query_one("#command", Input).value = command
    dialog.query_one("#name", Input).value = name
    await pilot.press("enter")
    new = await until(
        pilot, lambda: [j for j in app.hosts["local"].jobs if j.id not in before], what="new job"
    )
    await until(pilot, lambda: app.stream is not None and app.stream.job.id == new[0].id, what="log open")
    return new[0]


async def palette_pick(pilot: Pilot, query: str) -> None:
    """Type ``query`` into the open command palette and run the match, once it is the highlighted one."""
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, CommandPalette), what="command palette")
    await pilot.press(*query)

    def matched() -> bool:
        options = app.screen.query_one(CommandList)
        if options.highlighted is None:
            return False
        prompt = options.get_option_at_index(options.highlighted).prompt
        return query.lower() in str(getattr(prompt, "plain", prompt)).lower()

    await until(pilot, matched, what=f"palette match for {query!r}")
    await pilot.press("enter")


def log_lines(app: GpuTuiApp) -> list[str]:
    buf = app.query_one(LogView).buffer
    return [] if buf is None else [buf.line(i) for i in range(len(buf))]


# --- the local host, end to end through the app ----------------------------------------------------------------
async def test_local_host_shows_up_with_host_metrics(local: cfg.Config, tmp_path: Path) -> None:
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await until(pilot, lambda: "● " in screen_text(app) and "cpu " in screen_text(app), what="host row")
        text = screen_text(app)
        assert "local" in text and "1 host: 1 up" in text


async def test_new_job_dialog_starts_a_job_and_its_log_follows(local: cfg.Config, tmp_path: Path) -> None:
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        job = await start_from_dialog(pilot, py("print('hello from the dialog')"), name="greet")
        assert job.name == "greet" and job.command[-1] == "print('hello from the dialog')"
        await until(pilot, lambda: "hello from the dialog" in log_lines(app), what="output in the log pane")
        await until(
            pilot,
            lambda: any(ln.startswith(MARK + "job succeeded") for ln in log_lines(app)),
            what="end mark",
        )
        await until(pilot, lambda: "succeeded" in screen_text(app), what="state in jobs table")
        assert app.query_one(JobsTable).cursor_key == job.id


async def test_a_job_started_from_the_app_has_its_price_and_cost_in_history(
    local: cfg.Config, home: Home, tmp_path: Path
) -> None:
    path = home.write_config(
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\nprice_per_hour = 3.6\n'
    )
    app = local_app(cfg.load(str(path)), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        job = await start_from_dialog(pilot, py("print('priced')"), name="priced")
        await until(pilot, lambda: any(j.id == job.id and not j.running for j in app.hosts["local"].jobs))
    [run] = json.loads(home.cli("history", "--json", check=True).stdout)
    assert run["id"] == job.id and run["currency"] == "USD"
    assert run["cost"] == pytest.approx(3.6 * run["duration_s"] / 3600.0) and run["cost"] > 0


async def test_dialog_rejects_an_empty_or_unbalanced_command(local: cfg.Config, tmp_path: Path) -> None:
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("n")
        dialog = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen)
        await pilot.press("enter")
        assert "what should run" in screen_text(app)
        dialog.query_one("#command", Input).value = "python 'unclosed"
        await pilot.press("enter")
        assert "No closing quotation" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, NewJobScreen) and not app.hosts["local"].jobs


async def test_search_next_previous_and_follow(local: cfg.Config, tmp_path: Path) -> None:
    app = local_app(local, tmp_path)
    code = "for i in range(300): print('beta' if i % 100 == 50 else 'line', i)"
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await start_from_dialog(pilot, py(code))
        await until(pilot, lambda: "line 299" in log_lines(app), what="all output")
        view = app.query_one(LogView)
        assert view.follow and view.scroll_y == view.max_scroll_y
        await pilot.press("slash")
        search = app.query_one("#log-search", Input)
        await until(pilot, lambda: search.has_focus, what="search box")
        search.value = "BETA"
        await pilot.press("enter")
        first = view.match
        assert first is not None and log_lines(app)[first] == "beta 50"
        assert not view.follow
        await until(pilot, lambda: "paused: f to follow" in screen_text(app), what="paused in the title")
        await pilot.press("n")
        assert log_lines(app)[view.match] == "beta 150"
        await pilot.press("N")
        assert view.match == first
        await pilot.press("N")  # wraps around to the last match
        assert log_lines(app)[view.match] == "beta 250"
        await pilot.press("f")
        assert view.follow and view.scroll_y == view.max_scroll_y


async def test_scrolling_up_stops_following_and_f_resumes(local: cfg.Config, tmp_path: Path) -> None:
    app = local_app(local, tmp_path)
    gate = tmp_path / "gate"  # "late" comes only once the user has scrolled up
    code = (
        "import os, time\nfor i in range(100): print('tick', i, flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\nprint('late')"
    )
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await start_from_dialog(pilot, py(code))
        await until(pilot, lambda: "tick 99" in log_lines(app), what="first output")
        view = app.query_one(LogView)
        view.focus()
        await until(pilot, lambda: view.max_scroll_y > 0, what="a scrollable log")
        await pilot.press("pageup")
        assert not view.follow
        top = view.scroll_y
        gate.touch()
        await until(pilot, lambda: "late" in log_lines(app), what="later output")
        assert view.scroll_y == top  # the view stayed where the user put it
        await pilot.press("f")
        assert view.follow and view.scroll_y == view.max_scroll_y


async def test_kill_asks_first_and_shows_the_escalation(local: cfg.Config, tmp_path: Path) -> None:
    app = local_app(local, tmp_path, kill_grace_s=2.0)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        job = await start_from_dialog(pilot, py("import time; print('up', flush=True); time.sleep(600)"))
        await until(pilot, lambda: "up" in log_lines(app), what="job running")
        await pilot.press("k")
        await until(pilot, lambda: "SIGKILL" in screen_text(app), what="confirm")
        text = screen_text(app)
        assert f"Kill job {job.id}" in text and "SIGINT" in text and "SIGTERM" in text and "SIGKILL" in text
        assert "after 2 s" in text
        await pilot.press("n")  # no: nothing happens
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("k")  # the "no" was handled before this key
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert app.current_job().running and not killing(app)
        await pilot.press("y")
        await until(pilot, lambda: app.current_job().state == M.JOB_KILLED, what="killed")
        assert app.current_job().exit_code == 130
        assert len(killing(app)) == 1  # the "yes" alone asked for a kill


def killing(app: GpuTuiApp) -> list[str]:
    """The kills the app started (each says so in a notification)."""
    return [n.message for n in app._notifications if n.message.startswith("killing job")]


async def test_attach_suspends_and_runs_tmux_attach_for_the_job(
    local: cfg.Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that can suspend, and a runner that records the command (and checks the session exists)."""
    import subprocess

    monkeypatch.setattr(HeadlessDriver, "can_suspend", property(lambda self: True))
    ran: list[list[str]] = []
    codes: list[int] = []

    def runner(argv: list[str]) -> int:
        ran.append(argv)
        has = [*argv[:3], "has-session", "-t", argv[-1]]  # same server and exact target, without a terminal
        codes.append(subprocess.run(has, capture_output=True).returncode)
        return codes[-1]

    app = local_app(local, tmp_path, attach_runner=runner)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        job = await start_from_dialog(pilot, py("import time; time.sleep(600)"))
        await until(pilot, lambda: "Attach" in screen_text(app), what="attach in the footer")
        await pilot.press("a")
        await until(pilot, lambda: codes, what="runner called")
        socket = tmux_socket(Path(local.hosts["local"].remote_dir))
        assert ran == [["tmux", "-L", socket, "attach", "-t", f"={job.tmux_session}"]]
        assert codes == [0]  # has-session found it


async def test_attach_is_hidden_where_the_driver_cannot_suspend(tmp_path: Path) -> None:
    snaps = [snapshot("box", recorded_gpus("h100"), jobs=[job("box", "1", "train")])]
    app = GpuTuiApp(source_factory=static_factory(snaps), clock=lambda: T0, state_path=tmp_path / "ui.json")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_job() is not None, what="job selected")
        assert app.check_action("attach", ()) is False
        await until(pilot, lambda: "k Kill" in screen_text(app), what="footer")
        assert "Attach" not in screen_text(app)


# --- recorded snapshots through the snapshot path --------------------------------------------------------------
def fleet() -> list[M.HostSnapshot]:
    h100, a100 = recorded_gpus("h100"), recorded_gpus("a100x8")
    return [
        snapshot("h100-a", h100, jobs=[job("h100-a", "7", "train")], loaded_job="7"),
        snapshot("a100-pod", a100, jobs=[job("a100-pod", "3", "sweep"), job("a100-pod", "4", "eval")]),
    ]


def static_app(tmp_path: Path, snaps: list[M.HostSnapshot] | None = None, **kw: Any) -> GpuTuiApp:
    factory = static_factory(snaps if snaps is not None else fleet(), kw.pop("session", None))
    app = GpuTuiApp(source_factory=factory, clock=lambda: T0, state_path=tmp_path / "ui.json", **kw)
    app.test_source = factory.holder  # type: ignore[attr-defined]
    return app


async def test_select_host_by_keys_and_mouse(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED, what="snapshots applied")
        assert app.selected_host == "h100-a" and "H100 80GB HBM3" in screen_text(app)
        await pilot.press("down")
        await until(pilot, lambda: app.selected_host == "a100-pod", what="second host")
        await until(pilot, lambda: screen_text(app).count("A100-SXM4-40GB") >= 8, what="8 GPU cards")
        assert app.query_one(JobsTable).cursor_key == "4"  # newest job first
        await pilot.click(FleetTable, offset=(5, 2))  # first data row
        await until(pilot, lambda: app.selected_host == "h100-a", what="click selects")
        await pilot.press("enter")
        assert app.query_one(JobsTable).has_focus


async def test_snapshots_are_coalesced_and_applied_in_batches(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    applied: list[int] = []
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED)
        original = app._apply
        app._apply = lambda snaps: (applied.append(len(snaps)), original(snaps))  # type: ignore[method-assign]
        base = app.hosts["h100-a"]
        for i in range(200):
            app.test_source["source"].publish(M.HostSnapshot(name="h100-a", state=M.CONNECTED, metrics=base.metrics, updated_at=i))  # type: ignore[attr-defined]
        await until(pilot, lambda: app.hosts["h100-a"].updated_at == 199, what="newest applied")
        assert sum(applied) <= 2 and len(applied) <= 2  # 200 snapshots, at most a couple of batches


async def test_a_changed_metric_redraws_its_cell_and_leaves_the_other_cells_rendered(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(FleetTable)
        await until(pilot, lambda: "A100-SXM4-40GB" in screen_text(app), what="fleet drawn")
        util = table.get_cell("a100-pod", "util").plain
        cached = set(table._cell_render_cache.keys())
        kept = {k for k in cached if k[0] == "h100-a" or (k[0] == "a100-pod" and k[1] == "host")}
        assert kept and any(k[0] == "a100-pod" and k[1] == "util" for k in cached)
        count = table._update_count
        old = app.hosts["a100-pod"]
        busy = with_load(old.gpus, 5)
        app.test_source["source"].publish(replace(old, metrics=replace(old.metrics, gpus=busy)))  # type: ignore[attr-defined]
        await until(pilot, lambda: table.get_cell("a100-pod", "util").plain != util, what="util cell")
        new = table.get_cell("a100-pod", "util").plain
        row = next(line for line in screen_text(app).splitlines() if "a100-pod" in line and "●" in line)
        assert f" {new} " in row and "h100-a" in screen_text(app)
        assert table._update_count == count  # the count every cell's render-cache key holds did not move
        now = set(table._cell_render_cache.keys())
        assert kept <= now  # the other cells' renders are still the ones drawn: not rendered again
        drawn = [table._cell_render_cache[k] for k in now if k[0] == "a100-pod" and k[1] == "util"]
        assert drawn and all(new in "".join(s.text for s in lines[0]) for lines in drawn)  # no stale render


async def test_new_metrics_of_the_selected_host_reach_its_gpu_cards(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED, what="snapshots applied")
        card = app.query(GpuCard).first()
        before = card.text.plain
        old = app.hosts["h100-a"]
        busy = with_load(old.gpus, 5)
        assert busy[0].util_percent != old.gpus[0].util_percent
        app.test_source["source"].publish(replace(old, metrics=replace(old.metrics, gpus=busy)))  # type: ignore[attr-defined]
        want = f" {busy[0].util_percent:.0f}% "
        await until(pilot, lambda: want in card.text.plain, what="the card's new utilisation")
        assert card.text.plain != before


async def test_a_lost_gpu_shows_on_its_card_as_text_and_marks_its_host(tmp_path: Path) -> None:
    """GPU 2 of 4 fails its handle with words holding markup and an escape: its card says LOST with the words
    as they are, a health line gives the fix, the hosts table marks the host; the other cards read normally."""
    gpus = four_gpus_one_lost("[bold]Unknown[/] Error [@click=app.quit]x[/] \x1b[31m")
    assert [g.state for g in gpus] == ["ok", "ok", "lost", "ok"]
    app = static_app(tmp_path, [snapshot("quad", gpus)])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.query(GpuCard)) == 4, what="4 GPU cards")
        cards = list(app.query(GpuCard))
        assert cards[2].text.plain.startswith("LOST")
        assert "e for GPU 2: [bold]Unknown[/] Error" in cards[2].text.plain  # the driver's words, cut to fit
        assert all("util" in c.text.plain for c in cards[:2] + cards[3:])
        note = app.query_one(".gpu-note", TextBox).text.plain  # the health line, shown only when something is wrong
        assert note == (
            "GPU 2 lost: Unable to determine the device handle for GPU 2: [bold]Unknown[/] Error [@click=app.quit]x[/] "
            "[31m Fix: Reboot the host; if the GPU is still lost, ask the provider for another instance."
        )
        text = screen_text(app)
        assert "GPU 2 lost: Unable to determine the device handle" in text and "\x1b" not in text
        assert "⚠ 1 lost · 4× A10" in text  # the mark first: a narrow column cuts the end
        await pilot.pause()
        assert app.is_running  # the words were never markup: no action ran, nothing raised


async def test_a_snapshot_is_applied_by_the_next_flush_even_with_a_repaint_timer_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "FLEET_EVERY_S", 3600.0)  # the metrics repaint timer: an hour away
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED, what="snapshots applied")
        source = app.test_source["source"]  # type: ignore[attr-defined]
        base = app.hosts["h100-a"]
        source.publish(replace(base, updated_at=T0 + 1))  # metrics only: the fleet repaint is due in an hour
        await until(pilot, lambda: app.hosts["h100-a"].updated_at == T0 + 1, what="metrics applied")
        await until(pilot, lambda: app._flush_timer is not None, what="repaint timer pending")
        source.publish(replace(app.hosts["a100-pod"], state=M.RECONNECTING, error="link lost"))
        await until(pilot, lambda: "reconnecting" in screen_text(app), timeout=20, what="state change shown")


async def test_a_change_of_state_is_applied_without_waiting_for_the_flush_spacing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "FLUSH_S", 3600.0)  # metrics alone: one batch an hour
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED, what="snapshots applied")
        source = app.test_source["source"]  # type: ignore[attr-defined]
        source.publish(replace(app.hosts["h100-a"], updated_at=T0 + 1))  # waits for the next batch
        source.publish(replace(app.hosts["a100-pod"], state=M.ERROR, error="host key changed"))
        await until(pilot, lambda: "host key changed" in screen_text(app), timeout=20, what="error shown")


async def test_notifications_for_host_drop_return_and_job_end(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED)
        source = app.test_source["source"]  # type: ignore[attr-defined]
        ok = app.hosts["a100-pod"]
        from dataclasses import replace

        source.publish(
            replace(ok, state=M.RECONNECTING, error="Connection reset", detail="attempt 1, next in 0.6 s")
        )
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.RECONNECTING)
        source.publish(ok)
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED)
        ended = tuple(replace(j, state=M.JOB_FAILED, exit_code=3) if j.id == "3" else j for j in ok.jobs)
        source.publish(replace(ok, jobs=ended))
        await until(pilot, lambda: len(app._notifications) >= 3, what="three notices")
        messages = [n.message for n in app._notifications]
        assert messages == [
            "a100-pod dropped: Connection reset; reconnecting",
            "a100-pod is back",
            "job 3 (sweep) on a100-pod failed (exit 3)",
        ]
        severities = [n.severity for n in app._notifications]
        assert severities == ["warning", "information", "error"]


async def test_budget_alerts_once_per_level(tmp_path: Path) -> None:
    from gputui.core.config.file import Budget

    config = cfg.Config(path=None, hosts={}, budget=Budget(daily=10.0))
    snaps = [
        snapshot("a", cost=replace(price(1.0), today=5.0)),
        snapshot("b", cost=replace(price(1.0), today=3.5)),
    ]
    app = static_app(tmp_path, snaps, config=config)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app._notifications, what="budget warning")
        source = app.test_source["source"]  # type: ignore[attr-defined]
        source.publish(replace(snaps[1], updated_at=1.0))  # same spend: no second warning
        await until(pilot, lambda: app.hosts["b"].updated_at == 1.0)
        source.publish(replace(snaps[1], cost=replace(snaps[1].cost, today=6.0)))
        await until(pilot, lambda: len(app._notifications) >= 2, what="budget exceeded")
        source.publish(replace(snaps[0], updated_at=2.0))  # applied after the one above: its alerts are out
        await until(pilot, lambda: app.hosts["a"].updated_at == 2.0)
        assert [(n.severity, n.message) for n in app._notifications] == [
            ("warning", "daily budget at 85%: 8.50 of 10.00 USD"),
            ("error", "daily budget exceeded 110%: 11.00 of 10.00 USD"),
        ]


async def test_log_pane_marks_gaps_and_reconnects_and_shows_latest_redraw(tmp_path: Path) -> None:
    class GapSession(ReplaySession):
        async def follow_log(self, job, offset, on_data, on_end, on_gap):  # type: ignore[override]
            on_data(b"start\r\n" + b"".join(b"\r%3d%%" % i for i in range(0, 101, 5)) + b"\r\n")
            on_gap("12 bytes missing before offset 200")
            on_data(b"after the gap\r\n")

    snaps = [snapshot("box", recorded_gpus("h100"), jobs=[job("box", "1", "train")])]
    app = static_app(tmp_path, snaps, session=GapSession())
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "after the gap" in log_lines(app), what="log")
        from dataclasses import replace

        source = app.test_source["source"]  # type: ignore[attr-defined]
        source.publish(replace(snaps[0], state=M.RECONNECTING, error="link lost"))
        await until(pilot, lambda: app.hosts["box"].state == M.RECONNECTING)
        source.publish(snaps[0])
        await until(pilot, lambda: any("reconnected" in ln for ln in log_lines(app)), what="reconnect mark")
        lines = log_lines(app)
        assert lines[:4] == [
            "start",
            "100%",
            MARK + "gap: 12 bytes missing before offset 200",
            "after the gap",
        ]
        assert lines[4].startswith(MARK + "connection lost (link lost)")
        assert "── gap: 12 bytes missing" in screen_text(app)


RELEASE_ARGV = ("vastai", "destroy", "instance", "12345")


class RecordedRelease:
    """Stands in for the core's release call (the one that runs the commands): records what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, cfg.HostConfig, Ledger, ReleaseRequest]] = []

    async def __call__(
        self, session: Any, host: cfg.HostConfig, ledger: Ledger, request: ReleaseRequest
    ) -> ReleaseResult:
        self.calls.append((session, host, ledger, request))
        return ReleaseResult(host.name, [Step("client", host.release, 0, "")])


def release_app(tmp_path: Path, **host: Any) -> tuple[GpuTuiApp, RecordedRelease]:
    """The static fleet with h100-a's release configured as a user would (a command, a ledger); the call
    that would run it is recorded instead."""
    config = cfg.Config(path=None, hosts={"h100-a": cfg.HostConfig(name="h100-a", release=RELEASE_ARGV, **host)})
    recorded = RecordedRelease()
    app = static_app(tmp_path, config=config, release_call=recorded)
    app.test_source["source"].ledger = Ledger(tmp_path / "ledger.json")  # type: ignore[attr-defined]
    return app, recorded


async def test_release_asks_first_then_runs_the_configured_release(tmp_path: Path) -> None:
    app, recorded = release_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED)
        await pilot.press("r")
        await until(pilot, lambda: "Release h100-a?" in screen_text(app), what="confirm")
        assert "1 running job and everything on its disk will be lost: 7 (train)." in app.screen.body
        assert "Runs here: vastai destroy instance 12345" in app.screen.body
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="cancelled")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert recorded.calls == []  # the cancel ran nothing
        await pilot.click("#confirm")
        await until(pilot, lambda: any("h100-a released" in n.message for n in app._notifications), what="done")
    [(_, host, ledger, request)] = recorded.calls
    assert host is app.config.hosts["h100-a"] and ledger is app.source.ledger  # type: ignore[attr-defined]
    assert request == ReleaseRequest("h100-a", confirmed_jobs=frozenset({"7"}))
    assert any("vastai destroy instance 12345 -> exit 0" in n.message for n in app._notifications)


async def test_release_with_artifacts_checks_them_before_asking(tmp_path: Path) -> None:
    """A host that names artifacts gets the artifact check (here the replayed host cannot list them: nothing
    is known safe), whichever call would run the release."""
    app, recorded = release_app(tmp_path, artifacts=("~/ckpt/",))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ReleaseScreen), what="the artifact dialog")
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ReleaseScreen), what="cancelled")
    assert recorded.calls == []


def releasable(home: Home, marker: Path, extra: str = "") -> cfg.Config:
    """The local host with a harmless release command (it touches ``marker``) and a price."""
    path = home.write_config(
        f'[budget]\ndaily = 1.0\non_exceed = "release-idle"\n\n[hosts.local]\ntransport = "local"\n'
        f'remote_dir = "{home.state_dir}"\nprice_per_hour = 3.6\ncount_ssh_sessions = false\n'
        f'release = ["touch", "{marker}"]\n{extra}'
    )
    return cfg.load(str(path))


async def start_sleeper(home: Home) -> str:
    res = await asyncio.to_thread(
        home.cli, "run", "local", "--", sys.executable, "-c", "import time; time.sleep(120)", check=True
    )
    return res.stdout.strip()


async def test_release_refuses_jobs_that_the_confirmation_did_not_name(
    local: cfg.Config, home: Home, tmp_path: Path
) -> None:
    marker = tmp_path / "released"
    app = local_app(releasable(home, marker), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert "running job" not in app.screen.body  # nothing runs: the dialog names no job
        job_id = await start_sleeper(home)  # a job starts while the dialog is open
        await pilot.press("y")
        note = await until(
            pilot, lambda: [n for n in app._notifications if n.title == "not released"], what="refusal"
        )
        assert f"jobs started after you confirmed: {job_id}" in note[0].message
        assert not marker.exists()


async def test_budget_release_never_stops_a_job_started_after_the_idle_check(
    local: cfg.Config, home: Home, tmp_path: Path
) -> None:
    marker = tmp_path / "released"
    config = releasable(home, marker, "idle_minutes = 0\n")
    await start_sleeper(home)
    fleet = Fleet(config)
    await fleet.session("local").start()
    # what the app saw a moment before the job started: idle, nothing running, the daily budget exceeded
    seen = snapshot("local", cost=replace(price(3.6), today=2.0, idle=True, idle_seconds=600.0))
    static = static_factory([seen], fleet.session("local"))

    def source(on_change: Callable[[M.HostSnapshot], None]) -> Any:
        src = static(on_change)
        src.ledger = fleet.ledger  # type: ignore[attr-defined]
        return src

    app = GpuTuiApp(config, source_factory=source, clock=lambda: T0, state_path=tmp_path / "ui.json")
    try:
        async with app.run_test(size=SIZE) as pilot:
            note = await until(
                pilot, lambda: [n for n in app._notifications if n.title == "not released"], what="refusal"
            )
            assert "was not released automatically" in note[0].message and "running" in note[0].message
            assert any("budget exceeded: releasing idle host local" in n.message for n in app._notifications)
    finally:
        await fleet.close()
    assert not marker.exists()


async def test_release_without_a_release_command_says_so_before_asking(tmp_path: Path) -> None:
    recorded = RecordedRelease()
    app = static_app(tmp_path, release_call=recorded)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["a100-pod"].state == M.CONNECTED)
        await pilot.press("r")
        await until(
            pilot,
            lambda: any("release is not configured for h100-a" in n.message for n in app._notifications),
        )
        assert not isinstance(app.screen, ConfirmScreen)  # nothing to confirm: no "will be lost" dialog
    assert recorded.calls == []


async def test_theme_switch_from_the_picker_is_remembered(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "gputui-dark"
        await pilot.press("t")
        await palette_pick(pilot, "gputui-light")
        await until(pilot, lambda: app.theme == "gputui-light", what="theme applied")
        await until(pilot, lambda: (tmp_path / "ui.json").exists(), what="choice saved")
        assert app.palette.ok == "#2E7D32"  # level colours come from the theme's variables
    assert json.loads((tmp_path / "ui.json").read_text())["theme"] == "gputui-light"
    again = static_app(tmp_path)
    async with again.run_test(size=SIZE):
        assert again.theme == "gputui-light"


async def test_config_theme_applies_and_a_later_config_change_wins(tmp_path: Path) -> None:
    config = cfg.Config(path=None, hosts={}, theme="gputui-contrast")
    app = static_app(tmp_path, config=config)
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "gputui-contrast"
        app.theme = "gputui-light"
        await until(pilot, lambda: (tmp_path / "ui.json").exists())
    assert static_app(tmp_path, config=config).theme == "gputui-light"  # the user's later pick stays
    changed = cfg.Config(path=None, hosts={}, theme="gputui-dark")
    assert static_app(tmp_path, config=changed).theme == "gputui-dark"  # the config was edited since


@pytest.mark.parametrize("theme", ["gputui-dark", "gputui-light", "gputui-contrast", "textual-light"])
async def test_start_theme_is_the_watchers(tmp_path: Path, theme: str) -> None:
    """The app starts in its theme without Textual's theme watcher (which parses all CSS again before the
    first frame); what it draws must be exactly what the watcher's way draws: same variables, classes,
    ANSI colour mapping and screen."""
    hosts = [snapshot("h100-a", recorded_gpus("h100")), snapshot("a100-pod", recorded_gpus("a100x8"))]  # no job:
    # no log opens on a timer, so both screens settle to the same frame
    started = static_app(tmp_path / "a", hosts, config=cfg.Config(path=None, hosts={}, theme=theme))
    watched = static_app(tmp_path / "b", hosts, config=cfg.Config(path=None, hosts={}, theme="gputui-dark"))
    watched.theme = theme  # the watcher's way (the app's own colours follow the theme as at start)
    watched.palette = Palette.from_theme(watched.current_theme)
    shots = []
    for app in (started, watched):
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda app=app: app.hosts["a100-pod"].state == M.CONNECTED)
            await pilot.pause()
            red = app._filters[0].truecolor_style(Style(color="red"), RichColor.from_rgb(0, 0, 0))
            shots.append((app.theme, dict(app.theme_variables), set(app.classes), red, app.export_screenshot()))
    assert shots[0][0] == theme
    for got, want in zip(shots[0][1:], shots[1][1:], strict=True):
        assert got == want


def test_the_footer_and_the_help_are_built_from_one_key_table() -> None:
    """gputui/ui/keys.py is the one table: the app's, the log's and the dialogs' bindings, and the help's rows
    (each key's text there is its binding's)."""
    from gputui.ui import keys

    assert GpuTuiApp.BINDINGS == keys.APP_BINDINGS and keys.APP_BINDINGS[: len(keys.APP_KEYS)] == keys.APP_KEYS
    assert LogView.BINDINGS == keys.LOG_KEYS
    assert ConfirmScreen.BINDINGS == keys.CONFIRM_KEYS and ReleaseScreen.BINDINGS == keys.RELEASE_KEYS
    sections = dict(keys.help_sections())
    assert list(sections) == ["Everywhere", "Log pane", "Moving around", "Dialogs"]
    for title, bindings in (("Everywhere", keys.APP_KEYS), ("Log pane", keys.LOG_KEYS)):
        assert list(sections[title]) == [(keys.key_label(b), b.tooltip or b.description) for b in bindings]
    assert ("y / n", "confirm / cancel a kill or release") in sections["Dialogs"]


async def test_help_lists_every_key(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: "Everywhere" in screen_text(app), what="help")
        text = screen_text(app)
        scroller = app.screen.query_one(VerticalScroll)
        scroller.scroll_end(animate=False)  # the rest of a long list (the dialog scrolls)
        await until(pilot, lambda: scroller.scroll_y == scroller.max_scroll_y, what="scrolled")
        text += screen_text(app)
        for binding in [*APP_KEYS, *LOG_KEYS]:
            assert key_label(binding) in text and (binding.tooltip or binding.description) in text, binding
        for key in ("ctrl+p", "tab", "esc", "y / n"):
            assert key in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_palette_offers_every_action(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_job() is not None)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for b in APP_KEYS:
            hidden = app.check_action(b.action.split("(")[0], ()) is False  # e.g. attach: no suspend here
            if not hidden and b.action not in ("quit", "change_theme"):  # quit/theme: built in
                assert any(t.startswith(b.description) for t in titles), b.action
        assert {"Theme", "Quit", "Theme: gputui-light", "Theme: gputui-contrast"} <= set(titles)
        await pilot.press("ctrl+p")
        await palette_pick(pilot, "help")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help from the palette")


async def test_full_screen_log_toggles(tmp_path: Path) -> None:
    app = static_app(tmp_path, session=ReplaySession({"7": b"hello\r\n"}))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "hello" in log_lines(app), what="log")
        await pilot.press("l")
        assert app.log_full
        await until(pilot, lambda: "Hosts" not in screen_text(app), what="log only")
        assert "hello" in screen_text(app) and app.query_one(LogView).has_focus
        await pilot.press("l")
        await until(pilot, lambda: "Hosts" in screen_text(app), what="everything back")
        app.query_one(LogView).focus()
        await pilot.press("n")  # no search running: n in the log is still "new job"
        await until(pilot, lambda: isinstance(app.screen, NewJobScreen), what="new job dialog")


def test_cli_without_a_subcommand_starts_the_app_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import gputui.cli as cli
    import gputui.ui as ui

    started: list[cfg.Config] = []
    monkeypatch.setattr(ui, "run", lambda config, seeds=None: started.append(config) or 0)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("GPUTUI_CONFIG", raising=False)
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.main([])
    finally:
        end_early_agents()  # the launch started the local agent for the app, which did not run
    assert exit_.value.code == 0 and list(started[0].hosts) == ["local"]


def end_early_agents() -> None:
    """End the agents an app launch started early that no app took (their stdin closed: they exit)."""
    from gputui.core.deploy import agentproc

    agentproc._settle()  # an early start still under way in its thread
    for argv in list(agentproc._started):
        proc = agentproc.take(list(argv))
        if proc is not None:
            proc.communicate(timeout=30)

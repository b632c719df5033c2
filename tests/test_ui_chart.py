"""Charts in the app: a running job's metrics, a host's GPU history and three runs compared, as SVG snapshots
in the dark and light themes at 80x24; and the chart's text is literal and fits its box."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_ui_snapshots import TRAIN_LOG, log_ready, make_app, select, settle
from textual.pilot import Pilot
from ui_fixtures import ReplaySession

from gputui.core.config.file import Config
from gputui.core.jobs.compare import Run, compare_rows
from gputui.core.session.series import JobSeries
from gputui.ui.screens.chart import CompareChartScreen, JobChartScreen, compare_table
from gputui.ui.widgets.chart import Line, plot
from remote_agent.jobs import series as agent_series

SMALL = (80, 24)
THEMES = ["gputui-dark", "gputui-light"]


def series_of(tmp_path: Path, name: str, log: bytes, ended: bool) -> JobSeries:
    """The series the real host-side extractor keeps for ``log``, as the client gets them."""
    d = tmp_path / name
    d.mkdir()
    (d / "output.log").write_bytes(log)
    ex, size = agent_series.update(str(d), ended)
    return JobSeries.from_wire("h100-a", name, json.loads(json.dumps(agent_series.result(name, ex, size))))


class ChartSession(ReplaySession):
    def __init__(self, series: JobSeries) -> None:
        super().__init__({"7": TRAIN_LOG}, end=False)
        self.series = series

    async def job_series(self, job: str) -> JobSeries:
        return self.series


def themed(tmp_path: Path, theme: str, **kw: Any) -> Any:
    return make_app(tmp_path, config=Config(path=None, hosts={}, theme=theme), **kw)


@pytest.mark.parametrize("theme", THEMES)
def test_running_jobs_metrics_chart(snap_compare: Any, tmp_path: Path, theme: str) -> None:
    session = ChartSession(series_of(tmp_path, "7", TRAIN_LOG, ended=False))

    async def run(pilot: Pilot) -> None:
        await log_ready(pilot)
        pilot.app.clear_notifications()  # the fleet's toasts would cover the chart
        await pilot.press("c")
        await settle(pilot, lambda: isinstance(pilot.app.screen, JobChartScreen) and pilot.app.screen.data)

    assert snap_compare(themed(tmp_path, theme, session=session), terminal_size=SMALL, run_before=run)


@pytest.mark.parametrize("theme", THEMES)
def test_gpu_history_chart(snap_compare: Any, tmp_path: Path, theme: str) -> None:
    async def then(pilot: Pilot) -> None:
        pilot.app.clear_notifications()
        await pilot.press("g")
        await settle(pilot)

    assert snap_compare(themed(tmp_path, theme), terminal_size=SMALL, run_before=select("a100-busy", then))


def _runs(tmp_path: Path) -> list[Run]:
    runs = []
    for i, lr in enumerate(("1e-3", "3e-4", "1e-4")):
        log = b"".join(b"step %d loss=%.4f\n" % (s, 2.5 / (1 + s * (i + 1) / 10)) for s in range(1, 200))
        log += b"val_loss: %.3f\n" % (1.0 + i / 10)
        rec = {"host": "h100-a", "id": str(5 + i), "name": f"lr {lr}", "state": "succeeded", "exit_code": 0,
               "command": ["python", "train.py", "--lr", lr], "duration_s": 600.0 * (i + 1), "cost": 0.4 * (i + 1),
               "gpus": {"models": ["NVIDIA H100 80GB HBM3"], "indices": [0]}, "git": {"commit": "ab12cd34ef", "dirty": i == 2},
               "metrics": {}}
        runs.append(
            Run(rec, {"env_keys": ["SEED"] if i else []}, series_of(tmp_path, str(5 + i), log, ended=True))
        )
    return runs


@pytest.mark.parametrize("theme", THEMES)
def test_three_finished_runs_compared(snap_compare: Any, tmp_path: Path, theme: str) -> None:
    runs = _runs(tmp_path)
    labels = [r.label for r in runs]
    screen = CompareChartScreen(labels, [r.series for r in runs], compare_table(labels, compare_rows(runs)),
                                __import__("gputui.ui.palette", fromlist=["Palette"]).Palette())

    async def run(pilot: Pilot) -> None:
        await settle(pilot)
        pilot.app.clear_notifications()
        screen.palette = pilot.app.palette  # type: ignore[attr-defined]
        await pilot.app.push_screen(screen)
        await settle(pilot)

    assert snap_compare(themed(tmp_path, theme), terminal_size=(100, 40), run_before=run)


def test_series_names_are_literal_and_the_chart_fits_its_box() -> None:
    lines = [Line("[bold red]loss[/]\x1b[2J", [(0, 1.0), (5, 0.5), (9, 0.1)], "red"),
             Line("eval_loss", [(4, 0.8), (9, 0.3)], "blue", marked=True)]
    for log_y in (False, True):
        text = plot(lines, 80, 24, "x: step", log_y=log_y)
        rows = text.plain.split("\n")
        assert len(rows) <= 24 and all(len(r) <= 80 for r in rows)
        assert "[bold red]loss[/]\\x1b[2J" in rows[0] and "\x1b" not in text.plain
        assert "◆" in text.plain and any(0x2800 < ord(ch) <= 0x28FF for ch in text.plain)
    zoomed = plot(lines, 80, 24, "x: step", last_x=5).plain
    assert zoomed.splitlines()[-1].split()[0] == "4"  # only x >= 9 - 5 drawn
    assert (
        "values <= 0 left out" in plot([Line("a", [(0, 0.0), (1, 1.0)], "red")], 80, 24, "", log_y=True).plain
    )


def test_history_marks_two_to_eight_runs_and_compares_them(tmp_path: Path) -> None:
    import asyncio

    from gputui.ui.screens.compare import RunsScreen

    runs = _runs(tmp_path)
    nine = [dict(runs[i % 3].record, id=str(10 + i)) for i in range(9)]
    asked: list[list[tuple[str, str]]] = []

    async def records() -> list[dict[str, Any]]:
        return nine

    async def load(refs: list[tuple[str, str]]) -> list[Run]:
        asked.append(refs)
        return runs

    async def main() -> None:
        app = themed(tmp_path, "gputui-dark")
        async with app.run_test(size=(100, 40)) as pilot:
            await settle(pilot)
            screen = RunsScreen(records, load, app.palette)
            await app.push_screen(screen)
            await settle(pilot, lambda: screen.records)
            await pilot.press("space", "c")  # one run: not enough
            await settle(pilot)
            assert not asked and "mark 2 to 8" in str(screen.query_one("#runs-hint").render())
            for _ in range(8):  # rows 1-7 marked, the ninth run (row 8) refused
                await pilot.press("down", "space")
            await settle(pilot)
            assert len(screen.marked) == 8 and "at most 8" in str(screen.query_one("#runs-hint").render())
            await pilot.press("up", "space", "c")  # unmark row 7: rows 0-6 compared
            await settle(pilot, lambda: isinstance(app.screen, CompareChartScreen))
            assert asked == [[("h100-a", str(10 + i)) for i in range(7)]]
            assert isinstance(app.screen, CompareChartScreen) and len(app.screen.labels) == 3

    asyncio.run(main())


def test_the_app_opens_each_chart_by_its_key(tmp_path: Path) -> None:
    import asyncio

    from gputui.ui.screens.chart import GpuChartScreen
    from gputui.ui.screens.compare import RunsScreen

    session = ChartSession(series_of(tmp_path, "7", TRAIN_LOG, ended=True))

    async def main() -> None:
        app = themed(tmp_path, "gputui-dark", session=session)
        async with app.run_test(size=SMALL) as pilot:
            await log_ready(pilot)
            for key, screen in (("c", JobChartScreen), ("g", GpuChartScreen), ("C", RunsScreen)):
                await pilot.press(key)
                await settle(pilot, lambda s=screen: isinstance(app.screen, s))
                if key == "c":  # an ended job's final series: asked for once, no live timer left
                    await settle(pilot, lambda: app.screen.data is not None)
                    assert app.screen.live is None
                await pilot.press("escape")
                await settle(pilot, lambda s=screen: not isinstance(app.screen, s))

    asyncio.run(main())

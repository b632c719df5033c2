"""The app in a new user's first hour: the history uses the width, headers sit over their values, keys that
cannot act say why, a connecting host is not "down", commands show as typed. Recorded snapshots reach the
app through its snapshot path (see ui_fixtures)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from test_ui_app import SIZE, connected, local, local_app, static_app, until  # noqa: F401 - local: a fixture
from ui_fixtures import T0, ReplaySession, job, recorded_gpus, screen_text, snapshot

from gputui.core.config import file as cfg
from gputui.core.money.spend import fleet_spend
from gputui.core.session import model as M
from gputui.ui import fmt
from gputui.ui.keys import help_sections
from gputui.ui.palette import Palette
from gputui.ui.screens.reports import ReportScreen
from gputui.ui.widgets.fleet import FleetTable, fleet_summary
from gputui.ui.widgets.host import JobsTable

LONG_NAME = "finetune-llama-7b-lora-r16-alpha32-lr3e-4-warmup500-cosine-run-7"


class HistorySession(ReplaySession):
    """A host with finished runs whose logs end with their metrics."""

    def __init__(self, jobs: list[M.Job]) -> None:
        super().__init__()
        self.jobs = jobs

    async def list_jobs(self) -> list[M.Job]:
        return self.jobs

    async def read_log(self, job_id: str, offset: int = 0, **_kw: Any) -> tuple[int, bytes, int]:
        data = b"epoch 3/3 train_loss=0.1234 test_acc=0.9876\n"
        return offset, data[offset:], len(data)


async def test_history_view_uses_the_width_and_keeps_the_metrics(tmp_path: Path) -> None:
    runs = [
        job("h100-a", "3", LONG_NAME, M.JOB_SUCCEEDED, exit_code=0),
        job("h100-a", "2", "baseline", M.JOB_FAILED, exit_code=1),
    ]
    snaps = [snapshot("h100-a", recorded_gpus("h100"), jobs=runs)]
    app = static_app(tmp_path, snaps, session=HistorySession(runs))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.hosts["h100-a"].state == M.CONNECTED)
        await pilot.press("h")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), what="history")
        await until(pilot, lambda: "baseline" in screen_text(app), what="history rows")
        lines = screen_text(app).splitlines()
        at = next(i for i, ln in enumerate(lines) if " metrics " in ln)
        header = lines[at]
        for col in ("host", "id", "state", "exit", "ended", "time", "cost", "GPU mem", "util", "name"):
            assert f" {col} " in header + " ", (col, header)  # whole, not "ho…"
        assert header.rindex("name") - header.index("host") > 100  # most of 160 columns, not half (88)
        long_row = next(ln for ln in lines[at:] if LONG_NAME[:20] in ln)
        assert "test_acc=0.9876" in long_row  # the metrics column survives a long run name


async def test_numeric_headers_sit_over_their_values(tmp_path: Path) -> None:
    app = static_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "°C" in screen_text(app), what="host rows")
        lines = screen_text(app).splitlines()
        for table, header_word, row_word, labels in (
            (FleetTable, "State", "h100-a ", ("Util", "GPU mem", "Temp", "Jobs", "$/h", "Accrued", "Idle")),
            (JobsTable, "Runtime", "train", ("ID", "Runtime")),
        ):
            at = next(i for i, ln in enumerate(lines) if header_word in ln and labels[0] in ln)
            header = lines[at]
            row = next(ln for ln in lines[at + 1 :] if row_word in ln)
            for label in labels:
                end = header.index(label) + len(label)
                assert row[end - 1] != " " and row[end] == " ", (table.__name__, label, header, row)


async def test_home_and_end_jump_to_the_first_and_last_job(tmp_path: Path) -> None:
    jobs = [job("box", str(i), f"run {i}", M.JOB_SUCCEEDED, exit_code=0) for i in range(1, 7)]
    app = static_app(tmp_path, [snapshot("box", recorded_gpus("h100"), jobs=jobs)])
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(JobsTable)
        await until(pilot, lambda: table.row_count == 6, what="jobs")
        await pilot.press("2")  # the jobs pane
        assert table.has_focus and table.cursor_row == 0
        await pilot.press("end")
        await until(pilot, lambda: table.cursor_row == 5, what="last row")
        await pilot.press("home")
        await until(pilot, lambda: table.cursor_row == 0, what="first row")


async def test_kill_with_no_running_job_says_why(tmp_path: Path) -> None:
    ended = [job("box", "1", "done", M.JOB_SUCCEEDED, exit_code=0)]
    snaps = [snapshot("box", recorded_gpus("h100"), jobs=ended), snapshot("empty", recorded_gpus("h100"))]
    app = static_app(tmp_path, snaps)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.current_job() is not None, what="ended job selected")
        await pilot.press("k")
        await until(pilot, lambda: [n for n in app._notifications if "job 1 is not running" in n.message])
        await pilot.press("down")  # the host without jobs
        await until(pilot, lambda: app.selected_host == "empty")
        await pilot.press("k")
        await until(pilot, lambda: [n for n in app._notifications if "no job selected" in n.message])


def test_a_host_still_connecting_is_not_counted_as_down() -> None:
    snaps = [M.HostSnapshot(name="new"), replace(snapshot("up"), state=M.CONNECTED)]
    assert M.HostSnapshot(name="new").state == M.CONNECTING
    config = cfg.Config(path=None, hosts={})
    text = fleet_summary(snaps, fleet_spend(snaps, config), Palette()).plain
    assert "1 up" in text and "0 down" in text and "1 connecting" in text
    err = snapshot("bad", state=M.ERROR, error="refused")
    assert "1 down" in fleet_summary([*snaps, err], fleet_spend(snaps, config), Palette()).plain


def test_fleet_summary_shows_each_currency_and_never_adds_them() -> None:
    def priced(name: str, currency: str, per_hour: float) -> M.HostSnapshot:
        cost = M.CostInfo(currency=currency, price_per_hour=per_hour, accrued=10 * per_hour)
        return replace(snapshot(name), cost=cost)

    snaps = [priced("a", "USD", 2.0), priced("b", "EUR", 3.0), priced("c", "USD", 1.5)]
    text = fleet_summary(snaps, fleet_spend(snaps, cfg.Config(path=None, hosts={})), Palette()).plain
    assert "burn $3.50/h · 3.00 EUR/h   accrued $35.00 · 30.00 EUR" in text


async def test_commands_show_shell_quoted(tmp_path: Path) -> None:
    argv = ("python3", "-c", "import time;[print(i) for i in range(3)]")
    unnamed = replace(job("box", "1", " ".join(argv)), command=argv)  # the agent's default name
    assert fmt.job_name(unnamed.name, argv) == "python3 -c 'import time;[print(i) for i in range(3)]'"
    assert fmt.job_name("my run", argv) == "my run"  # a name the user gave stays as given
    app = static_app(tmp_path, [snapshot("box", recorded_gpus("h100"), jobs=[unnamed])])
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot, lambda: "python3 -c 'import" in screen_text(app), what="quoted command in the jobs table"
        )
        await until(pilot, lambda: "python3 -c 'import time;[print(i) for i in range(3)]'" in screen_text(app), what="whole command in the log title")


def test_an_ended_job_shows_no_eta() -> None:
    """A killed job's row kept the ETA its log implied when it stopped (``50%  5s``), as if still coming;
    the log header and ``gputui jobs`` already show an ETA only while a job runs."""
    from gputui.core.insights import JobInsights
    from gputui.ui.widgets.host import job_row

    ins = JobInsights(progress=0.5, eta_s=5.0)
    cells = job_row(job("box", "1", "train"), ins, T0, Palette())
    assert (cells[5].plain, cells[6].plain) == ("50%", "5s")  # type: ignore[attr-defined]
    for state in (M.JOB_KILLED, M.JOB_FAILED, M.JOB_SUCCEEDED, M.JOB_LOST):
        cells = job_row(job("box", "1", "train", state, exit_code=130), ins, T0, Palette())
        assert (cells[5].plain, cells[6].plain) == ("50%", ""), state  # type: ignore[attr-defined]


async def test_a_job_that_could_not_start_keeps_what_was_typed(
    local: cfg.Config,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A start the host refused (a working dir it lacks) closed the dialog and its fields went with it: `n`
    then opened an empty form. Now `n` brings them back with the reason, and after a start it is empty again."""
    from textual.widgets import Input, Static

    from gputui.ui.screens.new_job import NewJobScreen

    app = local_app(local, tmp_path)
    typed = {"command": "python3 train.py --lr '3e-4 x'", "cwd": str(tmp_path / "no-such-dir"), "name": "exp1",
             "env": "A=1 'B=two words'", "gpus": "", "sync": ""}

    async def dialog() -> NewJobScreen:
        await pilot.press("n")
        return await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")

    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        form = await dialog()
        for key, value in typed.items():
            form.query_one(f"#{key}", Input).value = value
        await pilot.press("enter")
        await until(pilot, lambda: [n for n in app._notifications if "does not exist" in n.message], what="refusal")
        assert not isinstance(app.screen, NewJobScreen) and not app.hosts["local"].jobs
        form = await dialog()
        assert {key: form.query_one(f"#{key}", Input).value for key in typed} == typed
        assert "does not exist" in str(form.query_one("#error", Static).render())
        form.query_one("#cwd", Input).value = str(tmp_path)
        await pilot.press("enter")
        await until(pilot, lambda: app.hosts["local"].jobs, what="the job started")
        form = await dialog()
        assert form.query_one("#command", Input).value == ""


async def test_a_job_for_a_host_that_is_not_up_says_it_waits(
    local: cfg.Config,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Enter in the new-job dialog for a host that is reconnecting gave no word for 30 s (then "not connected
    within 30 s"): now it says at once that the job waits for the host."""
    from sshd import free_port
    from textual.widgets import Input

    from gputui.ui.screens.new_job import NewJobScreen

    off = cfg.HostConfig(name="off", host="127.0.0.1", port=free_port(), remote_dir=str(tmp_path / "off"))
    app = local_app(replace(local, hosts={**local.hosts, "off": off}), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await until(pilot, lambda: app.hosts["off"].state == M.RECONNECTING, what="off reconnecting")
        app.selected_host = "off"
        await pilot.press("n")
        form = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")
        assert form.host == "off"
        form.query_one("#command", Input).value = "echo hi"
        await pilot.press("enter")
        notes = lambda: [n.message for n in app._notifications]  # noqa: E731
        await until(pilot, lambda: any("off is reconnecting: the job starts once it is up" in m for m in notes()))
        assert not any("could not start" in m for m in notes())


async def test_autostop_keys_with_no_autostop_say_why(tmp_path: Path) -> None:
    """z and x did nothing at all on a host without autostop (their bindings are off then): a silent key
    looks broken. Now they say what would arm it; the footer and help still list them only once."""
    app = static_app(tmp_path, [snapshot("box", recorded_gpus("h100"))])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.selected_host == "box", what="host selected")
        for key in ("z", "x"):
            app._notifications.clear()
            await pilot.press(key)
            await until(pilot, lambda: [n for n in app._notifications if "box has no autostop counting down" in n.message])
        assert sum(key == "z" for key, _ in help_sections()[0][1]) == 1


async def test_a_theme_the_config_names_wrongly_is_said(tmp_path: Path) -> None:
    """`theme = "gputui-ligth"` in the config started the default theme without a word."""
    config = cfg.Config(path=None, hosts={}, theme="gputui-ligth")
    app = static_app(tmp_path, [snapshot("box")], config=config)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: [n for n in app._notifications if "'gputui-ligth' is no theme here" in n.message])
        note = next(n.message for n in app._notifications if "gputui-ligth" in n.message)
        assert "gputui-light" in note and app.theme == "gputui-dark"

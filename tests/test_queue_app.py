"""The queue in the app: the new-job dialog's queue option, queued jobs with position and reason (plain text),
and kill of a queued job removing it from the queue; on the local host, through the real agent."""

from __future__ import annotations

from pathlib import Path

from test_ui_app import SIZE, connected, local, local_app, py, screen_text, start_from_dialog, until  # noqa: F401
from textual.widgets import Checkbox, Input

from gputui.core.config import file as cfg
from gputui.core.session import model as M
from gputui.ui.palette import Palette
from gputui.ui.screens.confirm import ConfirmScreen
from gputui.ui.screens.new_job import NewJobScreen
from gputui.ui.widgets.host import job_row


async def test_queue_from_the_dialog_shows_position_and_reason_and_kill_removes_it(
    local: cfg.Config,  # noqa: F811
    tmp_path: Path,
) -> None:
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        blocker = await start_from_dialog(pilot, py("import time; time.sleep(600)"))
        await pilot.press("n")
        dialog = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")
        dialog.query_one("#command", Input).value = "echo later"
        dialog.query_one("#queue", Checkbox).value = True
        await pilot.press("enter")
        queued = await until(pilot, lambda: [j for j in app.hosts["local"].jobs if j.state == M.JOB_QUEUED],
                             what="the queued job")
        want = f"job {blocker.id} running (this job asks for the whole host)"

        def reason() -> str | None:
            return next(j for j in app.hosts["local"].jobs if j.id == queued[0].id).queue_reason

        await until(pilot, lambda: reason() == want, timeout=60, what="the scheduler's reason, pushed live")
        await until(pilot, lambda: f"echo later · job {blocker.id} running" in screen_text(app), what="the row")
        assert "queued #1" in screen_text(app)
        app.select_job("local", queued[0].id)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert f"Remove job {queued[0].id} (echo later) from the queue" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: app.current_job().state == M.JOB_KILLED, what="removed")
        assert app.current_job().started_at is None
        assert next(j for j in app.hosts["local"].jobs if j.id == blocker.id).running


def test_a_queued_row_shows_host_text_as_plain_text() -> None:
    wire = {"id": "5", "name": "sweep", "state": "queued", "argv": ["python", "train.py"], "queue": {"gpu_count": 2},
            "queue_position": 2, "queue_reason": "GPU 0 used by pid 7 ([bold]x[/] \x1b[31m)"}
    row = job_row(M.Job.from_wire("gpu", wire), None, 0.0, Palette())  # type: ignore[arg-type]
    assert (row[2].plain, row[4].plain) == ("queued #2", "any 2")
    assert row[1].plain.startswith("sweep · GPU 0 used by pid 7 ([bold]x[/] ")
    assert "\x1b" not in row[1].plain


async def test_removing_a_queued_job_that_started_meanwhile_does_not_kill_it(
    local: cfg.Config,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The dialog promised "It never starts": if the scheduler starts the job while the dialog waits, the yes
    does not kill a running job (that takes a kill of its own, with the kill's own dialog)."""
    go = tmp_path / "go"
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        blocker = await start_from_dialog(pilot, py(f"import os,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"))
        await pilot.press("n")
        dialog = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")
        dialog.query_one("#command", Input).value = "sleep 600"
        dialog.query_one("#queue", Checkbox).value = True
        await pilot.press("enter")
        queued = await until(pilot, lambda: [j for j in app.hosts["local"].jobs if j.state == M.JOB_QUEUED],
                             what="the queued job")

        def state() -> str:
            return next(j for j in app.hosts["local"].jobs if j.id == queued[0].id).state

        app.select_job("local", queued[0].id)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert "It never starts" in screen_text(app)
        go.touch()  # the blocker ends: the scheduler starts the queued job while the dialog is open
        await until(pilot, lambda: state() == M.JOB_RUNNING, timeout=60, what="the queued job to start")
        await pilot.press("y")
        await until(pilot, lambda: [n for n in app._notifications if "started meanwhile" in n.message],
                    what="the refusal")
        assert state() == M.JOB_RUNNING
        assert next(j for j in app.hosts["local"].jobs if j.id == blocker.id).state == M.JOB_SUCCEEDED

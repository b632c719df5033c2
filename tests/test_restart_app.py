"""The new-job dialog's restart fields: the policy reaches the host, bad input is said in the dialog."""

from __future__ import annotations

from pathlib import Path

from test_ui_app import SIZE, connected, local, local_app, py, screen_text, until  # noqa: F401 (local: a fixture)
from textual.widgets import Input

from gputui.core.config import file as cfg
from gputui.ui.screens.new_job import NewJobScreen


async def test_the_dialog_starts_a_job_with_a_restart_policy_and_refuses_a_bad_one(local: cfg.Config, tmp_path: Path) -> None:  # noqa: F811
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("n")
        dialog = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")
        dialog.query_one("#command", Input).value = py("print('ok')")
        for restart, glob, said in (("on-failure:-1", "", "N is a whole number"),
                                    ("on-failure", "../x/*.pt", "outside the job's directory"),
                                    ("", "ckpt/*.pt", "needs a restart policy")):
            dialog.query_one("#restart", Input).value = restart
            dialog.query_one("#resume_from", Input).value = glob
            await pilot.press("enter")
            await until(pilot, lambda said=said: said in screen_text(app), what=said)
            assert isinstance(app.screen, NewJobScreen) and not app.hosts["local"].jobs
        dialog.query_one("#restart", Input).value = "on-failure:2"
        dialog.query_one("#resume_from", Input).value = "ckpt/*.pt"
        await pilot.press("enter")
        [job] = await until(pilot, lambda: app.hosts["local"].jobs, what="the job")
        assert job.record.get("restart", {}).get("max") == 2
        assert job.record.get("restart", {}).get("resume_from") == "ckpt/*.pt"

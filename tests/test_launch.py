"""The `gputui` command's first step (gputui/launch.py): bare `gputui` opens the app without the CLI, and
garbage collection paused for the start-up resumes with the first frame."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from ui_fixtures import static_factory

from gputui import appstart
from gputui.core.errors import ExitStatus
from gputui.ui.app import GpuTuiApp

ROOT = Path(__file__).resolve().parents[1]


def test_the_app_loads_without_the_cli_and_what_only_actions_need() -> None:
    """What the first frame waits for: the app's modules, not the CLI's commands, nor the modules only a
    key press needs (they load when first used)."""
    later = ["gputui.cli", "gputui.core.jobs.usecases", "gputui.core.money.release", "gputui.ui.screens.confirm", "gputui.ui.flows.release",
             "gputui.ui.flows.files"]
    code = f"import sys, gputui.launch, gputui.ui.app; print([m for m in {later!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip() == "[]"


def test_a_broken_config_is_a_usage_error_before_the_app(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "config.toml"
    bad.write_text("[hosts.a]\nhost = \n")
    assert appstart.run_app(str(bad)) == ExitStatus.USAGE == 2
    err = capsys.readouterr().err
    assert err.startswith("gputui: ") and "config.toml" in err and "line 2" in err
    assert gc.isenabled()


async def test_collection_resumes_with_the_first_frame(tmp_path: Path) -> None:
    app = GpuTuiApp(source_factory=static_factory([]), state_path=tmp_path / "ui.json")
    gc.disable()  # as appstart.run_app does
    try:
        async with app.run_test() as pilot:
            await pilot.pause()
            assert gc.isenabled()  # on_ready: the first frame is out
            assert gc.get_freeze_count() > 0  # what the start-up built is left out of later collections
    finally:
        gc.enable()
        gc.unfreeze()

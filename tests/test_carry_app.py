"""The app's carry actions through the pilot: a job synced from the new-job dialog, artifacts pulled from the
release dialog, and the one-key forward of a URL a job printed (local host, and over the real sshd)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import Home, SshHome
from test_carry_forward import fwd_home  # noqa: F401
from test_ui_app import SIZE, connected, local, local_app, log_lines, py, releasable, until  # noqa: F401
from textual.widgets import Input, Static

from gputui.core.config import file as cfg
from gputui.core.session import model as M
from gputui.ui.app import GpuTuiApp
from gputui.ui.screens.confirm import ConfirmScreen
from gputui.ui.screens.new_job import NewJobScreen
from gputui.ui.screens.release import ReleaseScreen


def notes(app: GpuTuiApp) -> list[str]:
    return [n.message for n in app._notifications]


async def open_dialog(pilot, app: GpuTuiApp, command: str, sync: str) -> NewJobScreen:  # type: ignore[no-untyped-def]
    await pilot.press("n")
    dialog = await until(pilot, lambda: isinstance(app.screen, NewJobScreen) and app.screen, what="dialog")
    dialog.query_one("#command", Input).value = command
    dialog.query_one("#sync", Input).value = sync
    return dialog


async def test_new_job_dialog_syncs_the_tree_and_runs_the_job_in_it(
    local: cfg.Config, home: Home, tmp_path: Path  # noqa: F811
) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "hello.txt").write_text("synced text\n")
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        dialog = await open_dialog(pilot, app, "true", str(tmp_path / "missing"))
        await pilot.press("enter")
        await until(pilot, lambda: "is not a directory" in str(dialog.query_one("#error", Static).render()))
        assert isinstance(app.screen, NewJobScreen)  # nothing started; the dialog stays
        await pilot.press("escape")

        await open_dialog(pilot, app, py("print(open('hello.txt').read())"), str(src))
        await pilot.press("enter")
        job = await until(pilot, lambda: app.hosts["local"].jobs and app.hosts["local"].jobs[0], what="job")
        await until(pilot, lambda: "synced text" in log_lines(app), what="the job read the synced file")
    target = home.root / "gputui-work" / "proj"
    assert job.cwd == str(target) and (target / "hello.txt").read_text() == "synced text\n"
    assert len(job.record["code"]["tree_sha256"]) == 64 and job.record["code"]["dir"] == str(target)
    assert (src / "hello.txt").read_text() == "synced text\n"  # the prefilled cwd (here) was not the target


async def test_new_job_dialog_does_not_start_a_job_whose_sync_did_not_fully_arrive(
    local: cfg.Config, home: Home, tmp_path: Path  # noqa: F811
) -> None:
    """A file the host refused (its dir is a symlink there): the job would run on stale code, so none starts."""
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "conf.txt").write_text("new\n")
    target = tmp_path / "host"
    (target / "elsewhere").mkdir(parents=True)
    os.symlink(target / "elsewhere", target / "pkg")
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        dialog = await open_dialog(pilot, app, "true", str(src))
        dialog.query_one("#cwd", Input).value = str(target)
        await pilot.press("enter")
        await until(pilot, lambda: any("job not started" in n for n in notes(app)), what="the refusal")
        assert not app.hosts["local"].jobs
    assert any("1 of 1 files did not arrive on local (pkg/conf.txt)" in n for n in notes(app)), notes(app)
    assert list((target / "elsewhere").iterdir()) == []


async def test_forward_key_shows_the_printed_url_with_its_token_as_plain_text(
    local: cfg.Config, tmp_path: Path  # noqa: F811
) -> None:
    app = local_app(local, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await pilot.press("o")
        await until(pilot, lambda: any("no job selected" in n for n in notes(app)), what="no job")
        token = "[b]x[/b]\x1b[31m"
        code = f"print('Jupyter at http://0.0.0.0:8888/lab?token={token}'); print('done')"
        await open_dialog(pilot, app, py(code), "")
        await pilot.press("enter")
        await until(pilot, lambda: "done" in log_lines(app), what="output")
        await pilot.press("o")
        shown = await until(pilot, lambda: [n for n in notes(app) if "127.0.0.1:8888" in n], what="url")
        assert "http://127.0.0.1:8888/lab?token=[b]x[/b]" in shown[0] and "no forward needed" in shown[0]
        assert "\x1b" not in shown[0]  # the ESC the job printed is never sent to the terminal


async def test_release_dialog_pulls_changed_artifacts_first(
    local: cfg.Config, home: Home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.chdir(tmp_path)  # ./gputui-artifacts lands here
    marker = tmp_path / "released"
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "a.pt").write_bytes(os.urandom(100_000))
    config = releasable(home, marker, 'artifacts = ["ckpt/"]\n')
    job = home.cli("run", "local", "--cwd", str(work), "--", "true", check=True).stdout.strip()
    app = local_app(config, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await until(pilot, lambda: app.hosts["local"].jobs, what="jobs")
        await pilot.press("r")
        dialog = await until(pilot, lambda: isinstance(app.screen, ReleaseScreen) and app.screen, what="dialog")
        assert f"{job}/ckpt/a.pt" in dialog.text() and "1 artifact file" in dialog.text()
        await pilot.press("y")  # the plain confirmation's yes: here it releases nothing
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ReleaseScreen), what="dialog closed")
        assert not marker.exists()
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ReleaseScreen), what="dialog again")
        await pilot.press("p")
        await until(pilot, lambda: marker.exists(), what="released after the pull")
        pulled = tmp_path / "gputui-artifacts" / "local" / job / "ckpt" / "a.pt"
        assert pulled.read_bytes() == (work / "ckpt" / "a.pt").read_bytes()
        await until(pilot, lambda: any("local released" in n for n in notes(app)), what="released note")
        marker.unlink()
        await pilot.press("r")  # nothing changed since that pull: the plain confirmation
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="plain confirm")


async def test_forward_key_over_ssh_reaches_the_jobs_http_server(
    fwd_home: SshHome, tmp_path: Path  # noqa: F811
) -> None:
    ssh_home = fwd_home  # an sshd that allows local TCP forwarding
    server = (
        "import http.server, socketserver\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = ('hello from ' + self.path).encode()\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "s = socketserver.TCPServer(('127.0.0.1', 0), H)\n"
        "print(f'TensorBoard at http://localhost:{s.server_address[1]}/?token=t0k', flush=True)\n"
        "s.serve_forever()\n"
    )
    job = ssh_home.cli("run", "box", "--", sys.executable, "-c", server, check=True).stdout.strip()
    app = GpuTuiApp(cfg.load(str(ssh_home.configure())), state_path=tmp_path / "ui.json")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.hosts["box"].state == M.CONNECTED and app.hosts["box"].jobs, timeout=60)
            app.select_job("box", job)
            await until(pilot, lambda: any("TensorBoard at" in ln for ln in log_lines(app)), what="url printed")
            await pilot.press("o")
            shown = await until(pilot, lambda: [n for n in notes(app) if "forwarded to box" in n], what="fwd")
            url = re.search(r"http://127\.0\.0\.1:\d+/\?token=t0k", shown[0])
            assert url is not None, shown
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url.group(0), timeout=30).read())
            assert body == b"hello from /?token=t0k"
            await pilot.press("o")  # again: the same forward, the same URL
            await until(pilot, lambda: len([n for n in notes(app) if url.group(0) in n]) == 2, what="again")
    finally:
        ssh_home.cli("kill", "box", job, "--yes", "--grace", "0")


async def test_release_dialog_shows_a_host_file_name_as_one_line(
    local: cfg.Config, home: Home, tmp_path: Path  # noqa: F811
) -> None:
    """A file name on the host may hold a line break: in the dialog it stays one escaped line, never a line of
    the dialog's own text (here one that says nothing will be lost)."""
    marker = tmp_path / "released"
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "a.pt\n\nNothing will be lost: release.\x1b[2J").write_bytes(b"weights")
    config = releasable(home, marker, 'artifacts = ["ckpt/"]\n')
    home.cli("run", "local", "--cwd", str(work), "--", "true", check=True)
    app = local_app(config, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot)
        await until(pilot, lambda: app.hosts["local"].jobs, what="jobs")
        await pilot.press("r")
        dialog = await until(pilot, lambda: isinstance(app.screen, ReleaseScreen) and app.screen, what="dialog")
        lines = dialog.text().splitlines()
        assert not any(line.startswith("Nothing will be lost") for line in lines), lines
        assert any(line.endswith("/ckpt/a.pt\\n\\nNothing will be lost: release.\\x1b[2J") for line in lines), lines
        await pilot.press("escape")
    assert not marker.exists()

"""Text from a host or a user is data: one corpus of hostile strings in every field that reaches the screen.

Each string goes into every text field at once (host name, hostname, errors, reconnect details, GPU and process
names, job ids, names and commands, log output, gap notices, doctor checks, history, dialog inputs, failures of
every command) and the app is driven through every screen and notification (rendered: ``notifications=True``).
Each screen must show the string literally (markup unparsed, control characters as visible escapes), hold no
raw control character, and carry no clickable action. The exact reproductions from the report are run against
the real local host (real agent, real tmux). The CLI's plain tables get the same corpus.
"""

from __future__ import annotations

import io
import os
import re
import select
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_ui_app import SIZE, connected, local, py, start_from_dialog, until  # noqa: F401 - fixture
from textual.pilot import Pilot
from textual.widgets import Input, Static
from ui_fixtures import T0, ReplaySession, job, price, recorded_gpus, snapshot, static_factory

from gputui import tables
from gputui.core.config import file as cfg
from gputui.core.insights import Hint, JobInsights
from gputui.core.money.cost import Ledger
from gputui.core.money.spend import FleetSpend, Spend
from gputui.core.safetext import TerminalGuard, clean, guard_terminal
from gputui.core.session import model as M
from gputui.ui.app import GpuTuiApp
from gputui.ui.palette import Palette
from gputui.ui.screens.confirm import ConfirmScreen
from gputui.ui.screens.new_job import NewJobScreen
from gputui.ui.screens.reports import ReportScreen, history_table
from gputui.ui.widgets.log import hints_text, insights_text

CORPUS = [
    "sync [/data]",
    "[/]",
    "[@click=app.quit]x",
    "[link=https://evil.example]pay here[/link]",
    "a[b]c",
    "[bold red]LOUD[/] [on red]bg",
    "python3 -c 'import time;[print(i) for i in range(3)]'",
    "\\[not-escaped] [",
    "\x1b[31mred\x1b[0m \x1b[2J\x1b[H",  # CSI: colour, clear screen, cursor home
    "\x1b]52;c;ZXZpbA==\x07clip",  # OSC 52: write the clipboard
    "\x1b]0;pwned title\x1b\\t \x1bP+q\x1b\\",  # OSC title, DCS
    "abc\u202edcba\u2066iso\u2069 \u200fx \u061c",  # bidi override, isolate, marks
    "line1\nline2\r\nline3",
    "c1 \x9b31m \x85 \x90 del\x7f",  # C1 CSI/NEL/DCS, DEL
    "bad utf8 \udcff\udcfe end",  # invalid UTF-8 bytes as surrogateescape leaves them
    "\x00nul \x07bel \x08bs \ttab",
    "W" * 10_000,  # 10 KB
]
IDS = [f"{i}:{s[:12]!r}" for i, s in enumerate(CORPUS)]
_RAW = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)


def rendered(app: Any) -> tuple[str, list[dict[str, Any]]]:
    """The screen as the terminal gets it: its text and the meta of every segment."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None, record=True)
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    metas = [dict(s.style.meta) for s in console.render(update) if s.style is not None and s.style.meta]
    console.print(update)
    return console.export_text(), metas


def probe(text: str, n: int = 12) -> str:
    """What must show literally: the start of the escaped text, up to a line end (a cell may wrap it)."""
    return clean(text).split("\\n")[0][:n]


def assert_safe(app: Any, *literal: str) -> str:
    """No raw control character, no clickable action on screen; each of ``literal`` shows as written."""
    text, metas = rendered(app)
    raw = _RAW.findall(text)
    assert not raw, f"raw control characters reach the terminal: {raw[:5]}"
    actions = [m["@click"] for m in metas if "@click" in m]
    assert not [a for a in actions if "quit" in str(a)], actions
    flat = text.replace("\n", "")
    for want in literal:
        assert want in text or want in flat, f"{want!r} not shown literally\n{text}"
    return text


async def shows(pilot: Pilot, *literal: str) -> None:
    """Wait until the screen shows every one of ``literal``, then check it with :func:`assert_safe`."""

    def shown() -> bool:
        text = rendered(pilot.app)[0]
        return all(w in text or w in text.replace("\n", "") for w in literal)

    await until(pilot, shown, what=f"{literal} on screen")
    assert_safe(pilot.app, *literal)


def hostile_log(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogateescape")
    return b"".join(
        [
            b"start\r\n" + raw + b"\r\n",
            b"\x1b[32mgreen\x1b[0m \x1b]52;c;ZXZpbA==\x07 \xc2\x9b31m \xe2\x80\xae" + raw[:200] + b"\r\n",
            b"loss=0.5 " + raw[:100] + b"\r\n",
            b" 41%|####      | 492/1200 [41:02<58:31,  \xe2\x80\xae1.17it/s]\r\n",
        ]
    )


class HostileSession(ReplaySession):
    """A host whose every answer carries the hostile string: log bytes, gaps, history, doctor, failures."""

    def __init__(self, s: str, jobs: list[M.Job]) -> None:
        super().__init__({}, end=False)
        self.s, self.jobs, self.name = s, jobs, s

    async def follow_log(self, job, offset, on_data, on_end, on_gap):  # type: ignore[override]
        on_data(hostile_log(self.s))
        on_gap(self.s)
        return None

    async def list_jobs(self) -> list[M.Job]:
        return self.jobs

    async def read_log(self, job_id: str, offset: int = 0, **_kw: Any) -> tuple[int, bytes, int]:
        data = hostile_log(self.s)
        return offset, data[offset:], len(data)

    async def doctor(self, *_a: Any, **_kw: Any) -> dict[str, Any]:
        check = {"id": self.s, "title": self.s, "status": "fail", "detail": self.s, "fix": self.s}
        return {"checks": [check, {**check, "status": self.s}]}

    async def snooze_autostop(self, *_a: Any, **_kw: Any) -> None:
        raise RuntimeError(self.s)

    async def cancel_autostop(self) -> None:
        raise RuntimeError(self.s)

    async def start_job(self, *_a: Any, **_kw: Any) -> M.Job:
        raise RuntimeError(self.s)

    async def kill_job(self, *_a: Any, **_kw: Any) -> M.Job:
        raise RuntimeError(self.s)


def hostile_fleet(s: str) -> tuple[list[M.HostSnapshot], list[M.Job]]:
    gpus = tuple(
        replace(g, name=s, processes=(M.GpuProcess(pid=4242, mem_mib=100.0, job="7", name=s),))
        for g in recorded_gpus("h100")
    )
    running = replace(job(s, "7", s), command=("python3", "-c", s), cwd=s)
    ended = [
        replace(job(s, f"{s[:40]}-{i}", s, state, exit_code=code), command=(s, "--flag", s), cwd=s)
        for i, (state, code) in enumerate([(M.JOB_FAILED, 1), (M.JOB_SUCCEEDED, 0)])
    ]
    cost = replace(price(2.0), reasons=(s, s), autostop_in_s=600.0)
    main = snapshot(s, gpus, jobs=[*ended, running], cost=cost)
    main = replace(main, facts={**main.facts, "hostname": s, "tmux_socket": s})
    down = snapshot("down", state=M.ERROR, error=s)
    flaky = snapshot("flaky", state=M.RECONNECTING, error=s, detail=s, gpu_error=s)
    return [main, down, flaky], ended


async def released(_session: Any, host: cfg.HostConfig, _ledger: Ledger, _request: Any) -> Any:
    """The call that would run the release on the host: it fails with the host's name."""
    raise RuntimeError(host.name)


async def wait_screen(pilot: Pilot, kind: type, what: str) -> Any:
    return await until(pilot, lambda: isinstance(pilot.app.screen, kind) and pilot.app.screen, what=what)


@pytest.mark.parametrize("s", CORPUS, ids=IDS)
async def test_hostile_text_in_every_field_of_every_screen(tmp_path: Path, s: str) -> None:
    snaps, ended = hostile_fleet(s)
    factory = static_factory(snaps, HostileSession(s, ended))
    release = cfg.HostConfig(name=s, release=(s, "--id", s))  # configured as a user would: the dialog shows it
    app = GpuTuiApp(
        cfg.Config(path=None, hosts={s: release}),
        source_factory=factory,
        clock=lambda: T0,
        state_path=tmp_path / "ui.json",
        release_call=released,
    )
    factory.holder["source"].ledger = Ledger(tmp_path / "ledger.json")  # type: ignore[attr-defined]
    want = probe(s)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        source = factory.holder["source"]  # type: ignore[attr-defined]
        await until(pilot, lambda: app.hosts["flaky"].state == M.RECONNECTING, what="snapshots applied")
        await until(pilot, lambda: app.stream is not None and len(app.stream.buffer) >= 5, what="log")
        await shows(pilot, want, "start", "green", "loss=0.5")  # fleet, host info, GPU cards, jobs, log

        # the other hosts: error line, reconnect detail, GPU error
        for key, host, marker in (("down", "down", "error: "), ("down", "flaky", "reconnecting ("), ("up", "down", "error: "), ("up", s, "cpu 37%")):
            await pilot.press(key)
            await until(pilot, lambda host=host: app.selected_host == host, what=f"host {host!r}")
            await shows(pilot, want, marker)

        await pilot.press("k")  # kill: the dialog names the job
        await wait_screen(pilot, ConfirmScreen, "kill confirm")
        assert_safe(app, want[:8])
        await pilot.press("y")  # the kill fails with the host's message: a notification
        await until(pilot, lambda: any("could not kill" in n.message for n in app._notifications))

        await pilot.press("r")  # release: the dialog names the host and its command; the release fails
        await wait_screen(pilot, ConfirmScreen, "release confirm")
        assert_safe(app, want[:8])
        await pilot.press("y")
        await until(pilot, lambda: any("release of" in n.message for n in app._notifications))

        seen = list(app._notifications)  # a new one is told by identity: older ones may expire meanwhile
        await pilot.press("z")  # snooze: the host answers with an error
        await until(pilot, lambda: any(n.severity == "error" and all(n is not o for o in seen)
                                       for n in app._notifications), what="the snooze's error")

        await pilot.press("d")  # doctor: titles, details, fixes and an unknown status from the host
        await wait_screen(pilot, ReportScreen, "doctor")
        await until(pilot, lambda: "loading" not in rendered(app)[0], what="doctor loaded")
        assert "could not load" not in rendered(app)[0]  # the host's checks, not an error
        assert_safe(app, want[:8])
        await pilot.press("escape")

        await pilot.press("h")  # history: names, commands, ids, metrics from the host's logs
        await wait_screen(pilot, ReportScreen, "history")
        await until(pilot, lambda: "loading" not in rendered(app)[0], what="history loaded")
        assert_safe(app, want[:8], "loss=0.5")
        await pilot.press("escape")

        await pilot.press("n")  # new job: the user's own text in every field, then the host's refusal
        dialog = await wait_screen(pilot, NewJobScreen, "new job dialog")
        for field in ("command", "cwd", "name", "gpus"):
            dialog.query_one(f"#{field}", Input).value = s
        dialog.query_one("#env", Input).value = shlex.quote(s.replace("=", ""))  # not KEY=VALUE: quoted back
        await pilot.press("enter")
        error = dialog.query_one("#error", Static)
        await until(pilot, lambda: str(error.render()), what="the dialog's error")  # the env, or the command
        assert_safe(app)
        dialog.query_one("#env", Input).value = ""
        await pilot.press("enter")
        if isinstance(app.screen, NewJobScreen):  # the command did not split (an unclosed quote)
            assert_safe(app, "command:")
            await pilot.press("escape")
        else:
            await until(pilot, lambda: any("could not start" in n.message for n in app._notifications))

        # The host drops with the hostile error, comes back; the running job ends: notifications, log marks.
        main = app.hosts[s]
        source.publish(replace(main, state=M.RECONNECTING, error=s))
        await until(pilot, lambda: app.hosts[s].state == M.RECONNECTING)
        source.publish(main)
        await until(pilot, lambda: app.hosts[s].state == M.CONNECTED)
        over = tuple(replace(j, state=M.JOB_FAILED, exit_code=3) if j.id == "7" else j for j in main.jobs)
        source.publish(replace(main, jobs=over, updated_at=T0 + 1))
        await until(pilot, lambda: any("failed (exit 3)" in n.message for n in app._notifications))
        await shows(pilot, want[:8], "(exit 3)")
        messages = "\n".join(n.message for n in app._notifications)
        assert clean(s)[:40] in messages.replace("\n", "\\n")
        assert app.is_running and app.return_code is None  # nothing clicked or crashed its way out


# --- the exact reproductions from the report, on the real local host -------------------------------------------
async def test_job_named_like_markup_ends_and_shows_in_history(local: cfg.Config, tmp_path: Path) -> None:  # noqa: F811
    """`sync [/data]` crashed the job-ended notification and `h`; `a[b]c` showed as `ac`; a job named
    `[@click=app.quit]x` was a clickable quit; a command with `[print(i) ...]` lost its brackets and quoting."""
    app = GpuTuiApp(local, state_path=tmp_path / "ui.json")
    code = "import time;[print(i) for i in range(3)]"
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await connected(pilot)
        for name in ("sync [/data]", "a[b]c", "[@click=app.quit]x"):
            job = await start_from_dialog(pilot, py("print('[/]')"), name=name)
            await until(pilot, lambda j=job, name=name: any(f"job {j.id} ({name}) on local succeeded" == n.message for n in app._notifications), what=f"end of {name}")
            await shows(pilot, f"({name})")
        unnamed = await start_from_dialog(pilot, py(code))
        shown = f"{sys.executable} -c '{code}'"
        await until(pilot, lambda: any(f"job {unnamed.id} ({shown}) on local succeeded" == n.message for n in app._notifications), what=f"unnamed end {[n.message for n in app._notifications]}")
        await pilot.press("h")
        await wait_screen(pilot, ReportScreen, "history")
        await until(pilot, lambda: "sync [/data]" in rendered(app)[0], 60, "history rows")
        assert_safe(app, "sync [/data]", "a[b]c", "[@click=app.quit]x")
        assert app.is_running


# --- the render functions with what only a host could send ----------------------------------------------------
def plain(renderable: Any, width: int = 200) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("s", CORPUS, ids=IDS)
def test_insights_hints_and_history_metrics_render_literally(s: str) -> None:
    ins = JobInsights(progress=0.5, rate=s, metrics={s: {"last": 1.0, "best": 0.5, "count": 2}})
    hint = Hint(code="x", title=s, fix=s)
    record = {
        "host": s, "id": s, "name": s, "state": s, "exit_code": 1, "command": [s], "ended_at": T0,
        "duration_s": 5.0, "cost": None, "currency": s, "gpu_peak_mem_mib": None, "gpu_mean_util": None,
        "metrics": {s: {"last": 0.25}},
    }
    for out in (
        insights_text(None, ins, Palette()).plain,
        hints_text([hint], Palette()).plain,
        plain(history_table([record], T0)),
    ):
        assert not _RAW.findall(out)
        assert probe(s, 5) in out.replace("\n", "")


# --- the CLI on a terminal -------------------------------------------------------------------------------------
def on_a_terminal(fn: Callable[[], None]) -> str:
    """Run ``fn`` with stdout and stderr on a real pty, through the guard the CLI installs; what arrived."""
    master, slave = os.openpty()
    old = sys.stdout, sys.stderr
    tty = open(slave, "w", encoding="utf-8", errors="surrogateescape", closefd=True)  # noqa: SIM115
    got = bytearray()
    try:
        sys.stdout = sys.stderr = tty
        guard_terminal()
        assert isinstance(sys.stdout, TerminalGuard) and isinstance(sys.stderr, TerminalGuard)
        fn()
        sys.stdout.flush()
        while select.select([master], [], [], 0.2)[0]:
            got += os.read(master, 1 << 16)
    finally:
        sys.stdout, sys.stderr = old
        tty.close()
        os.close(master)
    return got.decode("utf-8", "surrogateescape").replace("\r\n", "\n")


def print_tables(s: str) -> None:
    snaps, ended = hostile_fleet(s)
    record = {
        "host": s, "id": s, "name": s, "state": s, "exit_code": 1, "command": [s], "ended_at": T0,
        "duration_s": 5.0, "cost": 1.0, "currency": "USD", "gpu_peak_mem_mib": None, "gpu_mean_util": None,
        "metrics": {s: {"last": 0.25}},
    }
    host = {"name": s, "price_per_hour": 1.0, "today": 1.0, "month": 1.0, "accrued": 1.0, "released": False,
            "idle": True, "idle_seconds": 60.0, "reasons": [s]}
    tables.print_jobs([*ended, *snaps[0].jobs])
    tables.print_status(snaps)
    tables.print_history([record])
    tables.print_cost([host], FleetSpend((Spend("USD", 1.0, 1.0, 1.0, 1.0, 1),), (), "USD"))
    print(f"gputui: {s}: {s}", file=sys.stderr)  # an error line


@pytest.mark.parametrize("s", [c for c in CORPUS if len(c) < 1000], ids=IDS[:-1])
def test_cli_tables_and_errors_on_a_terminal_show_hostile_text_escaped(s: str) -> None:
    text = on_a_terminal(lambda: print_tables(s))
    assert not _RAW.findall(text)
    assert clean(s)[:30] in text


def test_cli_jobs_on_a_terminal_shows_what_the_agent_lets_through_escaped(home: Any) -> None:
    """End to end: the real agent keeps C1 controls and bidi overrides in a job's name; `gputui jobs` on a
    pty shows them as escapes (the same command into a pipe prints them as they are)."""
    name = "rev\u202eersed \u009b31m c1 \u2066x"
    home.cli("run", "local", "--name", name, "--", "true", check=True)
    master, slave = os.openpty()
    env = {**home.env, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "gputui", "jobs"], env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    got = bytearray()
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the pty
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = got.decode()
    assert not _RAW.findall(text.replace("\r\n", "\n")), text
    assert clean(name) in text


# --- a theme file is user text too -----------------------------------------------------------------------------
async def test_a_theme_named_like_markup_is_refused_and_the_palette_still_opens(tmp_path: Path) -> None:
    from test_ui_app import palette_pick, static_app

    from gputui.ui.themes import BUILTIN_DIR

    themes = tmp_path / "themes"
    themes.mkdir()
    (themes / "bad.toml").write_text('name = "a[/]b"\nprimary = "#ff0000"\n')
    (themes / "fine.toml").write_text('primary = "#00ff00"\n')
    app = static_app(tmp_path, theme_dirs=[BUILTIN_DIR, themes])
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        assert "a[/]b" not in app.available_themes and "fine" in app.available_themes
        await until(pilot, lambda: [n for n in app._notifications if "a theme's name is" in n.message])
        await pilot.press("t")  # the theme picker lists every theme by name
        await palette_pick(pilot, "fine")
        await until(pilot, lambda: app.theme == "fine", what="the good theme applied")
        assert_safe(app)

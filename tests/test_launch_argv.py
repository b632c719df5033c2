"""The light path's reading of the command line (gputui/launch.py): which lines the session service answers, with
what request, and which go to the full CLI (None) unread. Pure: the service's client and the CLI are stand-ins."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gputui import launch
from gputui.service import client

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, dict[str, Any]]]:
    """What the stand-in service was asked: (client function, config, request); each answers 0."""
    calls: list[tuple[str, Any, dict[str, Any]]] = []
    monkeypatch.setattr(client, "answer", lambda config, request: calls.append(("answer", config, request)) or 0)
    monkeypatch.setattr(client, "logs", lambda config, request, go_on: calls.append(("logs", config, request)) or 0)
    monkeypatch.setattr(client, "act", lambda config, request, go_on: calls.append(("act", config, request)) or 0)
    monkeypatch.setattr(client, "watch", lambda config, request, every, go_on: calls.append(
        ("watch", config, {**request, "every": every})) or 0)
    monkeypatch.delenv("GPUTUI_DIRECT", raising=False)
    return calls


def read(argv: list[str], monkeypatch: pytest.MonkeyPatch, calls: list[Any], tty: bool = True) -> Any:
    """What the service is asked for ``gputui ARGV`` (stdin a terminal or not), or None: the full CLI reads it."""
    monkeypatch.setattr(sys.stdin, "isatty", lambda: tty)
    rc = launch.through_service(argv)
    assert (rc is None) == (not calls) and len(calls) <= 1
    return calls[0] if calls else None


def status(op: str = "status", form: str = "text", host: str | None = None, now: bool = False,
           config: str | None = None) -> tuple[str, Any, dict[str, Any]]:
    return ("answer", config, {"op": op, "form": form, "host": host, "now": now})


def watch(every: float = 2.0, form: str = "text", config: str | None = None) -> tuple[str, Any, dict[str, Any]]:
    """``status --watch``'s request (stdout is not a terminal here: ``--json`` asks one line a round)."""
    return ("watch", config, {"op": "status", "form": form, "host": None, "now": False, "every": every})


def logs(host: str = "h", job: str = "j", tail: int | None = None, follow: bool = False,
         config: str | None = None) -> tuple[str, Any, dict[str, Any]]:
    return ("logs", config, {"op": "logs", "host": host, "job": job, "tail": tail, "follow": follow})


def kill(host: str = "h", job: str = "j", grace: float = 10.0, config: str | None = None) -> tuple[str, Any, dict[str, Any]]:
    return ("act", config, {"op": "kill", "host": host, "job": job, "grace": grace})


def release(host: str = "h", force: bool = False, pull: bool | None = None,
            config: str | None = None) -> tuple[str, Any, dict[str, Any]]:
    return ("act", config, {"op": "release", "host": host, "force": force, "pull": pull})


#: Command lines -> what the service is asked (stdin a terminal), or None (the full CLI reads the line). Taken
#: from the word-by-word parsers launch.py had before its table-driven one, case by case.
LINES: list[tuple[str, Any]] = [
    # which commands: the first word only
    ("", None), ("statu", None), ("--config c status", None), ("--direct status", None), ("run h x", None),
    ("queue", None), ("cost", None),
    # status [--json | --short] [--now]
    ("status", status()), ("status --json", status(form="json")), ("status --short", status(form="short")),
    ("status --json --short", None), ("status --short --json", None), ("status --json --json", None),
    ("status --now", status(now=True)), ("status --now --now", status(now=True)),
    ("status --now --short", status(form="short", now=True)),
    ("status h", None), ("status --help", None), ("status -h", None), ("status --direct", None),
    ("status --series", None), ("status --", None), ("status -", None), ("status --js", None),
    # --config PATH anywhere, once; its value is any next word; --config=PATH goes to the CLI
    ("status --config c", status(config="c")), ("status --json --config c", status(form="json", config="c")),
    ("status --config --json", status(config="--json")), ("status --config --config", status(config="--config")),
    ("status --config", None), ("status --config a --config b", None), ("status --config=c", None),
    # status --watch [S]: S from 0.2 to 86400, 2 without one; not with --now
    ("status --watch", watch()), ("status --watch 5", watch(5.0)), ("status --watch 0.2 --short", watch(0.2, "short")),
    ("status --json --watch 1", watch(1.0, "json-line")), ("status --watch --config c", watch(config="c")),
    ("status --watch 86400", watch(86400.0)), ("status --watch 0.1", None), ("status --watch 86401", None),
    ("status --watch nan", None), ("status --watch x", None), ("status --watch --watch", None),
    ("status --watch 1 --watch 2", None), ("status --watch 5 --now", None), ("status --now --watch", None),
    ("status --watch=5", None), ("status --watch 5 5", None), ("status --watch -1", None),
    # jobs / history [HOST] [--json]
    ("jobs", status("jobs")), ("history", status("history")), ("jobs h", status("jobs", host="h")),
    ("jobs --json h", status("jobs", form="json", host="h")),
    ("history h --json --config c", status("history", form="json", host="h", config="c")),
    ("jobs h g", None), ("jobs --json --json", None), ("jobs --short", None), ("jobs --now", None),
    ("history -", None), ("jobs -- h", None), ("jobs --config", None), ("history --all", None),
    # logs [-f] [--tail N] HOST JOB
    ("logs h j", logs()), ("logs h", None), ("logs", None), ("logs h j k", None), ("logs -- h j", None),
    ("logs h -- j", None), ("logs h j --", None), ("logs - j", None),
    ("logs -f h j", logs(follow=True)), ("logs h --follow j", logs(follow=True)),
    ("logs -f --follow h j", None), ("logs -f -f h j", None), ("logs -ff h j", None),
    ("logs h j --tail 5", logs(tail=5)), ("logs --tail 0 h j", logs(tail=0)), ("logs h j --tail 007", logs(tail=7)),
    ("logs h j --tail 10000000", logs(tail=10_000_000)), ("logs h j --tail 10000001", None),
    ("logs h j --tail -1", None), ("logs h j --tail x", None), ("logs h j --tail 1.5", None),
    ("logs h j --tail", None), ("logs h j --tail 5 --tail 6", None), ("logs h j --tail=5", None),
    ("logs h j --tail -f", None), ("logs --tail h j", None),
    ("logs -f h j --tail 3 --config c", logs(tail=3, follow=True, config="c")),
    ("logs --config -f h j", logs(config="-f")), ("logs h j --config", None),
    ("logs h j --config a --config b", None), ("logs h j --config=c", None),
    ("logs h j --rank 1", None), ("logs h j --direct", None), ("logs h j --help", None),
    # kill HOST JOB [--grace S], --yes or no terminal to ask on
    ("kill h j", None), ("kill h j --yes", kill()), ("kill -y h j", kill()), ("kill h j -y --yes -y", kill()),
    ("kill h --yes", None), ("kill --yes", None), ("kill h j k --yes", None), ("kill --yes -- h j", None),
    ("kill h j --yes --grace 5", kill(grace=5.0)), ("kill h j --yes --grace 0", kill(grace=0.0)),
    ("kill h j --yes --grace 3600", kill(grace=3600.0)), ("kill h j --yes --grace 3600.5", None),
    ("kill h j --yes --grace 1e3", kill(grace=1000.0)), ("kill h j --yes --grace 1_0", kill(grace=10.0)),
    ("kill h j --yes --grace -1", None), ("kill h j --yes --grace nan", None), ("kill h j --yes --grace inf", None),
    ("kill h j --yes --grace x", None), ("kill h j --yes --grace", None), ("kill h j --yes --grace=5", None),
    ("kill h j --yes --grace --yes", None),
    # --grace and --config may repeat in kill: the last wins; the range is the last value's
    ("kill h j --yes --grace 5000 --grace 5", kill(grace=5.0)), ("kill h j --yes --grace 5 --grace 5000", None),
    ("kill h j --yes --grace x --grace 5", None),
    ("kill h j --yes --config c", kill(config="c")), ("kill h j --yes --config a --config b", kill(config="b")),
    ("kill --config --yes h j", None), ("kill --config --yes h j -y", kill(config="--yes")),
    ("kill h j --yes --config", None), ("kill h j --yes --config=c", None),
    ("kill h j --yes --direct", None), ("kill h j --yes --help", None), ("kill h j --yes -f", None),
    # release HOST --yes [--force] [--no-pull]
    ("release h --yes", release()), ("release -y h", release()), ("release h", None), ("release --yes", None),
    ("release h g --yes", None), ("release h --yes -y", release()),
    ("release h --yes --force", release(force=True)), ("release h --yes --force --force", release(force=True)),
    ("release h --yes --no-pull", release(pull=False)), ("release h --no-pull --yes --no-pull", release(pull=False)),
    ("release h --yes --pull", None), ("release h --yes --check", None), ("release h --yes --direct", None),
    ("release h --yes --config c", release(config="c")), ("release h --yes --config", None),
    ("release h --yes --config a --config b", None), ("release h --yes --config=c", None),
    ("release --config h --yes g", release("g", config="h")), ("release -- h --yes", None),
]


@pytest.mark.parametrize(("line", "expected"), LINES, ids=[line or "(none)" for line, _ in LINES])
def test_a_line_is_served_as_before_or_left_to_the_cli(
    line: str, expected: Any, asked: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert read(line.split(), monkeypatch, asked) == expected


@pytest.mark.parametrize(("argv", "expected"), [
    (["status", "--config", ""], status(config="")), (["status", "--config", "", "--config", "b"], None),
    (["jobs", ""], None), (["logs", "h", ""], None), (["logs", "a b", "j"], logs("a b")),
    (["logs", "h", "j", "--tail", ""], None), (["logs", "h", "j", "--tail", " 5"], None),
    (["logs", "h", "j", "--tail", "\u0663"], logs(tail=3)),  # an Arabic-Indic 3: int() reads it, as argparse does
    (["logs", "h", "j", "--tail", "\u00b2"], None),  # a superscript 2: a digit int() cannot read (it used to raise)
    (["kill", "h", "j", "-y", "--grace", " 5 "], kill(grace=5.0)), (["release", "", "--yes"], None),
])
def test_odd_words(argv: list[str], expected: Any, asked: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty words and words with spaces (a shell's quoting) are read as they are."""
    assert read(argv, monkeypatch, asked) == expected


@pytest.mark.parametrize(("argv", "expected"), [
    (["w"], {}), (["w", "a"], None), (["w", "--json"], {"form": "json"}), (["w", "--json", "--json"], None),
    (["w", "--now", "--now"], {"now": True}), (["w", "-n", "3"], {"n": 3}), (["w", "-n"], None),
    (["w", "-n", "x"], None), (["w", "-n", "3", "-n", "4"], None), (["w", "--config", "-n"], {"config": "-n"}),
])
def test_read_line_without_names(argv: list[str], expected: Any) -> None:
    flags = {"--json": ("form", "json"), "--now": ("now", True), "-n": ("n", int), **launch.CONFIG}
    assert launch.read_line(argv, flags, (), again=("now",)) == expected


@pytest.mark.parametrize(("argv", "least", "expected"), [
    (["w", "a", "b"], None, {"x": "a", "y": "b"}), (["w", "a"], None, None), (["w", "a"], 1, {"x": "a"}),
    (["w"], 1, None), (["w"], 0, {}), (["w", "a", "b", "c"], 0, None), (["w", "a", "-", "b"], None, None),
    (["w", "a", "--", "b"], None, None), (["w", "", "a", "b"], None, None),
])
def test_read_line_names(argv: list[str], least: int | None, expected: Any) -> None:
    assert launch.read_line(argv, {}, ("x", "y"), least) == expected


@pytest.mark.parametrize(("line", "expected"), [
    ("kill h j", kill()), ("kill h j --grace 5 --config c", kill(grace=5.0, config="c")), ("kill h j --grace 5000", None),
    ("release h", None), ("release h --force", None), ("logs h j", logs()), ("status", status()),
])
def test_kill_needs_no_yes_without_a_terminal(
    line: str, expected: Any, asked: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a terminal to ask on, ``kill`` goes on unasked; ``release`` still needs ``--yes``."""
    assert read(line.split(), monkeypatch, asked, tty=False) == expected


def test_gputui_direct_leaves_every_line_to_the_cli(asked: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTUI_DIRECT", "1")
    for line in ("status", "jobs h", "logs h j", "kill h j --yes", "release h --yes"):
        assert read(line.split(), monkeypatch, asked) is None
    monkeypatch.setenv("GPUTUI_DIRECT", "")  # set but empty: not asked for
    assert read(["status"], monkeypatch, asked) == status()


@pytest.mark.parametrize(("line", "go_on", "argv", "kwargs"), [
    ("logs h j", 7, ["logs", "h", "j"], {"offset": 7}),
    ("logs --tail 3 -f h j --config c", 7, ["logs", "h", "j", "-f", "--config", "c"], {"offset": 7}),
    ("kill h j -y", 1.5, ["kill", "h", "j", "--yes", "--grace", "10.0"], {"after_service": 1.5}),
    ("kill h j -y --grace 1_0 --config c", 1.5, ["kill", "h", "j", "--yes", "--grace", "10.0", "--config", "c"],
     {"after_service": 1.5}),
    ("release h --yes --force --no-pull", 2.5, ["release", "h", "--yes"], {"after_service": 2.5}),
    ("release h --yes --config c", 2.5, ["release", "h", "--yes", "--config", "c"], {"after_service": 2.5}),
])
def test_where_the_service_goes_away_the_cli_goes_on(
    line: str, go_on: float, argv: list[str], kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line the full CLI goes on with (from the byte, or the time asked) once the service is gone."""
    ran: list[Any] = []
    cli = types.ModuleType("gputui.cli")
    cli.main = lambda argv, **kwargs: ran.append((argv, kwargs))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gputui.cli", cli)
    monkeypatch.setattr(client, "logs", lambda config, request, go_on_at: go_on_at(go_on))
    monkeypatch.setattr(client, "act", lambda config, request, go_on_at: go_on_at(go_on))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.delenv("GPUTUI_DIRECT", raising=False)
    launch.through_service(line.split())
    assert ran == [(argv, kwargs)]


def test_reading_a_line_imports_nothing() -> None:
    """The light path reads every command's line without loading a module (argparse, typing and the like)."""
    lines = [line.split() for line, _ in LINES]
    code = ("import sys; import gputui.launch as launch; from gputui.service import client; "
            "client.answer = client.logs = client.act = client.watch = lambda *a: None; before = set(sys.modules); "
            f"[launch.through_service(argv) for argv in {lines!r}]; "
            "print(sorted(set(sys.modules) - before), "
            "[m for m in ('argparse', 'typing', 'shutil', 'subprocess', 'tempfile') if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUTUI_DIRECT", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert res.stdout.strip() == "[] []"

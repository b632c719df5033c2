"""``gputui compare`` and ``--series``: what differed between runs, and their curves, without their logs."""

from __future__ import annotations

import json
import sys

from conftest import Home

from gputui.cli.compare import format_table
from gputui.core.jobs.compare import Run, argv_diffs, compare_rows

TRAIN = "import sys\nlr = float(sys.argv[1])\nfor i in range(1, 6): print(f'step {i} loss={1 / (i * lr):.3f}', flush=True)"


def _run(home: Home, lr: str, *extra: str) -> str:
    job = home.cli("run", "local", *extra, "--", sys.executable, "-c", TRAIN, lr, check=True).stdout.strip()
    assert home.cli("logs", "-f", "local", job).returncode == 0
    return job


def test_compare_prints_what_differed_between_three_runs(home: Home) -> None:
    a, b = _run(home, "1"), _run(home, "2", "--env", "SEED=1")
    c = _run(home, "4", "--env", "SEED=2", "--env", "TOKEN=secret-value")
    out = home.cli("compare", f"local:{a}", f"local:{b}", f"local:{c}", check=True).stdout
    rows = {line[2:].split()[0]: line for line in out.splitlines()[1:]}
    assert (
        rows["command"].startswith("* ")
        and " 2 " in rows["command"] + " "
        and rows["command"].rstrip().endswith("4")
    )
    assert rows["env"].startswith("* ") and "SEED TOKEN" in rows["env"] and "secret-value" not in out
    assert rows["gpus"].startswith("  ")  # the same on every run: not marked
    got = json.loads(home.cli("compare", "--json", f"local:{a}", f"local:{c}", check=True).stdout)
    by_field = {r["field"]: r for r in got["rows"]}
    assert by_field["loss final"]["values"] == ["0.2", "0.05"] and by_field["loss final"]["differs"]
    assert by_field["loss best"]["values"] == ["0.2", "0.05"]
    assert got["series"][f"local:{a}"]["series"]["loss"]["x"] == "step"


def test_history_and_jobs_give_the_series_of_ended_runs_without_their_logs(home: Home) -> None:
    job = _run(home, "1")
    [first] = json.loads(home.cli("history", "--json", "--series", check=True).stdout)
    assert [p[1] for p in first["series"]["series"]["loss"]["points"]] == [1, 2, 3, 4, 5]
    job_dir = home.state_dir / "jobs" / job
    (job_dir / "output.log").write_bytes(b"")  # the log gone: the series kept beside it still load
    [again] = json.loads(home.cli("jobs", "--json", "--series", check=True).stdout)
    assert again["series"]["done"] and again["series"]["series"]["loss"]["last"] == 0.2
    assert "series" not in json.loads(home.cli("jobs", "--json", check=True).stdout)[0]
    assert home.cli("history", "--series").returncode == 2  # only with --json


def test_compare_refuses_bad_runs_with_their_statuses(home: Home) -> None:
    job = _run(home, "1")
    assert home.cli("compare", f"local:{job}").returncode == 2  # one run
    assert home.cli("compare", f"local:{job}", f"local:{job}").returncode == 2  # twice the same
    assert home.cli("compare", f"local:{job}", "local").returncode == 2  # no job id
    missing = home.cli("compare", f"local:{job}", "local:999")
    assert missing.returncode == 5 and "no job 999 on local" in missing.stderr
    assert home.cli("compare", f"local:{job}", "nohost:1").returncode == 2


def test_argv_diffs_show_only_the_words_that_changed() -> None:
    base = ["python", "train.py", "--lr", "3e-4", "--epochs", "10"]
    assert argv_diffs([base, base, ["python", "train.py", "--lr", "1e-3", "--epochs", "10"],
                       ["python", "train.py", "--lr", "3e-4"]]) == ["=", "=", "1e-3", "(---epochs 10)"]


def test_the_table_is_plain_text_and_fits_the_terminal() -> None:
    rec = {"host": "h", "id": "1", "name": "[b]x[/b]\x1b[2J", "state": "succeeded", "exit_code": 0,
           "command": ["python", "t.py", "--name", "y" * 300], "metrics": {}, "gpus": {}}
    rows = compare_rows([Run(rec, {}), Run({**rec, "id": "2", "command": ["python", "t.py"]}, {})])
    lines = format_table(["h:1", "h:2"], rows, 80)
    assert all(len(line) <= 80 for line in lines) and "\x1b" not in "".join(lines)

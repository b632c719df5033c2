"""CLI commands on a local host start light: no UI (textual, rich) and no SSH (asyncssh) imported, and
`status` loads no log parser."""

from __future__ import annotations

import pytest
from conftest import Home

HEAVY = {"textual", "rich", "asyncssh", "cryptography"}


@pytest.mark.parametrize("command", ["status", "jobs", "history"])
def test_cli_on_a_local_host_imports_no_ui_and_no_ssh(home: Home, command: str) -> None:
    home.env["PYTHONPROFILEIMPORTTIME"] = "1"
    res = home.cli(command, "--json", check=True)
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "gputui.cli" in imported
    assert sorted(m for m in imported if m.split(".")[0] in HEAVY) == []
    if command == "status":  # no log is parsed: the parser is not loaded
        assert "gputui.core.insights" not in imported

"""The suite cannot touch the user's machine: every test is isolated, and the suite's processes are found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import kill_tmux, suite_processes, tmux_socket, wait_for


def test_every_test_runs_in_a_home_and_tmux_dir_of_its_own(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    assert home.is_dir() and not any(home.iterdir()), "a fresh, empty HOME"
    assert home != Path("~root").expanduser() and "pytest" in str(home)
    assert "pytest" in os.environ["TMUX_TMPDIR"]
    assert os.environ["GPUTUI_DIRECT"] == "1"  # no session service (tests/test_service.py asks for one)
    for key in os.environ:
        assert not key.startswith(("XDG_", "GPUTUI_")) or key == "GPUTUI_DIRECT", key
        assert key not in ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "TMUX", "TMUX_PANE"), key


def test_the_suite_finds_what_it_started(tmp_path: Path) -> None:
    """The session-end check's finder sees a tmux server, its job and a plain child started here."""
    state = tmp_path / "state"
    server = ["tmux", "-L", tmux_socket(state), "new-session", "-d", "-s", "probe", "sleep 600"]
    subprocess.run(server, check=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        wait_for(
            lambda: {" ".join(server), "sleep 600", child.pid}
            <= {x for pid, argv in suite_processes() for x in (pid, " ".join(argv))},
            what="the tmux server, its job and the child among the suite's processes",
        )
        assert os.getpid() not in [pid for pid, _ in suite_processes()]
    finally:
        kill_tmux(state)
        child.kill()
        child.wait()
    wait_for(
        lambda: not {" ".join(server), "sleep 600"} & {" ".join(argv) for _, argv in suite_processes()},
        what="the probe to end",
    )

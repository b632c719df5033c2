"""``resume_on_boot`` (remote_agent/host/autostart.py): the real ``crontab`` (Debian's cron) and the real agent,
watchdog and tmux. The line cron would run at boot is run as cron runs it (``/bin/sh -c``) after a reboot faked
as in tests/test_restart.py: tmux and the watchdog gone, the job's runner from another boot, the watchdog's
config armed in another boot. The user's crontab is saved first and put back after each test."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AgentProc, Home, kill_tmux, lost_in_a_reboot_job, stop_host, wait_for

from remote_agent.fsutil import read_json, write_json
from remote_agent.host import autostart
from remote_agent.watchdog import daemon as W

pytestmark = pytest.mark.skipif(shutil.which("crontab") is None, reason="no crontab (apt install cron)")

USERS = "# the user's own lines, kept as they are\nMAILTO=''\n17 3 * * * /usr/bin/true % not ours\n"


def crontab() -> str:
    res = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    return res.stdout if res.returncode == 0 else ""


@pytest.fixture
def users_crontab() -> Iterator[None]:
    """The machine's crontab with the user's lines in it; the one from before the test put back after it."""
    before = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    subprocess.run(["crontab", "-"], input=USERS, text=True, check=True)
    try:
        yield
    finally:
        if before.returncode == 0:
            subprocess.run(["crontab", "-"], input=before.stdout, text=True, check=True)
        else:
            subprocess.run(["crontab", "-r"], capture_output=True)


def ours(state: Path) -> list[str]:
    return [line for line in crontab().splitlines() if line.endswith(autostart.TAG + str(state))]


def test_the_line_is_there_exactly_while_asked_and_the_users_lines_are_kept(tmp_path: Path, users_crontab: None) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        reply = agent.call("watchdog.configure", config={"resume_on_boot": True})["result"]
        assert reply["autostart"] == {"ok": True, "changed": True, "detail": "added to the crontab"}
        [line] = ours(state)
        assert line.startswith("@reboot ") and f" boot {state} " in line
        assert crontab().startswith(USERS)
        again = agent.call("watchdog.configure", config={"resume_on_boot": True, "autostop_minutes": 60,
                                                         "release_remote": ["true"]})["result"]  # fmt: skip
        assert again["autostart"]["changed"] is False and len(ours(state)) == 1  # every connect: one line
        off = agent.call("watchdog.configure", config={"autostop_minutes": 60, "release_remote": ["true"]})["result"]
        assert off["autostart"]["detail"] == "taken out of the crontab"
        assert ours(state) == [] and crontab() == USERS
        assert "resume_on_boot: added to the crontab" in (state / W.LOG).read_text()
    finally:
        agent.close()
        stop_host(state)


def test_a_host_that_never_asked_runs_no_crontab(tmp_path: Path, users_crontab: None) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state, env={**os.environ, "PATH": "/nonexistent"})  # a crontab run would fail: none found
    try:
        reply = agent.call("watchdog.configure", config={"autostop_minutes": 60, "release_remote": ["true"]})
        assert reply["result"]["autostart"] == {"ok": True, "changed": False, "detail": ""}
    finally:
        agent.close()
        stop_host(state)


def test_after_a_reboot_the_line_resumes_the_lost_job_and_arms_the_idle_rule_again(
    tmp_path: Path, users_crontab: None
) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        config = {"resume_on_boot": True, "autostop_minutes": 600, "release_remote": ["true"],
                  "release_at": 4102444800.0, "count_sessions": False}  # fmt: skip
        assert agent.call("watchdog.configure", config=config)["result"]["armed"]
        restart = {"policy": "on-failure", "max": 3, "backoff_s": 0, "backoff_max_s": 0}
        jid = agent.call("jobs.start", argv=lost_in_a_reboot_job(tmp_path), restart=restart)["result"]["id"]
        job_dir = state / "jobs" / jid
        wait_for(lambda: (job_dir / "pid.json").exists(), what="the job to run")
        agent.close()
        # the reboot: the watchdog, tmux, the runner and the job are gone; every record is from the boot before
        wait_for(lambda: "started (pid" in (state / W.LOG).read_text() if (state / W.LOG).exists() else False,
                 what="the watchdog")  # fmt: skip
        for pid in _watchdogs(state):
            os.kill(pid, signal.SIGKILL)
        runner = read_json(str(job_dir / "pid.json"))
        kill_tmux(state)
        wait_for(lambda: not _alive(runner["runner_pid"]), what="the runner to die")
        write_json(str(job_dir / "pid.json"), dict(runner, boot_id="the-boot-before"))
        armed = read_json(str(state / W.CONFIG))
        write_json(str(state / W.CONFIG), dict(armed, boot_id="the-boot-before"))
        assert not W.is_armed(read_json(str(state / W.CONFIG)), _boot())  # as the new boot sees it
        [line] = ours(state)
        subprocess.run(["/bin/sh", "-c", line.removeprefix("@reboot ")], check=True, timeout=60)  # as cron does
        end = read_json(str(wait_for(lambda: (job_dir / "status.json").exists() and job_dir / "status.json",
                                     timeout=90, what="the resumed job to end")))  # fmt: skip
        assert end["exit_code"] == 0
        assert "── attempt 2 of 3, after a reboot lost the job, 0 s backoff ──" in (job_dir / "output.log").read_text()
        now = read_json(str(state / W.CONFIG))
        assert now["boot_id"] == _boot() and W.is_armed(now, _boot()) and now["autostop_minutes"] == 600
        assert "release_at" not in now  # a deadline is not carried over a reboot
        assert "resume_on_boot: armed again for this boot" in (state / W.LOG).read_text()
    finally:
        agent.close()
        stop_host(state)


def _boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def _watchdogs(state: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"watchdog {state}" in argv:
            found.append(int(pid))
    return found


def test_the_cli_adds_the_line_doctor_shows_it_and_turning_it_off_takes_it_out(home: Home, users_crontab: None) -> None:
    table = f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
    home.write_config(table + "resume_on_boot = true\n")
    doctor = home.cli("doctor", "local")
    assert re.search(r"OK +resume on boot +an @reboot line in the host's crontab", doctor.stdout), doctor.stdout
    assert len(ours(home.state_dir)) == 1
    home.write_config(table)
    home.cli("status", check=True)
    assert ours(home.state_dir) == [] and crontab() == USERS
    assert "resume on boot" not in home.cli("doctor", "local").stdout


def test_a_path_with_a_line_break_makes_no_line(tmp_path: Path, users_crontab: None) -> None:
    """A line break in the state dir (it comes from the config's remote_dir) would end the crontab line and
    start one of its own: no line is made, and the crontab stays as it was."""
    state = tmp_path / "state\n* * * * * touch /tmp/gputui-not-from-cron"
    said = autostart.sync(True, str(state), [sys.executable, "-c", "pass"])
    assert said["ok"] is False and "line break" in said["detail"]
    assert crontab() == USERS

"""``resume_on_boot`` (remote_agent/watchdog/autostart.py): the real ``crontab`` (Debian's cron) and the real agent,
watchdog and tmux. The line cron would run at boot is run as cron runs it (``/bin/sh -c``) after a reboot faked
as in tests/test_restart.py: tmux and the watchdog gone, the job's runner from another boot, the watchdog's
config armed in another boot. The user's crontab is saved first and put back after each test."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import AgentProc, Home, kill_tmux, lost_in_a_reboot_job, stop_host, suite_env, wait_for

from remote_agent.fsutil import read_json, write_json
from remote_agent.watchdog import autostart
from remote_agent.watchdog import daemon as watchdog_daemon

pytestmark = pytest.mark.skipif(shutil.which("crontab") is None, reason="no crontab (apt install cron)")

USERS = "# the user's own lines, kept as they are\nMAILTO=''\n17 3 * * * /usr/bin/true % not ours\n"


def crontab() -> str:
    res = subprocess.run(["crontab", "-l"], capture_output=True)
    return res.stdout.decode("utf-8", "surrogateescape") if res.returncode == 0 else ""


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
    return [line for line in crontab().split("\n") if line.endswith(autostart.tagged(str(state)))]


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
                                                         "release_remote": ["true"]})["result"]
        assert again["autostart"]["changed"] is False and len(ours(state)) == 1  # every connect: one line
        off = agent.call("watchdog.configure", config={"autostop_minutes": 60, "release_remote": ["true"]})["result"]
        assert off["autostart"]["detail"] == "taken out of the crontab"
        assert ours(state) == [] and crontab() == USERS
        assert "resume_on_boot: added to the crontab" in (state / watchdog_daemon.LOG).read_text()
    finally:
        agent.close()
        stop_host(state)


def test_a_host_without_cron_that_never_asked_is_fine(tmp_path: Path, users_crontab: None) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state, env={**os.environ, "PATH": "/nonexistent"})  # no crontab found: nothing to do
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
                  "release_at": 4102444800.0, "count_sessions": False}
        assert agent.call("watchdog.configure", config=config)["result"]["armed"]
        restart = {"policy": "on-failure", "max": 3, "backoff_s": 0, "backoff_max_s": 0}
        jid = agent.call("jobs.start", argv=lost_in_a_reboot_job(tmp_path), restart=restart)["result"]["id"]
        job_dir = state / "jobs" / jid
        wait_for(lambda: (job_dir / "pid.json").exists(), what="the job to run")
        agent.close()
        # the reboot: the watchdog, tmux, the runner and the job are gone; every record is from the boot before
        wait_for(lambda: "started (pid" in (state / watchdog_daemon.LOG).read_text() if (state / watchdog_daemon.LOG).exists() else False,
                 what="the watchdog")
        for pid in _watchdogs(state):
            os.kill(pid, signal.SIGKILL)
        runner = read_json(str(job_dir / "pid.json"))
        kill_tmux(state)
        wait_for(lambda: not _alive(runner["runner_pid"]), what="the runner to die")
        write_json(str(job_dir / "pid.json"), dict(runner, boot_id="the-boot-before"))
        armed = read_json(str(state / watchdog_daemon.CONFIG))
        write_json(str(state / watchdog_daemon.CONFIG), dict(armed, boot_id="the-boot-before"))
        assert not watchdog_daemon.is_armed(read_json(str(state / watchdog_daemon.CONFIG)), _boot())  # as the new boot sees it
        [line] = ours(state)
        subprocess.run(["/bin/sh", "-c", line.removeprefix("@reboot ")], check=True, timeout=60)  # as cron does
        end = read_json(str(wait_for(lambda: (job_dir / "status.json").exists() and job_dir / "status.json",
                                     timeout=90, what="the resumed job to end")))
        assert end["exit_code"] == 0
        assert "── attempt 2 of 3, after a reboot lost the job, 0 s backoff ──" in (job_dir / "output.log").read_text()
        now = read_json(str(state / watchdog_daemon.CONFIG))
        assert now["boot_id"] == _boot() and watchdog_daemon.is_armed(now, _boot()) and now["autostop_minutes"] == 600
        assert "release_at" not in now  # a deadline is not carried over a reboot
        assert "resume_on_boot: armed again for this boot" in (state / watchdog_daemon.LOG).read_text()
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


# --- the user's bytes, the line cron runs, our line found by its tag ------------------------------------------------
SPOOL = Path("/var/spool/cron/crontabs")
#: Crontabs whose every byte must come back: a comment holding U+2028 (Python's splitlines would make a live job of
#: the rest), NEL, FF, VT, FS; a Latin-1 byte; a CRLF line end; a CR inside a command; a literal backslash-r.
#: The second has no CR: Debian's ``crontab -l`` (which shows a CR as ``\r``) lists it faithfully.
RAW_WITH_CR = (
    b"# disabled until Monday\xe2\x80\xa8* * * * * /bin/echo X\n# nel \xc2\x85 ff \x0c vt \x0b fs \x1c caf\xe9\n"
    b"17 3 * * * /usr/bin/printf 'a\rb' | sed 's/\\r//'\r\n# the last line has no line end"
)
RAW_NO_CR = b"# disabled until Monday\xe2\x80\xa8* * * * * /bin/echo X\n17 3 * * * /bin/echo caf\xe9 \x0c\x0b\xc2\x85\n"


def installed() -> bytes:
    """The crontab's real bytes, as cron reads them (the spool file, without the 3 lines crontab puts first)."""
    path = SPOOL / pwd.getpwuid(os.getuid()).pw_name
    if not os.access(SPOOL, os.X_OK):
        pytest.skip("the cron spool is not readable here")
    return path.read_bytes().split(b"\n", 3)[3] if path.exists() else b""


@pytest.mark.parametrize("raw", [RAW_WITH_CR, RAW_NO_CR], ids=["with-cr", "no-cr"])
def test_every_byte_of_the_users_crontab_is_kept(tmp_path: Path, users_crontab: None, raw: bytes) -> None:
    subprocess.run(["crontab", "-"], input=raw, check=True)
    assert installed() == raw
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        on = agent.call("watchdog.configure", config={"resume_on_boot": True})
        assert on["result"]["autostart"] == {"ok": True, "changed": True, "detail": "added to the crontab"}, on
        [line] = [each for each in installed().split(b"\n") if each.endswith(os.fsencode(autostart.tagged(str(state))))]
        assert line.startswith(b"@reboot ")
        assert installed() == (raw if raw.endswith(b"\n") else raw + b"\n") + line + b"\n"
        again = agent.call("watchdog.configure", config={"resume_on_boot": True})["result"]["autostart"]
        assert again["changed"] is False
        off = agent.call("watchdog.configure", config={})["result"]["autostart"]
        assert off["detail"] == "taken out of the crontab"
        assert installed() == (raw if raw.endswith(b"\n") else raw + b"\n")  # (a line end was due before ours)
    finally:
        agent.close()
        stop_host(state)


def test_a_crontab_that_is_not_utf8_never_locks_the_host_out(home: Home, users_crontab: None) -> None:
    subprocess.run(["crontab", "-"], input=b"# caf\xe9\n17 3 * * * /usr/bin/true\n", check=True)
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\nresume_on_boot = true\n')
    assert "local" in home.cli("status", check=True).stdout
    assert home.cli("run", "local", "--", "true", check=True).stdout.strip()
    home.cli("jobs", "local", check=True)
    doctor = home.cli("doctor", "local")
    assert re.search(r"OK +resume on boot", doctor.stdout), doctor.stdout
    assert installed().startswith(b"# caf\xe9\n17 3 * * * /usr/bin/true\n") and len(ours(home.state_dir)) == 1


def test_our_line_goes_when_the_state_dir_went_first(tmp_path: Path, users_crontab: None) -> None:
    """The state dir (and all we knew of the line) removed while the setting was on: the next arming with the
    setting off finds the line by its tag and takes it out."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        assert agent.call("watchdog.configure", config={"resume_on_boot": True})["result"]["autostart"]["ok"]
    finally:
        agent.close()
        stop_host(state)
    shutil.rmtree(state)
    assert len(ours(state)) == 1
    agent = AgentProc(state)
    try:
        off = agent.call("watchdog.configure", config={})["result"]["autostart"]
        assert off == {"ok": True, "changed": True, "detail": "taken out of the crontab"}
        assert ours(state) == [] and crontab() == USERS
    finally:
        agent.close()
        stop_host(state)


def _real_cron_at_boot(tmp_path: Path) -> subprocess.Popen[bytes]:
    """The real cron daemon starting as at a boot, on a copy of this user's crontab only: in a mount namespace of
    its own (a fresh /run, so it runs the @reboot lines; no /etc/crontab nor /etc/cron.d). The copy starts with
    this test run's variables, so the suite finds (and ends) what the line starts."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("cron") is None:
        pytest.skip("needs root, unshare and cron")
    spool, etc_d, etc_crontab = tmp_path / "spool", tmp_path / "cron.d", tmp_path / "crontab"
    spool.mkdir(mode=0o1730)
    etc_d.mkdir()
    etc_crontab.write_bytes(b"")
    user = pwd.getpwuid(os.getuid()).pw_name
    head = "".join(f"{k}={v}\n" for k, v in suite_env().items()).encode()
    (spool / user).write_bytes(head + installed())
    (spool / user).chmod(0o600)
    script = (f"mount -t tmpfs tmpfs /run && mount --bind {spool} {SPOOL} && mount --bind {etc_d} /etc/cron.d && "
              f"mount --bind {etc_crontab} /etc/crontab && exec cron -f")
    return subprocess.Popen(["unshare", "--mount", "--fork", "--kill-child", "/bin/sh", "-c", script],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_the_real_cron_runs_our_line_for_a_state_dir_with_percent_signs_and_backslashes(
    tmp_path: Path, users_crontab: None
) -> None:
    """``%`` is a line break to cron (``\\%`` a ``%``; other backslashes are kept): the line for a state dir like
    ``100%\\%d`` still runs the boot of that very dir when cron starts."""
    state = tmp_path / "100% done\\%d \\ x'%"
    agent = AgentProc(state)
    try:
        config = {"resume_on_boot": True, "autostop_minutes": 600, "release_remote": ["true"], "count_sessions": False}
        reply = agent.call("watchdog.configure", config=config)["result"]
        assert reply["armed"] and reply["autostart"]["ok"], reply
        assert len(ours(state)) == 1
    finally:
        agent.close()
    wait_for(lambda: _watchdogs(state), what="the watchdog")
    for pid in _watchdogs(state):
        os.kill(pid, signal.SIGKILL)
    write_json(str(state / watchdog_daemon.CONFIG), dict(read_json(str(state / watchdog_daemon.CONFIG)), boot_id="the-boot-before"))
    cron = _real_cron_at_boot(tmp_path)
    try:
        wait_for(lambda: "resume_on_boot: armed again for this boot" in (state / watchdog_daemon.LOG).read_text(), timeout=60,
                 what="cron to run the @reboot line")
        assert read_json(str(state / watchdog_daemon.CONFIG))["boot_id"] == _boot()
    finally:
        cron.kill()
        cron.wait()
        stop_host(state)

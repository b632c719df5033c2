"""Release and autostop on the real local host: real agent, real detached watchdog, harmless commands."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Home, stop_host, wait_for


def local_config(home: Home, extra: str = "") -> None:
    home.write_config(
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
        f"price_per_hour = 3.6\ncount_ssh_sessions = false\n{extra}"
    )


def cost_of(home: Home) -> dict:
    [host] = json.loads(home.cli("cost", "--json", check=True).stdout)["hosts"]
    return host


@pytest.fixture
def watched(home: Home) -> Iterator[Home]:
    yield home
    state = (
        json.loads((home.state_dir / "watchdog_state.json").read_text() or "{}")
        if (home.state_dir / "watchdog_state.json").exists()
        else {}
    )
    if state.get("pid"):
        try:
            os.kill(state["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_sleeper(home: Home, tmp_path: Path, gate: Path | None = None) -> str:
    """A job that runs until ``gate`` exists (or it is killed; a minute at most); returns once it runs."""
    marker, gate = tmp_path / "job-ready", gate or tmp_path / "never-opened"
    code = (
        f"import os, pathlib, time; pathlib.Path({str(marker)!r}).touch(); end = time.monotonic() + 60\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < end: time.sleep(0.05)"
    )
    job_id = home.cli("run", "local", "--", sys.executable, "-c", code, check=True).stdout.strip()
    wait_for(marker.exists, what="job start")
    return job_id


def test_release_runs_both_commands_and_closes_the_ledger(home: Home, tmp_path: Path) -> None:
    here, there = tmp_path / "released-here", tmp_path / "released-there"
    local_config(home, f'release = ["touch", "{here}"]\nrelease_remote = ["touch", "{there}"]\n')
    assert cost_of(home)["released"] is False
    res = home.cli("release", "local", "--yes")
    assert res.returncode == 0, res.stderr
    assert here.exists() and there.exists()
    assert "[host] touch" in res.stdout and "[client] touch" in res.stdout and "local: released" in res.stdout
    host = cost_of(home)
    assert host["released"] is True and host["price_per_hour"] == 3.6


def test_release_needs_confirmation_or_yes(home: Home, tmp_path: Path) -> None:
    local_config(home, f'release = ["touch", "{tmp_path / "x"}"]\n')
    res = home.cli("release", "local")
    assert res.returncode == 2 and "--yes" in res.stderr and not (tmp_path / "x").exists()


def test_release_refuses_while_jobs_run(home: Home, tmp_path: Path) -> None:
    local_config(home, f'release = ["touch", "{tmp_path / "gone"}"]\n')
    job_id = start_sleeper(home, tmp_path)
    res = home.cli("release", "local", "--yes")
    assert res.returncode == 1 and f"running jobs: {job_id}" in res.stderr and "--force" in res.stderr
    assert not (tmp_path / "gone").exists()
    res = home.cli("release", "local", "--yes", "--force")
    assert res.returncode == 0 and (tmp_path / "gone").exists()
    home.cli("kill", "local", job_id, "--grace", "1", check=True)


def test_failing_release_command_is_reported_and_not_released(home: Home) -> None:
    local_config(home, 'release = ["sh", "-c", "echo quota exceeded >&2; exit 3"]\n')
    res = home.cli("release", "local", "--yes")
    assert res.returncode == 1 and "exited 3: quota exceeded" in res.stderr
    assert cost_of(home)["released"] is False


def test_hanging_release_command_times_out(home: Home) -> None:
    local_config(home, 'release = ["sleep", "60"]\nrelease_timeout = 1\n')
    res = home.cli("release", "local", "--yes")
    assert res.returncode == 1 and "did not finish within 1 s" in res.stderr
    assert cost_of(home)["released"] is False


def test_missing_release_command_says_what_to_set(home: Home) -> None:
    local_config(home)
    res = home.cli("release", "local", "--yes")
    assert res.returncode == 2 and "set release" in res.stderr and "release_remote" in res.stderr


def test_status_json_carries_idle_and_cost(home: Home, tmp_path: Path) -> None:
    local_config(home, "idle_minutes = 0\n")
    job_id = start_sleeper(home, tmp_path)
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    c = host["cost"]
    assert c["price_per_hour"] == 3.6 and c["currency"] == "USD" and c["accrued"] > 0
    assert c["idle"] is False and f"job {job_id} running" in c["reasons"]
    home.cli("kill", "local", job_id, "--grace", "1", check=True)
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    assert (
        host["cost"]["idle"] is True and host["cost"]["reasons"] == [] and host["cost"]["idle_seconds"] >= 0
    )


def test_autostop_releases_an_idle_host_with_no_client(watched: Home, tmp_path: Path) -> None:
    home = watched
    stopped = tmp_path / "stopped"
    hook = tmp_path / "checkpoint-synced"
    local_config(
        home,
        f'autostop_minutes = 0.05\nrelease_remote = ["touch", "{stopped}"]\npre_stop = ["touch", "{hook}"]\n',
    )
    home.cli("status", check=True)  # connecting arms the watchdog; then the client goes away
    log_file = home.state_dir / "watchdog.log"
    # The watchdog logs the release command's exit after it returned: wait for that line, not just the file.
    wait_for(lambda: log_file.exists() and "release_remote: exit" in log_file.read_text(), timeout=60,
             what="autostop to run release_remote")
    assert stopped.exists() and hook.exists() and hook.stat().st_mtime <= stopped.stat().st_mtime
    log = log_file.read_text()
    assert "releasing: idle for" in log and "pre_stop: exit 0" in log and "release_remote: exit 0" in log


def test_autostop_waits_while_a_job_runs(watched: Home, tmp_path: Path) -> None:
    home = watched
    stopped, gate = tmp_path / "stopped", tmp_path / "gate"
    local_config(home, f'autostop_minutes = 0.1\nrelease_remote = ["touch", "{stopped}"]\n')
    job_id = start_sleeper(home, tmp_path, gate)
    home.cli("status", check=True)
    state_file = home.state_dir / "watchdog_state.json"

    def busy_since() -> float | None:
        """The watchdog's time of its last pass, while it still sees the job running."""
        state = json.loads(state_file.read_text() or "{}") if state_file.exists() else {}
        return state.get("t") if f"job {job_id} running" in (state.get("reasons") or []) else None

    first = wait_for(busy_since, what="watchdog sees job")
    # the watchdog has watched the job run for longer than the 6 s window, by its own passes
    wait_for(lambda: (busy_since() or 0.0) >= first + 6 + 1, timeout=60, what="a window of passes")
    assert not stopped.exists()  # never while the job ran
    gate.touch()
    assert home.cli("logs", "-f", "local", job_id).returncode == 0
    ended = json.loads(home.cli("jobs", "--json", check=True).stdout)[0]["ended_at"]
    wait_for(stopped.exists, timeout=60, what="autostop after the job ended")
    assert stopped.stat().st_mtime >= ended + 6 - 0.5  # the window restarted when the job ended


def test_autostop_snooze_and_cancel(watched: Home, tmp_path: Path) -> None:
    home = watched
    stopped = tmp_path / "stopped"
    local_config(home, f'autostop_minutes = 0.05\nrelease_remote = ["touch", "{stopped}"]\n')
    job_id = start_sleeper(home, tmp_path)  # keep it busy while we cancel
    home.cli("status", check=True)
    res = home.cli("autostop", "local", "--cancel", check=True)
    assert "cancelled" in res.stdout
    config = json.loads((home.state_dir / "watchdog.json").read_text())
    assert config["cancelled"] is True
    home.cli("status", check=True)  # reconnecting with the same settings keeps the cancel
    assert json.loads((home.state_dir / "watchdog.json").read_text())["cancelled"] is True
    res = home.cli("autostop", "local", "--snooze", "30", check=True)
    config = json.loads((home.state_dir / "watchdog.json").read_text())
    assert config["cancelled"] is False and config["snoozed_until"] > time.time() + 29 * 60
    home.cli("kill", "local", job_id, "--grace", "1", check=True)


def test_a_cancelled_autostop_never_releases_the_idle_host(watched: Home, tmp_path: Path) -> None:
    home = watched
    stopped = tmp_path / "stopped"
    window_s = 3.0
    local_config(home, f'autostop_minutes = {window_s / 60}\nrelease_remote = ["touch", "{stopped}"]\n')
    job_id = start_sleeper(home, tmp_path)  # busy while we cancel: nothing is due yet
    home.cli("status", check=True)  # arms the watchdog
    home.cli("autostop", "local", "--cancel", check=True)
    home.cli("kill", "local", job_id, "--grace", "1", check=True)  # now idle, and it stays idle
    state_file = home.state_dir / "watchdog_state.json"

    def idle_seconds() -> float:
        state = json.loads(state_file.read_text() or "{}") if state_file.exists() else {}
        return state.get("idle_seconds", 0.0) if state.get("autostop_at") is None else -1.0

    # The watchdog keeps checking: wait until the host has been idle for three windows by its own reckoning.
    wait_for(lambda: stopped.exists() or idle_seconds() >= 3 * window_s, timeout=60, what="three idle windows")
    assert not stopped.exists()
    assert "releasing" not in (home.state_dir / "watchdog.log").read_text()


# --- the autostop window never starts before the user armed it ---------------------------------------------------
WINDOW_MIN = 0.05  # 3 s: the watchdog checks every 0.5 s


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def idle_for(home: Home, seconds: float) -> None:
    """The agent's own record of the last busy moment, as if it had watched the host idle for ``seconds``."""
    home.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    activity = {"last_busy": time.time() - seconds, "boot_id": boot_id()}
    (home.state_dir / "activity.json").write_text(json.dumps(activity))


def watchdog_config(home: Home) -> dict:
    return json.loads((home.state_dir / "watchdog.json").read_text())


def autostop_in_s(home: Home) -> float | None:
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    return host["cost"]["autostop_in_s"]


def released_at(stopped: Path) -> float:
    wait_for(stopped.exists, timeout=60, what="autostop to run release_remote")
    return stopped.stat().st_mtime + 0.05  # file times come from a coarse clock


def test_arming_on_a_long_idle_host_starts_the_window_at_arming(watched: Home, tmp_path: Path) -> None:
    home, stopped = watched, tmp_path / "stopped"
    idle_for(home, 90)
    local_config(home, f'autostop_minutes = {WINDOW_MIN}\nrelease_remote = ["touch", "{stopped}"]\n')
    countdown = autostop_in_s(home)  # this connect arms it
    assert countdown is not None and 0 < countdown <= WINDOW_MIN * 60
    assert released_at(stopped) >= watchdog_config(home)["armed_at"] + WINDOW_MIN * 60


def test_changed_settings_restart_the_window(watched: Home, tmp_path: Path) -> None:
    home, stopped = watched, tmp_path / "stopped"
    idle_for(home, 90)
    local_config(home, f'autostop_minutes = 1\nrelease_remote = ["touch", "{stopped}"]\n')
    home.cli("status", check=True)  # armed with a window the host has not been idle for
    first = watchdog_config(home)["armed_at"]
    local_config(home, f'autostop_minutes = {WINDOW_MIN}\nrelease_remote = ["touch", "{stopped}"]\n')
    home.cli("status", check=True)  # the running watchdog picks the new window up
    armed = watchdog_config(home)["armed_at"]
    assert armed > first
    assert released_at(stopped) >= armed + WINDOW_MIN * 60


def watchdog_running(home: Home) -> bool:
    import fcntl

    with open(home.state_dir / "watchdog.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        return False


def test_removing_the_settings_disarms_the_watchdog(watched: Home, tmp_path: Path) -> None:
    home, stopped = watched, tmp_path / "stopped"
    local_config(home, f'autostop_minutes = 1\nrelease_remote = ["touch", "{stopped}"]\n')
    assert autostop_in_s(home) is not None
    wait_for(lambda: watchdog_running(home), what="watchdog start")
    local_config(home)  # no autostop, no release command: nothing may be released any more
    assert autostop_in_s(home) is None
    wait_for(lambda: not watchdog_running(home), what="watchdog to disarm")
    assert "disarmed: nothing to watch" in (home.state_dir / "watchdog.log").read_text()
    assert not stopped.exists() and not (home.state_dir / "watchdog.json").exists()


def test_snooze_restarts_the_window_at_its_end(watched: Home, tmp_path: Path) -> None:
    home, stopped = watched, tmp_path / "stopped"
    local_config(home, f'autostop_minutes = {WINDOW_MIN}\nrelease_remote = ["touch", "{stopped}"]\n')
    job_id = start_sleeper(home, tmp_path)  # busy: nothing is released while we snooze
    home.cli("status", check=True)
    home.cli("autostop", "local", "--snooze", "0.1", check=True)
    snoozed_until = watchdog_config(home)["snoozed_until"]
    home.cli("kill", "local", job_id, "--grace", "1", check=True)
    assert released_at(stopped) >= snoozed_until + WINDOW_MIN * 60


def test_watchdog_needs_the_whole_window_on_the_monotonic_clock(tmp_path: Path) -> None:
    """A wall-clock jump (or a restarted watchdog) never shortens the window: this process must watch it all."""
    from remote_agent.fsutil import write_json
    from remote_agent.watchdog import daemon

    stopped = tmp_path / "stopped"
    config = {"autostop_minutes": 1, "armed_at": 0.0, "boot_id": "b", "count_sessions": False,
              "release_remote": ["touch", str(stopped)]}
    write_json(str(tmp_path / daemon.CONFIG), config)
    dog = daemon.Watchdog(str(tmp_path))
    facts = {"boot_id": "b", "boot_time": 0.0}
    idle = lambda: ({"gpus": []}, [])  # noqa: E731
    t = 1_000_000.0
    assert dog.check(config, facts, idle, now=t, mono=5.0)["due"] is None
    jumped = dog.check(config, facts, idle, now=t + 3600, mono=6.0)  # the wall clock leapt an hour
    assert jumped["due"] is None and jumped["autostop_at"] == pytest.approx(t + 3600 + 59)
    assert not stopped.exists()
    released = dog.check(config, facts, idle, now=t + 3660, mono=65.0)
    assert released["action"] == "released" and stopped.exists()


def test_a_clock_jump_does_not_bring_the_deadline_forward(tmp_path: Path) -> None:
    from remote_agent.fsutil import write_json
    from remote_agent.watchdog import daemon

    stopped, t = tmp_path / "stopped", 1_000_000.0
    config = {
        "release_at": t + 3600,
        "boot_id": "b",
        "count_sessions": False,
        "release_remote": ["touch", str(stopped)],
    }
    write_json(str(tmp_path / daemon.CONFIG), config)
    dog, facts, idle = daemon.Watchdog(str(tmp_path)), {"boot_id": "b"}, lambda: ({"gpus": []}, [])
    assert dog.check(config, facts, idle, now=t, mono=0.0)["due"] is None
    # the wall clock leaps an hour: the deadline has not come on the monotonic clock
    assert dog.check(config, facts, idle, now=t + 3601, mono=1.0)["due"] is None
    assert not stopped.exists()
    state = dog.check(config, facts, idle, now=t + 7200, mono=3600.0)
    assert state["due"] == "deadline reached" and state["action"] == "released"


def test_a_deadline_already_past_when_set_waits_a_grace_and_says_so(tmp_path: Path) -> None:
    """release_after_hours on a host up longer (or a release_at in the past) must not release it, running jobs
    and all, the moment the setting arrives: the deadline comes DEADLINE_GRACE_S after arming, its countdown
    shows that, and only then does it release."""
    from remote_agent.fsutil import write_json
    from remote_agent.watchdog import daemon

    stopped, t = tmp_path / "stopped", 1_000_000.0
    config = {"release_at": t - 7200, "armed_at": t, "boot_id": "b", "count_sessions": False,
              "release_remote": ["touch", str(stopped)]}
    write_json(str(tmp_path / daemon.CONFIG), config)
    dog, facts, idle = daemon.Watchdog(str(tmp_path)), {"boot_id": "b"}, lambda: ({"gpus": []}, [])
    first = dog.check(config, facts, idle, now=t + 1, mono=0.0)
    assert first["due"] is None and first["release_at"] == t + daemon.DEADLINE_GRACE_S
    assert dog.check(config, facts, idle, now=t + daemon.DEADLINE_GRACE_S - 5, mono=daemon.DEADLINE_GRACE_S - 6)["due"] is None
    assert not stopped.exists()
    done = dog.check(config, facts, idle, now=t + daemon.DEADLINE_GRACE_S + 1, mono=daemon.DEADLINE_GRACE_S)
    assert done["due"] == "deadline reached" and done["action"] == "released" and stopped.exists()
    # a deadline further off than the grace is kept as set
    assert daemon.deadline_at(dict(config, release_at=t + 3600)) == t + 3600


def test_watchdog_rereads_its_config_before_releasing(tmp_path: Path) -> None:
    from remote_agent.fsutil import write_json
    from remote_agent.watchdog import daemon

    stopped = tmp_path / "stopped"
    config = {
        "release_at": 0.0,
        "boot_id": "b",
        "count_sessions": False,
        "release_remote": ["touch", str(stopped)],
    }
    write_json(str(tmp_path / daemon.CONFIG), dict(config, cancelled=True, release_at=None))  # changed meanwhile
    state = daemon.Watchdog(str(tmp_path)).check(config, {"boot_id": "b"}, lambda: ({"gpus": []}, []))
    assert state["action"] is None and not stopped.exists()
    assert "config changed meanwhile" in (tmp_path / daemon.LOG).read_text()


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("jobs.kill", {"job": "1", "grace_s": "nan"}),
        ("jobs.kill", {"job": "1", "grace_s": -1}),
        ("jobs.kill", {"job": "1", "grace_s": "inf"}),
        ("watchdog.snooze", {"minutes": "nan"}),
        ("watchdog.snooze", {"minutes": 0}),
        (
            "watchdog.configure",
            {"config": {"autostop_minutes": 1, "interval": "nan", "release_remote": ["x"]}},
        ),
        ("watchdog.configure", {"config": {"autostop_minutes": "inf", "release_remote": ["x"]}}),
    ],
)
def test_agent_refuses_numbers_out_of_bounds(agent, op: str, args: dict) -> None:
    reply = agent.call(op, **args)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_args", reply
    assert "must be" in reply["error"]["message"]  # (a bare NaN token is a malformed frame: test_agent_protocol)
    assert not (agent.state_dir / "watchdog.json").exists()


def due_watchdog(tmp_path: Path, pre_stop: list[str]) -> tuple:
    """A watchdog whose autostop is due now (idle for ages, watched long enough), with ``pre_stop``."""
    from remote_agent.fsutil import write_json
    from remote_agent.watchdog import daemon

    stopped = tmp_path / "stopped"
    config = {"autostop_minutes": 0.001, "armed_at": 0.0, "boot_id": "b", "count_sessions": False,
              "pre_stop": pre_stop, "release_remote": ["touch", str(stopped)]}
    write_json(str(tmp_path / daemon.CONFIG), config)
    write_json(str(tmp_path / "activity.json"), {"last_busy": 0.0, "boot_id": "b"})
    dog = daemon.Watchdog(str(tmp_path))
    dog.watched_since = -1e9
    return dog, config, stopped


def test_a_snooze_while_pre_stop_runs_wins(tmp_path: Path) -> None:
    """pre_stop may run for minutes (a checkpoint sync): a snooze meanwhile must stop the release."""
    path = tmp_path / "watchdog.json"
    snooze = f"import json, pathlib; p = pathlib.Path({str(path)!r}); c = json.loads(p.read_text()); "
    snooze += "c['snoozed_until'] = 9e9; p.write_text(json.dumps(c))"
    dog, config, stopped = due_watchdog(tmp_path, [sys.executable, "-c", snooze])
    state = dog.check(config, {"boot_id": "b"}, lambda: ({"gpus": []}, []))
    assert state["action"] is None and not stopped.exists()
    assert "not releasing: the config changed while pre_stop ran" in (tmp_path / "watchdog.log").read_text()


def test_a_job_started_while_pre_stop_runs_wins(tmp_path: Path) -> None:
    dog, config, stopped = due_watchdog(tmp_path, ["true"])
    samples = iter([({"gpus": []}, []), ({"gpus": []}, [{"id": "7", "state": "running"}])])
    state = dog.check(config, {"boot_id": "b"}, lambda: next(samples))
    assert state["action"] is None and not stopped.exists() and state["reasons"] == ["job 7 running"]
    assert "not due any more (job 7 running) while pre_stop ran" in (tmp_path / "watchdog.log").read_text()


async def test_an_automatic_release_checks_again_that_the_host_is_idle(home: Home, tmp_path: Path) -> None:
    from gputui.core.config import file as cfg
    from gputui.core.hosts.fleet import Fleet
    from gputui.core.money.release import ReleaseError, ReleaseRequest, release_host

    marker = tmp_path / "released"
    local_config(home, f'release = ["touch", "{marker}"]\nidle_minutes = 1000\n')
    config = cfg.load(str(home.root / ".config" / "gputui" / "config.toml"))
    fleet = Fleet(config)
    try:
        session = fleet.session("local")
        await session.start()
        with pytest.raises(ReleaseError, match="not released automatically: it is not idle"):
            await release_host(session, config.hosts["local"], fleet.ledger, ReleaseRequest("local", idle_only=True))
    finally:
        await fleet.close()
    assert not marker.exists() and not fleet.ledger.released("local")


def test_cost_shows_mixed_currencies_per_currency_never_summed(home: Home, tmp_path: Path) -> None:
    home.write_config(
        "".join(
            f'[hosts.{name}]\ntransport = "local"\nremote_dir = "{home.root / name}"\nprice_per_hour = {p}\n'
            f'count_ssh_sessions = false\ncurrency = "{cur}"\n\n'
            for name, cur, p in (("usd", "USD", 3.6), ("eur", "EUR", 7.2))
        )
        + "[budget]\ndaily = 1000.0\n"
    )
    try:
        out = json.loads(home.cli("cost", "--json", check=True).stdout)
        table = home.cli("cost", check=True).stdout
    finally:
        for name in ("usd", "eur"):
            stop_host(home.root / name)
    assert out["currency"] is None and out["total"] is None and out["burn_per_hour"] is None
    assert [(t["currency"], t["burn_per_hour"]) for t in out["by_currency"]] == [("USD", 3.6), ("EUR", 7.2)]
    assert "total USD" in table and "total EUR" in table


# --- rules whose breaking would otherwise go unnoticed ----------------------------------------------------------
def test_a_config_from_another_boot_never_acts(tmp_path: Path) -> None:
    """After a reboot the old config (a deadline long past, here) must not release the new boot: the real
    watchdog loop disarms at once, and the agent shows no countdown from it."""
    from remote_agent.fsutil import write_json
    from remote_agent.host.boot import boot_id as this_boot
    from remote_agent.watchdog import daemon

    stopped = tmp_path / "stopped"
    config = {"release_at": 1.0, "armed_at": 0.0, "boot_id": "a-boot-before-the-reboot", "interval": 0.5,
              "count_sessions": False, "release_remote": ["touch", str(stopped)]}
    write_json(str(tmp_path / daemon.CONFIG), config)
    assert daemon.run(str(tmp_path), []) == 0
    assert not stopped.exists()
    assert "disarmed: config is from another boot" in (tmp_path / daemon.LOG).read_text()
    assert daemon.view(str(tmp_path), {"idle_since": 0.0, "reasons": []}, this_boot()) is None
    # the same config on this boot is armed, and due (the control: the rule is what kept it quiet)
    assert daemon.is_armed(dict(config, boot_id=this_boot()), this_boot())


def test_a_failed_release_remote_is_retried_only_after_its_backoff(tmp_path: Path) -> None:
    from remote_agent.fsutil import write_json
    from remote_agent.watchdog import daemon

    attempts = tmp_path / "attempts"
    failing = ["sh", "-c", f'echo x >> "{attempts}"; echo quota >&2; exit 3']
    config = {"release_at": 0.0, "armed_at": 0.0, "boot_id": "b", "count_sessions": False, "release_remote": failing}
    write_json(str(tmp_path / daemon.CONFIG), config)
    dog, facts, idle, t = daemon.Watchdog(str(tmp_path)), {"boot_id": "b"}, lambda: ({"gpus": []}, []), 1_000_000.0
    assert dog.check(config, facts, idle, now=t, mono=0.0)["action"] == "release failed"
    for dt in (1.0, 60.0, daemon.RETRY_AFTER_FAILURE_S - 1):  # still due, but within the backoff: not run again
        state = dog.check(config, facts, idle, now=t + dt, mono=dt)
        assert state["due"] == "deadline reached" and state["action"] == "release failed"  # still billing
    assert attempts.read_text() == "x\n"
    again = dog.check(config, facts, idle, now=t + daemon.RETRY_AFTER_FAILURE_S, mono=daemon.RETRY_AFTER_FAILURE_S)
    assert again["action"] == "release failed" and attempts.read_text() == "x\nx\n"
    assert (tmp_path / daemon.LOG).read_text().count("release_remote: exit 3: quota") == 2


async def test_an_automatic_release_of_an_idle_host_releases_it(home: Home, tmp_path: Path) -> None:
    """The budget's release-idle path when the host is idle: the release runs and the ledger closes."""
    from gputui.core.config import file as cfg
    from gputui.core.hosts.fleet import Fleet
    from gputui.core.money.release import ReleaseRequest, release_host

    marker = tmp_path / "released"
    local_config(home, f'release = ["touch", "{marker}"]\nidle_minutes = 0\n')
    config = cfg.load(str(home.root / ".config" / "gputui" / "config.toml"))
    fleet = Fleet(config)
    try:
        session = fleet.session("local")
        await session.start()
        result = await release_host(
            session, config.hosts["local"], fleet.ledger, ReleaseRequest("local", idle_only=True)
        )
    finally:
        await fleet.close()
    assert marker.exists() and fleet.ledger.released("local")
    assert [(s.where, s.exit_code) for s in result.steps] == [("client", 0)]

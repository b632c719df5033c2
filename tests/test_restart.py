"""Restart policies (remote_agent/jobs/restart.py): real tmux, the real detached watchdog, no client connected."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, Home, kill_tmux, lost_in_a_reboot_job, stop_host, wait_for

from remote_agent.fsutil import read_json, write_json
from remote_agent.jobs import restart as restart_policy
from remote_agent.watchdog import daemon

FAST = {"policy": "on-failure", "backoff_s": 0, "backoff_max_s": 0}


def _job(state: Path, jid: str) -> Path:
    return state / "jobs" / jid


def _ended(state: Path, jid: str, timeout: float = 90) -> dict[str, Any]:
    path = _job(state, jid) / "status.json"
    wait_for(lambda: path.exists(), timeout=timeout, what=f"job {jid} to end for good")
    return read_json(str(path))


def _script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def _watchdog_pid(state: Path) -> int:
    return int((state / daemon.LOG).read_text().split("started (pid ")[-1].split(")")[0])


def test_a_job_failing_twice_then_succeeding_restarts_with_markers_env_and_checkpoint(tmp_path: Path) -> None:
    """Attempts 1 and 2 fail, 3 succeeds: every attempt kept, a marker per restart in the one log, GPUTUI_ATTEMPT
    counted, GPUTUI_RESUME_FROM the newest complete checkpoint (not the partial one, not the one still changing)."""
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    argv = _script(tmp_path, """
import os, sys, time
n = int(os.environ["GPUTUI_ATTEMPT"])
print("attempt", n, "resume", os.environ.get("GPUTUI_RESUME_FROM"), flush=True)
path = "ckpt/epoch%d.pt" % n
open(path, "w").write("weights")
t = time.time() - 100 + n
os.utime(path, (t, t))                       # saved a while ago, complete
open("ckpt/epoch99.pt.tmp", "w").write("half")  # a partial file: never resumed from
print("epoch", n, flush=True)
if n < 3:
    print("RuntimeError: NCCL timeout", flush=True)
    sys.exit(1)
""")
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        policy = dict(FAST, max=4, resume_from="ckpt/*.pt")
        job = agent.call("jobs.start", argv=argv, cwd=str(work), restart=policy)["result"]
        jid = job["id"]
        assert job["restart"]["max"] == 4
        agent.close()  # nobody connected from here on: the watchdog decides
        end = _ended(state, jid)
        assert end["exit_code"] == 0 and not end.get("error")
        log = (_job(state, jid) / "output.log").read_text()
        assert "attempt 1 resume None" in log
        assert f"attempt 2 resume {work}/ckpt/epoch1.pt" in log
        assert f"attempt 3 resume {work}/ckpt/epoch2.pt" in log
        assert "── attempt 2 of 4, after exit 1 (RuntimeError: NCCL timeout), 0 s backoff ──" in log
        assert "── attempt 3 of 4, after exit 1 (RuntimeError: NCCL timeout), 0 s backoff ──" in log
        assert log.index("attempt 1 resume") < log.index("── attempt 2 of 4") < log.index("attempt 2 resume")
        attempts = read_json(str(_job(state, jid) / restart_policy.ATTEMPTS))
        assert [(a["attempt"], a["exit_code"], a["progress"]) for a in attempts] == [(1, 1, "epoch 1"), (2, 1, "epoch 2")]
        assert all(a["started_at"] <= a["ended_at"] for a in attempts)
        agent = AgentProc(state)
        record = agent.call("jobs.get", job=jid)["result"]
        assert (record["state"], record["attempt"], len(record["attempts"])) == ("succeeded", 3, 2)
        assert record["started_at"] == attempts[0]["started_at"]  # the job's cost counts every attempt
        assert f"restart: job {jid} attempt 1 ended (exit 1 (RuntimeError: NCCL timeout))" in (state / daemon.LOG).read_text()
    finally:
        agent.close()
        stop_host(state)


def test_a_crash_loop_stops_with_its_reason_and_a_cap_stops_a_job_that_moves(tmp_path: Path) -> None:
    """Three attempts dying at the same step are a crash loop (before the cap of 5); a job that gets further
    each time but always fails stops at its cap."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        stuck = agent.call("jobs.start", argv=[sys.executable, "-c",
                           "print('step 1200'); print('ValueError: bad batch'); raise SystemExit(3)"],
                           restart=dict(FAST, max=5))["result"]["id"]
        moving = agent.call("jobs.start", argv=[sys.executable, "-c",
                            "import os; print('step', 10 * int(os.environ['GPUTUI_ATTEMPT'])); raise SystemExit(1)"],
                            restart=dict(FAST, max=2))["result"]["id"]
        agent.close()
        end = _ended(state, stuck)
        assert end["exit_code"] == 3
        assert end["error"] == "crash loop: 3 attempts at step 1200, last error: ValueError: bad batch"
        assert len(read_json(str(_job(state, stuck) / restart_policy.ATTEMPTS))) == 3
        end = _ended(state, moving)
        assert end["error"] == "gave up after 2 attempts in a row, last error: step 20"
        agent = AgentProc(state)
        record = agent.call("jobs.get", job=stuck)["result"]
        assert record["state"] == "failed" and record["error"].startswith("crash loop: 3 attempts at step 1200")
    finally:
        agent.close()
        stop_host(state)


#: An attempt that prints its step, then 50 MB of output (far more than any tail), then fails.
LOUD = """
import os, sys
n = int(os.environ["GPUTUI_ATTEMPT"])
print("step %d" % ({step}), flush=True)
sys.stdout.write("x" * 50_000_000 + "\\n")
print("ValueError: bad batch", flush=True)
raise SystemExit(3)
"""


@pytest.mark.parametrize(("step", "loop"), [("1200", True), ("1000 * n", False)], ids=["stuck", "moving"])
def test_the_crash_loop_guard_takes_progress_from_the_whole_log_not_its_tail(
    tmp_path: Path, step: str, loop: bool
) -> None:
    """Each attempt prints its step and then 50 MB: the step is far out of any tail, yet the host's series.json
    (the log read through) holds it. Three attempts at one step are a crash loop; attempts that each get further
    are not (they stop at the cap)."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        argv = _script(tmp_path, LOUD.format(step=step))
        jid = agent.call("jobs.start", argv=argv, restart=dict(FAST, max=3 if not loop else 4))["result"]["id"]
        agent.close()
        end = _ended(state, jid, timeout=240)
        attempts = read_json(str(_job(state, jid) / restart_policy.ATTEMPTS))
        assert all(a["log_bytes"] > 50_000_000 for a in attempts)
        if loop:
            assert end["error"] == "crash loop: 3 attempts at step 1200, last error: ValueError: bad batch"
            assert [a["progress"] for a in attempts] == ["step 1200"] * 3
        else:
            assert end["error"] == "gave up after 3 attempts in a row, last error: ValueError: bad batch"
            assert [a["progress"] for a in attempts] == ["step 1000", "step 2000", "step 3000"]
    finally:
        agent.close()
        stop_host(state)


def test_a_job_killed_by_the_user_is_never_restarted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        jid = agent.call("jobs.start", argv=["sleep", "600"], restart=dict(FAST, max=5))["result"]["id"]
        wait_for(lambda: (_job(state, jid) / "pid.json").exists(), what="the job to run")
        wait_for(lambda: (state / daemon.LOG).exists() and "started (pid" in (state / daemon.LOG).read_text(), what="the watchdog")
        killed = agent.call("jobs.kill", job=jid, grace_s=5)["result"]
        assert killed["state"] == "killed"
        agent.close()
        # The watchdog stays while a job may still restart; it leaves after a pass that found nothing to restart.
        wait_for(lambda: "disarmed: nothing to watch" in (state / daemon.LOG).read_text(), timeout=60, what="its pass")
        assert read_json(str(_job(state, jid) / "pid.json"))["attempt"] == 1
        assert not (_job(state, jid) / restart_policy.ATTEMPT).exists() and not (_job(state, jid) / restart_policy.ATTEMPTS).exists()
        assert "── attempt" not in (_job(state, jid) / "output.log").read_text()
        assert f"restart: job {jid}" not in (state / daemon.LOG).read_text()
    finally:
        agent.close()
        stop_host(state)


def test_a_kill_while_waiting_to_restart_ends_the_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        jid = agent.call("jobs.start", argv=["false"], restart=dict(FAST, backoff_s=3600, backoff_max_s=3600))["result"]["id"]
        wait_for(lambda: (_job(state, jid) / restart_policy.PENDING).exists(), timeout=60, what="the restart to be planned")
        record = agent.call("jobs.get", job=jid)["result"]
        assert (record["state"], record["attempt"]) == ("running", 2) and record["restart_at"] > time.time() + 3000
        killed = agent.call("jobs.kill", job=jid, grace_s=1)["result"]
        assert (killed["state"], killed["error"]) == ("killed", "killed while waiting to restart")
    finally:
        agent.close()
        stop_host(state)


def test_a_job_lost_in_a_reboot_restarts_at_the_next_agent_start(tmp_path: Path) -> None:
    """The tmux server dies with the job and the boot id changes (a reboot); the watchdog is gone too. The next
    agent start resumes the job and says so."""
    argv = lost_in_a_reboot_job(tmp_path)
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        jid = agent.call("jobs.start", argv=argv, restart=dict(FAST, max=3))["result"]["id"]
        wait_for(lambda: (_job(state, jid) / "pid.json").exists(), what="the job to run")
        wait_for(lambda: (state / daemon.LOG).exists() and "started (pid" in (state / daemon.LOG).read_text(), what="the watchdog")
        agent.close()
        pid = _watchdog_pid(state)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(),
                 what="the watchdog to be gone")
        runner = read_json(str(_job(state, jid) / "pid.json"))
        kill_tmux(state)  # the reboot: tmux, the runner and the job are gone, with no status written
        wait_for(lambda: not Path(f"/proc/{runner['runner_pid']}").exists()
                 or "zombie" in Path(f"/proc/{runner['runner_pid']}/status").read_text().lower(), what="the runner to die")
        write_json(str(_job(state, jid) / "pid.json"), dict(runner, boot_id="the-boot-before"))
        assert not (_job(state, jid) / "status.json").exists()
        agent = AgentProc(state)  # the next connect after the reboot
        end = _ended(state, jid)
        assert end["exit_code"] == 0
        log = (_job(state, jid) / "output.log").read_text()
        assert "── attempt 2 of 3, after a reboot lost the job, 0 s backoff ──" in log and "attempt 2" in log
        assert f"restart: job {jid} was lost in a reboot: resuming it (attempt 2)" in (state / daemon.LOG).read_text()
        [first] = read_json(str(_job(state, jid) / restart_policy.ATTEMPTS))
        assert (first["exit_code"], first["hint"], first["rebooted"]) == (None, "lost in a reboot", True)
    finally:
        agent.close()
        stop_host(state)


# --- bad input ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["on-failure:-1", "on-failure:0", "on-failure:x", "always", "on-failure:101"])
def test_bad_restart_policies_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="restart policy"):
        restart_policy.parse_policy(text)


@pytest.mark.parametrize("pattern", ["../ckpt/*.pt", "/etc/*", "ckpt/../../x", "~/ckpt/*"])
def test_a_checkpoint_glob_outside_the_jobs_dir_is_refused(tmp_path: Path, pattern: str) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        reply = agent.call("jobs.start", argv=["true"], restart=dict(FAST, resume_from=pattern))
        assert reply["error"]["code"] == "bad_args" and "outside the job's directory" in reply["error"]["message"]
        assert agent.call("jobs.list")["result"]["jobs"] == []
    finally:
        agent.close()
        stop_host(state)


def test_bad_restart_requests_on_the_wire_are_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        for bad, said in (({"policy": "on-failure", "max": -1}, "1 to 100"), ({"policy": "sometimes"}, "use 'no'"),
                          ({"policy": "on-failure", "backoff_s": "soon"}, "backoff_s"), ("on-failure", "an object")):
            reply = agent.call("jobs.start", argv=["true"], restart=bad)
            assert reply["error"]["code"] == "bad_args" and said in reply["error"]["message"], reply
    finally:
        agent.close()
        stop_host(state)


def test_a_link_out_of_the_dir_is_never_resumed_from_and_thousands_of_matches_are_fine(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    outside = tmp_path / "secret.pt"
    outside.write_text("x")
    old = time.time() - 1000
    for n in range(3000):
        path = work / "ckpt" / f"step{n}.pt"
        path.write_text("w")
        os.utime(path, (old + n * 0.1, old + n * 0.1))
    (work / "ckpt" / "zz.pt").symlink_to(outside)  # newest of all, but outside the job's dir
    os.utime(outside, (old + 900, old + 900))
    (work / "ckpt" / "fresh.pt").write_text("still being written")  # changed just now: skipped
    assert restart_policy.newest_checkpoint(str(work), "ckpt/*.pt") == str(work / "ckpt" / "step2999.pt")
    assert restart_policy.newest_checkpoint(str(work), "nothing/*.pt") is None


def test_cli_refuses_a_bad_policy_before_connecting(home: Home) -> None:
    for args, said in ((["--restart", "on-failure:-1"], "N is a whole number"),
                       (["--restart", "on-failure", "--resume-from", "../c/*.pt"], "outside the job's directory"),
                       (["--resume-from", "c/*.pt"], "needs a restart policy")):
        res = home.cli("run", "local", *args, "--", "true")
        assert res.returncode == 2 and said in res.stderr, res.stderr


def test_restarts_and_the_crash_loop_are_notified_with_no_client(tmp_path: Path) -> None:
    """The watchdog sends ``job_restarted`` per restart and ``crash_loop`` with its reason (not ``job_failed``)."""
    sent = tmp_path / "sent"
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        settings = {"command": ["sh", "-c", f'{{ echo "$GPUTUI_NOTIFY_EVENT"; cat; echo; }} >> "{sent}"'],
                    "events": ["job_restarted", "crash_loop", "job_failed"], "host": "gpu1"}
        assert agent.call("watchdog.configure", config={"notify": settings, "interval": 0.5})["result"]["armed"]
        jid = agent.call("jobs.start", argv=[sys.executable, "-c", "print('epoch 7'); raise SystemExit(2)"],
                         restart=dict(FAST, max=9))["result"]["id"]
        agent.close()
        _ended(state, jid)
        wait_for(lambda: sent.exists() and "crash_loop" in sent.read_text(), timeout=60, what="the crash_loop message")
        text = sent.read_text()
        assert f"[gpu1] job {jid} restarted after attempt 1 ended (exit 2: epoch 7)" in text
        assert f"[gpu1] job {jid} restarted after attempt 2 ended (exit 2: epoch 7)" in text
        assert f"[gpu1] job {jid} stopped restarting: crash loop: 3 attempts at epoch 7, last error: epoch 7" in text
        assert "job_failed" not in text and "attempt 3 ended" not in text
    finally:
        agent.close()
        stop_host(state)


def test_the_cli_runs_with_the_hosts_default_policy_and_jobs_shows_every_attempt(home: Home) -> None:
    """``restart`` in [hosts.X] is the default of ``gputui run``; ``jobs --json`` and ``jobs`` show the attempts."""
    import json

    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
                      'restart = "on-failure:2"\nrestart_backoff_s = 0\n')
    run = home.cli("run", "local", "--", sys.executable, "-c", "print('Error: no data'); raise SystemExit(4)", check=True)
    jid = run.stdout.strip()
    end = _ended(home.state_dir, jid)
    assert end["error"] == "gave up after 2 attempts in a row, last error: Error: no data"
    [job] = json.loads(home.cli("jobs", "local", "--json", check=True).stdout)
    assert job["restart"]["policy"] == "on-failure" and job["restart"]["max"] == 2
    assert [(a["attempt"], a["exit_code"], a["hint"]) for a in job["attempts"]] == [(1, 4, "Error: no data"), (2, 4, "Error: no data")]
    text = home.cli("jobs", "local", check=True).stdout
    assert f"local {jid} attempts: exit 4 (Error: no data) exit 4 (Error: no data)" in text
    assert "gave up after 2 attempts" in text
    [run] = json.loads(home.cli("history", "local", "--json", check=True).stdout)
    assert [a["attempt"] for a in run["attempts"]] == [1, 2]
    assert run["started_at"] == job["attempts"][0]["started_at"]  # the run's duration and cost span every attempt
    plain = home.cli("run", "local", "--restart", "no", "--", "false", check=True).stdout.strip()
    assert _ended(home.state_dir, plain)["exit_code"] == 1 and not (home.job_dir(plain) / restart_policy.ATTEMPTS).exists()


def test_a_bad_host_default_policy_is_a_config_error(home: Home) -> None:
    home.write_config('[hosts.gpu]\nhost = "gpu.example"\nrestart = "on-failure:-1"\n')
    res = home.cli("jobs", "gpu")
    assert res.returncode == 2 and "restart" in res.stderr and "N is a whole number" in res.stderr, res.stderr


def test_a_ctrl_c_in_the_jobs_pane_is_never_restarted(tmp_path: Path) -> None:
    """An attempt ended by SIGINT (what Ctrl-C in ``tmux attach`` sends) is the user stopping it."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        code = "import os, signal; print('step 3'); os.kill(os.getpid(), signal.SIGINT); import time; time.sleep(60)"
        jid = agent.call("jobs.start", argv=[sys.executable, "-c", code], restart=dict(FAST, max=5))["result"]["id"]
        end = _ended(state, jid)
        assert (end["exit_code"], end["signal"]) == (130, signal.SIGINT)
        assert not (_job(state, jid) / restart_policy.ATTEMPTS).exists() and not (_job(state, jid) / restart_policy.PENDING).exists()
    finally:
        agent.close()
        stop_host(state)


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = {"backoff_s": 30.0, "backoff_max_s": 600.0}
    assert [restart_policy.backoff(policy, n) for n in range(1, 8)] == [30, 60, 120, 240, 480, 600, 600]


def test_a_healthy_stretch_resets_the_attempt_counter(tmp_path: Path) -> None:
    """Each attempt ran for ``healthy_s`` (0 here): the count of failures in a row starts again every time, so a
    cap of 2 does not stop a job whose third attempt fails, and its fourth runs (and succeeds)."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        code = "import os, sys; n = int(os.environ['GPUTUI_ATTEMPT']); print('step 7'); sys.exit(0 if n == 4 else 1)"
        jid = agent.call("jobs.start", argv=[sys.executable, "-c", code],
                         restart=dict(FAST, max=2, healthy_s=0))["result"]["id"]
        end = _ended(state, jid)
        assert end["exit_code"] == 0
        attempts = read_json(str(_job(state, jid) / restart_policy.ATTEMPTS))
        assert [(a["attempt"], a["streak_reset"]) for a in attempts] == [(1, True), (2, True), (3, True)]
        assert "── attempt 4 of 4, after exit 1 (step 7), 0 s backoff ──" in (_job(state, jid) / "output.log").read_text()
    finally:
        agent.close()
        stop_host(state)


def test_a_host_being_released_never_restarts_a_job(tmp_path: Path) -> None:
    """The restart pass of a watchdog whose host was released ends a failed attempt for good instead."""
    from remote_agent.__main__ import launcher
    from remote_agent.jobs.store import JobStore

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    try:
        jid = store.start(["false"], restart=dict(FAST, max=5))["id"]  # the store alone: no watchdog runs
        wait_for(lambda: (_job(state, jid) / restart_policy.ATTEMPT).exists(), timeout=60, what="the attempt to end")
        assert store.describe(jid)["state"] == "running"  # between attempts: not over
        said: list[str] = []
        assert restart_policy.Restarts(store, said.append, "b").run_pass(released=True) == 0
        record = store.describe(jid)
        assert (record["state"], record["exit_code"], record["error"]) == ("failed", 1, "not restarted: the host was released")
        assert read_json(str(_job(state, jid) / "pid.json"))["attempt"] == 1
        assert said == [f"restart: job {jid} ends for good: not restarted: the host was released"]
    finally:
        stop_host(state)


def test_a_job_waiting_to_restart_on_a_host_a_deadline_releases_ends_for_good(tmp_path: Path) -> None:
    """The real watchdog releases the host (a deadline) while a job waits out its backoff: the job must end as
    failed, saying why, instead of showing "restarting" for ever (nothing would ever restart it)."""
    state, stopped = tmp_path / "state", tmp_path / "stopped"
    agent = AgentProc(state)
    try:
        jid = agent.call("jobs.start", argv=["false"], restart=dict(FAST, max=5, backoff_s=3600,
                         backoff_max_s=3600))["result"]["id"]
        wait_for(lambda: (_job(state, jid) / restart_policy.PENDING).exists(), timeout=60, what="the restart to be scheduled")
        config = {"release_at": time.time() + 1, "count_sessions": False, "interval": 0.5,
                  "release_remote": ["touch", str(stopped)]}
        assert agent.call("watchdog.configure", config=config)["result"]["armed"]
        armed = read_json(str(state / daemon.CONFIG))
        write_json(str(state / daemon.CONFIG), dict(armed, armed_at=armed["armed_at"] - daemon.DEADLINE_GRACE_S))  # long armed
        agent.close()
        end = _ended(state, jid)
        assert stopped.exists()
        assert (end["exit_code"], end["error"]) == (1, "not restarted: the host was released")
    finally:
        agent.close()
        stop_host(state)

"""The GPU-aware queue (remote_agent/jobs/queue.py), on GPU readings recorded on real GPUs: two of the 8x A100
recording (``--state q`` of the nvidia-smi stand-in) and the H100 capture under gpu_burn (a foreign process)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, Home, SshHome, stop_host, wait_for
from sshd import SYSTEM_PATH
from test_agent_bad_logs import small_disk
from test_metrics_smi import H100, NoNvml, fake_smi

from remote_agent.fsutil import read_json, write_json
from remote_agent.jobs import queue as job_queue
from remote_agent.jobs.store import JobStore
from remote_agent.metrics.sampler import MetricsSampler
from remote_agent.watchdog import daemon

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
A100_X8 = FIXTURES / "a100-sxm4-40gb-x8_460.32.03_nvidia-smi-q.txt"
T = 1_000_000.0


def a100s(where: Path, count: int = 2) -> Path:
    """A directory holding an ``nvidia-smi`` that replays the first ``count`` GPUs of the 8x A100 recording."""
    where.mkdir(parents=True, exist_ok=True)
    exe = where / "nvidia-smi"
    exe.write_text(f'#!/bin/sh\nFAKE_NVIDIA_SMI_GPUS={count} exec "{sys.executable}" "{FIXTURES / "fake_nvidia_smi.py"}" '
                   f'--capture "{A100_X8}" --state q "$@"\n')
    exe.chmod(0o755)
    return where


def sample_of(tmp_path: Path, smi: str) -> dict[str, Any]:
    return MetricsSampler(str(tmp_path), nvidia_smi=smi, nvml=NoNvml()).sample(lambda pid: None)


def queued(jid: str, gpus: str | None = None, **request: Any) -> dict[str, Any]:
    return {"id": jid, "state": "queued", "queue": dict({"gpus": gpus, "after": [], "after_ok": []}, **request)}


def ended(jid: str, state: str, code: int | None) -> dict[str, Any]:
    return {"id": jid, "state": state, "exit_code": code, "ended_at": T}


# --- deciding, on recorded readings --------------------------------------------------------------------------------
def test_two_recorded_a100s_are_read_as_two_idle_gpus(tmp_path: Path) -> None:
    sample = sample_of(tmp_path, str(a100s(tmp_path / "bin") / "nvidia-smi"))
    assert [(g["index"], g["name"], g["util_percent"], g["processes"]) for g in sample["gpus"]] == [
        (0, "A100-SXM4-40GB", 0, []), (1, "A100-SXM4-40GB", 0, [])
    ]


def test_disjoint_gpus_run_side_by_side_and_a_waiting_job_keeps_its_gpus(tmp_path: Path) -> None:
    sample = sample_of(tmp_path, str(a100s(tmp_path / "bin") / "nvidia-smi"))
    jobs = [queued("1", "0"), queued("2", "1"), queued("3", "1")]
    assert job_queue.plan(jobs, jobs, sample, []) == {
        "start": [("1", "0"), ("2", "1")], "fail": {},
        "wait": {"3": "GPU 1 kept for an earlier job of the queue"},
    }
    # job 5 runs on GPU 0: a 2-GPU job waits, and keeps GPU 1 from the 1-GPU job behind it (no starving)
    jobs = [queued("6", gpu_count=2), queued("7", gpu_count=1)]
    decided = job_queue.plan(jobs, jobs, sample, [{"id": "5", "gpus": "0"}])
    assert decided["start"] == []
    assert decided["wait"]["6"] == "needs 2 free GPUs, 1 free; GPU 0 held by job 5"
    assert decided["wait"]["7"] == "needs 1 free GPU, 0 free; GPU 0 held by job 5"
    # a job given every GPU (no CUDA_VISIBLE_DEVICES) holds them all
    assert job_queue.plan([queued("8", gpu_count=1)], [], sample, [{"id": "5", "gpus": None}])["wait"]["8"].startswith(
        "needs 1 free GPU, 0 free; GPU 0 held by job 5; GPU 1 held by job 5"
    )


def test_a_foreign_process_and_a_busy_gpu_hold_a_job_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from remote_agent.metrics import sampler as metrics

    monkeypatch.setattr(metrics, "process_name", lambda pid: None)
    load = sample_of(tmp_path, fake_smi(tmp_path, H100, "load"))  # gpu_burn and two memhogs, 100 %
    decided = job_queue.plan([queued("1", gpu_count=1)], [], load, [])
    why = decided["wait"]["1"]
    assert decided["start"] == [] and "used by pid 11345 (gpu_burn)" in why and "at 100% utilisation" in why
    idle = sample_of(tmp_path / "x", fake_smi(tmp_path, H100, "idle"))
    assert job_queue.plan([queued("1", gpu_count=1)], [], idle, [])["start"] == [("1", "0")]


def test_the_real_scheduler_holds_a_job_back_while_a_foreign_process_uses_the_gpu(tmp_path: Path) -> None:
    """The agent reads the H100 under gpu_burn (recorded): the job waits and says why; the recording goes idle
    (gpu_burn gone) with no client connected, and the job starts."""
    state = tmp_path / "state"
    agent = AgentProc(state, "--nvidia-smi", fake_smi(tmp_path, H100, "load"))
    try:
        jid = agent.call("jobs.start", argv=["true"], queue={"gpu_count": 1})["result"]["id"]

        def reason() -> str:
            return str(agent.call("jobs.get", job=jid)["result"].get("queue_reason"))

        wait_for(lambda: "used by pid" in reason(), timeout=60, what="the scheduler's reason")
        why = reason()
        assert why.startswith("needs 1 free GPU, 0 free; GPU 0 used by pid 11327")
        assert "used by pid 11345" in why and "at 100% utilisation" in why
        assert not (state / "jobs" / jid / "pid.json").exists()
        agent.close()
        fake_smi(tmp_path, H100, "idle")  # the same nvidia-smi now replays the idle recording
        wait_for(lambda: (state / "jobs" / jid / "status.json").exists(), timeout=60, what="the job to run")
        assert read_json(str(state / "jobs" / jid / "env.json"))["CUDA_VISIBLE_DEVICES"] == "0"
    finally:
        agent.close()
        stop_host(state)


def test_after_waits_and_after_ok_on_a_failed_job_never_starts(tmp_path: Path) -> None:
    sample = sample_of(tmp_path, str(a100s(tmp_path / "bin") / "nvidia-smi"))
    jobs = [ended("1", "failed", 3), {"id": "2", "state": "running"}, queued("3", gpu_count=1, after=["1"]),
            queued("4", gpu_count=1, after=["2"]), queued("5", gpu_count=1, after_ok=["1"])]
    decided = job_queue.plan(jobs[2:], jobs, sample, [{"id": "2", "gpus": "1"}])
    assert decided["start"] == [("3", "0")]
    assert decided["wait"] == {"4": "after job 2 (running)"}
    assert decided["fail"] == {"5": "never started: job 1 it waits for (--after-ok) ended failed (exit 3)"}


def test_jobs_waiting_on_each_other_or_on_themselves_fail_with_the_loop(tmp_path: Path) -> None:
    jobs = [ended("1", "failed", 3), {"id": "2", "state": "running"},
            queued("6", "none", after=["7"]), queued("7", "none", after=["6"]), queued("8", "none", after_ok=["8"]),
            queued("9", "none", after_ok=["6"]), queued("10", "none", after=["6"]), queued("11", "none", after=["2"]),
            queued("12", "none", after=["2"], after_ok=["1"])]
    decided = job_queue.plan(jobs[2:], jobs, {"gpus": []}, [])
    assert decided["fail"] == {
        "6": "never started: it waits on itself through 6 -> 7 -> 6",
        "7": "never started: it waits on itself through 7 -> 6 -> 7",
        "8": "never started: it waits on itself through 8 -> 8",
        "9": "never started: job 6 it waits for (--after-ok) can never start",
        "12": "never started: job 1 it waits for (--after-ok) ended failed (exit 3)",  # though job 2 still runs
    }
    assert decided["wait"] == {"10": "after job 6 (queued)", "11": "after job 2 (running)"}
    from remote_agent.watchdog.activity import busy_reasons

    # only the jobs that can still start are activity: a queue that can never move never holds the host busy
    assert busy_reasons({"gpus": []}, jobs) == ["job 2 running", "2 jobs queued (10, 11)"]
    assert busy_reasons({"gpus": []}, jobs[2:6]) == []


def test_a_submission_that_closes_a_loop_is_refused_and_leaves_no_job(tmp_path: Path) -> None:
    from remote_agent.__main__ import launcher
    from remote_agent.jobs.store import JobError

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store)
    first = queue.submit(job_queue.parse_request({"gpu_count": 1}), ["true"], None, None, None, {}, "b")
    job_json = state / "jobs" / first / "job.json"  # its stored request names the next id (restored from a backup)
    record = json.loads(job_json.read_text())
    write_json(str(job_json), dict(record, queue=dict(record["queue"], after=[str(int(first) + 1)])))
    with pytest.raises(JobError) as refused:
        queue.submit(job_queue.parse_request({"gpus": "none", "after": [first]}), ["true"], None, None, None, {}, "b")
    assert refused.value.code == "bad_args"
    assert str(refused.value) == f"not queued: the job would wait on itself through {int(first) + 1} -> {first} -> {int(first) + 1}"
    assert store.job_ids() == [first] and [j["id"] for j in queue.queued()] == [first]
    assert queue.run_pass({"gpus": []}, store.list(), "b") == 0  # the pass fails the job left waiting on nothing
    assert store.describe(first)["error"] == f"job {int(first) + 1} it waits for (--after) does not exist"


def test_a_kill_wins_over_every_later_pick_and_relaunch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed while picked (its runner not up yet): no later pass starts it, not even as a relaunch after a crash."""
    from remote_agent.__main__ import launcher
    from remote_agent.jobs import store as job_store

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store)
    try:
        ran = tmp_path / "ran"
        jid = queue.submit(job_queue.parse_request({"gpus": "none"}), ["touch", str(ran)], None, None, None, {}, "b")
        job_json = state / "jobs" / jid / "job.json"
        write_json(str(job_json), dict(json.loads(job_json.read_text()), dequeued_at=time.time(), start_attempts=1))
        assert store.describe(jid)["state"] == "running"  # picked: its runner is starting
        assert queue.remove(jid, "removed from the queue before it started") is None  # the agent's jobs.kill ...
        killed = store.kill(jid, grace_s=0.0)  # ... then kills what started
        assert (killed["state"], killed["error"]) == ("killed", "killed before it started")
        monkeypatch.setattr(job_store, "START_GRACE_S", 0.0)
        assert queue.run_pass({"gpus": []}, store.list(), "b") == 0
        assert store.describe(jid)["state"] == "killed" and not (state / "jobs" / jid / "pid.json").exists()
        assert not ran.exists() and store.tmux_sessions() == set()
    finally:
        stop_host(state)


def test_a_killed_job_picked_before_a_crash_is_never_relaunched(tmp_path: Path) -> None:
    """The kill record of a picked job without a status (a kill that crashed half way) is a tombstone: no relaunch."""
    from remote_agent.__main__ import launcher

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store)
    try:
        jid = queue.submit(job_queue.parse_request({"gpus": "none"}), ["true"], None, None, None, {}, "b")
        job_json = state / "jobs" / jid / "job.json"
        write_json(str(job_json), dict(json.loads(job_json.read_text()), dequeued_at=time.time() - 60, start_attempts=1))
        write_json(str(state / "jobs" / jid / "kill.json"), {"asked_at": time.time(), "grace_s": 0.0})
        assert queue.run_pass({"gpus": []}, store.list(), "b") == 0
        assert (store.describe(jid)["state"], store.describe(jid)["error"]) == ("killed", "killed before it started")
        assert not (state / "jobs" / jid / "pid.json").exists()
    finally:
        stop_host(state)


# --- the real agent and its detached scheduler -----------------------------------------------------------------
def _state(agent: AgentProc, jid: str) -> dict[str, Any]:
    return agent.call("jobs.get", job=jid)["result"]


def test_move_reorders_kill_removes_and_a_queue_survives_the_agent(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state, "--nvidia-smi", str(a100s(tmp_path / "bin") / "nvidia-smi"))
    try:
        hold = tmp_path / "hold"
        blocker = agent.call("jobs.start", argv=[sys.executable, "-c", f"import os,time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.05)"])["result"]
        ids = [agent.call("jobs.start", argv=["true"], name=f"q{n}", queue={"gpu_count": 1})["result"]["id"] for n in range(3)]
        listing = agent.call("queue.list")["result"]
        assert [(j["id"], j["queue_position"]) for j in listing["jobs"]] == [(ids[0], 1), (ids[1], 2), (ids[2], 3)]
        wait_for(lambda: "held by job" in (agent.call("queue.list")["result"]["jobs"][0]["queue_reason"]),
                 timeout=60, what="the scheduler's reason")
        assert agent.call("queue.list")["result"]["jobs"][0]["queue_reason"] == (
            f"needs 1 free GPU, 0 free; GPU 0 held by job {blocker['id']}; GPU 1 held by job {blocker['id']}"
        )
        moved = agent.call("queue.move", job=ids[2], to=1)["result"]
        assert [j["id"] for j in moved["jobs"]] == [ids[2], ids[0], ids[1]]
        removed = agent.call("jobs.kill", job=ids[0])["result"]
        assert (removed["state"], removed["error"], removed["started_at"]) == (
            "killed", "removed from the queue before it started", None
        )
        assert [j["id"] for j in agent.call("queue.list")["result"]["jobs"]] == [ids[2], ids[1]]
        assert "1 job" not in str(agent.call("metrics.sample", count_sessions=False)["result"]["activity"]["reasons"])
        agent.close()  # the client goes: the scheduler starts the rest when the blocker ends
        hold.touch()
        for jid in (ids[2], ids[1]):
            wait_for(lambda jid=jid: (state / "jobs" / jid / "status.json").exists(), timeout=60, what=f"job {jid}")
        assert not (state / "jobs" / ids[0] / "pid.json").exists()  # removed: never ran
        log = (state / daemon.LOG).read_text()  # picked in the new order (their runners, started in one pass, race)
        assert log.index(f"queue: starting job {ids[2]} ") < log.index(f"queue: starting job {ids[1]} ")
        assert f"queue: job {ids[2]} moved to position 1" in log and f"queue: job {ids[0]} removed" in log
    finally:
        agent.close()
        stop_host(state)


def test_a_crash_between_pick_and_start_neither_loses_nor_repeats_the_job(tmp_path: Path) -> None:
    from remote_agent.__main__ import launcher

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store)
    try:
        request = job_queue.parse_request({"gpus": None})
        jid = queue.submit(request, [sys.executable, "-c", "print('ran')"], None, None, "once", {}, "b")
        job_json = state / "jobs" / jid / "job.json"
        record = json.loads(job_json.read_text())
        record.update(dequeued_at=time.time() - 60, start_attempts=1)  # picked; the scheduler died before launch
        write_json(str(job_json), record)
        [job] = queue.queued()
        assert job["id"] == jid and job["state"] == "queued"
        assert queue.run_pass({"gpus": []}, store.list(), "b") == 1  # launched, not yet on record: stay for it
        wait_for(lambda: store.describe(jid)["state"] == "succeeded", timeout=30, what="the relaunched job")
        assert queue.run_pass({"gpus": []}, store.list(), "b") == 0  # ended: never launched again
        assert (state / "jobs" / jid / "output.log").read_bytes().count(b"ran") == 1
        assert json.loads(job_json.read_text())["start_attempts"] == 2
    finally:
        stop_host(state)


def test_a_job_picked_before_a_crash_can_still_be_removed(tmp_path: Path) -> None:
    from remote_agent.__main__ import launcher

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store)
    jid = queue.submit(job_queue.parse_request({"gpus": "none"}), ["true"], None, None, None, {}, "b")
    job_json = state / "jobs" / jid / "job.json"
    write_json(str(job_json), dict(json.loads(job_json.read_text()), dequeued_at=time.time() - 60, start_attempts=1))
    removed = queue.remove(jid, "removed from the queue before it started")
    assert removed is not None and removed["state"] == "killed"
    assert queue.run_pass({"gpus": []}, store.list(), "b") == 0
    assert not (state / "jobs" / jid / "pid.json").exists()


def test_a_remove_move_or_submit_while_a_pass_samples_is_not_undone(tmp_path: Path) -> None:
    """The scheduler lists the jobs before it takes the lock: what changed meanwhile wins."""
    from remote_agent.__main__ import launcher

    state = tmp_path / "state"
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store)
    try:
        req = job_queue.parse_request({"gpus": "none"})
        a, b, c = (queue.submit(req, ["true"], None, None, None, {}, "x") for _ in range(3))
        stale = store.list()  # the pass's listing ...
        queue.remove(a, "removed from the queue before it started")  # ... then the user acts
        queue.move(c, 1)
        d = queue.submit(job_queue.parse_request({"gpu_count": 1}), ["true"], None, None, None, {}, "x")
        assert queue.run_pass({"gpus": []}, stale, "x") == 3  # d waits (no GPU); b and c start (not yet on record)
        assert store.describe(a)["state"] == "killed" and not (state / "jobs" / a / "pid.json").exists()
        assert read_json(str(state / "jobs" / a / "job.json")).get("dequeued_at") is None
        assert [j["id"] for j in queue.queued()] == [d] and queue.state()["order"] == [d]
        assert [store.describe(j)["state"] != "queued" for j in (b, c)] == [True, True]
    finally:
        stop_host(state)


def test_after_a_reboot_the_queue_resumes_and_says_so(tmp_path: Path) -> None:
    from remote_agent.__main__ import launcher

    state = tmp_path / "state"
    lines: list[tuple[str, Any]] = []
    store = JobStore(str(state), launcher())
    queue = job_queue.JobQueue(store, lambda line: lines.append((line, queue.state().get("resumed_at"))))
    jid = queue.submit(job_queue.parse_request({"gpu_count": 1}), ["true"], None, None, None, {}, "boot-1")
    assert queue.run_pass({"gpus": []}, store.list(), "boot-2") == 1
    [(said, resumed_at)] = [(line, at) for line, at in lines if "resumed" in line]
    assert said == "queue resumed after a reboot: 1 job waiting" and resumed_at  # recorded before it is said
    assert queue.state()["resumed_at"] and queue.queued()[0]["id"] == jid


def test_after_a_reboot_the_next_connect_restarts_the_scheduler(tmp_path: Path) -> None:
    """The watchdog is gone (as after a reboot) and the queue file is of another boot: the next agent starts
    the scheduler again, which says the queue resumed."""
    import signal

    state = tmp_path / "state"
    agent = AgentProc(state, "--nvidia-smi", fake_smi(tmp_path, H100, "load"))
    try:
        jid = agent.call("jobs.start", argv=["true"], queue={"gpu_count": 1})["result"]["id"]  # gpu_burn: waits
        wait_for(lambda: "used by pid" in str(agent.call("queue.list")["result"]["jobs"][0]["queue_reason"]),
                 timeout=60, what="the scheduler's first pass")
        agent.close()
        pid = int((state / daemon.LOG).read_text().split("started (pid ")[1].split(")")[0])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(),
                 what="the scheduler to be gone")
        saved = read_json(str(state / job_queue.QUEUE))
        write_json(str(state / job_queue.QUEUE), dict(saved, boot_id="the-boot-before"))
        agent = AgentProc(state)  # the next connect
        wait_for(lambda: "queue resumed after a reboot: 1 job waiting" in (state / daemon.LOG).read_text(), timeout=60,
                 what="the resumed scheduler")
        listing = agent.call("queue.list")["result"]
        assert [j["id"] for j in listing["jobs"]] == [jid] and listing["resumed_at"] is not None
    finally:
        agent.close()
        stop_host(state)


def test_the_queue_file_is_bounded_and_a_lost_order_loses_no_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from remote_agent.__main__ import launcher
    from remote_agent.jobs.store import JobError

    monkeypatch.setattr(job_queue, "MAX_QUEUED", 3)
    store = JobStore(str(tmp_path / "state"), launcher())
    queue = job_queue.JobQueue(store)
    ids = [queue.submit(job_queue.parse_request({}), ["true"], None, None, None, {}, "b") for _ in range(3)]
    with pytest.raises(JobError, match="the queue is full"):
        queue.submit(job_queue.parse_request({}), ["true"], None, None, None, {}, "b")
    queue.move(ids[2], 1)
    (tmp_path / "state" / job_queue.QUEUE).write_text("{garbage")
    assert [j["id"] for j in queue.queued()] == ids  # back to submission order, none lost


def test_autostop_does_not_release_while_the_queue_is_not_empty(tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    config = {"autostop_minutes": 1, "armed_at": 0.0, "boot_id": "b", "count_sessions": False,
              "release_remote": ["touch", str(stopped)]}
    write_json(str(tmp_path / daemon.CONFIG), config)
    dog = daemon.Watchdog(str(tmp_path))
    sample = sample_of(tmp_path, str(a100s(tmp_path / "bin") / "nvidia-smi"))
    facts = {"boot_id": "b", "boot_time": 0.0}
    waiting = [queued("4", gpu_count=2, after=["3"]), ended("3", "failed", 1)]
    for t in (0, 61, 200, 400):
        state = dog.check(config, facts, lambda: (sample, waiting), now=T + t, mono=t)
        assert state["reasons"] == ["1 job queued (4)"] and state["action"] is None
    assert not stopped.exists()
    for t in (401, 4100, 530):  # the queue emptied: the idle window starts again and runs out
        state = dog.check(config, facts, lambda: (sample, waiting[1:]), now=T + t, mono=t)
    assert state["action"] == "released" and stopped.exists()
    log = (tmp_path / daemon.LOG).read_text()
    assert "autostop waits: 1 job queued (4)" in log and "the queue is empty: it no longer holds autostop" in log


# --- over the real sshd, with the client gone ----------------------------------------------------------------------
def test_two_2_gpu_jobs_run_one_after_the_other_with_the_client_gone(ssh_home: SshHome, tmp_path: Path) -> None:
    """A host with two recorded A100s (its PATH finds the stand-in): the CLI queues two jobs that each want both
    GPUs and exits; the host's scheduler starts the second when the first ends, with nobody connected."""
    bin_dir = a100s(tmp_path / "a100-bin")
    ssh_home.sshd.client_key("a100x2", f"{bin_dir}:{SYSTEM_PATH}")
    ssh_home.configure(key="a100x2")
    go = tmp_path / "go"
    code = f"import os,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint(os.environ['CUDA_VISIBLE_DEVICES'])"
    first = ssh_home.cli("run", "box", "--queue", "--gpus", "2", "--", "python3", "-c", code, check=True)
    second = ssh_home.cli("run", "box", "--queue", "--gpus", "2", "--", "python3", "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])", check=True)
    one, two = first.stdout.strip(), second.stdout.strip()
    assert f"job {two} queued on box at position" in second.stderr
    remote = ssh_home.remote_dir / "jobs"
    wait_for(lambda: (remote / one / "pid.json").exists(), timeout=60, what="the first job to start")
    listing = json.loads(ssh_home.cli("queue", "box", "--json", check=True).stdout)
    assert [(j["position"], j["id"], j["gpus"]) for j in listing["jobs"]] == [(1, two, "2")]
    wait_for(lambda: "held by job" in (json.loads(ssh_home.cli("queue", "box", "--json").stdout)["jobs"][0]["waits_for"] or ""),
             timeout=60, what="the scheduler's reason")
    why = json.loads(ssh_home.cli("queue", "box", "--json", check=True).stdout)["jobs"][0]["waits_for"]
    assert why == f"needs 2 free GPUs, 0 free; GPU 0 held by job {one}; GPU 1 held by job {one}"
    [waiting] = [j for j in json.loads(ssh_home.cli("jobs", "box", "--json", check=True).stdout) if j["id"] == two]
    assert (waiting["state"], waiting["queue_position"], waiting["queue_reason"]) == ("queued", 1, why)
    assert not (remote / two / "pid.json").exists()
    go.touch()  # no client is connected now: the scheduler alone starts job two
    wait_for(lambda: (remote / two / "status.json").exists(), timeout=90, what="the second job to run and end")
    ended_one, ended_two = (read_json(str(remote / j / "status.json")) for j in (one, two))
    assert ended_two["exit_code"] == 0, (ended_two, (ssh_home.remote_dir / daemon.LOG).read_text())
    started_two = read_json(str(remote / two / "pid.json"))
    assert started_two["started_at"] >= ended_one["ended_at"]
    for jid in (one, two):
        assert (remote / jid / "output.log").read_bytes().strip() == b"0,1"
    jobs = json.loads(ssh_home.cli("jobs", "box", "--json", check=True).stdout)
    assert [(j["id"], j["state"]) for j in jobs] == [(one, "succeeded"), (two, "succeeded")]
    assert f"queue: starting job {two} on GPU 0,1" in (ssh_home.remote_dir / daemon.LOG).read_text()


def test_after_ok_on_a_failed_job_never_starts_and_says_why(home: Home) -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    failed = home.cli("run", "local", "--", sys.executable, "-c", "raise SystemExit(3)", check=True).stdout.strip()
    wait_for(lambda: (home.job_dir(failed) / "status.json").exists(), timeout=30, what="the job to fail")
    res = home.cli("run", "local", "--after-ok", failed, "--", "touch", str(home.root / "ran"), check=True)
    jid = res.stdout.strip()
    wait_for(lambda: (home.job_dir(jid) / "status.json").exists(), timeout=60, what="the queue's verdict")
    [job] = [j for j in json.loads(home.cli("jobs", "local", "--json", check=True).stdout) if j["id"] == jid]
    assert job["state"] == "failed" and job["started_at"] is None
    assert job["error"] == f"never started: job {failed} it waits for (--after-ok) ended failed (exit 3)"
    assert not (home.root / "ran").exists()
    assert json.loads(home.cli("queue", "local", "--json", check=True).stdout)["jobs"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--after", "x"], "--after/--after-ok 'x': expected job ids"),
        (["--queue", "--gpus", "0"], "--gpus 0 with --queue: a bare number is a GPU count"),
        (["--after", "99"], "no job 99 on this host to wait for"),
        (["--after", *map(str, range(1, 52))], "--after: at most 50 job ids, not 51"),
    ],
)
def test_bad_queue_requests_are_clear_errors(home: Home, args: list[str], message: str) -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    res = home.cli("run", "local", *args, "--", "true")
    assert res.returncode != 0 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = home.cli("queue", "local", "--move", "3")
    assert res.returncode == 2 and "--move ID and --to N go together" in res.stderr



def test_release_refuses_while_a_job_waits_in_the_queue(home: Home, tmp_path: Path) -> None:
    """A queued job would be lost with the host: release names it and wants --force, like a running one."""
    gone = tmp_path / "gone"
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
                      f'release = ["touch", "{gone}"]\n')
    fake_smi(tmp_path, H100, "load")  # the host's one GPU runs gpu_burn: the job waits
    home.env["PATH"] = f"{tmp_path}:{home.env['PATH']}"
    jid = home.cli("run", "local", "--queue", "--gpus", "1", "--", "true", check=True).stdout.strip()
    res = home.cli("release", "local", "--yes")
    assert res.returncode == 1 and f"running jobs: {jid} (true)" in res.stderr and "--force" in res.stderr
    assert not gone.exists()


def test_logs_follow_of_a_queued_job_waits_for_it_to_run_and_end(home: Home, tmp_path: Path) -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    go = tmp_path / "go"
    home.cli("run", "local", "--", sys.executable, "-c",
             f"import os,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)", check=True)
    jid = home.cli("run", "local", "--queue", "--", sys.executable, "-c", "print('from the queue'); raise SystemExit(4)",
                   check=True).stdout.strip()
    follow = subprocess.Popen([sys.executable, "-m", "gputui", "logs", "local", jid, "-f"], env=home.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "running" in home.cli("jobs", "local").stdout, what="the blocker to run")
        assert follow.poll() is None  # still waiting: the job has not even started
        go.touch()
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert (follow.returncode, out) == (4, "from the queue\n"), err


def test_cli_queue_move_and_kill(home: Home, tmp_path: Path) -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    go = tmp_path / "go"
    home.cli("run", "local", "--", sys.executable, "-c",
             f"import os,time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)", check=True)
    a, b = (home.cli("run", "local", "--queue", "--name", n, "--", "true", check=True).stdout.strip() for n in "ab")
    moved = home.cli("queue", "local", "--move", b, "--to", "1", check=True).stdout.splitlines()
    assert moved[0].split() == ["POS", "ID", "GPUS", "NAME", "WAITS", "FOR"]
    assert [line.split()[:4] for line in moved[1:]] == [["1", b, "all", "b"], ["2", a, "all", "a"]]
    res = home.cli("kill", "local", a, "--yes", check=True)
    assert res.stdout.strip() == f"job {a} on local: removed from the queue (it never started)"
    assert [j["id"] for j in json.loads(home.cli("queue", "local", "--json", check=True).stdout)["jobs"]] == [b]
    res = home.cli("queue", "local", "--move", a, "--to", "1")
    assert res.returncode == 5 and f"job {a} is not queued on local" in res.stderr
    go.touch()


def test_a_queue_bigger_than_a_frame_is_listed_in_part_and_says_how_much_is_left(home: Home, tmp_path: Path) -> None:
    """100 queued jobs with commands of 5000 emoji (cut to 4 K characters for listings: 49 KB of JSON each) make
    more than one reply frame holds: the listing shows the first ones in order and counts the rest, instead of
    failing."""
    agent = AgentProc(home.state_dir)
    try:
        hold = tmp_path / "hold"
        blocker = agent.call("jobs.start", argv=[sys.executable, "-c", f"import os,time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.05)"])["result"]
        after = {"after": [blocker["id"]]}
        ids = [agent.call("jobs.start", argv=["echo", str(n), "\U0001f600" * 5000], queue=after)["result"]["id"]
               for n in range(100)]
        listing = agent.call("queue.list")
        assert "error" not in listing, listing.get("error")
        shown = [j["id"] for j in listing["result"]["jobs"]]
        assert 0 < len(shown) < 100 and shown == ids[: len(shown)] and listing["result"]["more"] == 100 - len(shown)
    finally:
        agent.close()
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    out = json.loads(home.cli("queue", "local", "--json", check=True).stdout)
    assert [j["id"] for j in out["jobs"]] == shown and out["more"] == 100 - len(shown)
    res = home.cli("queue", "local", check=True)
    assert res.stdout.splitlines()[-1] == f"... and {100 - len(shown)} more queued jobs (not listed)"


def test_a_damaged_queued_job_fails_alone_and_the_queue_goes_on(tmp_path: Path) -> None:
    """A job.json whose queue request cannot be read (edited by hand, written by another gputui version) fails
    that job with the reason; it never stops the scheduler (nor, with it, autostop) for every other job."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        hold = tmp_path / "hold"
        blocker = agent.call("jobs.start", argv=[sys.executable, "-c", f"import os,time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.05)"])["result"]
        after = {"gpus": "none", "after": [blocker["id"]]}
        bad, good = (agent.call("jobs.start", argv=["true"], queue=after)["result"]["id"] for _ in range(2))
        path = str(state / "jobs" / bad / "job.json")
        write_json(path, dict(read_json(path), queue=dict(read_json(path)["queue"], gpus=5, idle_util_percent="x")))
        hold.touch()
        wait_for(lambda: (state / "jobs" / good / "status.json").exists(), timeout=60, what="the good job to run")
        record = agent.call("jobs.get", job=bad)["result"]
        assert record["state"] == "failed" and "queue request" in record["error"], record
        assert not (state / "jobs" / bad / "pid.json").exists()
    finally:
        agent.close()
        stop_host(state)


def test_a_failing_queue_pass_never_ends_the_watchdog(tmp_path: Path) -> None:
    """queue.json cannot be written (a full disk, here a directory in its place) while no client is connected:
    the watchdog says so once and goes on (its autostop with it); the queue resumes when the disk does."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    hold = tmp_path / "hold"
    wait_py = [sys.executable, "-c", f"import os,time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.05)"]
    try:
        blocker = agent.call("jobs.start", argv=wait_py)["result"]
        first = agent.call("jobs.start", argv=["true"], queue={"gpus": "none", "after": [blocker["id"]]})["result"]
        last = agent.call("jobs.start", argv=["true"], queue={"gpus": "none", "after": [first["id"]]})["result"]
        agent.close()
        queue_file = state / job_queue.QUEUE
        queue_file.unlink()
        queue_file.mkdir()
        wait_for(lambda: "queue pass failed" in (state / daemon.LOG).read_text() or "Traceback" in (state / daemon.LOG).read_text(),
                 timeout=60, what="a failing pass")
        queue_file.rmdir()
        hold.touch()
        wait_for(lambda: (state / "jobs" / last["id"] / "status.json").exists(), timeout=60, what="the queue to go on")
        assert (state / daemon.LOG).read_text().count("queue pass failed") == 1
    finally:
        agent.close()
        stop_host(state)


def test_a_request_the_host_can_never_meet_is_refused_at_once(tmp_path: Path, home: Home) -> None:
    """3 GPUs (or GPU 5) on a 2-GPU host would wait forever, keeping every free GPU from the jobs behind it
    and the host from autostop: refused when submitted, saying why; nothing is queued."""
    state = tmp_path / "state"
    agent = AgentProc(state, "--nvidia-smi", str(a100s(tmp_path / "bin") / "nvidia-smi"))
    try:
        for request, words in (({"gpu_count": 3}, "3 GPUs asked for, this host has 2 GPUs"),
                               ({"gpus": "0,5"}, "no GPU 5 on this host (it has 2 GPUs)")):
            reply = agent.call("jobs.start", argv=["true"], queue=request)
            assert "error" in reply and words in reply["error"]["message"], reply
        assert agent.call("queue.list")["result"]["jobs"] == []
        assert "error" not in agent.call("jobs.start", argv=["true"], queue={"gpu_count": 2})
    finally:
        agent.close()
        stop_host(state)
    # The CLI on a host without GPUs: a clear error, no traceback, nothing queued.
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    res = home.cli("run", "local", "--queue", "--gpus", "1", "--", "true")
    assert res.returncode != 0 and "this host has 0 GPUs" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert home.cli("queue", "local", check=True).stdout.strip() == "no queued jobs"


def test_the_watchdog_log_is_bounded(tmp_path: Path) -> None:
    """Months of queue, stall and notify lines: the log turns over at MAX_LOG_BYTES, the previous one kept."""
    log = tmp_path / daemon.LOG
    log.write_bytes(b"x" * 100 + b"\n" + b"old line\n" * (daemon.MAX_LOG_BYTES // 9))
    daemon.log_line(str(tmp_path), "queue: job 7 queued at position 1")
    assert log.stat().st_size < 200 and log.read_text().endswith("queue: job 7 queued at position 1\n")
    assert (tmp_path / (daemon.LOG + ".1")).read_bytes().startswith(b"x" * 100)
    for n in range(3 * daemon.MAX_LOG_BYTES // 40):
        daemon.log_line(str(tmp_path), f"queue: job {n} started")
    for path in (log, tmp_path / (daemon.LOG + ".1")):
        assert path.stat().st_size <= daemon.MAX_LOG_BYTES + 100


def test_jobs_picked_while_the_disk_is_full_run_once_and_the_queue_resumes_without_a_client(tmp_path: Path) -> None:
    """The state dir's disk full when the queue's jobs come up (a real ENOSPC: a small tmpfs, as root): no job
    runs before its start is on record, none runs twice, and the watchdog starts them once space returns, with
    no client connected."""
    disk = tmp_path / "disk"
    small_disk(disk, "4m")
    state, ledger, hold, passes = disk / "state", tmp_path / "ledger", tmp_path / "hold", tmp_path / "passes"
    smi = tmp_path / "smi" / "nvidia-smi"  # the A100 stand-in, counting the watchdog's passes (one reading each)
    smi.parent.mkdir()
    smi.write_text(f'#!/bin/sh\necho >> "{passes}"\nexec "{a100s(tmp_path / "bin") / "nvidia-smi"}" "$@"\n')
    smi.chmod(0o755)
    agent = AgentProc(state, "--nvidia-smi", str(smi))
    try:
        blocker = agent.call("jobs.start", argv=[sys.executable, "-c", f"import os,time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.05)"])["result"]
        after = {"gpus": "none", "after": [blocker["id"]]}
        ids = [agent.call("jobs.start", argv=["sh", "-c", f"echo q{n} >> {ledger}"], queue=after)["result"]["id"]
               for n in range(3)]
        agent.close()
        wait_for(lambda: (state / daemon.LOG).exists() and "started (pid" in (state / daemon.LOG).read_text(), what="the watchdog")
        # The blocker runs (its start on record) before the disk fills: a runner that cannot record runs nothing.
        wait_for(lambda: (read_json(str(state / "jobs" / blocker["id"] / "pid.json")) or {}).get("pid"),
                 what="the blocker to run")
        (disk / "room").write_bytes(bytes(256 * 1024))
        fill(disk / "filler")
        hold.touch()
        wait_for(lambda: (state / "jobs" / blocker["id"] / "status.json").exists(), what="the blocker to end")
        (disk / "room").unlink()  # a little room: enough for a job's small files, not under MIN_FREE_BYTES
        seen = passes.read_text().count("\n")
        wait_for(lambda: passes.read_text().count("\n") >= seen + 2, what="a pass on the full disk")
        assert not ledger.exists()  # nothing ran without room to record its start
        (disk / "filler").unlink()
        wait_for(lambda: all((state / "jobs" / j / "status.json").exists() for j in ids), timeout=60,
                 what="the queue to resume with no client")
        again = AgentProc(state, "--nvidia-smi", str(smi))  # a client connects: nothing is started again
        try:
            assert [j["state"] for j in again.call("jobs.list")["result"]["jobs"][1:]] == ["succeeded"] * 3
        finally:
            again.close()
        assert sorted(ledger.read_text().split()) == ["q0", "q1", "q2"]
        assert [read_json(str(state / "jobs" / j / "job.json"))["start_attempts"] for j in ids] == [1, 1, 1]
    finally:
        agent.close()
        stop_host(state)
        subprocess.run(["umount", "-l", str(disk)])


def fill(path: Path) -> None:
    """Write ``path`` until its disk is full (ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def test_a_runner_runs_nothing_it_cannot_record_nor_an_attempt_on_record_already(tmp_path: Path) -> None:
    """The job's start (pid.json) is on disk before the job runs: a runner that cannot write it (here a
    directory in its place) runs nothing, and one launched for an attempt already on record runs nothing."""
    store = JobStore(str(tmp_path / "state"), [sys.executable, "-m", "remote_agent"])
    ran = tmp_path / "ran"
    for blocked in (True, False):
        job_dir = Path(store.job_dir(store.create(["sh", "-c", f"echo x >> {ran}"])))
        if blocked:
            (job_dir / "pid.json").mkdir()
        else:
            write_json(str(job_dir / "pid.json"), {"pid": None, "runner_pid": 1, "attempt": 1, "started_at": T})
        runner = subprocess.run([sys.executable, "-m", "remote_agent", "runner", str(job_dir)], cwd=Path(__file__).parent.parent,
                                stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        assert not (job_dir / "status.json").exists() and not ran.exists(), runner.stderr


def test_a_lost_gpu_is_never_handed_to_a_queued_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 recorded A100s, GPU 2's handle fails: a 4-GPU job waits, saying why; a 3-GPU job gets the live three."""
    monkeypatch.setenv("FAKE_NVIDIA_SMI_NO_HANDLE", "2")
    sample = sample_of(tmp_path, str(a100s(tmp_path / "bin", 4) / "nvidia-smi"))
    assert [g["state"] for g in sample["gpus"]] == ["ok", "ok", "lost", "ok"]
    jobs = [queued("1", gpu_count=4)]
    assert job_queue.plan(jobs, jobs, sample, [])["wait"]["1"] == (
        "needs 4 free GPUs, 3 free; GPU 2 lost (Unable to determine the device handle for GPU 00000003:00:00.0: "
        "Unknown Error)"
    )
    jobs = [queued("2", gpu_count=3)]
    assert job_queue.plan(jobs, jobs, sample, [])["start"] == [("2", "0,1,3")]
    jobs = [queued("3", "2")]
    assert job_queue.plan(jobs, jobs, sample, [])["wait"]["3"].startswith("GPU 2 lost (")

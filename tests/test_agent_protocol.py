"""The agent's protocol edge: malformed frames get error replies (never a crash); silence ends the agent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import AgentProc, kill_tmux, wait_for

from remote_agent import protocol as P


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        (b"this is not json\n", "malformed", "not a JSON line"),
        (b"[1, 2, 3]\n", "malformed", "not an object"),
        (b"\xff\xfe\n", "malformed", "not a JSON line"),
        (b'{"id": 5, "op": "rm -rf", "args": {}}\n', "unknown_op", "unknown operation"),
        (b'{"id": 6, "op": "jobs.start", "args": [1]}\n', "bad_args", "args must be an object"),
        (b'{"id": 7, "op": "logs.read", "args": {"job": "1", "offset": "x"}}\n', "bad_args", "offset must be an integer"),
        pytest.param(b"[" * 200_000 + b"]" * 200_000 + b"\n", "malformed", "nested too deeply", id="deep"),
        (b'{"id": 8, "op": "ping", "args": {"x": NaN}}\n', "malformed", "not a number JSON allows"),
        (b'{"id": 9, "op": "metrics.subscribe", "args": {"interval": 1e999}}\n', "malformed", "out of range"),
    ],
)
def test_malformed_frames_get_error_replies(agent: AgentProc, raw: bytes, code: str, words: str) -> None:
    agent.send_raw(raw)
    while True:
        frame = agent.next_frame()
        if "event" not in frame:
            break
    assert frame["ok"] is False and frame["error"]["code"] == code and words in frame["error"]["message"]
    assert agent.call("ping")["ok"]  # still serving


def test_oversized_frame_is_rejected_and_skipped(agent: AgentProc) -> None:
    agent.send_raw(b'{"id": 1, "pad": "' + b"x" * (P.MAX_FRAME_BYTES + 10) + b'"}\n')
    reply = agent.reply(1)  # answered under the id the frame starts with
    assert reply["error"]["code"] == "malformed" and "exceeds" in reply["error"]["message"]
    assert agent.call("ping")["ok"]


def test_agent_exits_when_client_goes_silent_and_jobs_keep_running(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state, "--idle-timeout", "1.5")
    try:
        marker = tmp_path / "alive"
        # counts until killed (a job that ended by itself would not show it kept running)
        code = f"import itertools, pathlib, time\nfor i in itertools.count():\n    pathlib.Path({str(marker)!r}).write_text(str(i)); time.sleep(0.1)"
        job = agent.call("jobs.start", argv=[sys.executable, "-c", code])["result"]
        wait_for(lambda: agent.proc.poll() is not None, timeout=20, what="agent exit on silence")
        assert agent.proc.returncode == 0
        seen = marker.read_text()
        wait_for(lambda: marker.read_text() != seen, what="job still running after the agent left")
        again = AgentProc(state)
        [listed] = again.call("jobs.list")["result"]["jobs"]
        assert listed["id"] == job["id"] and listed["state"] == "running"
        again.call("jobs.kill", job=job["id"], grace_s=1)
        again.close()
    finally:
        agent.close()
        kill_tmux(state)


def test_agent_exits_when_stdin_closes(agent: AgentProc) -> None:
    assert agent.proc.stdin
    agent.proc.stdin.close()
    assert agent.proc.wait(timeout=60) == 0  # a clean exit (the bound only guards against a hang)


def test_metrics_subscription_pushes_samples(agent: AgentProc) -> None:
    rep = agent.call("metrics.subscribe", interval=0.2)
    assert rep["ok"]
    seqs = [agent.wait_event("metrics")["data"]["seq"] for _ in range(3)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    sample = agent.wait_event("metrics")["data"]
    assert sample["host"]["cpu_count"] >= 1 and "activity" in sample
    assert json.dumps(sample)  # plain JSON all the way


def test_a_job_that_ends_at_once_still_gets_its_end_event(agent: AgentProc) -> None:
    job = agent.call("jobs.start", argv=[sys.executable, "-c", "pass"])["result"]
    ended = agent.wait_event("job", id=job["id"], state="succeeded")
    assert ended["data"]["exit_code"] == 0


@pytest.mark.parametrize("interval", ["1e999", "inf", "nan", -1, 0, "soon", [1]])
def test_bad_metrics_interval_is_refused_and_metrics_keep_flowing(agent: AgentProc, interval: object) -> None:
    rep = agent.call("metrics.subscribe", interval=interval)
    assert not rep["ok"] and rep["error"]["code"] == "bad_args" and "interval" in rep["error"]["message"]
    assert agent.call("metrics.subscribe", interval=0.2)["ok"]
    seqs = [agent.wait_event("metrics")["data"]["seq"] for _ in range(2)]
    assert seqs[1] > seqs[0]  # the sampling and push threads are alive


@pytest.mark.parametrize(
    ("op", "args", "words"),
    [
        ("jobs.kill", {"job": "1", "grace_s": "inf"}, "grace_s"),
        ("host.exec", {"argv": ["true"], "timeout_s": "nan"}, "timeout_s"),
        ("watchdog.snooze", {"minutes": 1e300}, "minutes"),
        ("metrics.sample", {"idle_util_percent": "nan"}, "idle_util_percent"),
    ],
)
def test_non_finite_numbers_in_args_are_refused(agent: AgentProc, op: str, args: dict, words: str) -> None:
    if op == "jobs.kill":
        args["job"] = agent.call("jobs.start", argv=["sleep", "30"])["result"]["id"]
    rep = agent.call(op, **args)
    assert not rep["ok"] and rep["error"]["code"] == "bad_args" and words in rep["error"]["message"], rep
    assert agent.call("ping")["ok"]

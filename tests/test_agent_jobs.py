"""Jobs through the real agent and real tmux on a private socket."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AgentProc, kill_tmux, tmux_socket, wait_for


def start(agent: AgentProc, argv: list[str], **kw) -> dict:
    rep = agent.call("jobs.start", argv=argv, **kw)
    assert rep["ok"], rep
    return rep["result"]


def follow_all(agent: AgentProc, job_id: str, offset: int = 0, timeout: float = 60) -> tuple[bytes, dict]:
    """Follow a job's log until log_end; return every byte received and the end event's data."""
    rep = agent.call("logs.follow", job=job_id, offset=offset)
    assert rep["ok"], rep
    out = bytearray()
    cursor = offset
    while True:
        frame = agent.wait_event(("log", "log_end"), timeout, job=job_id)
        data = frame["data"]
        if frame["event"] == "log_end":
            assert data["offset"] == cursor
            return bytes(out), data
        assert data["offset"] == cursor, "chunks must be contiguous"
        chunk = base64.b64decode(data["b64"])
        out += chunk
        cursor += len(chunk)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_hello_reports_host_facts(agent: AgentProc) -> None:
    facts = agent.hello["data"]["host"]
    assert agent.hello["data"]["protocol"] == 1
    assert facts["cpu_count"] >= 1 and facts["boot_id"] and facts["boot_time"] > 0
    assert facts["tmux_version"] and facts["python"].count(".") == 2
    assert facts["tmux_socket"] == tmux_socket(agent.state_dir)


def test_job_succeeds_and_log_is_complete(agent: AgentProc) -> None:
    job = start(agent, py("print('hi'); import sys; print('err', file=sys.stderr)"), name="greeting")
    assert job["state"] == "running" and job["name"] == "greeting"
    out, end = follow_all(agent, job["id"])
    assert out.replace(b"\r\n", b"\n") == b"hi\nerr\n"
    assert end["job_state"] == "succeeded" and end["exit_code"] == 0
    [listed] = agent.call("jobs.list")["result"]["jobs"]
    assert (
        listed["state"] == "succeeded"
        and listed["exit_code"] == 0
        and listed["ended_at"] >= listed["started_at"]
    )


def test_nonzero_exit_is_failed(agent: AgentProc) -> None:
    job = start(agent, py("import sys; sys.exit(3)"))
    _, end = follow_all(agent, job["id"])
    assert (end["job_state"], end["exit_code"]) == ("failed", 3)


def test_missing_executable_fails_with_127(agent: AgentProc) -> None:
    job = start(agent, ["/nonexistent/prog", "x"])
    out, end = follow_all(agent, job["id"])
    assert end["exit_code"] == 127 and b"cannot start" in out


@pytest.mark.parametrize("argv", [["/etc/passwd"], ["/etc"]], ids=["not-executable", "directory"])
def test_found_but_not_executable_fails_with_126_like_a_shell(agent: AgentProc, argv: list[str]) -> None:
    shell = subprocess.run(["sh", "-c", 'exec "$0"', *argv], capture_output=True)
    job = start(agent, argv)
    out, end = follow_all(agent, job["id"])
    assert end["exit_code"] == shell.returncode == 126 and b"cannot start" in out


def test_kill_sends_sigint_first(agent: AgentProc, tmp_path) -> None:
    marker = tmp_path / "ready"
    code = (
        "import pathlib, time\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('got SIGINT', flush=True); raise\n"
    )
    job = start(agent, py(code))
    wait_for(marker.exists, what="job start")
    rep = agent.call("jobs.kill", job=job["id"], grace_s=5)
    assert rep["ok"], rep
    assert rep["result"]["state"] == "killed" and rep["result"]["exit_code"] == 130
    out, end = follow_all(agent, job["id"])
    assert b"got SIGINT" in out and end["job_state"] == "killed"


def test_kill_escalates_when_sigint_is_ignored(agent: AgentProc, tmp_path) -> None:
    marker = tmp_path / "ready"
    code = f"import signal, time, pathlib\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)\n"
    job = start(agent, py(code))
    wait_for(marker.exists, what="job start")
    rep = agent.call("jobs.kill", job=job["id"], grace_s=0.5)
    assert rep["result"]["state"] == "killed" and rep["result"]["exit_code"] == 128 + 15


def test_kill_of_ended_job_is_refused(agent: AgentProc) -> None:
    job = start(agent, py("pass"))
    follow_all(agent, job["id"])
    rep = agent.call("jobs.kill", job=job["id"])
    assert not rep["ok"] and "not running" in rep["error"]["message"]


def test_lost_after_tmux_server_dies(agent: AgentProc, tmp_path) -> None:
    marker = tmp_path / "ready"
    start(agent, py(f"import time, pathlib; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"))
    wait_for(marker.exists, what="job start")
    kill_tmux(agent.state_dir)
    wait_for(lambda: agent.call("jobs.list")["result"]["jobs"][0]["state"] == "lost", what="lost state")


def test_read_from_offset_returns_exactly_the_rest(agent: AgentProc) -> None:
    job = start(agent, py("import sys; sys.stdout.buffer.write(bytes(range(256)) * 40)"))
    full, _ = follow_all(agent, job["id"])
    assert len(full) >= 256 * 40
    for offset in (0, 1, 4095, len(full) - 1, len(full)):
        rep = agent.call("logs.read", job=job["id"], offset=offset)["result"]
        assert base64.b64decode(rep["b64"]) == full[offset:] and rep["size"] == len(full)
    rest, _ = follow_all(agent, job["id"], offset=1000)
    assert rest == full[1000:]


def test_tail_lines(agent: AgentProc) -> None:
    job = start(agent, py("for i in range(100): print(i)"))
    full, _ = follow_all(agent, job["id"])
    rep = agent.call("logs.read", job=job["id"], tail_lines=3)["result"]
    assert base64.b64decode(rep["b64"]) == b"97\r\n98\r\n99\r\n" and full.endswith(b"99\r\n")


HOSTILE = [
    "it's",
    'a "quoted"; rm -rf /',
    "$(touch PWNED)",
    "`id`",
    "line\nbreak",
    "-t",
    "=gputui-1",
    "é ü 日本",
]


def test_hostile_names_and_arguments_pass_through_untouched(agent: AgentProc, tmp_path) -> None:
    code = "import json, sys; sys.stdout.write(json.dumps(sys.argv[1:]))"
    job = start(agent, [*py(code), *HOSTILE], name='x"; $(reboot) \n\x1b[31m' + "n" * 500, cwd=str(tmp_path))
    assert "\n" not in job["name"] and "\x1b" not in job["name"] and len(job["name"]) <= 200
    out, end = follow_all(agent, job["id"])
    assert end["exit_code"] == 0
    # the pty turns \n into \r\n on output; the arguments themselves arrived byte-exact
    assert json.loads(out.decode()) == HOSTILE
    assert not (tmp_path / "PWNED").exists()


def test_non_utf8_output_is_byte_exact(agent: AgentProc) -> None:
    raw = b"\xff\xfe\x80 latin1 \xe9 cut utf8 \xe2\x82\n"
    job = start(agent, py(f"import sys; sys.stdout.buffer.write({raw!r})"))
    out, _ = follow_all(agent, job["id"])
    assert out == raw.replace(b"\n", b"\r\n")


def test_ten_megabyte_line(agent: AgentProc) -> None:
    job = start(agent, py("import sys; sys.stdout.write('x' * (10 * 1024 * 1024)); sys.stdout.flush()"))
    out, end = follow_all(agent, job["id"], timeout=120)
    assert end["exit_code"] == 0 and len(out) == 10 * 1024 * 1024 and set(out) == {ord("x")}


def test_env_cwd_gpus_and_unbuffered(agent: AgentProc, tmp_path) -> None:
    code = "import os; print(os.getcwd(), os.environ['FOO'], repr(os.environ.get('CUDA_VISIBLE_DEVICES')), os.environ['PYTHONUNBUFFERED'])"
    job = start(agent, py(code), cwd=str(tmp_path), env={"FOO": "b a r"}, gpus="1,3")
    out, _ = follow_all(agent, job["id"])
    assert out.decode().strip() == f"{tmp_path} b a r '1,3' 1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"argv": []}, "non-empty list"),
        ({"argv": "echo hi"}, "argv must be a list, not a string"),
        ({"argv": ["x\x00y"]}, "NUL"),
        ({"argv": ["true"], "cwd": "/no/such/dir"}, "does not exist"),
        ({"argv": ["true"], "gpus": "0;reboot"}, "GPU selection"),
        ({"argv": ["true"], "env": {"A=B": "c"}}, "env"),
        ({"argv": ["true"], "secrets": {"1X": "v"}}, "secret name '1X': use letters, digits and _"),
        ({"argv": ["true"], "secrets": {"X\n": "v"}}, "secret name 'X\\n': use letters, digits and _"),
        ({"argv": ["true"], "secrets": {"T": "a\x00b"}}, "secret T: its value must be a string of at most"),
        ({"argv": ["true"], "env": {"T": "a"}, "secrets": {"T": "b"}}, "T: given both as env and as a secret"),
    ],
)
def test_bad_job_requests_are_refused(agent: AgentProc, args: dict, message: str) -> None:
    rep = agent.call("jobs.start", **args)
    assert not rep["ok"] and rep["error"]["code"] == "bad_args" and message in rep["error"]["message"]


@pytest.mark.parametrize(
    ("op", "args", "message"),
    [
        ("jobs.start", {"argv": ["true"], "env": ["A=1"]}, "env must be an object, not a list"),
        ("jobs.start", {"argv": ["true"], "queue": {"after": [7]}}, "queue.after[0] must be a string, not an integer"),
        ("jobs.start", {"argv": ["true"], "slurm": {"gpus": "2"}}, "slurm.gpus must be an integer, not a string"),
        ("jobs.start", {"argv": ["true"], "code": 5}, "code must be an object, not an integer"),
        ("jobs.start", {"argv": ["true"], "secrets": {"T": 5}}, "secrets.T must be a string, not an integer"),
        ("jobs.kill", {"job": "1", "grace_s": "soon"}, "grace_s must be a number, not a string"),
        ("jobs.get", {"job": ["1"]}, "job must be a string, not a list"),
        ("jobs.list", {"after": True}, "after must be an integer, not true or false"),
        ("logs.read", {"job": "1", "offset": 1.5}, "offset must be an integer, not a number"),
        ("logs.tails", {"jobs": "1,2"}, "jobs must be a list, not a string"),
        ("metrics.subscribe", {"interval": "fast"}, "interval must be a number or null, not a string"),
        ("watchdog.configure", {"config": []}, "config must be an object, not a list"),
        ("queue.move", {"job": "1", "to": "top"}, "to must be an integer, not a string"),
        ("files.delete", {"target": "~/t", "rels": "a.py"}, "rels must be a list, not a string"),
        ("files.write", {"target": "~/t", "rel": "a", "commit": {"mode": "0644"}}, "commit.mode must be an integer, not a string"),
        ("files.list", {"patterns": [1]}, "patterns[0] must be a string, not an integer"),
        ("files.read", {"path": "/etc/hostname", "offset": "0"}, "offset must be an integer, not a string"),
    ],
)
def test_a_wrong_typed_field_is_bad_args_naming_it(agent: AgentProc, op: str, args: dict, message: str) -> None:
    rep = agent.call(op, **args)
    assert not rep["ok"] and rep["error"] == {"code": "bad_args", "message": f"bad arguments for {op}: {message}"}
    assert agent.call("jobs.list")["result"]["jobs"] == []  # nothing was started on the way


def test_the_jobs_table_shows_a_jobs_log_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The runner's "disk full at offset N" (the log stops there) is in the table, not only in jobs --json."""
    from gputui.core.session import model as M
    from gputui.tables import print_jobs

    wire = {"id": "3", "state": "failed", "exit_code": 7, "argv": ["python", "train.py"],
            "log_error": "disk full at offset 1048576"}
    print_jobs([M.Job.from_wire("gpu", wire), M.Job.from_wire("gpu", dict(wire, id="4", log_error=None))])  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[1:3]] == ["3", "4"]
    assert lines[3:] == ["  gpu 3 log: disk full at offset 1048576"]


def test_unknown_job(agent: AgentProc) -> None:
    for job in ("999", "../../etc", ""):
        rep = agent.call("logs.read", job=job)
        assert rep["error"]["code"] == "not_found", rep


def test_job_dir_is_private(agent: AgentProc) -> None:
    job = start(agent, py("pass"))
    follow_all(agent, job["id"])
    job_dir = agent.state_dir / "jobs" / job["id"]
    assert (agent.state_dir.stat().st_mode & 0o777) == 0o700
    assert (job_dir.stat().st_mode & 0o777) == 0o700
    for name in ("job.json", "env.json", "status.json", "output.log"):
        assert ((job_dir / name).stat().st_mode & 0o777) == 0o600, name


def test_tmux_session_is_exact_and_private(agent: AgentProc, tmp_path) -> None:
    marker = tmp_path / "ready"
    job = start(agent, py(f"import time, pathlib; pathlib.Path({str(marker)!r}).touch(); time.sleep(30)"))
    wait_for(marker.exists, what="job start")
    sock = tmux_socket(agent.state_dir)
    names = subprocess.run(
        ["tmux", "-L", sock, "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True
    )
    assert names.stdout.split() == [f"gputui-{job['id']}"]
    # Private: on the agent's own server, whose socket only this user can reach (tmux's per-user dir is 0700,
    # the socket itself 0660 at most); the user's default server has no job.
    server = Path(os.environ["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}"
    assert (server / sock).is_socket() and (server / sock).stat().st_mode & 0o007 == 0
    assert server.stat().st_mode & 0o777 == 0o700
    default = subprocess.run(["tmux", "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True)
    assert f"gputui-{job['id']}" not in default.stdout
    agent.call("jobs.kill", job=job["id"], grace_s=2)

"""One bad job never hangs or fails the host: logs that became dirs or FIFOs, deleted logs, a full disk."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AgentProc, Home, kill_tmux, wait_for

SLOW_READ_S = 10  # far more than a read of a tiny log takes, far less than the 30 s request timeout


def finished_job(home: Home, code: str = "print('hello')") -> str:
    res = home.cli("run", "local", "--", sys.executable, "-c", code, check=True)
    job_id = res.stdout.strip()
    home.cli("logs", "-f", "local", job_id)
    return job_id


def spoil(log: Path, kind: str) -> None:
    """Turn a job's output.log into a FIFO, a directory or a symlink to a file outside the state dir."""
    log.unlink()
    if kind == "fifo":
        os.mkfifo(log)
    elif kind == "dir":
        log.mkdir()
    else:
        outside = log.parent.parent.parent.parent / "outside.txt"
        outside.write_text("not the job's log\n")
        log.symlink_to(outside)


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink"])
def test_a_spoilt_log_is_that_jobs_error_and_nothing_hangs(home: Home, kind: str) -> None:
    good = finished_job(home, "print('fine')")
    bad = finished_job(home)
    spoil(home.job_dir(bad) / "output.log", kind)

    res = home.cli("logs", "local", bad, timeout=SLOW_READ_S)
    assert res.returncode != 0 and "output.log is a" in res.stderr and "not a regular file" in res.stderr
    res = home.cli("logs", "-f", "local", bad, timeout=SLOW_READ_S)
    assert res.returncode == 0 and "log unreadable" in res.stderr and res.stdout == ""

    for command in ("jobs", "history"):
        res = home.cli(command, "--json", timeout=SLOW_READ_S)
        assert res.returncode == 0, res.stderr
        listed = {j.get("id") or j.get("job"): j for j in json.loads(res.stdout)}
        assert set(listed) == {good, bad}, listed
    jobs = {j["id"]: j for j in json.loads(home.cli("jobs", "--json").stdout)}
    [hint] = jobs[bad]["insights"]["hints"]
    assert hint["code"] == "log_unreadable" and "not a regular file" in hint["line"]
    assert jobs[good]["insights"]["metrics"] == {} and jobs[good]["state"] == "succeeded"


def follow_until_end(agent: AgentProc, job_id: str) -> tuple[bytes, list[dict], dict]:
    """Bytes, notices (resets and errors) and the end event of a follow from offset 0."""
    assert agent.call("logs.follow", job=job_id, offset=0)["ok"]
    out, notices = bytearray(), []
    while True:
        frame = agent.wait_event(("log", "log_end"), 60, job=job_id)
        data = frame["data"]
        if frame["event"] == "log_end":
            return bytes(out), notices, data
        if data.get("reset") or data.get("error"):
            notices.append(data)
        out += base64.b64decode(data["b64"])


def test_follow_of_a_running_job_whose_log_becomes_a_dir_gets_a_notice_then_its_end(
    agent: AgentProc, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    code = f"import os, time\nprint('before', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nraise SystemExit(4)"
    job = agent.call("jobs.start", argv=[sys.executable, "-c", code])["result"]
    log = agent.state_dir / "jobs" / job["id"] / "output.log"
    wait_for(lambda: log.exists() and b"before" in log.read_bytes(), what="first output")
    assert agent.call("logs.follow", job=job["id"], offset=0)["ok"]
    first = agent.wait_event("log", job=job["id"])
    assert b"before" in base64.b64decode(first["data"]["b64"])
    spoil(log, "dir")
    # The gap and the notice come in either order: the follower may read the dir before it sees the swap.
    events = [agent.wait_event("log", job=job["id"])["data"] for _ in range(2)]
    [gap] = [e for e in events if "reset" in e]
    [notice] = [e for e in events if "error" in e]
    assert gap["reset"] in ("deleted", "replaced") and gap["lost_from"] == len(b"before\r\n")
    assert "output.log is a directory, not a regular file" in notice["error"]
    go.touch()
    end = agent.wait_event("log_end", 60, job=job["id"])["data"]
    assert end["exit_code"] == 4 and "not a regular file" in end["error"]


def test_deleting_the_log_while_following_is_a_gap_notice_not_a_silent_end(
    agent: AgentProc, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    code = (
        "import os, time\nprint('before', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('after', flush=True)"
    )
    job = agent.call("jobs.start", argv=[sys.executable, "-c", code])["result"]
    log = agent.state_dir / "jobs" / job["id"] / "output.log"
    wait_for(lambda: log.exists() and b"before" in log.read_bytes(), what="first output")
    assert agent.call("logs.follow", job=job["id"], offset=0)["ok"]
    first = agent.wait_event("log", job=job["id"])["data"]
    log.unlink()
    notice = agent.wait_event("log", job=job["id"])["data"]
    assert notice["reset"] == "deleted" and notice["lost_from"] == len(base64.b64decode(first["b64"]))
    go.touch()
    end = agent.wait_event("log_end", 60, job=job["id"])["data"]
    assert end["exit_code"] == 0 and end["job_state"] == "succeeded"


def test_follow_ends_with_an_error_when_the_whole_job_dir_is_deleted(
    agent: AgentProc, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    code = f"import os, time\nprint('before', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    job = agent.call("jobs.start", argv=[sys.executable, "-c", code])["result"]
    job_dir = agent.state_dir / "jobs" / job["id"]
    wait_for(lambda: (job_dir / "output.log").exists(), what="the log")
    assert agent.call("logs.follow", job=job["id"], offset=0)["ok"]
    agent.wait_event("log", job=job["id"])
    shutil.rmtree(job_dir)
    end = agent.wait_event("log_end", 60, job=job["id"])["data"]
    assert f"no job '{job['id']}'" in end["error"]
    go.touch()


def test_cli_follow_shows_the_deletion_as_a_gap(home: Home, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = (
        "import os, time\nprint('before', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('after', flush=True)"
    )
    job_id = home.cli("run", "local", "--", sys.executable, "-c", code, check=True).stdout.strip()
    log = home.job_dir(job_id) / "output.log"
    wait_for(lambda: log.exists() and b"before" in log.read_bytes(), what="first output")
    follow = subprocess.Popen(
        [sys.executable, "-m", "gputui", "logs", "-f", "local", job_id], env=home.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    try:
        assert follow.stdout is not None
        assert b"before" in follow.stdout.readline()
        log.unlink()
        wait_for(lambda: not log.exists(), what="deletion")
        go.touch()
        _, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0 and b"log deleted" in err


def small_disk(path: Path, size: str) -> None:
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)])
    if res.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs (a real full disk: ENOSPC)")


def test_full_disk_keeps_the_job_alive_and_records_why(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    small_disk(disk, "1m")
    state = disk / "state"
    marker = tmp_path / "wrote-all"
    code = (
        "import pathlib, sys\nline = b'x' * 1023 + b'\\n'\n"
        "for _ in range(3 * 1024): sys.stdout.buffer.write(line)\nsys.stdout.buffer.flush()\n"
        f"pathlib.Path({str(marker)!r}).touch()\nsys.exit(7)"
    )
    agent = AgentProc(state)
    try:
        job = agent.call("jobs.start", argv=[sys.executable, "-c", code])["result"]
        ended = agent.wait_event("job", 120, id=job["id"], state="failed")["data"]
        assert marker.exists()  # the job wrote its 3 MB and went on after the disk was full
        size = (state / "jobs" / job["id"] / "output.log").stat().st_size
        assert 0 < size < 1024 * 1024
        assert ended["exit_code"] == 7 and ended["log_error"] == f"disk full at offset {size}"
        [listed] = agent.call("jobs.list")["result"]["jobs"]
        assert listed["log_error"] == ended["log_error"]
    finally:
        agent.close()
        kill_tmux(state)
        subprocess.run(["umount", "-l", str(disk)])
        shutil.rmtree(disk, ignore_errors=True)

"""Notifications against hostile endpoints and a job's secrets: a webhook that drips bytes forever, one that
redirects the POST elsewhere, and a job started without a name whose command line carries a password.

The endpoints are real TCP servers on 127.0.0.1 speaking raw bytes, so the test controls every byte's timing.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, Home, stop_host, wait_for
from test_notify import Hook, hook  # noqa: F401  (the fixture)

from remote_agent.fsutil import write_json
from remote_agent.watchdog import daemon
from remote_agent.watchdog import notify as notifier

T = 1_000_000.0
FACTS = {"boot_id": "b", "boot_time": 0.0}
SECRET = "hunter2-secret"


class Raw:
    """A TCP endpoint that reads each request's head, then answers with ``reply(conn)``; counts connections
    and how many are open now (a drip holds its connection until the client gives up or the test ends)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.open = 0
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self.lock:
            self.open += 1
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            self.requests.append(head)
            self.reply(self, conn)
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.closing.set()
        self.sock.close()


def drip(server: Raw, conn: socket.socket) -> None:
    """A status line one byte at a time, a byte every 0.2 s, for as long as the client listens."""
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10**6:
        if server.closing.wait(0.2):
            return
        conn.sendall(bytes([byte]))


@pytest.fixture
def dripping() -> Iterator[Raw]:
    server = Raw(drip)
    yield server
    server.close()


def hang(server: Raw, conn: socket.socket) -> None:
    """Read the request, never answer."""
    server.closing.wait(120)


@pytest.mark.parametrize("reply", [drip, hang], ids=["drip", "hang"])
def test_a_slow_webhook_is_cut_at_the_deadline_with_a_clear_error(reply: Any) -> None:
    server = Raw(reply)
    try:
        problem = notifier.deliver({"webhook": server.url, "ntfy": "t", "ntfy_server": server.url}, "test", "hi", 1.0)
        assert problem == "ntfy did not answer within 1 s; webhook did not answer within 1 s"
        if reply is drip:  # the sender closed its end: the dripping server notices
            wait_for(lambda: server.open == 0, what="the sender to close the dripping connection")
    finally:
        server.close()


def test_the_watchdog_pass_never_waits_for_a_send(tmp_path: Path, dripping: Raw) -> None:
    """The pass hands the message to the sender and returns while the endpoint still drips."""
    config = {"boot_id": "b", "armed_at": T, "count_sessions": False,
              "notify": {"webhook": dripping.url, "events": ["job_failed"], "host": "gpu1"}}
    write_json(str(tmp_path / daemon.CONFIG), config)
    failed = {"id": "4", "name": "train", "argv": ["python"], "state": "failed", "exit_code": 1, "ended_at": T + 1}
    dog = daemon.Watchdog(str(tmp_path))
    dog.check(config, FACTS, lambda: ({"gpus": []}, [failed]), now=T + 2, mono=0)
    wait_for(lambda: dripping.requests, what="the POST to reach the endpoint")
    assert dog.notifier.sender.pending("job_failed:4:%s" % (T + 1))  # still sending: the pass did not wait
    assert dog.notifier.sender.wait(3 * notifier.TIMEOUT_S)  # and the send ends at its deadline
    dog.notifier.collect()
    log = (tmp_path / daemon.LOG).read_text()
    assert "attempt 1 failed (webhook did not answer within 10 s); retrying in 5 s" in log


def test_a_dripping_webhook_does_not_hold_up_the_hosts_queue(tmp_path: Path, dripping: Raw) -> None:
    """With the watchdog posting to an endpoint that never finishes answering, a queued job still starts."""
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        settings = {"webhook": dripping.url, "events": ["job_failed"], "host": "gpu1"}
        assert agent.call("watchdog.configure", config={"notify": settings, "interval": 0.5})["result"]["armed"]
        agent.call("jobs.start", argv=[sys.executable, "-c", "raise SystemExit(3)"], name="boom")
        wait_for(lambda: dripping.requests, timeout=60, what="the job_failed POST to start dripping")
        queued = agent.call("jobs.start", argv=[sys.executable, "-c", "print(1)"], queue={"gpus": "none"})["result"]
        assert queued["state"] == "queued"

        def state_of() -> str:
            return str(agent.call("jobs.get", job=queued["id"])["result"]["state"])

        wait_for(lambda: state_of() == "succeeded", timeout=60, what="the queued job to run while the hook drips")
    finally:
        agent.close()
        stop_host(state)


def drip_body(server: Raw, conn: socket.socket) -> None:
    """A 2xx status and headers at once, then the body a byte every 0.2 s, for as long as the client listens."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    while not server.closing.wait(0.2):
        conn.sendall(b"a")


@pytest.mark.parametrize(
    ("reply", "sent"), [(drip_body, True), (drip, False), (hang, False)], ids=["body drips", "status drips", "hang"]
)
def test_notify_test_is_sent_on_a_2xx_status_and_fails_without_one_within_its_deadline(
    home: Home, reply: Any, sent: bool
) -> None:
    """A 2xx status within the deadline is a delivery (the body is never read: it may drip forever); a status
    line and headers that do not arrive whole within it (dripping, or never sent) fail with the deadline."""
    server = Raw(reply)
    try:
        home.write_config(
            f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
            f'[hosts.local.notify]\nwebhook = "{server.url}"\n'
        )
        res = home.cli("notify", "local", "--test", timeout=120)
        if sent:
            assert res.returncode == 0 and "local: test notification sent" in res.stdout, res.stderr
            wait_for(lambda: server.open == 0, what="the sender to close the connection whose body drips")
        else:
            assert res.returncode == 1, (res.returncode, res.stderr)
            assert "test notification failed: webhook did not answer within 10 s" in res.stderr
    finally:
        server.close()


def redirect_to(target: str) -> Any:
    def reply(server: Raw, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % target.encode())

    return reply


def test_a_redirect_is_never_followed_for_a_post(hook: Hook) -> None:  # noqa: F811
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    elsewhere = Raw(lambda server, conn: conn.sendall(ok))  # stands for another host: it must get no request
    redirecting = Raw(redirect_to(elsewhere.url))
    try:
        problem = notifier.deliver({"webhook": redirecting.url}, "test", "hello")
        assert problem == (
            f"webhook answered HTTP 302, a redirect to {elsewhere.url}: not followed (a POST is never redirected)"
        )
        assert len(redirecting.requests) == 1 and redirecting.requests[0].startswith(b"POST /hook ")
        assert elsewhere.requests == []
    finally:
        redirecting.close()
        elsewhere.close()


# --- a job's command line never reaches a notification ------------------------------------------------------------
def test_no_notification_kind_carries_the_command_line(tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    """A job started without a name is named after its command (``--password=...``): every event kind that
    names a job says its id, never that name; a name the user gave is kept."""
    argv = ["python3", "train.py", f"--password={SECRET}"]
    unnamed = {"argv": argv, "name": " ".join(argv), "exit_code": 3, "started_at": T - 60, "ended_at": T + 1,
               "queue": {"gpus": None}, "dequeued_at": T + 0.5}
    jobs = [dict(unnamed, id=str(i), state=s) for i, s in enumerate(("succeeded", "failed", "killed", "lost"), 1)]
    named = dict(unnamed, id="9", state="failed", name="resnet run")
    cut = dict(unnamed, id="10", state="failed", argv=["python3", "train.py", "... [command cut for listing]"],
               argv_truncated={"args": 3, "chars": 40})
    events = list(notifier.EVENTS)
    config = {"boot_id": "b", "armed_at": T, "count_sessions": False, "idle_minutes": None,
              "notify": {"webhook": hook.url, "events": events, "host": "gpu1", "idle_minutes": 0.01}}
    write_json(str(tmp_path / daemon.CONFIG), config)
    dog = daemon.Watchdog(str(tmp_path))
    for t in (2, 3, 4):  # at most MAX_PER_PASS sends are outstanding: three passes send them all
        dog.check(config, FACTS, lambda: ({"gpus": []}, [*jobs, named, cut]), now=T + t, mono=t)
        assert dog.notifier.sender.wait(30)
    texts = [b["text"] for b in hook.bodies]
    assert SECRET not in json.dumps(hook.bodies) and "train.py" not in json.dumps(hook.bodies)
    assert "[gpu1] job 2 failed (exit 3)" in texts and "[gpu1] job 9 resnet run failed (exit 3)" in texts
    assert "[gpu1] job 4 lost" in texts and "[gpu1] job 10 failed (exit 3)" in texts
    assert "[gpu1] the queue is empty (last job: 10)" in texts


def test_a_job_without_a_name_is_posted_by_id_from_the_real_watchdog(tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        settings = {"webhook": hook.url, "events": ["job_failed"], "host": "gpu1"}
        assert agent.call("watchdog.configure", config={"notify": settings, "interval": 0.5})["result"]["armed"]
        code = "import sys; raise SystemExit(3)"
        job = agent.call("jobs.start", argv=[sys.executable, "-c", code, f"--password={SECRET}"])["result"]
        wait_for(lambda: hook.bodies, timeout=60, what="the job_failed POST")
        assert [b["text"] for b in hook.bodies] == [f"[gpu1] job {job['id']} failed (exit 3)"]
    finally:
        agent.close()
        stop_host(state)

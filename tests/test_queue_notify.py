"""Notifications of the queue and the host: queue empty, host idle for N minutes, deadline in an hour (each once),
and the ntfy topic shorthand; a real HTTP server on 127.0.0.1 captures what the host's watchdog sends."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, stop_host, wait_for
from test_notify import Hook, checked, hook  # noqa: F401  (the fixture)

from remote_agent.fsutil import write_json
from remote_agent.watchdog import daemon

T = 1_000_000.0
FACTS = {"boot_id": "b", "boot_time": 0.0}


class Ntfy:
    """An ntfy server stand-in: records (path, content type, body) of each POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, str]] = []
        box = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                box.posts.append((self.path, self.headers["Content-Type"], body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def ntfy() -> Iterator[Ntfy]:
    n = Ntfy()
    yield n
    n.server.shutdown()
    n.server.server_close()


def _config(tmp_path: Path, **notify: Any) -> dict[str, Any]:
    config = {"boot_id": "b", "armed_at": T, "count_sessions": False, "notify": dict({"host": "gpu1"}, **notify)}
    write_json(str(tmp_path / daemon.CONFIG), config)
    return config


def test_queue_empty_is_sent_once_when_the_last_queued_job_leaves(tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    config = _config(tmp_path, webhook=hook.url, events=["queue_empty"])
    dog = daemon.Watchdog(str(tmp_path))
    picked = {"id": "7", "state": "running", "queue": {"gpus": None}, "dequeued_at": T + 5}
    waiting = {"id": "8", "state": "queued", "queue": {"gpus": None}}
    checked(dog, config, lambda: ({"gpus": []}, [picked, waiting]), 6)
    assert hook.bodies == []  # job 8 still waits
    done = [dict(picked, state="succeeded", ended_at=T + 9), dict(waiting, state="running", dequeued_at=T + 9)]
    for t in (10, 20, 30):
        checked(dog, config, lambda: ({"gpus": []}, done), t)
    assert [b["text"] for b in hook.bodies] == ["[gpu1] the queue is empty (last job: 8)"]


def test_idle_for_n_minutes_and_deadline_in_an_hour_are_sent_once(tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    config = _config(tmp_path, webhook=hook.url, events=["idle", "deadline_soon"], idle_minutes=2)
    config["release_at"] = T + 7200.0
    config["release_remote"] = ["true"]
    write_json(str(tmp_path / daemon.CONFIG), config)
    write_json(str(tmp_path / "activity.json"), {"last_busy": T, "boot_id": "b"})
    dog = daemon.Watchdog(str(tmp_path))
    idle = lambda: ({"gpus": []}, [])  # noqa: E731
    for t in (60, 119):
        checked(dog, config, idle, t)
    assert hook.bodies == []
    for t in (121, 300, 3599):
        checked(dog, config, idle, t)
    assert [b["text"] for b in hook.bodies] == ["[gpu1] host idle for 2 min"]
    for t in (3601, 3700, 5000):  # the deadline is an hour away or less from T + 3600
        checked(dog, config, idle, t)
    assert [b["event"] for b in hook.bodies] == ["idle", "deadline_soon"]
    assert hook.bodies[1]["text"] == "[gpu1] deadline releases the host in 60 min"


def test_a_deadline_past_when_set_is_announced_at_once_with_its_grace(tmp_path: Path, hook: Hook) -> None:  # noqa: F811
    config = _config(tmp_path, webhook=hook.url, events=["deadline_soon"])
    config.update(release_at=T - 3600.0, release_remote=["true"])
    write_json(str(tmp_path / daemon.CONFIG), config)
    checked(daemon.Watchdog(str(tmp_path)), config, lambda: ({"gpus": []}, []), 1)
    assert [b["text"] for b in hook.bodies] == ["[gpu1] deadline releases the host in 10 min"]


def test_ntfy_topic_gets_the_plain_text(agent: AgentProc, ntfy: Ntfy) -> None:
    reply = agent.call("notify.test", notify={"ntfy": "gputui-runs", "ntfy_server": ntfy.url, "host": "gpu1"})
    assert reply["result"] == {"sent": True, "error": None}
    assert ntfy.posts == [("/gputui-runs", "text/plain; charset=utf-8", "[gpu1] test message from gputui")]
    bad = agent.call("notify.test", notify={"ntfy": "no/slash"})
    assert bad["ok"] is False and "topic name" in bad["error"]["message"]


def test_queue_empty_fires_from_the_host_with_no_client(tmp_path: Path, ntfy: Ntfy) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        settings = {"ntfy": "runs", "ntfy_server": ntfy.url, "events": ["queue_empty", "job_succeeded"], "host": "gpu1"}
        assert agent.call("watchdog.configure", config={"notify": settings, "interval": 0.5})["result"]["armed"]
        job = agent.call("jobs.start", argv=[sys.executable, "-c", "print(1)"], queue={"gpus": "none"})["result"]
        assert job["state"] == "queued"
        agent.close()
        wait_for(lambda: len(ntfy.posts) >= 2, timeout=60, what="the queue_empty and job_succeeded posts")
        texts = sorted(body for _, _, body in ntfy.posts)
        assert texts == [f"[gpu1] job {job['id']} succeeded (exit 0)",  # no name given: never its command
                         f"[gpu1] the queue is empty (last job: {job['id']})"]
    finally:
        agent.close()
        stop_host(state)


def test_ntfy_idle_minutes_and_the_new_events_in_the_config(tmp_path: Path) -> None:
    from gputui.core.config.file import ConfigError, parse
    from gputui.core.money import autostop

    text = '[notify]\nntfy = "my-runs"\nidle_minutes = 30\nevents = ["queue_empty", "idle", "deadline_soon"]\n'
    host = parse(text + '[hosts.a]\nhost = "a"\n', tmp_path / "c.toml").hosts["a"]
    settings = autostop.notify_settings(host)
    assert settings is not None
    assert (settings["ntfy"], settings["ntfy_server"], settings["idle_minutes"]) == ("my-runs", None, 30.0)
    assert settings["events"] == ["queue_empty", "idle", "deadline_soon"]
    with pytest.raises(ConfigError, match="notify.ntfy: must be an ntfy topic name"):
        parse('[notify]\nntfy = "a b"\n[hosts.a]\nhost = "a"\n', tmp_path / "c.toml")
    with pytest.raises(ConfigError, match="notify.idle_minutes: must be a number of minutes above 0"):
        parse('[notify]\nntfy = "t"\nidle_minutes = 0\n[hosts.a]\nhost = "a"\n', tmp_path / "c.toml")

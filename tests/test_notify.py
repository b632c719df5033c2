"""Notifications from the host's watchdog: a real HTTP server on 127.0.0.1 captures the webhook's POSTs."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import AgentProc, Home, SshHome, stop_host, wait_for

from remote_agent.fsutil import read_json, write_json
from remote_agent.watchdog import daemon


class Hook:
    """A webhook endpoint: records each POST body; answers 500 to the first ``fail`` of them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.bodies.append(body)
                failing = len(hook.bodies) <= hook.fail
                self.send_response(500 if failing else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()
    h.server.server_close()


T = 1_000_000.0
FACTS = {"boot_id": "b", "boot_time": 0.0}
FAILED = {"id": "4", "name": "train", "state": "failed", "exit_code": 3, "started_at": T - 60, "ended_at": T + 1,
          "env": {"WANDB_API_KEY": "hunter2-secret"}, "argv": ["python", "train.py", "--token=hunter2-secret"]}


def notify_config(tmp_path: Path, **notify: Any) -> dict[str, Any]:
    config = {"boot_id": "b", "armed_at": T, "count_sessions": False,
              "notify": dict({"events": ["job_failed", "job_succeeded"], "host": "gpu1"}, **notify)}
    write_json(str(tmp_path / daemon.CONFIG), config)
    return config


def checked(dog: daemon.Watchdog, config: dict[str, Any], jobs: Any, t: float) -> dict[str, Any]:
    """One watchdog pass at ``T + t``, then wait for the sends it started (they run on the sender's thread)."""
    state = dog.check(config, FACTS, jobs, now=T + t, mono=t)
    assert dog.notifier.sender.wait(30), "the sends of the pass did not finish"
    return state


def test_a_failed_job_is_posted_once_after_two_failures_with_backoff(tmp_path: Path, hook: Hook) -> None:
    hook.fail = 2
    config = notify_config(tmp_path, webhook=hook.url)
    assert daemon.is_armed(config, "b")  # notify alone arms the watchdog
    dog = daemon.Watchdog(str(tmp_path))
    old = dict(FAILED, id="3", ended_at=T - 5)  # ended before notify was armed: history, never sent
    jobs = lambda: ({"gpus": []}, [old, FAILED])  # noqa: E731
    checked(dog, config, jobs, 2)
    assert len(hook.bodies) == 1
    checked(dog, config, jobs, 4)  # the retry is not due yet (5 s after the attempt at T + 2)
    assert len(hook.bodies) == 1
    checked(dog, config, jobs, 8)
    assert len(hook.bodies) == 2
    for t in (40, 100, 1000):  # the third attempt is accepted; nothing is sent again
        checked(dog, config, jobs, t)
    assert len(hook.bodies) == 3 and all(b == hook.bodies[0] for b in hook.bodies)
    body = hook.bodies[0]
    assert body["text"] == body["content"] == body["message"] == "[gpu1] job 4 train failed (exit 3)"
    assert "hunter2" not in json.dumps(body)
    log = (tmp_path / daemon.LOG).read_text()
    assert "attempt 1 failed (webhook answered HTTP 500); retrying in 5 s" in log
    assert "attempt 2 failed" in log and "sent on attempt 3" in log
    assert checked(daemon.Watchdog(str(tmp_path)), config, jobs, 2000) and len(hook.bodies) == 3


def test_a_command_gets_the_text_and_only_chosen_events_fire(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    config = notify_config(
        tmp_path, command=["sh", "-c", f'cat > "{marker}"; echo "$GPUTUI_NOTIFY_EVENT" >> "{marker}"']
    )
    ok = dict(FAILED, id="5", state="succeeded", exit_code=0)
    lost = dict(FAILED, id="6", state="lost", exit_code=None)  # job_lost is not among the events asked for
    checked(daemon.Watchdog(str(tmp_path)), config, lambda: ({"gpus": []}, [ok, lost]), 2)
    assert marker.read_text() == "[gpu1] job 5 train succeeded (exit 0)job_succeeded\n"


def test_notify_alone_runs_the_watchdog_with_no_client(tmp_path: Path, hook: Hook) -> None:
    state = tmp_path / "state"
    agent = AgentProc(state)
    try:
        settings = {"webhook": hook.url, "events": ["job_failed"], "host": "gpu1"}
        reply = agent.call("watchdog.configure", config={"notify": settings, "interval": 0.5})
        assert reply["result"]["armed"] is True, reply
        job = agent.call("jobs.start", argv=[sys.executable, "-c", "raise SystemExit(3)"], name="boom")[
            "result"
        ]
        agent.close()  # the client goes away before the job ends
        wait_for(lambda: len(hook.bodies) >= 1, timeout=60, what="the job_failed POST")
        wait_for(lambda: _passes(state) >= 3, timeout=60, what="three more watchdog passes")
        assert [b["text"] for b in hook.bodies] == [f"[gpu1] job {job['id']} boom failed (exit 3)"]
    finally:
        agent.close()
        stop_host(state)


_seen: dict[str, list[float]] = {}


def _passes(state: Path) -> int:
    """How many distinct watchdog passes this test has seen since the first POST."""
    t = (read_json(str(state / daemon.STATE)) or {}).get("t")
    seen = _seen.setdefault(str(state), [])
    if t is not None and t not in seen:
        seen.append(t)
    return len(seen)


def test_the_notify_test_op_reports_success_and_failure(agent: AgentProc, hook: Hook) -> None:
    reply = agent.call("notify.test", notify={"webhook": hook.url, "events": [], "host": "gpu1"})
    assert reply["result"] == {"sent": True, "error": None}
    assert hook.bodies[-1]["text"] == "[gpu1] test message from gputui"
    hook.fail = 99
    reply = agent.call("notify.test", notify={"webhook": hook.url})
    assert reply["result"]["sent"] is False and "HTTP 500" in reply["result"]["error"]
    bad = agent.call("notify.test", notify={"webhook": "file:///etc/passwd"})
    assert bad["ok"] is False and "http or https" in bad["error"]["message"]
    assert "notify test: sent" in (agent.state_dir / daemon.LOG).read_text()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[notify]\nwebhook = "ftp://x"\n', "notify.webhook: must be an http:// or https:// URL"),
        ('[notify]\nwebhook = "https://x"\nevents = ["job_exploded"]\n', "notify.events: unknown event"),
        ("[notify]\ncommand = 3\n", "notify.command: must be a command"),
        ('[notify]\nevents = ["stalled"]\n', "notify: needs a webhook, an ntfy topic or a command"),
        ('[notify]\nwebhok = "https://x"\n', "notify.webhok: unknown setting"),
    ],
)
def test_bad_notify_settings_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    from gputui.core.config.file import ConfigError, parse

    with pytest.raises(ConfigError, match=message):
        parse(text + '[hosts.gpu]\nhost = "h"\n', tmp_path / "c.toml")


def test_host_notify_keys_override_the_global_ones(tmp_path: Path) -> None:
    from gputui.core.config.file import parse

    text = '[notify]\nwebhook = "https://hooks.example/a"\nevents = ["job_failed"]\n'
    text += '[hosts.a]\nhost = "a"\n[hosts.b]\nhost = "b"\n[hosts.b.notify]\nevents = ["stalled"]\n'
    hosts = parse(text, tmp_path / "c.toml").hosts
    assert hosts["a"].notify is not None and hosts["a"].notify.events == ("job_failed",)
    assert hosts["b"].notify is not None and hosts["b"].notify.events == ("stalled",)
    assert hosts["b"].notify.webhook == "https://hooks.example/a"


def test_cli_notify_test_sends_and_reports(home: Home, hook: Hook) -> None:
    def configure(url: str | None) -> None:
        extra = f'[hosts.local.notify]\nwebhook = "{url}"\n' if url else ""
        home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n{extra}')

    configure(hook.url)
    res = home.cli("notify", "local", "--test")
    assert res.returncode == 0 and "local: test notification sent" in res.stdout, res.stderr
    assert hook.bodies[-1]["content"] == "[local] test message from gputui"
    hook.fail = 99
    res = home.cli("notify", "local", "--test")
    assert res.returncode == 1 and "test notification failed: webhook answered HTTP 500" in res.stderr
    configure(None)
    res = home.cli("notify", "local", "--test")
    assert res.returncode == 2 and "no notifications" in res.stderr


def test_autostop_soon_and_released_are_sent_once(tmp_path: Path, hook: Hook) -> None:
    stopped = tmp_path / "stopped"
    config = notify_config(tmp_path, webhook=hook.url, events=["autostop_soon", "released"])
    config.update(autostop_minutes=1, release_remote=["touch", str(stopped)])
    write_json(str(tmp_path / daemon.CONFIG), config)
    write_json(str(tmp_path / "activity.json"), {"last_busy": T, "boot_id": "b"})
    dog = daemon.Watchdog(str(tmp_path))
    idle = lambda: ({"gpus": []}, [])  # noqa: E731
    for t in (1, 20, 40):  # release due at T + 61: within SOON_S all along, announced once
        assert checked(dog, config, idle, t)["action"] is None
    assert [b["event"] for b in hook.bodies] == ["autostop_soon"]
    assert hook.bodies[0]["text"].startswith("[gpu1] autostop releases the host in 1 min")
    assert checked(dog, config, idle, 62)["action"] == "released" and stopped.exists()
    assert [b["event"] for b in hook.bodies] == ["autostop_soon", "released"]
    assert hook.bodies[1]["text"] == "[gpu1] released (idle for 1.0 min)"


def test_removing_the_notify_settings_disarms_the_watchdog() -> None:
    assert (
        daemon.disarmed_because(
            {"notify": {"webhook": "http://h/", "events": ["job_failed"]}, "boot_id": "b"}, "b"
        )
        is None
    )
    assert daemon.disarmed_because({"notify": None, "boot_id": "b"}, "b") == "nothing to watch"
    assert daemon.disarmed_because({"notify": {"webhook": "http://h/", "events": []}, "boot_id": "b"}, "b") == (
        "nothing to watch"
    )


def test_a_dead_endpoint_is_tried_a_bounded_number_of_times_per_pass(tmp_path: Path) -> None:
    from remote_agent.watchdog import notify as notifier

    config = notify_config(tmp_path, webhook="http://127.0.0.1:9/closed")  # discard port: refused
    ended = [dict(FAILED, id=str(i)) for i in range(12)]
    dog = daemon.Watchdog(str(tmp_path))
    checked(dog, config, lambda: ({"gpus": []}, ended), 2)
    checked(dog, config, lambda: ({"gpus": []}, ended), 3)  # records the first ones; the next are not due
    log = (tmp_path / daemon.LOG).read_text()
    assert log.count("attempt 1 failed (webhook failed:") == notifier.MAX_PER_PASS
    assert len(read_json(str(tmp_path / notifier.OUTBOX))["items"]) == 12  # the rest wait for a later pass


def test_a_job_that_fails_after_the_ssh_client_left_is_posted(ssh_home: SshHome, hook: Hook) -> None:
    """Over the real sshd: the CLI starts a job and exits; the host's watchdog posts its failure alone."""
    config = ssh_home.configure()
    config.write_text(
        config.read_text() + f'[hosts.box.notify]\nwebhook = "{hook.url}"\nevents = ["job_failed"]\n'
    )
    gate = ssh_home.remote_dir.parent / "gate"  # the job fails once the CLI is gone and the test opens it
    wait_gate = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\nraise SystemExit(4)"
    job_id = ssh_home.cli("run", "box", "--", "python3", "-c", wait_gate, check=True).stdout.strip()
    gate.touch()
    wait_for(lambda: len(hook.bodies) >= 1, timeout=90, what="the job_failed POST from the host")
    assert hook.bodies[0]["text"] == f"[box] job {job_id} failed (exit 4)"
    log = ssh_home.remote_dir / daemon.LOG  # (a loaded machine may time the first attempt out: then the retry's)
    wait_for(lambda: "(job_failed): sent on attempt" in log.read_text(), what="the watchdog to log the send")

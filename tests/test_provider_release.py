"""The watchdog releases through the provider's API (issue 26): against the local stand-in
(tests/provider_standin.py), in process and on an emulated pod (a PID namespace whose PID 1 alone holds
RUNPOD_*, as over SSH), with the webhook receiver of tests/test_notify.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import provider_standin as standin
import pytest
from conftest import wait_for
from provider_standin import RUNPOD_KEY, VAST_KEY, StandIn
from test_notify import Hook, hook  # noqa: F401  (the webhook receiver fixture)

from remote_agent.fsutil import read_json, write_json
from remote_agent.host import provider as pv
from remote_agent.watchdog import daemon

ROOT = Path(__file__).resolve().parent.parent
POD, VAST = "xedezhzb9la3ye", "883"
T = 1_000_000.0
FACTS = {"boot_id": "b", "boot_time": 0.0}
IDLE = lambda: ({"gpus": []}, [])  # noqa: E731
ENVS = {
    pv.RUNPOD: {"RUNPOD_POD_ID": POD, "RUNPOD_API_KEY": RUNPOD_KEY},
    pv.VASTAI: {"CONTAINER_ID": VAST, "CONTAINER_API_KEY": VAST_KEY},
}


@pytest.fixture
def api() -> Iterator[StandIn]:
    state, server = standin.start()
    state.pods[POD] = standin.runpod_pod(POD)
    state.vast[VAST] = standin.vast_instance(int(VAST))
    try:
        yield state
    finally:
        standin.stop(state, server)


@pytest.fixture
def on_pod(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The agent's own environment holds a provider's variables (``on_pod(provider)``)."""

    def put(provider: str) -> pv.Detected:
        for name in (n for env in ENVS.values() for n in env):
            monkeypatch.delenv(name, raising=False)
        for name, value in ENVS[provider].items():
            monkeypatch.setenv(name, value)
        found = pv.detect()
        assert found.provider == provider
        return found

    yield put


def armed(tmp_path: Path, api: StandIn, found: pv.Detected, **extra: Any) -> dict[str, Any]:
    """A watchdog config as ``watchdog.configure`` writes it for a pod: a deadline due now, no release_remote."""
    config = {"release_at": 0.0, "armed_at": T - 3600, "boot_id": "b", "count_sessions": False, "interval": 0.05,
              "provider": "auto", "api_urls": {found.provider: api.base(found.provider)},
              "release_via": {k: v for k, v in pv.describe(found).items() if k != "note"}, **extra}
    write_json(str(tmp_path / daemon.CONFIG), config)
    return config


def releases(api: StandIn) -> list[str]:
    return [m for m in api.methods() if not m.startswith("GET")]


@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_a_due_release_stops_the_instance_through_the_provider_and_confirms(
    tmp_path: Path, api: StandIn, on_pod: Any, provider: str
) -> None:
    config = armed(tmp_path, api, on_pod(provider))
    assert daemon.is_armed(config, "b")  # no release_remote needed where the provider can release from the host
    state = daemon.Watchdog(str(tmp_path)).check(config, FACTS, IDLE, now=T, mono=0.0)
    assert state["action"] == "released"
    want = f"POST /runpod/pods/{POD}/stop" if provider == pv.RUNPOD else f"PUT /vastai/instances/{VAST}/"
    assert releases(api) == [want]
    assert ("EXITED" if provider == pv.RUNPOD else "stopped") in state["released_how"]
    request = read_json(str(tmp_path / daemon.RELEASE_REQUEST))  # recorded before the call
    assert request["mode"] == "stop" and request["provider"] == provider
    log = (tmp_path / daemon.LOG).read_text()
    assert "provider release: confirmed" in log
    assert RUNPOD_KEY not in log and VAST_KEY not in log


@pytest.mark.parametrize("value", ["$0.74", "abc", -1, float("nan"), 1e308, True, [0.74], "9" * 200_000])
@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_an_unusable_price_never_blocks_the_watchdogs_check_or_release(
    tmp_path: Path, api: StandIn, on_pod: Any, provider: str, value: Any
) -> None:
    """The price is display-only: the check is ok and says "price per hour unknown"; the due release stops the
    instance and its read-back (which still holds the odd price) confirms it."""
    if provider == pv.RUNPOD:
        api.pods[POD]["costPerHr"] = value
    else:
        api.vast[VAST]["dph_total"] = value
    config = armed(tmp_path, api, on_pod(provider))
    verdict = daemon.release_check(config)
    assert verdict["ok"] is True and verdict["price_per_hour"] is None, verdict
    assert "must be" in verdict["price_per_hour_unknown"] and "price per hour unknown" in verdict["detail"]
    state = daemon.Watchdog(str(tmp_path)).check(config, FACTS, IDLE, now=T, mono=0.0)
    assert state["action"] == "released", state
    assert len(releases(api)) == 1


def test_a_pod_with_a_network_volume_is_terminated_when_no_mode_is_set(
    tmp_path: Path, api: StandIn, on_pod: Any
) -> None:
    api.pods[POD] = standin.runpod_pod(POD, volume="vol123")
    config = armed(tmp_path, api, on_pod(pv.RUNPOD))
    assert daemon.Watchdog(str(tmp_path)).check(config, FACTS, IDLE, now=T, mono=0.0)["action"] == "released"
    assert releases(api) == [f"DELETE /runpod/pods/{POD}"]


def test_a_stop_mode_the_pod_cannot_do_is_a_loud_failure_not_a_terminate(
    tmp_path: Path, api: StandIn, on_pod: Any
) -> None:
    api.pods[POD] = standin.runpod_pod(POD, volume="vol123")
    config = armed(tmp_path, api, on_pod(pv.RUNPOD), release_mode="stop")
    state = daemon.Watchdog(str(tmp_path)).check(config, FACTS, IDLE, now=T, mono=0.0)
    assert state["action"] == "release failed" and "network volume" in state["release_error"]
    assert releases(api) == []


def test_a_failing_stop_is_notified_retried_with_backoff_and_never_released(
    tmp_path: Path, api: StandIn, on_pod: Any, hook: Hook  # noqa: F811
) -> None:
    api.fault = "500"
    config = armed(tmp_path, api, on_pod(pv.RUNPOD),
                   notify={"webhook": hook.url, "events": ["release_failed", "released"], "host": "pod1"})
    dog = daemon.Watchdog(str(tmp_path))
    state = dog.check(config, FACTS, IDLE, now=T, mono=0.0)
    assert state["action"] == "release failed" and "500" in state["release_error"]
    assert dog.notifier.sender.wait(30)
    [body] = hook.bodies
    assert body["text"].startswith("[pod1] release FAILED, the host still bills: runpod") and "500" in body["text"]
    calls = len(api.requests)
    within = dog.check(config, FACTS, IDLE, now=T + daemon.RETRY_AFTER_FAILURE_S - 1, mono=1.0)
    assert within["action"] == "release failed" and len(api.requests) == calls  # still billing, not tried
    api.fault = None
    again = dog.check(config, FACTS, IDLE, now=T + daemon.RETRY_AFTER_FAILURE_S, mono=2.0)
    assert again["action"] == "released"
    assert dog.notifier.sender.wait(30)
    assert [b["text"].split(" ", 2)[1] for b in hook.bodies] == ["release", "released"]


def test_the_backoff_grows_after_each_failure(tmp_path: Path, api: StandIn, on_pod: Any) -> None:
    api.fault = "500"
    config = armed(tmp_path, api, on_pod(pv.VASTAI))
    dog, t = daemon.Watchdog(str(tmp_path)), T
    waits = []
    for _ in range(3):
        state = dog.check(config, FACTS, IDLE, now=t, mono=t - T)
        waits.append(state["retry_at"] - t)
        t = state["retry_at"]
    assert waits == [daemon.RETRY_AFTER_FAILURE_S, 2 * daemon.RETRY_AFTER_FAILURE_S, 4 * daemon.RETRY_AFTER_FAILURE_S]


def test_a_wrong_key_fails_the_check_at_arming_and_notifies(
    tmp_path: Path, api: StandIn, on_pod: Any, monkeypatch: pytest.MonkeyPatch, hook: Hook  # noqa: F811
) -> None:
    found = on_pod(pv.RUNPOD)
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_WRONGKEY_0123456789")
    config = armed(tmp_path, api, found, release_at=None, autostop_minutes=600,
                   notify={"webhook": hook.url, "events": ["release_check_failed"], "host": "pod1"})
    dog = daemon.Watchdog(str(tmp_path))
    dog.check(config, FACTS, IDLE, now=T, mono=0.0)
    verdict = read_json(str(tmp_path / daemon.RELEASE_CHECK))
    assert verdict["ok"] is False and verdict["kind"] == "auth" and verdict["armed_at"] == config["armed_at"]
    assert daemon.view(str(tmp_path), {"idle_since": T, "reasons": []}, "b")["release_check"]["ok"] is False
    assert dog.notifier.sender.wait(30)
    [body] = hook.bodies
    assert "release check failed, the host would NOT be released" in body["text"]
    assert "rpa_WRONGKEY" not in json.dumps(body)
    assert releases(api) == []  # a check has no side effects
    dog.check(config, FACTS, IDLE, now=T + 1, mono=1.0)  # checked once per arming
    assert len([r for r in api.requests if r.method == "GET"]) == 1
    dog.check(config, FACTS, IDLE, now=T + daemon.RECHECK_S, mono=2.0)  # and again now and then
    assert len([r for r in api.requests if r.method == "GET"]) == 2
    assert dog.notifier.sender.wait(30) and len(hook.bodies) == 1  # the failure was told once for this arming


def test_a_good_check_says_what_the_release_would_do(tmp_path: Path, api: StandIn, on_pod: Any) -> None:
    config = armed(tmp_path, api, on_pod(pv.RUNPOD), release_at=None, autostop_minutes=600)
    daemon.Watchdog(str(tmp_path)).check(config, FACTS, IDLE, now=T, mono=0.0)
    verdict = read_json(str(tmp_path / daemon.RELEASE_CHECK))
    assert verdict["ok"] is True and verdict["mode"] == "stop" and verdict["price_per_hour"] == 0.74
    assert releases(api) == []


def test_a_missing_release_remote_program_fails_the_check(tmp_path: Path) -> None:
    verdict = daemon.release_check({"release_remote": ["no-such-program-gputui", "x"]})
    assert verdict["ok"] is False and "not found or not executable" in verdict["detail"]
    assert daemon.release_check({"release_remote": ["true"]})["ok"] is True


def test_provider_none_or_no_release_setting_releases_nothing(
    tmp_path: Path, api: StandIn, on_pod: Any
) -> None:
    """The trust rule: a detected pod is released only when the user set a release (autostop, a deadline), and
    never with provider = "none" (nor another provider named)."""
    from remote_agent.ops import watchdog as ops

    on_pod(pv.RUNPOD)

    class Jobs:
        state_dir, nvidia_smi = str(tmp_path), "nvidia-smi"

    class Agent:
        jobs, launcher = Jobs(), [sys.executable, "-c", "pass"]  # a watchdog that exits at once

        def facts(self) -> dict[str, Any]:
            return {"boot_id": "b"}

    for provider in ("none", "vastai", "lambda"):
        reply = ops.configure(Agent(), {"config": {"autostop_minutes": 1, "provider": provider}})  # type: ignore[arg-type]
        assert reply["armed"] is False, provider
    reply = ops.configure(Agent(), {"config": {"stall_minutes": 5, "provider": "auto"}})  # type: ignore[arg-type]
    assert "release_via" not in (reply["config"] or {})  # nothing asks for a release: none is prepared
    forged = {"autostop_minutes": 1, "provider": "none", "release_via": {"provider": "runpod", "instance_id": POD,
                                                                         "source": "environment"}}
    assert ops.configure(Agent(), {"config": forged})["armed"] is False  # type: ignore[arg-type]
    reply = ops.configure(Agent(), {"config": {"autostop_minutes": 1, "provider": "auto"}})  # type: ignore[arg-type]
    assert reply["armed"] is True and reply["config"]["release_via"]["instance_id"] == POD
    assert api.requests == []


def test_a_changed_detection_is_not_released_through(tmp_path: Path, api: StandIn, on_pod: Any) -> None:
    config = armed(tmp_path, api, on_pod(pv.RUNPOD))
    on_pod(pv.VASTAI)  # now another instance's variables: never release one the user did not arm
    state = daemon.Watchdog(str(tmp_path)).check(config, FACTS, IDLE, now=T, mono=0.0)
    assert state["action"] == "release failed" and "detection changed" in state["release_error"]
    assert releases(api) == []


# ---- an emulated pod, no client connected ---------------------------------------------------------------------

CONFIGURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote_agent.__main__ import launcher
from remote_agent.ops import watchdog as ops
class Jobs:
    state_dir, nvidia_smi = sys.argv[2], "nvidia-smi-none"
class Agent:
    jobs, launcher = Jobs(), launcher()
    def facts(self):
        from remote_agent.host.boot import boot_id
        return {"boot_id": boot_id()}
config = {"autostop_minutes": 0.02, "count_sessions": False, "provider": "auto", "release_timeout": 60, "interval": 0.5,
          "api_urls": {"runpod": sys.argv[3], "vastai": sys.argv[4]}}
print(json.dumps(ops.configure(Agent(), {"config": config})))
"""


def _unshare_ok() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
                           capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"unshare --pid is not permitted: {probe.stderr!r}"


@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_autostop_stops_an_emulated_pod_with_no_client(tmp_path: Path, api: StandIn, provider: str) -> None:
    """Only autostop_minutes is set; the agent (its own environment without the variables) arms the real
    detached watchdog, which finds the instance through /proc/1/environ and stops it through the stand-in."""
    why = _unshare_ok()
    if why:
        pytest.skip(why)
    env, state, gate = ENVS[provider], tmp_path / "state", tmp_path / "gate"
    state.mkdir()
    unset = " ".join(f"-u {name}" for name in env)
    script = (f'env {unset} "{sys.executable}" -c "$CONFIGURE" "$ROOT" "$STATE" "$RP" "$VA" > "$STATE/armed.json"; '
              'while [ ! -e "$GATE" ]; do sleep 0.1; done')  # sh stays PID 1 (and keeps the pod alive)
    pod = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "env", "-i",
         *(f"{k}={v}" for k, v in env.items()), f"CONFIGURE={CONFIGURE}", f"ROOT={ROOT}", f"STATE={state}",
         f"RP={api.base('runpod')}", f"VA={api.base('vastai')}", f"GATE={gate}", "PATH=/usr/bin:/bin",
         "/bin/sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        stopped = (lambda: api.pods[POD]["desiredStatus"] == "EXITED") if provider == pv.RUNPOD else (
            lambda: api.vast[VAST]["actual_status"] == "stopped")
        wait_for(lambda: (read_json(str(state / daemon.STATE)) or {}).get("action") == "released", timeout=90,
                 what="the watchdog to release the pod")
        assert stopped()
        armed_reply = json.loads((state / "armed.json").read_text())
        assert armed_reply["armed"] is True
        assert armed_reply["config"]["release_via"]["source"] == "/proc/1/environ"
        log = (state / daemon.LOG).read_text()
        assert "release check: ok" in log and "provider release: confirmed" in log
        assert RUNPOD_KEY not in log and VAST_KEY not in log
    finally:
        gate.touch()
        try:
            pod.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pod.kill()
            pod.wait()

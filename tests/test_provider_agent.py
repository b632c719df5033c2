"""remote_agent/host/provider.py: where the agent runs (RunPod, vast.ai) and the providers' REST APIs, against the
local stand-in (tests/provider_standin.py) and an emulated pod (a PID namespace whose PID 1 holds RUNPOD_*)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import provider_standin as standin
import pytest
from provider_standin import RUNPOD_KEY, VAST_KEY, StandIn

from remote_agent.host import provider as pv

ROOT = Path(__file__).resolve().parent.parent
POD, VAST = "xedezhzb9la3ye", "883"


@pytest.fixture
def api() -> Iterator[StandIn]:
    state, server = standin.start()
    state.pods[POD] = standin.runpod_pod(POD)
    state.vast[VAST] = standin.vast_instance(int(VAST))
    try:
        yield state
    finally:
        standin.stop(state, server)


def nowhere(tmp_path: Path) -> dict[str, object]:
    """detect() arguments that look at no real file."""
    return {"env_files": (), "proc_environ": str(tmp_path / "no-environ")}


RUNPOD_ENV = {"RUNPOD_POD_ID": POD, "RUNPOD_API_KEY": RUNPOD_KEY}
VAST_ENV = {"CONTAINER_ID": VAST, "CONTAINER_API_KEY": VAST_KEY}


def on(provider: str) -> tuple[pv.Detected, dict[str, str]]:
    """A detection from the agent's own environment, and that environment."""
    env = RUNPOD_ENV if provider == pv.RUNPOD else VAST_ENV
    return pv.Detected(provider, POD if provider == pv.RUNPOD else VAST, pv.ENVIRONMENT), dict(env)


# ---- detection ---------------------------------------------------------------------------------------------


def test_detect_reads_the_agents_own_environment_first(tmp_path: Path) -> None:
    environ = tmp_path / "environ"
    environ.write_bytes(b"RUNPOD_POD_ID=other1\0RUNPOD_API_KEY=otherkey-123456\0")
    found = pv.detect(env=dict(RUNPOD_ENV), env_files=(), proc_environ=str(environ))
    assert found == pv.Detected(pv.RUNPOD, POD, pv.ENVIRONMENT)
    assert RUNPOD_KEY not in repr(found) and RUNPOD_KEY not in str(pv.describe(found))


def test_detect_reads_rp_environment_export_lines_with_quotes(tmp_path: Path) -> None:
    rp = tmp_path / "rp_environment"
    rp.write_text(f"# written by the start script\nexport PATH=/usr/bin\nexport RUNPOD_POD_ID=\"{POD}\"\n"
                  f"export RUNPOD_API_KEY='{RUNPOD_KEY}'\n")
    found = pv.detect(env={}, env_files=(str(rp), str(tmp_path / "environment")), proc_environ="/nonexistent")
    assert found == pv.Detected(pv.RUNPOD, POD, str(rp))


def test_detect_reads_etc_environment_plain_lines_for_vast(tmp_path: Path) -> None:
    etc = tmp_path / "environment"
    etc.write_text(
        f'PATH="/usr/local/sbin:/usr/bin"\nCONTAINER_ID={VAST}  # the instance\nCONTAINER_API_KEY={VAST_KEY}\n'
    )
    found = pv.detect(env={}, env_files=(str(tmp_path / "absent"), str(etc)), proc_environ="/nonexistent")
    assert found == pv.Detected(pv.VASTAI, VAST, str(etc))


def test_detect_reads_pid1_environ_only_for_the_keys_it_needs(tmp_path: Path) -> None:
    environ = tmp_path / "environ"
    environ.write_bytes(b"HOME=/root\0SECRET_TOKEN=nothing-to-do-with-us\0" + f"CONTAINER_ID={VAST}\0".encode()
                        + f"CONTAINER_API_KEY={VAST_KEY}\0".encode() + b"\xff\xfe=junk\0")
    found = pv.detect(env={"HOME": "/root"}, env_files=(), proc_environ=str(environ))
    assert found == pv.Detected(pv.VASTAI, VAST, str(environ))
    assert pv.parse_environ(environ.read_bytes(), ["CONTAINER_ID", "SECRET_TOKEN"]).keys() == {
        "CONTAINER_ID", "SECRET_TOKEN"
    }


def test_an_id_without_its_key_does_not_count_and_a_later_source_wins(tmp_path: Path) -> None:
    environ = tmp_path / "environ"
    environ.write_bytes(f"RUNPOD_POD_ID={POD}\0RUNPOD_API_KEY={RUNPOD_KEY}\0".encode())
    found = pv.detect(env={"RUNPOD_POD_ID": "podfromshell"}, env_files=(), proc_environ=str(environ))
    assert found == pv.Detected(pv.RUNPOD, POD, str(environ))


@pytest.mark.parametrize(
    ("env", "note"),
    [
        ({}, ""),
        ({"RUNPOD_POD_ID": POD}, "RUNPOD_API_KEY in the environment is missing"),
        ({"RUNPOD_POD_ID": "../../etc", "RUNPOD_API_KEY": RUNPOD_KEY}, "RUNPOD_POD_ID in the environment is not an instance id"),
        ({"CONTAINER_ID": VAST, "CONTAINER_API_KEY": "short"}, "CONTAINER_API_KEY in the environment is not an API key"),
        ({"CONTAINER_ID": VAST, "CONTAINER_API_KEY": "has space in it"}, "not an API key"),
    ],
)
def test_detect_says_none_and_why_for_half_or_malformed_settings(
    tmp_path: Path, env: dict[str, str], note: str
) -> None:
    found = pv.detect(env=env, **nowhere(tmp_path))  # type: ignore[arg-type]
    assert found.provider == pv.NONE and found.instance_id == "" and note in found.note
    assert RUNPOD_KEY not in found.note


def test_detect_reads_a_huge_environ_only_up_to_its_bound(tmp_path: Path) -> None:
    environ = tmp_path / "environ"
    pad = b"PAD=" + b"x" * pv.MAX_PROC_ENVIRON + b"\0"
    environ.write_bytes(pad + f"RUNPOD_POD_ID={POD}\0RUNPOD_API_KEY={RUNPOD_KEY}\0".encode())
    assert pv.detect(env={}, env_files=(), proc_environ=str(environ)).provider == pv.NONE
    environ.write_bytes(f"RUNPOD_POD_ID={POD}\0RUNPOD_API_KEY={RUNPOD_KEY}\0".encode() + pad)
    assert pv.detect(env={}, env_files=(), proc_environ=str(environ)).provider == pv.RUNPOD


def test_an_unreadable_or_odd_source_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")  # a FIFO with no writer: never blocks the agent
    found = pv.detect(
        env={}, env_files=(str(tmp_path / "dir"), str(tmp_path / "fifo")), proc_environ="/nonexistent"
    )
    assert found.provider == pv.NONE


def test_the_key_is_read_again_from_its_source_for_every_call(api: StandIn, tmp_path: Path) -> None:
    rp = tmp_path / "rp_environment"
    rp.write_text(f"export RUNPOD_POD_ID={POD}\nexport RUNPOD_API_KEY={RUNPOD_KEY}\n")
    found = pv.detect(env={}, env_files=(str(rp),), proc_environ="/nonexistent")
    assert pv.instance(found, api_url=api.base("runpod")).state == pv.RUNNING
    rp.write_text(f"export RUNPOD_POD_ID={POD}\n")
    with pytest.raises(pv.ProviderError) as err:
        pv.instance(found, api_url=api.base("runpod"))
    assert err.value.kind == "auth" and "no longer in" in str(err.value)


# ---- the clients -------------------------------------------------------------------------------------------


def test_runpod_instance_reads_state_price_and_start(api: StandIn) -> None:
    detected, env = on(pv.RUNPOD)
    got = pv.instance(detected, api_url=api.base("runpod"), env=env)
    assert (got.state, got.provider_state, got.price_per_hour, got.can_stop) == (
        pv.RUNNING,
        "RUNNING",
        0.74,
        True,
    )
    assert got.started_at == pytest.approx(1720811680.144)
    assert api.requests[-1].auth == f"Bearer {RUNPOD_KEY}" and api.methods() == [f"GET /runpod/pods/{POD}"]


def test_vast_instance_reads_state_and_dph_total(api: StandIn) -> None:
    detected, env = on(pv.VASTAI)
    got = pv.instance(detected, api_url=api.base("vastai"), env=env)
    assert (got.state, got.price_per_hour, got.started_at) == (pv.RUNNING, 0.3312, 1761008618.225083)
    assert api.methods() == [f"GET /vastai/instances/{VAST}/"]


@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_check_proves_key_and_instance_without_side_effects(api: StandIn, provider: str) -> None:
    detected, env = on(provider)
    for mode in (None, "stop", "terminate"):
        assert pv.check(detected, mode, api_url=api.base(provider), env=env).state == pv.RUNNING
    assert {r.method for r in api.requests} == {"GET"}
    assert api.pods[POD]["desiredStatus"] == "RUNNING" and api.vast[VAST]["actual_status"] == "running"


def test_a_runpod_pod_with_a_network_volume_can_only_be_terminated(api: StandIn) -> None:
    api.pods[POD] = standin.runpod_pod(POD, volume="agv6w2qcg7")
    detected, env = on(pv.RUNPOD)
    for call in (pv.check, pv.release):
        with pytest.raises(pv.ProviderError) as err:
            call(detected, "stop", api_url=api.base("runpod"), env=env)
        assert err.value.kind == "unsupported"
        assert "network volume" in str(err.value) and 'release_mode = "terminate"' in str(err.value)
    assert all(r.method == "GET" for r in api.requests)  # refused before anything was asked
    assert pv.check(detected, "terminate", api_url=api.base("runpod"), env=env).can_stop is False


@pytest.mark.parametrize(
    ("provider", "mode", "request_line", "state"),
    [
        (pv.RUNPOD, "stop", f"POST /runpod/pods/{POD}/stop", pv.STOPPED),
        (pv.RUNPOD, "terminate", f"DELETE /runpod/pods/{POD}", pv.TERMINATED),
        (pv.VASTAI, "stop", f"PUT /vastai/instances/{VAST}/", pv.STOPPED),
        (pv.VASTAI, "terminate", f"DELETE /vastai/instances/{VAST}/", pv.TERMINATED),
    ],
)
def test_release_then_confirm_polls_until_the_provider_says_so(
    api: StandIn, provider: str, mode: str, request_line: str, state: str
) -> None:
    api.settle_reads = 2
    detected, env = on(provider)
    pv.release(detected, mode, api_url=api.base(provider), env=env)
    assert request_line in api.methods()
    if provider == pv.VASTAI and mode == "stop":
        assert api.requests[-1].body == {"state": "stopped"}
    done = pv.confirm(detected, mode, interval_s=0, api_url=api.base(provider), env=env)
    assert done.state == state and done.polls == 3


# Values a provider may put where a price (or another number) belongs; none of them is a usable price.
ODD_NUMBERS = ["$0.74", "abc", -1, float("nan"), 1e308, True, None, [0.74], {"usd": 0.74}, "9" * 200_000]
ODD_IDS = ["dollar", "abc", "negative", "nan", "1e308", "true", "null", "list", "object", "huge-string"]
PRICE_FIELDS = {pv.RUNPOD: "costPerHr", pv.VASTAI: "dph_total"}


def odd_instance(api: StandIn, provider: str, value: Any) -> dict[str, Any]:
    """The stand-in's instance with ``value`` in its price field (and its start time: a number there too)."""
    inst = api.pods[POD] if provider == pv.RUNPOD else api.vast[VAST]
    inst[PRICE_FIELDS[provider]] = value
    inst["lastStartedAt" if provider == pv.RUNPOD else "start_date"] = value
    return inst


@pytest.mark.parametrize("value", ODD_NUMBERS, ids=ODD_IDS)
@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_an_unusable_price_never_blocks_a_check_a_release_or_its_read_back(
    api: StandIn, provider: str, value: Any
) -> None:
    """The price is display-only: the status shows "price unknown", the check, the stop and the read-back after
    it (the answer still holding the odd price) go through."""
    odd_instance(api, provider, value)
    detected, env = on(provider)
    shown = pv.instance(detected, api_url=api.base(provider), env=env)
    assert (shown.price_per_hour, shown.started_at) == (None, None)
    assert {name for name, _ in shown.unusable} == (set() if value is None else {"price_per_hour", "started_at"})
    assert pv.check(detected, "stop", api_url=api.base(provider), env=env).state == pv.RUNNING
    pv.release(detected, "stop", api_url=api.base(provider), env=env)
    done = pv.confirm(detected, "stop", interval_s=0, api_url=api.base(provider), env=env)
    assert done.state == pv.STOPPED and [m for m in api.methods() if not m.startswith("GET")] == [
        f"POST /runpod/pods/{POD}/stop" if provider == pv.RUNPOD else f"PUT /vastai/instances/{VAST}/"
    ]


@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_an_unusable_state_fails_the_check_and_the_read_back_but_not_the_request(
    api: StandIn, provider: str
) -> None:
    """What an action needs decides it: a confirm cannot say stopped without a state, and says why."""
    field = "desiredStatus" if provider == pv.RUNPOD else "actual_status"
    (api.pods[POD] if provider == pv.RUNPOD else api.vast[VAST])[field] = 5
    api.settle_reads = 10**6  # the odd state stays
    detected, env = on(provider)
    assert pv.instance(detected, api_url=api.base(provider), env=env).state == pv.OTHER
    pv.release(detected, "stop", api_url=api.base(provider), env=env)
    for call in (pv.check, pv.confirm):
        with pytest.raises(pv.ProviderError, match=f"{field} must be a string") as err:
            call(detected, "stop", api_url=api.base(provider), env=env)  # type: ignore[operator]
        assert err.value.kind == "bad_answer"


def test_confirm_retries_transient_errors_within_its_bound(api: StandIn) -> None:
    api.settle_reads = 0
    detected, env = on(pv.RUNPOD)
    pv.release(detected, "stop", api_url=api.base("runpod"), env=env)
    api.fault, api.fault_count = "429", 1
    done = pv.confirm(detected, "stop", interval_s=0, api_url=api.base("runpod"), env=env)
    assert done.state == pv.STOPPED and done.polls == 2


def test_confirm_gives_up_loudly_at_its_bound(api: StandIn) -> None:
    api.settle_reads = 10**6
    detected, env = on(pv.VASTAI)
    pv.release(detected, "stop", api_url=api.base("vastai"), env=env)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(pv.ProviderError) as err:
        pv.confirm(detected, "stop", timeout_s=30, interval_s=10, api_url=api.base("vastai"), env=env,
                   sleep=sleep, clock=lambda: now[0])
    assert err.value.kind == "unconfirmed" and "not stopped after 30 s (4 reads)" in str(err.value)
    assert "running" in str(err.value)


def test_confirm_stops_at_once_on_a_refused_key(api: StandIn) -> None:
    detected, env = on(pv.RUNPOD)
    api.fault = "401"
    with pytest.raises(pv.ProviderError) as err:
        pv.confirm(detected, "stop", interval_s=0, api_url=api.base("runpod"), env=env)
    assert err.value.kind == "auth" and len(api.requests) == 1


def test_a_key_with_a_trailing_newline_is_trimmed_wherever_it_is_read(api: StandIn, tmp_path: Path) -> None:
    """PID 1's RUNPOD_API_KEY='...\\n': the header cannot hold the newline, the key is the rest."""
    detected, env = on(pv.RUNPOD)
    assert pv.check(detected, api_url=api.base("runpod"), env={**env, "RUNPOD_API_KEY": RUNPOD_KEY + "\n"}).state
    environ = tmp_path / "environ"
    environ.write_bytes(f"RUNPOD_POD_ID={POD}\0RUNPOD_API_KEY={RUNPOD_KEY}\r\n\0".encode())
    found = pv.detect(env={}, env_files=(), proc_environ=str(environ))
    assert found == pv.Detected(pv.RUNPOD, POD, str(environ))
    pv.release(found, "stop", api_url=api.base("runpod"))
    rp_environment = tmp_path / "rp_environment"
    rp_environment.write_text(f"export RUNPOD_POD_ID={POD}\nexport RUNPOD_API_KEY='{RUNPOD_KEY}\t'\n")
    found = pv.detect(env={}, env_files=(str(rp_environment),), proc_environ=str(tmp_path / "none"))
    assert pv.check(found, api_url=api.base("runpod")).provider == pv.RUNPOD
    assert {r.auth for r in api.requests} == {f"Bearer {RUNPOD_KEY}"}


@pytest.mark.parametrize("bad", [RUNPOD_KEY[:8] + "\n" + RUNPOD_KEY[8:], RUNPOD_KEY + "\x01", RUNPOD_KEY + " x",
                                 RUNPOD_KEY + "\u00e9"])
def test_a_key_a_header_cannot_hold_is_refused_by_its_name_never_its_value(api: StandIn, bad: str) -> None:
    detected, env = on(pv.RUNPOD)
    with pytest.raises(pv.ProviderError) as err:
        pv.check(detected, api_url=api.base("runpod"), env={**env, "RUNPOD_API_KEY": bad})
    assert err.value.kind == "config" and "RUNPOD_API_KEY in the environment is not an API key" in str(err.value)
    with pytest.raises(pv.ProviderError) as sent:  # nor is it sent by the HTTP layer, whoever calls it
        pv.http_json("GET", api.base("runpod") + f"/pods/{POD}", bad)
    assert sent.value.kind == "config" and "cannot hold" in str(sent.value)
    for message in (str(err.value), str(sent.value)):
        assert "STANDINKEY" not in message and "rpa_" not in message
    assert api.requests == []


def test_every_form_of_the_key_an_error_may_hold_is_redacted() -> None:
    key = RUNPOD_KEY + "\n"
    texts = [f"Invalid header value {('Bearer ' + key).encode()!r}", f"got {key!r}", f"url ?k={RUNPOD_KEY}",
             "/x?auth=" + urllib.parse.quote("Bearer " + RUNPOD_KEY), "q=" + urllib.parse.quote_plus(RUNPOD_KEY + "/+")]
    for text in texts:
        cleaned = pv.redact(text, key, RUNPOD_KEY + "/+")
        assert "STANDINKEY" not in cleaned and "***" in cleaned, (text, cleaned)
    assert pv.redact("nothing secret here", key) == "nothing secret here"


def test_a_wrong_key_is_refused_by_the_provider(api: StandIn) -> None:
    detected, _ = on(pv.RUNPOD)
    env = {"RUNPOD_POD_ID": POD, "RUNPOD_API_KEY": "rpa_WRONGKEY0123"}
    with pytest.raises(pv.ProviderError) as err:
        pv.check(detected, api_url=api.base("runpod"), env=env)
    assert err.value.kind == "auth" and "refused (401)" in str(err.value) and "WRONGKEY" not in str(err.value)


def test_an_unknown_instance_is_not_found(api: StandIn) -> None:
    detected = pv.Detected(pv.VASTAI, "999", pv.ENVIRONMENT)
    env = {"CONTAINER_ID": "999", "CONTAINER_API_KEY": VAST_KEY}
    for call in (lambda: pv.check(detected, api_url=api.base("vastai"), env=env),
                 lambda: pv.release(detected, "stop", api_url=api.base("vastai"), env=env)):
        with pytest.raises(pv.ProviderError) as err:
            call()
        assert err.value.kind == "not_found" and "999" in str(err.value)


@pytest.mark.parametrize(
    ("fault", "kind", "words"),
    [
        ("401", "auth", "refused (401)"),
        ("404", "not_found", "no instance"),
        ("429", "rate_limited", "retry after 7 s"),
        ("500", "server", "provider error 500"),
        ("slow", "timeout", "within 0.5 s"),
        ("drip", "timeout", "within 0.5 s"),
        ("redirect", "redirect", "'https://evil.example/steal?[31m'; redirects are never followed"),
        ("wrongtype", "bad_answer", "must be"),
        ("huge", "bad_answer", "longer than 1048576 bytes"),
        ("hugelength", "bad_answer", "answer of 2097152 bytes"),
        ("notjson", "bad_answer", "not JSON"),
    ],
)
@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_every_failure_is_a_clear_provider_error(
    api: StandIn, provider: str, fault: str, kind: str, words: str
) -> None:
    api.fault = fault
    detected, env = on(provider)
    with pytest.raises(pv.ProviderError) as err:  # a check: it needs the state ("wrongtype" breaks it)
        pv.check(
            detected, api_url=api.base(provider), env=env, deadline_s=0.5 if fault in ("slow", "drip") else 10
        )
    message = str(err.value)
    assert err.value.kind == kind and words in message, message
    assert RUNPOD_KEY not in message and VAST_KEY not in message and "\x1b" not in message
    assert err.value.retryable == (kind in ("rate_limited", "server", "timeout"))


@pytest.mark.parametrize(
    "url",
    ["http://api.example.com/v1", "ftp://127.0.0.1/", "https://user:pw@rest.runpod.io/v1",
     "https://rest.runpod.io/v1?x=1", "rest.runpod.io", ""],
)
def test_api_urls_are_https_or_loopback_http_only(url: str) -> None:
    with pytest.raises(pv.ProviderError) as err:
        pv.check_api_url(url)
    assert err.value.kind == "config"


def test_a_mode_no_provider_has_is_refused_before_any_call(api: StandIn) -> None:
    detected, env = on(pv.RUNPOD)
    with pytest.raises(pv.ProviderError) as err:
        pv.release(detected, "hibernate", api_url=api.base("runpod"), env=env)
    assert err.value.kind == "config" and api.requests == []
    with pytest.raises(pv.ProviderError):
        pv.release(pv.Detected(pv.NONE), "stop")


# ---- an emulated pod -----------------------------------------------------------------------------------------

PROBE = (
    "import json, os, sys; sys.path.insert(0, sys.argv[1]); from remote_agent.host import provider as p; "
    "d = p.detect(); print(json.dumps({'own': sorted(k for k in os.environ if k in p._wanted()), "
    "'found': p.describe(d), 'state': p.instance(d, api_url=sys.argv[2]).state}))"
)


@pytest.mark.parametrize("provider", [pv.RUNPOD, pv.VASTAI])
def test_an_emulated_pod_is_found_through_pid1_environ(api: StandIn, provider: str) -> None:
    """PID 1 of the namespace holds the provider's variables, the process the agent runs as does not (as over
    SSH): the agent finds them in /proc/1/environ and the instance answers with that key."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here: {probe.stderr.decode(errors='replace').strip()}")
    detected, env = on(provider)
    unset = " ".join(f"-u {name}" for name in env)
    script = f'env {unset} "{sys.executable}" -c "$PROBE" "$ROOT" "$API"; exit $?'  # sh stays PID 1
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "env", "-i",
         *(f"{k}={v}" for k, v in env.items()), f"PROBE={PROBE}", f"ROOT={ROOT}", f"API={api.base(provider)}",
         "PATH=/usr/bin:/bin", "/bin/sh", "-c", script],
        capture_output=True, timeout=60, text=True,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["own"] == []  # the agent's own environment has none of them
    assert result["found"] == {**pv.describe(detected), "source": "/proc/1/environ"}
    assert result["state"] == "running"
    assert RUNPOD_KEY not in out.stdout + out.stderr and VAST_KEY not in out.stdout + out.stderr


def test_the_deadline_covers_a_hung_name_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The call gives up at its deadline while the lookup is still hung (it finishes in the background)."""
    gate, returned = threading.Event(), threading.Event()
    real = socket.getaddrinfo

    def hung(*args: Any, **kwargs: Any) -> Any:
        gate.wait(60)
        returned.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hung)
    try:
        with pytest.raises(pv.ProviderError) as err:
            pv.http_json("GET", "http://localhost:9/pods/x", RUNPOD_KEY, deadline_s=0.3)
        assert err.value.kind == "timeout" and not returned.is_set()
    finally:
        gate.set()


def _parsed(provider: str, change: dict[str, Any]) -> pv.Instance:
    """The stand-in's instance, with ``change`` made to its fields, as the agent parses it."""
    if provider == pv.RUNPOD:
        return pv._runpod_instance({**standin.runpod_pod(POD), **change}, POD)
    found = pv._vast_instance({"instances": {**standin.vast_instance(int(VAST)), **change}}, VAST)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("provider", "change", "words", "feeds"),
    [
        (pv.RUNPOD, {"costPerHr": -1}, "costPerHr must be a price", "price_per_hour"),
        (pv.RUNPOD, {"costPerHr": True}, "costPerHr must be a number", "price_per_hour"),
        (pv.RUNPOD, {"costPerHr": "NaN"}, "costPerHr must be a number", "price_per_hour"),
        (pv.RUNPOD, {"costPerHr": 1e9}, "costPerHr must be a price", "price_per_hour"),
        (pv.RUNPOD, {"desiredStatus": None}, "desiredStatus must be a string", "state"),
        (pv.RUNPOD, {"desiredStatus": "R" * 500}, "desiredStatus must be a string", "state"),
        (pv.RUNPOD, {"networkVolumeId": 5}, "networkVolumeId must be a string", "can_stop"),
        (pv.RUNPOD, {"lastStartedAt": "yesterday"}, "lastStartedAt must be an ISO 8601 time", "started_at"),
        (pv.RUNPOD, {"id": "someoneelse"}, "id must be the pod asked for", None),
        (pv.VASTAI, {"dph_total": float("inf")}, "dph_total must be a price", "price_per_hour"),
        (pv.VASTAI, {"dph_total": [0.3]}, "dph_total must be a number", "price_per_hour"),
        (pv.VASTAI, {"actual_status": 1}, "actual_status must be a string", "state"),
        (pv.VASTAI, {"start_date": "soon"}, "start_date must be an ISO 8601 time", "started_at"),
        (pv.VASTAI, {"id": 884}, "id must be the instance asked for", None),
    ],
)
def test_every_field_used_is_checked_by_type(
    provider: str, change: dict[str, Any], words: str, feeds: str | None
) -> None:
    """Every field is checked; an unusable one reads as unknown, noted for the field of ``Instance`` it feeds
    (which only the actions that need that field refuse: ``pv.NEEDS``). Another instance's id is never used."""
    if feeds is None:
        with pytest.raises(pv.ProviderError) as err:
            _parsed(provider, change)
        assert err.value.kind == "bad_answer" and words in str(err.value)
        return
    found = _parsed(provider, change)
    assert [(name, words in why) for name, why in found.unusable] == [(feeds, True)]
    assert getattr(found, feeds) in (None, pv.OTHER, True)  # unknown (a stop is left to the provider to refuse)
    for action, needs in pv.NEEDS.items():
        if feeds in needs:
            with pytest.raises(pv.ProviderError, match=words):
                found.needed(action)
        else:
            assert found.needed(action) is found


@pytest.mark.parametrize("body", [[], "pod", 5, None])
def test_an_answer_of_the_wrong_shape_is_a_clear_error(body: Any) -> None:
    with pytest.raises(pv.ProviderError) as err:
        pv._runpod_instance(body, POD)
    assert err.value.kind == "bad_answer" and "must be a JSON object" in str(err.value)
    with pytest.raises(pv.ProviderError):
        pv._vast_instance({"instances": body or 7}, VAST)


def test_vast_reports_gone_and_stopped_states_as_the_bill_sees_them() -> None:
    assert pv._vast_instance({"instances": None}, VAST) is None
    stopped = pv._vast_instance({"instances": standin.vast_instance(int(VAST), "stopped", "stopped")}, VAST)
    frozen = pv._vast_instance({"instances": standin.vast_instance(int(VAST), "frozen", "running")}, VAST)
    loading = pv._vast_instance({"instances": standin.vast_instance(int(VAST), None, "running")}, VAST)
    assert [i.state if i else None for i in (stopped, frozen, loading)] == [
        pv.STOPPED,
        pv.RUNNING,
        pv.STARTING,
    ]
    assert (
        pv.reached(stopped, "stop") and not pv.reached(stopped, "terminate") and pv.reached(None, "terminate")
    )

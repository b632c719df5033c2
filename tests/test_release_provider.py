"""``gputui release HOST [--check]`` and ``status`` on provider hosts (issue 26): the real CLI and agent (local
transport), the provider APIs played by tests/provider_standin.py. The agent's environment holds the pod's
variables (the emulated pod with PID 1 alone holding them is in tests/test_provider_release.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import provider_standin as standin
import pytest
from conftest import Home
from provider_standin import LAMBDA_KEY, RUNPOD_KEY, VAST_KEY, StandIn

POD, LAMBDA_ID = "xedezhzb9la3ye", "0920582c7ff041399e34823a0be62549"


@pytest.fixture
def api() -> Iterator[StandIn]:
    state, server = standin.start()
    state.pods[POD] = standin.runpod_pod(POD)
    state.lambdas[LAMBDA_ID] = standin.lambda_instance(LAMBDA_ID, "127.0.0.1")
    try:
        yield state
    finally:
        standin.stop(state, server)


def pod_config(home: Home, api: StandIn, extra: str = "", key: str = RUNPOD_KEY) -> None:
    """A local host whose agent runs "on a RunPod pod" (its environment holds the pod's id and key)."""
    home.env.update(RUNPOD_POD_ID=POD, RUNPOD_API_KEY=key)
    home.write_config(
        f'[providers.runpod]\napi_url = "{api.base("runpod")}"\n'
        f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\ncount_ssh_sessions = false\n{extra}'
    )


def writes(api: StandIn) -> list[str]:
    return [m for m in api.methods() if not m.startswith("GET")]


def test_check_proves_the_provider_release_without_side_effects(home: Home, api: StandIn) -> None:
    pod_config(home, api)
    res = home.cli("release", "local", "--check")
    assert res.returncode == 0, res.stderr
    assert f"release check ok (runpod): runpod answers for instance {POD} (RUNNING); release would stop it" in res.stdout
    assert writes(api) == [] and api.pods[POD]["desiredStatus"] == "RUNNING"


def test_a_wrong_key_fails_the_check(home: Home, api: StandIn) -> None:
    pod_config(home, api, key="rpa_WRONGKEY_0123456789")
    res = home.cli("release", "local", "--check")
    assert res.returncode == 1
    assert "release check FAILED (runpod)" in res.stderr and "refused (401)" in res.stderr
    assert "WRONGKEY" not in res.stderr + res.stdout and writes(api) == []


def test_a_missing_release_remote_program_fails_the_check(home: Home, api: StandIn) -> None:
    pod_config(home, api, 'release_remote = ["no-such-release-program-gputui"]\n')
    res = home.cli("release", "local", "--check")
    assert res.returncode == 1 and "not found or not executable on the host" in res.stderr
    # The user's command wins: the check does not ask the provider (the one read is the pod's price, at connect).
    assert api.methods() == [f"GET /runpod/pods/{POD}"]


def test_release_stops_the_pod_through_the_agent_and_confirms_before_closing_the_ledger(
    home: Home, api: StandIn
) -> None:
    pod_config(home, api, "price_per_hour = 1.0\n")
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 0, res.stderr
    assert writes(api) == [f"POST /runpod/pods/{POD}/stop"] and api.pods[POD]["desiredStatus"] == "EXITED"
    assert "local: released (confirmed: runpod: EXITED (stopped))" in res.stdout
    [host] = json.loads(home.cli("cost", "--json", check=True).stdout)["hosts"]
    assert host["released"] is True


def test_a_failing_stop_is_not_released(home: Home, api: StandIn) -> None:
    pod_config(home, api, "price_per_hour = 1.0\n")
    api.fault = "500"
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 1 and "local was not released: runpod" in res.stderr and "500" in res.stderr
    [host] = json.loads(home.cli("cost", "--json", check=True).stdout)["hosts"]
    assert host["released"] is False


def test_provider_none_has_no_release(home: Home, api: StandIn) -> None:
    pod_config(home, api, 'provider = "none"\n')
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 2 and "no release command for local" in res.stderr
    assert api.requests == []


def test_status_shows_the_provider_its_price_and_the_check(home: Home, api: StandIn) -> None:
    pod_config(home, api, "autostop_minutes = 600\n")
    home.cli("status", check=True)  # arms the watchdog, which checks the release at once
    from conftest import wait_for

    wait_for(lambda: (home.state_dir / "release_check.json").exists(), what="the watchdog's release check")
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    cost = host["cost"]
    assert cost["price_per_hour"] == 0.74 and cost["price_source"] == "runpod"
    assert cost["provider"] == "runpod" and cost["instance_id"] == POD and cost["release_check_ok"] is True
    text = home.cli("status", check=True).stdout
    assert "0.74 USD/h · runpod" in text and f"release  runpod {POD} · release checked" in text
    assert writes(api) == []


@pytest.mark.parametrize(
    ("provider", "value"), [("runpod", "$0.74"), ("runpod", float("nan")), ("runpod", True), ("vastai", 1e308),
                            ("vastai", "abc"), ("vastai", float("nan"))],
)
def test_a_price_the_provider_gives_unusably_is_unknown_and_the_release_goes_through(
    home: Home, api: StandIn, provider: str, value: object
) -> None:
    """status says "price unknown" (the check is ok, its detail says why); release stops the instance and
    reads it back (the answer after the stop still holds the odd price)."""
    if provider == "runpod":
        pod_config(home, api, "autostop_minutes = 600\n")
        api.pods[POD]["costPerHr"], want = value, f"POST /runpod/pods/{POD}/stop"
    else:
        vast_config(home, api, "autostop_minutes = 600\n")
        api.vast[VAST_ID]["dph_total"], want = value, f"PUT /vastai/instances/{VAST_ID}/"
    home.cli("status", check=True)
    from conftest import wait_for

    wait_for(lambda: (home.state_dir / "release_check.json").exists(), what="the watchdog's release check")
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    cost = host["cost"]
    assert cost["price_per_hour"] is None and cost["release_check_ok"] is True
    field = "costPerHr" if provider == "runpod" else "dph_total"
    assert f"{field} must be" in cost["price_unknown"] and "price per hour unknown" in cost["release_check_detail"]
    assert "cost  price unknown" in home.cli("status", check=True).stdout
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 0, res.stderr
    assert writes(api) == [want] and "released (confirmed:" in res.stdout


def test_a_lambda_host_is_matched_by_address_and_terminated_from_here(home: Home, api: StandIn) -> None:
    home.env.update(LAMBDA_API_KEY=LAMBDA_KEY)
    home.write_config(
        f'[providers.lambda]\napi_url = "{api.base("lambda")}"\n'
        f'[hosts.local]\ntransport = "local"\nhost = "127.0.0.1"\nremote_dir = "{home.state_dir}"\n'
        'count_ssh_sessions = false\nprovider = "lambda"\nprice_per_hour = 1.29\n'
    )
    check = home.cli("release", "local", "--check")
    assert check.returncode == 0 and f"lambda answers for instance {LAMBDA_ID}" in check.stdout, check.stderr
    assert writes(api) == []
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 0, res.stderr
    assert writes(api) == ["POST /lambda/instance-operations/terminate"]
    assert "released (confirmed: lambda:" in res.stdout


async def test_add_detects_the_provider(
    home: Home, api: StandIn, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ``add`` flow's hook: the new host's agent finds the pod, asking the API at the config's ``api_url``;
the provider and the pod's id go where none is set, the price is not frozen (a host that is no pod:
tests/test_hostadd.py)."""
    from gputui.cli import hosts
    from gputui.core.config import file as cfg
    from gputui.core.hosts.fleet import Fleet
    from gputui.core.money import autostop

    pod_config(home, api)
    for name in ("RUNPOD_POD_ID", "RUNPOD_API_KEY"):
        monkeypatch.setenv(name, home.env[name])  # the local agent runs with this process' environment
    config = cfg.load(str(home.root / ".config" / "gputui" / "config.toml"))
    fleet = Fleet(config)
    try:
        session = fleet.session("local")
        await session.start()
        assert hosts.detect_provider is not None
        urls = autostop.api_urls(config)
        found = await hosts.detect_provider(session, {"transport": "local"}, urls)
        kept = await hosts.detect_provider(session, {"price_per_hour": 2.0}, urls)
    finally:
        await fleet.close()
    assert found == {"provider": "runpod", "instance_id": POD}  # the price is read at every connect, never frozen
    assert kept == {"provider": "runpod", "instance_id": POD}  # a price the user typed stays theirs
    out = capsys.readouterr().out
    assert "provider: runpod prices it at 0.74/h now; gputui reads its price at every connect" in out
    assert f"provider: runpod detected; adding provider = 'runpod', instance_id = '{POD}'" in out
    assert f"GET /runpod/pods/{POD}" in api.methods() and writes(api) == []


def _release_check(home: Home) -> dict:
    [report] = json.loads(home.cli("doctor", "--json", "--timeout", "60").stdout)["hosts"]
    return next(c for c in report["checks"] if c["id"] == "release")


def test_doctor_has_the_release_check(home: Home, api: StandIn) -> None:
    pod_config(home, api)
    check = _release_check(home)
    assert check["status"] == "ok" and check["detail"].startswith(f"runpod: runpod answers for instance {POD}")
    pod_config(home, api, key="rpa_WRONGKEY_0123456789")
    check = _release_check(home)
    assert check["status"] == "fail" and "refused (401)" in check["detail"] and "would NOT be released" in check["detail"]
    assert writes(api) == []


def test_doctor_skips_the_release_check_where_none_is_set_or_found(home: Home) -> None:
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n')
    assert _release_check(home)["status"] == "skip"


def test_the_app_shows_the_price_source_the_check_and_a_failed_release() -> None:
    import time

    from gputui.core.session import model as M
    from gputui.ui.palette import Palette
    from gputui.ui.widgets.host import host_info

    cost = M.CostInfo(price_per_hour=0.74, price_source="runpod", autostop_in_s=2520.0, provider="runpod",
                      instance_id=POD, release_check_ok=True, release_check_at=time.time() - 180)
    line = host_info(M.HostSnapshot(name="pod", cost=cost), Palette()).plain
    assert "· runpod" in line and "autostop in 42m" in line and "release checked 3m" in line
    unknown = M.CostInfo(price_unknown="runpod API: costPerHr must be a number, not '$0.74'", provider="runpod")
    assert "price unknown" in host_info(M.HostSnapshot(name="pod", cost=unknown), Palette()).plain
    failed = M.CostInfo(price_per_hour=0.74, release_failed="runpod stop: provider error 500\x1b[2J")
    line = host_info(M.HostSnapshot(name="pod", cost=failed), Palette()).plain
    assert "RELEASE FAILED, still billing: runpod stop: provider error 500" in line and "\x1b" not in line


def test_autostop_on_a_host_with_no_provider_and_no_command_says_it_is_not_armed(home: Home) -> None:
    """provider "auto" lets autostop go without release_remote; where the host turns out to be no pod, nothing
    is armed, and status says so instead of showing a countdown that would release nothing."""
    home.write_config(f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
                      "count_ssh_sessions = false\nautostop_minutes = 30\n")
    [host] = json.loads(home.cli("status", "--json", check=True).stdout)["hosts"]
    assert host["cost"]["release_check_ok"] is False and host["cost"]["autostop_in_s"] is None
    assert "NOT armed" in host["cost"]["release_check_detail"]
    assert not (home.state_dir / "watchdog.json").exists()
    assert "release  autostop / deadline NOT armed on the host" in home.cli("status", check=True).stdout


def test_a_users_release_command_wins_over_the_provider(home: Home, api: StandIn) -> None:
    """``release`` (run here) set: autostop is a config error (it cannot run with the laptop closed), and the
    watchdog is never told to use the provider instead."""
    pod_config(home, api, 'release = ["true"]\nautostop_minutes = 30\n')
    res = home.cli("status")
    assert res.returncode == 2 and "needs release_remote" in res.stderr and "release runs here" in res.stderr
    from gputui.core.config import file as cfg
    from gputui.core.money import autostop

    host = cfg.HostConfig(name="h", release=("true",), release_at=None)
    assert autostop.watchdog_config(host, None)["provider"] == "none"
    assert api.requests == []


VAST_ID = "4242"


def end_the_container(home: Home) -> Callable[[], None]:
    """What a stop does to a pod: every process in it ends, the agent (and with it the link) first."""

    def end() -> None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if str(home.state_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGKILL)

    return end


def vast_config(home: Home, api: StandIn, extra: str = "price_per_hour = 1.0\n") -> None:
    """A local host whose agent runs "on a vast.ai instance" (the instance's own id and key in its env)."""
    api.vast[VAST_ID] = standin.vast_instance(int(VAST_ID))
    home.env.update(CONTAINER_ID=VAST_ID, CONTAINER_API_KEY=VAST_KEY)
    home.write_config(
        f'[providers.vastai]\napi_url = "{api.base("vastai")}"\n[hosts.local]\ntransport = "local"\n'
        f'remote_dir = "{home.state_dir}"\ncount_ssh_sessions = false\n{extra}'
    )


def released(home: Home) -> bool:
    [host] = json.loads(home.cli("cost", "--json", check=True).stdout)["hosts"]
    return bool(host["released"])


def test_a_stop_that_ends_the_pod_and_the_link_is_confirmed_from_here_with_the_users_key(
    home: Home, api: StandIn
) -> None:
    pod_config(home, api, "price_per_hour = 1.0\n")  # RUNPOD_API_KEY is in this machine's environment too
    api.on_release = end_the_container(home)
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 0, res.stderr
    assert api.pods[POD]["desiredStatus"] == "EXITED" and writes(api) == [f"POST /runpod/pods/{POD}/stop"]
    assert "released (confirmed: runpod: EXITED, read back from this machine with the key in $RUNPOD_API_KEY" in res.stdout
    assert released(home)


def test_without_a_key_here_a_release_the_link_did_not_outlive_is_loud_and_not_marked(
    home: Home, api: StandIn
) -> None:
    vast_config(home, api)  # the instance's CONTAINER_API_KEY is no key of the user's: nothing to read back with
    api.on_release = end_the_container(home)
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 1, res.stdout
    assert "it is NOT marked released" in res.stderr and f"check instance {VAST_ID}" in res.stderr
    assert "$VAST_API_KEY or ~/.config/vastai/vast_api_key" in res.stderr and VAST_KEY not in res.stderr
    assert writes(api) == [f"PUT /vastai/instances/{VAST_ID}/"] and not released(home)


def test_the_vastai_cli_key_file_here_confirms_it(home: Home, api: StandIn) -> None:
    vast_config(home, api)
    key_file = Path(home.env["HOME"]) / ".config" / "vastai" / "vast_api_key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(VAST_KEY + "\n")
    api.on_release = end_the_container(home)
    res = home.cli("release", "local", "--yes", "--no-pull")
    assert res.returncode == 0, res.stderr
    assert "read back from this machine with the key in ~/.config/vastai/vast_api_key" in res.stdout
    assert api.vast[VAST_ID]["actual_status"] == "stopped" and released(home)


def test_account_keys_are_read_from_the_providers_own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.core.money import providers

    monkeypatch.setenv("HOME", str(tmp_path))
    assert providers.account_key("runpod", env={}) is None
    conf = tmp_path / ".runpod" / "config.toml"
    conf.parent.mkdir()
    conf.write_text('apikey = "rpa_FROMRUNPODCTL0123"\napiurl = "https://api.runpod.io/graphql"\n')  # runpodctl
    assert providers.account_key("runpod", env={}) == ("rpa_FROMRUNPODCTL0123", "~/.runpod/config.toml")
    conf.write_text('[default]\napi_key = "rpa_FROMSDK0123456"\n')  # runpod-python's `runpod config`
    assert providers.account_key("runpod", env={})[0] == "rpa_FROMSDK0123456"  # type: ignore[index]
    assert providers.account_key("runpod", env={"RUNPOD_API_KEY": "rpa_ENV0123456789"})[1] == "$RUNPOD_API_KEY"  # type: ignore[index]
    conf.write_text('apikey = "two words"\n')
    with pytest.raises(providers.ProviderError, match="runpod API key in ~/.runpod/config.toml is not an API key"):
        providers.account_key("runpod", env={})
    assert providers.account_key("lambda", env={}) is None  # Lambda's key is its own (lambda_key)


def _all_text(home: Home, *outputs: subprocess.CompletedProcess[str]) -> bytes:
    """Every command's output and every file under the test's HOME (the host's state dir, release_check.json,
    watchdog.log, the client's state, cache and log dirs), as bytes."""
    found = [(res.stdout + res.stderr).encode() for res in outputs]
    found += [p.read_bytes() for p in home.root.rglob("*") if p.is_file() and not p.is_symlink()]
    return b"\n".join(found)


@pytest.mark.parametrize("fault", [None, "echo", "notjson", "redirect", "401"])
def test_a_key_with_a_newline_releases_and_never_shows_anywhere(home: Home, api: StandIn, fault: str | None) -> None:
    """PID 1's RUNPOD_API_KEY='...\\n' (a trailing newline): trimmed, it works; with an endpoint that fails in
    several ways (echoing the key as sent and URL-quoted, a redirect, a refusal), the key's value appears in no
    output and no file of ours: the check, status with the armed watchdog, doctor, the release."""
    pod_config(home, api, "price_per_hour = 1.0\nautostop_minutes = 600\n", key=RUNPOD_KEY + "\n")
    api.fault = fault
    check = home.cli("release", "local", "--check")
    status = home.cli("status")  # arms the watchdog: its own check goes to release_check.json and watchdog.log
    from conftest import wait_for

    wait_for(lambda: (home.state_dir / "release_check.json").exists(), what="the watchdog's release check")
    doctor = home.cli("doctor", "--json", "--timeout", "60")
    release = home.cli("release", "local", "--yes", "--no-pull")
    assert (check.returncode, release.returncode) == ((0, 0) if fault is None else (1, 1)), release.stderr
    assert released(home) is (fault is None)
    text = _all_text(home, check, status, doctor, release)
    assert (home.state_dir / "watchdog.log").exists()  # (release_check.json: waited for above)
    for form in (RUNPOD_KEY, urllib.parse.quote(RUNPOD_KEY), "STANDINKEY"):
        assert form.encode() not in text, form

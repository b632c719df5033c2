"""gputui/core/money/providers.py (the Lambda client, against the local stand-in) and the config keys ``provider``,
``release_mode`` and ``[providers.NAME] api_url``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import provider_standin as standin
import pytest
from provider_standin import LAMBDA_KEY, StandIn

from gputui.core.config import file as cfg
from gputui.core.config import providers as settings
from gputui.core.money import providers as pr

IP = "198.51.100.7"


@pytest.fixture
def api() -> Iterator[StandIn]:
    state, server = standin.start()
    state.lambdas["0920582c7ff041399e34823a0be62549"] = standin.lambda_instance(
        "0920582c7ff041399e34823a0be62549", IP
    )
    state.lambdas["other"] = standin.lambda_instance("other", "203.0.113.9", cents=2490)
    try:
        yield state
    finally:
        standin.stop(state, server)


ID = "0920582c7ff041399e34823a0be62549"


# ---- the key -------------------------------------------------------------------------------------------------


def test_lambda_key_comes_from_the_env_var_first_then_the_lambda_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "lambda_keys"
    keys.write_text(f"# Lambda Cloud\napi_key = {LAMBDA_KEY}\n")
    assert pr.lambda_key(env={}, path=keys) == LAMBDA_KEY
    assert pr.lambda_key(env={"LAMBDA_API_KEY": "secret_fromenv_123"}, path=keys) == "secret_fromenv_123"
    assert pr.lambda_key(env={}, path=tmp_path / "absent") is None
    keys.write_text("api_key = has a space\n")
    with pytest.raises(pr.ProviderError) as err:
        pr.lambda_key(env={}, path=keys)
    assert err.value.kind == "config" and str(keys) in str(err.value) and "has a space" not in str(err.value)


# ---- the client ------------------------------------------------------------------------------------------------


def test_list_reads_instances_with_the_types_price(api: StandIn) -> None:
    got = asyncio.run(pr.list_instances(LAMBDA_KEY, api.base("lambda")))
    mine = next(i for i in got if i.id == ID)
    assert (mine.ip, mine.status, mine.type_name, mine.price_per_hour) == (
        IP,
        "active",
        "gpu_1x_a100_sxm4",
        1.29,
    )
    assert api.requests[-1].auth == f"Bearer {LAMBDA_KEY}" and api.methods() == ["GET /lambda/instances"]


def test_a_host_is_matched_by_its_address(api: StandIn) -> None:
    assert asyncio.run(pr.find(LAMBDA_KEY, IP, api.base("lambda"))).id == ID  # type: ignore[union-attr]
    assert asyncio.run(pr.find(LAMBDA_KEY, "192.0.2.200", api.base("lambda"))) is None
    listed = asyncio.run(pr.list_instances(LAMBDA_KEY, api.base("lambda")))
    assert pr.match(listed, ["198-51-100-7.cloud.lambdalabs.com."]).id == ID  # type: ignore[union-attr]


def test_check_proves_key_and_address_without_side_effects(api: StandIn, tmp_path: Path) -> None:
    assert asyncio.run(pr.check(LAMBDA_KEY, IP, api.base("lambda"))).price_per_hour == 1.29
    with pytest.raises(pr.ProviderError) as err:
        asyncio.run(pr.check(LAMBDA_KEY, "192.0.2.200", api.base("lambda")))
    assert err.value.kind == "not_found" and "'192.0.2.200'" in str(err.value)
    assert {r.method for r in api.requests} == {"GET"}
    with pytest.raises(pr.ProviderError) as err:
        pr.require_lambda_key(env={}, path=tmp_path / "absent")
    assert "LAMBDA_API_KEY" in str(err.value) and "api_key = KEY" in str(err.value)


def test_a_terminated_instance_or_two_matches_are_never_a_guess() -> None:
    one = pr.parse_instance(standin.lambda_instance("a", IP, status="terminated"))
    assert pr.match([one], [IP]) is None
    two = [pr.parse_instance(standin.lambda_instance(i, IP)) for i in ("a", "b")]
    with pytest.raises(pr.ProviderError) as err:
        pr.match(two, [IP])
    assert "several instances (a, b)" in str(err.value)


def test_terminate_then_confirm_polls_until_terminated(api: StandIn) -> None:
    api.settle_reads = 2
    asyncio.run(pr.terminate(LAMBDA_KEY, ID, api.base("lambda")))
    assert api.requests[-1].body == {"instance_ids": [ID]}
    assert api.lambdas["other"]["status"] == "active"  # only the one asked for
    done = asyncio.run(pr.confirm_terminated(LAMBDA_KEY, ID, api.base("lambda"), interval_s=0))
    assert done.state == "terminated" and done.polls == 3


def test_terminating_an_unknown_instance_is_not_found(api: StandIn) -> None:
    with pytest.raises(pr.ProviderError) as err:
        pr.terminate_sync(LAMBDA_KEY, "nope", api.base("lambda"))
    assert err.value.kind == "not_found"


def test_confirm_gives_up_loudly_at_its_bound(api: StandIn) -> None:
    api.settle_reads = 10**6
    pr.terminate_sync(LAMBDA_KEY, ID, api.base("lambda"))
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(pr.ProviderError) as err:
        pr.confirm_terminated_sync(LAMBDA_KEY, ID, api.base("lambda"), timeout_s=20, interval_s=10, sleep=sleep,
                                   clock=lambda: now[0])
    assert err.value.kind == "unconfirmed" and "last: terminating" in str(err.value)


@pytest.mark.parametrize(
    ("fault", "kind"),
    [("401", "auth"), ("429", "rate_limited"), ("500", "server"), ("slow", "timeout"), ("drip", "timeout"),
     ("redirect", "redirect"), ("wrongtype", "bad_answer"), ("huge", "bad_answer"), ("notjson", "bad_answer"),
     ("404", "bad_answer")],
)
def test_every_failure_is_a_clear_provider_error(api: StandIn, fault: str, kind: str) -> None:
    api.fault = fault
    with pytest.raises(pr.ProviderError) as err:
        asyncio.run(
            pr.list_instances(
                LAMBDA_KEY, api.base("lambda"), deadline_s=0.5 if fault in ("slow", "drip") else 10
            )
        )
    assert err.value.kind == kind and LAMBDA_KEY not in str(err.value)


@pytest.mark.parametrize("value", [129.5, "$1.29", "abc", -1, float("nan"), 1e308, True, None, [129], "9" * 200_000])
def test_an_unusable_price_is_unknown_and_never_blocks_the_release(api: StandIn, value: object) -> None:
    """price_cents_per_hour is display-only: any odd value reads as None; matching, terminating and the
    read-back go through (what they need, id and status, is usable)."""
    api.lambdas[ID]["instance_type"]["price_cents_per_hour"] = value
    api.lambdas[ID]["name"] = {"odd": "name"}
    found = asyncio.run(pr.check(LAMBDA_KEY, IP, api.base("lambda")))
    assert (found.id, found.price_per_hour, found.name) == (ID, None, None)
    pr.terminate_sync(LAMBDA_KEY, ID, api.base("lambda"))
    assert pr.confirm_terminated_sync(LAMBDA_KEY, ID, api.base("lambda"), interval_s=0).state == "terminated"


def test_a_wrong_key_is_refused(api: StandIn) -> None:
    with pytest.raises(pr.ProviderError) as err:
        pr.list_instances_sync("secret_wrong_0000", api.base("lambda"))
    assert err.value.kind == "auth"


# ---- release modes and config --------------------------------------------------------------------------------


def test_release_mode_defaults_and_problems() -> None:
    assert [settings.default_release_mode(p) for p in ("runpod", "vastai", "lambda", "auto")] == [
        "stop", "stop", "terminate", "stop"
    ]
    assert "Lambda has no stop" in (settings.release_mode_problem("lambda", "stop") or "")
    assert settings.release_mode_problem("runpod", "stop") is None
    assert "must be one of stop, terminate" in (settings.release_mode_problem("runpod", "pause") or "")


def parse(text: str) -> cfg.Config:
    return cfg.parse(text, Path("c.toml"))


def error_of(text: str) -> str:
    with pytest.raises(cfg.ConfigError) as err:
        parse(text)
    return str(err.value)


def test_provider_settings_parse_with_their_defaults() -> None:
    conf = parse(
        '[providers.runpod]\napi_url = "http://127.0.0.1:9/runpod"\n[providers.lambda]\n'
        'api_url = "https://proxy.example/lambda/v1"\n'
        '[hosts.a]\n[hosts.b]\nprovider = "lambda"\nrelease_mode = "terminate"\n'
        '[hosts.c]\nprovider = "runpod"\nrelease_mode = "stop"\n'
    )
    assert (conf.hosts["a"].provider, conf.hosts["a"].release_mode) == ("auto", None)
    assert (conf.hosts["b"].provider, conf.hosts["b"].release_mode) == ("lambda", "terminate")
    assert conf.hosts["c"].release_mode == "stop"
    assert conf.providers == {
        "runpod": cfg.ProviderSettings("http://127.0.0.1:9/runpod"),
        "lambda": cfg.ProviderSettings("https://proxy.example/lambda/v1"),
    }
    assert parse("[hosts.a]\n").providers == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[hosts.a]\nprovider = "aws"\n', "c.toml:2: hosts.a.provider: 'aws' is not a provider gputui knows (known: auto, runpod"),
        ('[hosts.a]\nprovider = "lambda"\nrelease_mode = "stop"\n', "c.toml:3: hosts.a.release_mode: Lambda has no stop"),
        ('[hosts.a]\nrelease_mode = "hibernate"\n', "c.toml:2: hosts.a.release_mode: must be one of stop, terminate"),
        ('[hosts.a]\nprovider = "none"\nrelease_mode = "stop"\n', 'release_mode: needs a provider: with provider = "none"'),
        ('[hosts.a]\nprovider = 3\n', "c.toml:2: hosts.a.provider: must be a string"),
        ('[providers.aws]\napi_url = "https://x.example"\n', "c.toml:1: providers.aws: unknown provider (known: runpod, vastai, lambda)"),
        ('[providers.runpod]\nurl = "https://x.example"\n', "c.toml:2: providers.runpod.url: unknown setting (did you mean 'api_url'?"),
        ('[providers.runpod]\napi_url = "http://api.example.com"\n', "c.toml:2: providers.runpod.api_url: 'http://api.example.com': plain http only to a loopback address"),
        ('[providers.vastai]\napi_url = 5\n', "c.toml:2: providers.vastai.api_url: must be a string"),
        ('[providers.vastai]\napi_url = "https://x.example/\\u001b[2J"\n', "must not contain control characters"),
        ("[providers]\nrunpod = 1\n", "c.toml:2: providers.runpod: must be a table like [providers.runpod]"),
        ("providers = 1\n", "c.toml:1: providers: must be a table"),
    ],
)
def test_provider_settings_errors_name_file_line_and_why(text: str, message: str) -> None:
    assert message in error_of(text)


def test_an_explicit_lambda_host_in_defaults_with_stop_is_refused() -> None:
    message = error_of('[defaults]\nrelease_mode = "stop"\n[hosts.a]\nprovider = "lambda"\n')
    assert "hosts.a.release_mode: Lambda has no stop" in message

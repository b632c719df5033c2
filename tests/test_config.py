"""Config validation: every number finite and in range, no control characters in strings, a BOM is fine."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Home

from gputui.core.config import file as cfg


def error_of(text: str) -> str:
    with pytest.raises(cfg.ConfigError) as err:
        cfg.parse(text, Path("c.toml"))
    return str(err.value)


@pytest.mark.parametrize("number", ["nan", "inf", "-inf", "+nan"])
@pytest.mark.parametrize(
    ("table", "key"),
    [("hosts.a", "price_per_hour"), ("defaults", "autostop_minutes"), ("hosts.a", "connect_timeout"),
     ("budget", "daily"), ("budget", "warn_fraction"), ("prices", '"H100"')],
)
def test_non_finite_numbers_are_rejected_with_file_line_and_field(table: str, key: str, number: str) -> None:
    extra = 'release_remote = "true"\n' if key == "autostop_minutes" else ""
    message = error_of(f"[{table}]\n{extra}{key} = {number}\n")
    line = 3 if extra else 2
    assert (
        message.startswith(f"c.toml:{line}: {table}.{key.strip(chr(34))}: ") and number.lstrip("+") in message
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("release_timeout = 0", "release_timeout: must be above 0"),
        ("release_timeout = 1e9", "release_timeout: must be at most 86400"),
        ("pre_stop_timeout = 1e9", "pre_stop_timeout: must be at most 86400"),
        ("connect_timeout = 0", "connect_timeout: must be above 0"),
        ("idle_util_percent = 150", "idle_util_percent: must be at most 100"),
        ("keepalive_count_max = -1", "keepalive_count_max: must not be negative"),
        ("idle_minutes = -1", "idle_minutes: must not be negative"),
        ("release_after_hours = 1e300", "release_after_hours: must be at most 100000"),
    ],
)
def test_numbers_out_of_range(setting: str, message: str) -> None:
    assert f"c.toml:2: hosts.a.{message}" in error_of(f"[hosts.a]\n{setting}\n")


def test_budget_fraction_is_a_fraction() -> None:
    assert "c.toml:2: budget.warn_fraction: must be at most 1" in error_of("[budget]\nwarn_fraction = 80\n")


@pytest.mark.parametrize(
    "value", ['"/tmp/x\\ny"', '"a\\u001b[31mb"', '"a\\tb"', '"a\\u202eb"', '"a\\u0085b"', '"a\\u007fb"']
)
@pytest.mark.parametrize("key", ["remote_dir", "host", "user", "python", "identity_file", "release_remote"])
def test_control_characters_in_strings_are_rejected(key: str, value: str) -> None:
    message = error_of(f'[hosts.a]\ntransport = "ssh"\n{key} = {value}\n')
    assert message.startswith(f"c.toml:3: hosts.a.{key}: must not contain control characters")
    assert "\x1b" not in message and "\n" not in message and "\u202e" not in message


def test_control_characters_in_commands_and_global_strings() -> None:
    assert "c.toml:2: hosts.a.release: must not contain control" in error_of(
        '[hosts.a]\nrelease = ["a", "b\\nc"]\n'
    )
    assert "c.toml:1: ssh_config: must not contain control" in error_of('ssh_config = "x\\u001bx"\n')
    assert "budget.on_exceed: must not contain" in error_of('[budget]\non_exceed = "warn\\n"\n')


def test_a_bom_at_the_start_is_accepted(home: Home) -> None:
    path = home.write_config("")
    path.write_bytes(
        b"\xef\xbb\xbf" + f'[hosts.local]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'.encode()
    )
    assert list(cfg.load(str(path)).hosts) == ["local"]
    assert "c.toml:2: hosts.a.port" in error_of('\ufeff[hosts.a]\nport = "22"\n')  # lines still count right
    assert "c.toml:3: hosts.a.port" in error_of('# a\u2028b\r\n[hosts.a]\r\nport = "22"\r\n')  # TOML's lines
    res = home.cli("jobs")
    assert res.returncode == 0, res.stderr


def test_bytes_that_are_not_utf8_are_fine_in_comments_only(home: Home) -> None:
    """An old editor's Latin-1 comment does not stop gputui; such bytes in a key or value are an error."""
    path = home.write_config("")
    path.write_bytes(f'# caf\xe9\n[hosts.local]  # \xff\ntransport = "local"\nremote_dir = "{home.state_dir}"\n'
                     .encode("latin-1"))
    assert list(cfg.load(str(path)).hosts) == ["local"]
    assert home.cli("jobs").returncode == 0
    path.write_bytes(b'[hosts.local]\ntransport = "local"\nremote_dir = "/tmp/caf\xe9"\n')
    with pytest.raises(cfg.ConfigError, match="hosts.local.remote_dir: holds bytes that are not UTF-8"):
        cfg.load(str(path))
    path.write_bytes(b'[hosts."caf\xe9\\u001b"]\ntransport = "local"\n')
    with pytest.raises(cfg.ConfigError, match=r"hosts\.'caf\\udce9\\x1b': holds bytes"):
        cfg.load(str(path))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[hosts.a]\nprot = 22\n", "c.toml:2: hosts.a.prot: unknown setting (did you mean 'port'?"),
        ("[budget]\ndialy = 3\n", "c.toml:2: budget.dialy: unknown setting (did you mean 'daily'?"),
        ('[notify]\nwebhok = "https://x"\n', "c.toml:2: notify.webhok: unknown setting (did you mean 'webhook'?"),
        ('currency = "USD"\n\n[host.a]\nhost = "x"\n', "c.toml:3: host: unknown setting (did you mean 'hosts'?"),
        ('host = "10.0.0.1"\n', "c.toml:1: host: unknown setting (did you mean 'hosts'? known: budget, "),
        ('[hosts.a]\nport = "22"\n', "c.toml:2: hosts.a.port: must be a whole number, not str '22'"),
        ('[hosts.a]\nverify_host_key = "no"\n', "hosts.a.verify_host_key: must be true or false, not str 'no'"),
        ('[budget]\ndaily = "x"\n', "c.toml:2: budget.daily: must be a number, not 'x'"),
        ("theme = 3\n", "c.toml:1: theme: must be a string, not 3"),
    ],
)
def test_a_typo_gets_the_setting_it_meant_and_the_line(text: str, says: str) -> None:
    """A misspelt key was "unknown" among ~30 names, a misspelt table had no line, a type was "a int"."""
    assert says in error_of(text)
    if text.startswith("host ="):  # a host's setting at the top: where it goes
        assert "it goes in a [hosts.NAME] table" in error_of(text)


def test_a_config_without_hosts_applies_notify_to_local_but_not_defaults(home: Home) -> None:
    """With no [hosts] the fleet is the local host, as with no file; its [notify] was ignored, so
    `gputui notify local --test` said "set [notify] ..." under a config that had set it. [defaults] stays
    for the hosts to come: its release commands and autostop never arm this machine."""
    out = home.root / "notified.txt"
    path = home.write_config(
        '[defaults]\nrelease_remote = "sudo shutdown -h now"\nautostop_minutes = 1\nprice_per_hour = 1.5\n\n'
        f'[notify]\ncommand = ["sh", "-c", "cat > {out}"]\n'
    )
    [local] = cfg.load(str(path)).hosts.values()
    assert (local.name, local.transport, local.remote_dir) == ("local", "local", cfg.default_local().remote_dir)
    assert (local.release_remote, local.autostop_minutes, local.price_per_hour) == (None, None, None)
    res = home.cli("notify", "local", "--test")
    assert res.returncode == 0, res.stderr
    assert out.read_text().startswith("[local] test message")

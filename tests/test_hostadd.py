"""gputui add / remove / hosts / --version: destinations as ssh takes them, the user's config kept byte for byte,
and the whole flow against the real test sshd (tests/sshd.py)."""

from __future__ import annotations

import functools
import json
import os
import pty
import select
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import Home, SshHome, wait_for

from gputui.core.hosts import edit as host_edit

UNREACHABLE, REFUSED, USAGE = 3, 4, 2

USER_CONFIG = """\
# my fleet: comments, odd spacing and order must survive
currency   =   "EUR"      # euros

# the box under my desk
[hosts.desk]
transport = "local"   # this machine
remote_dir = '~/.gputui-desk'

# keys every host shares
[defaults]
connect_timeout = 10
"""


# --- destinations ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "given, expected",
    [
        ("root@203.0.113.7", host_edit.Destination("203.0.113.7", "root")),
        ("gpu-box", host_edit.Destination("gpu-box")),
        ("ssh://ubuntu@203.0.113.7:22022", host_edit.Destination("203.0.113.7", "ubuntu", 22022)),
        ("ssh://MyBox", host_edit.Destination("MyBox")),
        ("ssh://u@[2001:db8::1]:2222", host_edit.Destination("2001:db8::1", "u", 2222)),
        ("[2001:db8::1]", host_edit.Destination("2001:db8::1")),
        ("me@[::1]", host_edit.Destination("::1", "me")),
        ("a@b@host", host_edit.Destination("host", "a@b")),  # ssh splits at the last @
    ],
)
def test_destinations_as_ssh_takes_them(given: str, expected: host_edit.Destination) -> None:
    assert host_edit.parse_destination(given) == expected


@pytest.mark.parametrize(
    "given, says",
    [
        ("203.0.113.7:22", "use -p 22"),
        ("ssh://h/path", "nothing more"),
        ("[not-v6]", "not an IPv6 address"),
        ("@host", "not a user name"),
        ("-oProxyCommand=x", "not a host name"),
        ("ho st", "not a host name"),
        ("ssh://h:99999", "not an ssh:// URL"),
    ],
)
def test_bad_destinations_say_why(given: str, says: str) -> None:
    with pytest.raises(host_edit.DestinationError, match=says):
        host_edit.parse_destination(given)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("ssh root@203.0.113.7 -p 22022 -i ~/.ssh/id_ed25519",
         host_edit.Destination("203.0.113.7", "root", 22022, "~/.ssh/id_ed25519")),
        ("ssh -p 22022 -l ubuntu 203.0.113.7", host_edit.Destination("203.0.113.7", "ubuntu", 22022)),
        ("ssh -o Port=2200 -o IdentityFile=/k -oUser=me h", host_edit.Destination("h", "me", 2200, "/k")),
        ("ssh -o 'Port 2200' -tt -p2200 h", host_edit.Destination("h", None, 2200)),
        ("/usr/bin/ssh -tv -i/k h", host_edit.Destination("h", None, None, "/k")),
    ],
)
def test_a_pasted_ssh_command_line(line: str, expected: host_edit.Destination) -> None:
    assert host_edit.parse(line, None) == expected  # quoted in one word
    assert host_edit.parse(None, shlex.split(line)) == expected  # after --


@pytest.mark.parametrize(
    "line, says",
    [
        ("ssh -p 12345 root@ssh5.vast.ai -L 8080:localhost:8080", "-L is not one gputui add takes.*gputui forward"),
        ("ssh -J jump h", "-J is not one.*ProxyJump"),
        ("ssh -o StrictHostKeyChecking=no h", "-o StrictHostKeyChecking is not one"),
        ("ssh h nvidia-smi", "'nvidia-smi' after the destination is a remote command"),
        ("ssh -p", "-p needs a value"),
        ("ssh -p 0 h", "port must be a number from 1 to 65535"),
        ("ssh -l a b@h", "two users"),
        ("scp a h:", "not an ssh command line"),
        ("ssh -v", "no destination"),
    ],
)
def test_a_pasted_ssh_command_line_gputui_cannot_take_is_named(line: str, says: str) -> None:
    with pytest.raises(host_edit.DestinationError, match=says):
        host_edit.parse(None, line.split())


def test_flags_beside_the_destination_merge_and_must_agree() -> None:
    dest = host_edit.parse("root@h", None).merged(port=2222, identity_file="/k")
    assert dest == host_edit.Destination("h", "root", 2222, "/k")
    with pytest.raises(host_edit.DestinationError, match="-p 22 contradicts"):
        host_edit.parse("ssh://h:2222", None).merged(port=22)


# --- the config file ---------------------------------------------------------------------------------------------
def _file(tmp_path: Path, text: str | None) -> host_edit.ConfigFile:
    path = tmp_path / "config.toml"
    if text is not None:
        path.write_text(text)
    return host_edit.read(path)


def test_adding_appends_and_keeps_every_byte_removing_restores_the_file(tmp_path: Path) -> None:
    file = _file(tmp_path, USER_CONFIG)
    text = host_edit.with_host(file, "gpu.1", {"host": "203.0.113.7", "user": "root", "port": 22022, "price_per_hour": 2.49})
    assert text.startswith(USER_CONFIG)
    assert text[len(USER_CONFIG) :] == (
        '\n[hosts."gpu.1"]\nhost = "203.0.113.7"\nuser = "root"\nport = 22022\nprice_per_hour = 2.49\n'
    )
    host_edit.write(file, text)
    again = host_edit.read(file.path)
    assert again.config().hosts["gpu.1"].port == 22022 and again.config().currency == "EUR"
    assert host_edit.without_host(again, "gpu.1") == USER_CONFIG


def test_removing_a_table_between_others_keeps_the_comments_of_the_next(tmp_path: Path) -> None:
    file = _file(tmp_path, USER_CONFIG)
    assert host_edit.without_host(file, "desk") == (
        "# my fleet: comments, odd spacing and order must survive\n"
        'currency   =   "EUR"      # euros\n'
        "\n"
        "# keys every host shares\n"
        "[defaults]\n"
        "connect_timeout = 10\n"
    )  # its own comment block went with it; the next table's stayed


def test_the_comments_heading_the_file_or_ending_the_table_before_stay(tmp_path: Path) -> None:
    text = '# my config\n[hosts.a]\nhost = "a"\n# was: port = 2\n[hosts.b]\nhost = "b"\n'
    assert host_edit.without_host(_file(tmp_path, text), "a") == '# my config\n# was: port = 2\n[hosts.b]\nhost = "b"\n'
    assert host_edit.without_host(_file(tmp_path, text), "b") == '# my config\n[hosts.a]\nhost = "a"\n# was: port = 2\n'


def test_a_sub_table_goes_with_its_host(tmp_path: Path) -> None:
    text = '[hosts.a]\nhost = "a"\n\n[hosts.a.notify]\nntfy = "t"\n\n[hosts.b]\nhost = "b"\n'
    assert host_edit.without_host(_file(tmp_path, text), "a") == '[hosts.b]\nhost = "b"\n'


@pytest.mark.parametrize(
    "text, name, says",
    [
        ('[hosts.gpu1]\nhost = "x"\n', "gpu1", "a host named 'gpu1' exists already"),
        ("", "bad name!", "bad host name"),
        ("", "local", "gputui's name for this machine"),
        ('hosts = { a = { host = "x" } }\n', "gpu1", "add it by hand"),
        ("[hosts\n", "gpu1", "invalid TOML"),
    ],
)
def test_an_add_that_cannot_be_done_writes_nothing(tmp_path: Path, text: str, name: str, says: str) -> None:
    with pytest.raises(host_edit.EditError, match=says):
        host_edit.with_host(_file(tmp_path, text), name, {"host": "h"})


def test_a_host_written_inline_is_not_cut_out(tmp_path: Path) -> None:
    with pytest.raises(host_edit.EditError, match="remove it by hand"):
        host_edit.without_host(_file(tmp_path, '[hosts]\na = { host = "x" }\n'), "a")


def test_a_file_changed_since_it_was_read_is_not_overwritten(tmp_path: Path) -> None:
    file = _file(tmp_path, USER_CONFIG)
    text = host_edit.with_host(file, "gpu1", {"host": "h"})
    file.path.write_text(USER_CONFIG + "# edited meanwhile\n")
    with pytest.raises(host_edit.EditError, match="changed while gputui worked on it"):
        host_edit.write(file, text)
    assert file.path.read_text() == USER_CONFIG + "# edited meanwhile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".config.toml.gputui-lock", "config.toml"]  # no temp file


def test_removing_the_last_table_keeps_the_commented_out_tables_and_notes_after_it(tmp_path: Path) -> None:
    text = '[hosts.a]\nhost = "a"\n\n[hosts.b]\nhost = "b"\n\n# [hosts.old]\n# host = "x"\n\n# note: keep\n'
    assert host_edit.without_host(_file(tmp_path, text), "b") == (
        '[hosts.a]\nhost = "a"\n\n# [hosts.old]\n# host = "x"\n\n# note: keep\n'
    )  # they belong to nobody
    assert host_edit.without_host(_file(tmp_path, '[hosts.a]\nhost = "a"\n# port = 2\n'), "a") == "# port = 2\n"
    assert host_edit.without_host(_file(tmp_path, 'x = 1\n\n[hosts.a]\nhost = "a"\n\n\n'), "a") == "x = 1\n"


def test_a_bom_before_the_first_table_stays_and_the_table_goes(tmp_path: Path) -> None:
    text = '\ufeff[hosts.a]\nhost = "a"\n\n[hosts.b]\nhost = "b"\n'
    assert host_edit.without_host(_file(tmp_path, text), "a") == '\ufeff[hosts.b]\nhost = "b"\n'
    assert host_edit.without_host(_file(tmp_path, text), "b") == '\ufeff[hosts.a]\nhost = "a"\n'


HEAD = b'# caf\xe9 \xff: my hosts\n[hosts.a]\nhost = "a"  # \xe9t\xe9\n'
TABLE = b'[hosts.b]\nhost = "b"\n'
TAIL = b"# keys every host shares\n[defaults]\nconnect_timeout = 10\n"


def _variant(data: bytes, bom: bool, crlf: bool, utf8: bool) -> bytes:
    if not utf8:  # the same text with the comments' bytes as UTF-8
        data = data.replace(b"\xe9", "\u00e9".encode()).replace(b"\xff", b"?")
    return (b"\xef\xbb\xbf" if bom else b"") + (data.replace(b"\n", b"\r\n") if crlf else data)


@pytest.mark.parametrize("bom, crlf, utf8", [(False, False, True), (True, False, True), (False, True, True),
                                             (False, False, False), (True, True, False)])
@pytest.mark.parametrize("final_newline", [True, False])
def test_remove_then_add_keeps_every_other_byte(
    tmp_path: Path, bom: bool, crlf: bool, utf8: bool, final_newline: bool
) -> None:
    """A BOM, CRLF line ends, a missing final newline, bytes that are not UTF-8 in comments: kept as they are."""
    path = tmp_path / "config.toml"
    v = functools.partial(_variant, bom=False, crlf=crlf, utf8=utf8)
    last = _variant(HEAD + b"\n" + TABLE, bom, crlf, utf8)
    path.write_bytes(last if final_newline else last.removesuffix(b"\n").removesuffix(b"\r"))
    file = host_edit.read(path)
    host_edit.write(file, host_edit.without_host(file, "b"))
    assert path.read_bytes() == _variant(HEAD, bom, crlf, utf8)
    file = host_edit.read(path)
    host_edit.write(file, host_edit.with_host(file, "b", {"host": "b"}))
    assert path.read_bytes() == last  # as it was (with a final newline: the new table ends its line)

    middle = _variant(HEAD, bom, crlf, utf8) + v(b"\n" + TABLE + b"\n" + TAIL)
    path.write_bytes(middle if final_newline else middle.removesuffix(b"\n").removesuffix(b"\r"))
    file = host_edit.read(path)
    host_edit.write(file, host_edit.without_host(file, "b"))
    after = _variant(HEAD, bom, crlf, utf8) + v(b"\n" + TAIL)
    assert path.read_bytes() == (after if final_newline else after.removesuffix(b"\n").removesuffix(b"\r"))


def test_bytes_that_are_not_utf8_in_a_value_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b'[hosts.a]\nhost = "caf\xe9"\n')
    with pytest.raises(host_edit.EditError, match="not UTF-8"):
        host_edit.without_host(host_edit.read(path), "a")


def test_gputui_writers_take_turns_and_the_last_check_sees_the_other_ones_edit(tmp_path: Path) -> None:
    """Every gputui writer holds the lock beside the config from its last check to its rename: one waiting for
    it sees the edit the holder made and writes nothing."""
    file = _file(tmp_path, USER_CONFIG)
    text = host_edit.with_host(file, "gpu1", {"host": "h"})
    failed: list[BaseException] = []

    def second_writer() -> None:
        try:
            host_edit.write(file, text)
        except host_edit.EditError as exc:
            failed.append(exc)

    with host_edit.locked(file.path):  # another gputui, between its own last check and its rename
        writer = threading.Thread(target=second_writer)
        writer.start()
        wait_for(lambda: any(p.name.endswith(".gputui-tmp") for p in tmp_path.iterdir()), what="the temp file")
        file.path.write_text(USER_CONFIG + "# theirs\n")
    writer.join(timeout=60)
    assert not writer.is_alive() and "changed while gputui worked on it" in str(failed[0])
    assert file.path.read_text() == USER_CONFIG + "# theirs\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".gputui-tmp")]


def test_a_lock_held_too_long_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = _file(tmp_path, USER_CONFIG)
    monkeypatch.setattr(host_edit, "LOCK_WAIT_S", 0.0)
    with host_edit.locked(file.path), pytest.raises(host_edit.EditError, match="another gputui is writing it"):
        host_edit.write(file, host_edit.with_host(file, "gpu1", {"host": "h"}))
    assert file.path.read_text() == USER_CONFIG


def test_a_new_config_is_created_private_with_a_header(tmp_path: Path) -> None:
    file = _file(tmp_path, None)
    host_edit.write(file, host_edit.with_host(file, "gpu1", {"host": "h"}))
    assert oct(file.path.stat().st_mode & 0o777) == "0o600"
    text = file.path.read_text()
    assert text.startswith("# gputui config") and text.endswith('\n[hosts.gpu1]\nhost = "h"\n')


def test_the_mode_is_kept_and_a_symlinked_config_stays_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "gputui.toml"
    real.parent.mkdir()
    real.write_text(USER_CONFIG)
    real.chmod(0o640)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    file = host_edit.read(link)
    host_edit.write(file, host_edit.with_host(file, "gpu1", {"host": "h"}))
    assert link.is_symlink() and oct(real.stat().st_mode & 0o777) == "0o640"
    assert "[hosts.gpu1]" in real.read_text()


def test_ssh_config_aliases_are_the_plain_host_names(tmp_path: Path) -> None:
    path = tmp_path / "ssh_config"
    path.write_text("Host *\n  User x\nHost a100 h100 # two\n  HostName 1.2.3.4\nhost=lambda1\nHost !no ok?\n")
    assert host_edit.ssh_config_aliases(str(path)) == ["a100", "h100", "lambda1"]


def test_ssh_config_aliases_include_the_included_files(tmp_path: Path) -> None:
    """``Include`` as OpenSSH follows it: relative to ~/.ssh, globbed in sorted order, nested, ``~`` expanded."""
    ssh = Path(os.path.expanduser("~/.ssh"))
    (ssh / "conf.d").mkdir(parents=True)
    (ssh / "conf.d" / "b").write_text("Host b1 b2\n")
    (ssh / "conf.d" / "a").write_text("Host a1 # first by name\nInclude ~/.ssh/nested\n")
    (ssh / "nested").write_text("Host deep\n")
    (tmp_path / "abs").write_text("Host elsewhere\n")
    (ssh / "config").write_text(f"Host top\nInclude conf.d/* {tmp_path / 'abs'} missing/*\nHost last\n")
    assert host_edit.ssh_config_aliases(None) == ["top", "a1", "deep", "b1", "b2", "elsewhere", "last"]


def test_ssh_config_aliases_of_a_file_including_itself_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ssh_config"
    path.write_text(f"Host a\nInclude {path}\n")
    with pytest.raises(host_edit.EditError, match="Include nested more than 16 deep"):
        host_edit.ssh_config_aliases(str(path))


# --- against the real sshd ---------------------------------------------------------------------------------------
def _fresh(ssh_home: SshHome) -> Path:
    """The user's commented config, with the remote state dir of this test in [defaults] (no host yet)."""
    return ssh_home.write_config(USER_CONFIG + f'remote_dir = "{ssh_home.remote_dir}"\n')


def _add(ssh_home: SshHome, *extra: str, key: str = "ok") -> list[str]:
    s = ssh_home.sshd
    return ["add", "gpu1", f"{s.user}@127.0.0.1", "-p", str(s.port), "-i", str(s.keys[key]), *extra]


def test_add_trusts_checks_writes_then_a_job_runs(ssh_home: SshHome) -> None:
    config = _fresh(ssh_home)
    before = config.read_text()
    known = ssh_home.root / ".ssh" / "known_hosts"  # the default: ~/.ssh/known_hosts of the isolated HOME

    res = ssh_home.cli(*_add(ssh_home))  # no terminal, no --yes: refused before anything is written
    assert res.returncode == USAGE and "--yes" in res.stderr, res.stderr
    assert config.read_text() == before and not known.exists()

    res = ssh_home.cli(*_add(ssh_home, "--yes", "--price", "2.5"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"ED25519 key {ssh_home.sshd.fingerprint()}" in res.stdout
    assert "gpu1: " in res.stdout and "tmux" in res.stdout.lower()  # the doctor's checks, printed
    assert "provider: none detected" in res.stdout
    assert known.read_text() == ssh_home.sshd.host_key_line()
    text = config.read_text()
    assert text.startswith(before)  # the user's bytes, untouched
    assert text[len(before) :] == (
        f'\n[hosts.gpu1]\nhost = "127.0.0.1"\nuser = "{ssh_home.sshd.user}"\nport = {ssh_home.sshd.port}\n'
        f'identity_file = "{ssh_home.sshd.keys["ok"]}"\nprice_per_hour = 2.5\n'
    )

    job = ssh_home.cli("run", "gpu1", "--", "echo", "hi", check=True).stdout.strip()
    res = ssh_home.cli("logs", "-f", "gpu1", job, check=True)
    assert res.stdout.strip() == "hi"

    listed = json.loads(ssh_home.cli("hosts", "--json", check=True).stdout)["hosts"]
    gpu1 = next(h for h in listed if h["name"] == "gpu1")
    assert gpu1["source"] == "config" and gpu1["price_per_hour"] == 2.5 and gpu1["currency"] == "EUR"
    assert gpu1["address"] == f"{ssh_home.sshd.user}@127.0.0.1:{ssh_home.sshd.port}"

    again = ssh_home.cli("add", "gpu2", "--yes", "--", "ssh", "-p", str(ssh_home.sshd.port), "-i",
                         str(ssh_home.sshd.keys["ok"]), f"{ssh_home.sshd.user}@127.0.0.1")
    assert again.returncode == USAGE and "configured already as 'gpu1'" in again.stderr
    assert config.read_text() == text


def test_add_detects_a_lambda_instance_through_the_configured_api_url(ssh_home: SshHome) -> None:
    """``[providers.lambda] api_url`` (a proxy, a private endpoint) is the API add asks, never Lambda's own."""
    import provider_standin as standin

    state, server = standin.start()
    try:
        state.lambdas["i-1"] = standin.lambda_instance("i-1", "127.0.0.1", cents=129)
        config = ssh_home.write_config(f'[providers.lambda]\napi_url = "{state.base("lambda")}"\n\n[defaults]\n'
                                       f'remote_dir = "{ssh_home.remote_dir}"\n')
        ssh_home.env["LAMBDA_API_KEY"] = standin.LAMBDA_KEY
        res = ssh_home.cli(*_add(ssh_home, "--yes"), timeout=120)
        assert res.returncode == 0, res.stderr
        assert "provider: lambda detected; adding provider = 'lambda', price_per_hour = 1.29" in res.stdout, res.stdout
        assert 'provider = "lambda"\nprice_per_hour = 1.29\n' in config.read_text()
        assert "GET /lambda/instances" in state.methods() and standin.LAMBDA_KEY not in res.stdout + res.stderr
    finally:
        standin.stop(state, server)


def test_hosts_says_the_provider_the_config_sets(home: Home) -> None:
    home.write_config('[hosts.pod]\nhost = "203.0.113.7"\nprovider = "runpod"\n\n[hosts.box]\nhost = "box"\n\n'
                      '[hosts.own]\nhost = "own"\nprovider = "none"\n')
    listed = {h["name"]: h["provider"] for h in json.loads(home.cli("hosts", "--json", check=True).stdout)["hosts"]}
    assert listed == {"pod": "runpod", "box": None, "own": "none"}  # "auto" (box): known once connected
    assert [line.split()[3] for line in home.cli("hosts", check=True).stdout.splitlines()[1:]] == ["runpod", "-", "none"]


def test_add_with_a_key_the_host_refuses_writes_nothing(ssh_home: SshHome) -> None:
    config = _fresh(ssh_home)
    before = config.read_text()
    res = ssh_home.cli(*_add(ssh_home, "--yes", key="stranger"))
    assert res.returncode == REFUSED and "authentication failed" in res.stderr, res.stderr
    assert config.read_text() == before
    assert not (ssh_home.root / ".ssh" / "known_hosts").exists()  # the key accepted was not kept either


def test_add_of_an_unreachable_host_writes_nothing(ssh_home: SshHome) -> None:
    from sshd import free_port

    config = _fresh(ssh_home)
    before = config.read_text()
    res = ssh_home.cli("add", "gpu1", "root@127.0.0.1", "-p", str(free_port()), "--yes")
    assert res.returncode == UNREACHABLE and "connection refused" in res.stderr, res.stderr
    assert config.read_text() == before


def test_add_into_no_config_creates_one(ssh_home: SshHome) -> None:
    path = ssh_home.root / ".config" / "gputui" / "config.toml"
    path.unlink()
    ssh_home.env["GPUTUI_STATE_DIR"] = str(ssh_home.remote_dir)
    res = ssh_home.cli(*_add(ssh_home, "--yes"), timeout=120)
    assert res.returncode == 0, res.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o600" and path.read_text().startswith("# gputui config")


def test_remove_refuses_while_a_job_runs_and_never_touches_the_host(ssh_home: SshHome, tmp_path: Path) -> None:
    ssh_home.configure()  # host box, trusted
    config = ssh_home.root / ".config" / "gputui" / "config.toml"
    before = config.read_text()
    gate = tmp_path / "gate"
    job = ssh_home.cli("run", "box", "--", "sh", "-c", f'touch {gate}.started; while [ ! -e {gate} ]; do sleep 0.1; done',
                       check=True).stdout.strip()
    wait_for(lambda: Path(f"{gate}.started").exists(), timeout=30)

    res = ssh_home.cli("remove", "box", "--yes")
    assert res.returncode == 1 and f"{job} (running)" in res.stderr and "--force" in res.stderr, res.stderr
    assert config.read_text() == before

    res = ssh_home.cli("remove", "box", "--force")  # --force skips the check, not the question
    assert res.returncode == USAGE and "--yes" in res.stderr
    res = ssh_home.cli("remove", "box", "--force", "--yes", check=True)
    assert "nothing on the host was touched" in res.stdout
    assert "[hosts.box]" not in config.read_text()
    assert (ssh_home.remote_job_dir(job) / "output.log").exists()
    gate.touch()  # the job, still running on the host, may end now


def test_remove_of_an_unreachable_host_needs_force(ssh_home: SshHome) -> None:
    from sshd import free_port

    ssh_home.configure(port=free_port())
    res = ssh_home.cli("remove", "box", "--yes")
    assert res.returncode == UNREACHABLE and "--force" in res.stderr, res.stderr
    assert "[hosts.box]" in (ssh_home.root / ".config" / "gputui" / "config.toml").read_text()
    ssh_home.cli("remove", "box", "--yes", "--force", check=True)


def test_a_broken_table_blocks_only_its_own_removal_check(home: Home) -> None:
    """Another host's broken field does not stop remove from asking this host; a host whose own table is
    broken cannot be asked: --force removes it."""
    config = home.write_config(f'[hosts.a]\ntransport = "local"\nremote_dir = "{home.state_dir}"\n\n'
                               '[hosts.b]\nhost = "b"\nport = "x"\n')
    res = home.cli("remove", "b", "--yes")
    assert res.returncode == USAGE and "hosts.b.port" in res.stderr and "--force removes it" in res.stderr
    res = home.cli("remove", "a", "--yes")
    assert res.returncode == 0, res.stderr
    assert config.read_text() == '[hosts.b]\nhost = "b"\nport = "x"\n'
    home.cli("remove", "b", "--yes", "--force", check=True)
    assert config.read_text() == ""


def test_hosts_lists_ssh_config_aliases_and_adds_them(ssh_home: SshHome) -> None:
    s = ssh_home.sshd
    ssh_dir = ssh_home.root / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(
        f"Host testbox\n  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n  IdentityFile {s.keys['ok']}\n"
        f"  UserKnownHostsFile {ssh_home.known_hosts}\nHost *\n  ServerAliveInterval 30\n"
    )
    _fresh(ssh_home)
    listed = json.loads(ssh_home.cli("hosts", "--json", "--ssh-config", check=True).stdout)
    assert listed["ssh_config_not_added"] == ["testbox"]
    res = ssh_home.cli("add", "--from-ssh-config", "testbox", timeout=120)  # its key is trusted already
    assert res.returncode == 0 and "already trusted" in res.stdout, res.stderr
    listed = json.loads(ssh_home.cli("hosts", "--json", "--ssh-config", check=True).stdout)
    assert listed["ssh_config_not_added"] == []
    assert {"name": "testbox", "source": "ssh_config"}.items() <= next(
        h for h in listed["hosts"] if h["name"] == "testbox"
    ).items()
    assert "testbox" in ssh_home.cli("hosts", check=True).stdout


def test_add_from_ssh_config_fetches_the_key_where_the_alias_s_own_block_sends_it(ssh_home: SshHome) -> None:
    """The common layout (specific hosts first, ``Host *`` defaults last): the alias's Port, not the default's."""
    from sshd import free_port

    s = ssh_home.sshd
    ssh_dir = ssh_home.root / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(
        f"Host a100\n  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n  IdentityFile {s.keys['ok']}\n"
        f"Host *\n  Port {free_port()}\n"
    )
    _fresh(ssh_home)
    res = ssh_home.cli("add", "--from-ssh-config", "a100", "--yes", timeout=120)
    assert res.returncode == 0, res.stderr
    assert (ssh_dir / "known_hosts").read_text() == s.host_key_line()


def test_version(home: Home) -> None:
    from gputui import __version__

    assert home.cli("--version", check=True).stdout.strip() == f"gputui {__version__}"
    assert f"(gputui {__version__})" in home.cli("--help", check=True).stdout


def _on_a_terminal(home: SshHome, args: list[str], reply: str) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, answering ``reply`` to each ``[y/N]`` question."""
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gputui", *args], env=home.env, stdin=sub, stdout=sub, stderr=sub)
    os.close(sub)
    out, asked = b"", 0
    try:
        while True:
            ready, _, _ = select.select([main], [], [], 60.0)
            if not ready:
                raise AssertionError(f"no output within 60 s: {out!r}")
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if out.rstrip().endswith(b"[y/N]") and out.count(b"[y/N]") > asked:
                asked += 1
                os.write(main, reply.encode() + b"\n")
        return proc.wait(timeout=60), out.decode("utf-8", "replace")
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()


def test_add_on_a_terminal_asks_about_the_key(ssh_home: SshHome) -> None:
    config = _fresh(ssh_home)
    before = config.read_text()
    code, out = _on_a_terminal(ssh_home, _add(ssh_home), "n")
    assert code == 1 and ssh_home.sshd.fingerprint() in out and "not trusted" in out, out
    assert config.read_text() == before and not (ssh_home.root / ".ssh" / "known_hosts").exists()
    code, out = _on_a_terminal(ssh_home, _add(ssh_home), "y")
    assert code == 0 and "added [hosts.gpu1]" in out, out
    assert "[hosts.gpu1]" in config.read_text()


def test_add_refuses_a_host_whose_key_changed(ssh_home: SshHome) -> None:
    from sshd import keygen

    config = _fresh(ssh_home)
    before = config.read_text()
    impostor = keygen(ssh_home.root / "impostor")
    kind, data = impostor.with_suffix(".pub").read_text().split()[:2]
    known = ssh_home.root / ".ssh" / "known_hosts"
    known.parent.mkdir(mode=0o700)
    known.write_text(f"[127.0.0.1]:{ssh_home.sshd.port} {kind} {data}\n")
    res = ssh_home.cli(*_add(ssh_home, "--yes"))
    assert res.returncode == REFUSED and "the host key CHANGED" in res.stderr, res.stderr
    assert config.read_text() == before and known.read_text() == f"[127.0.0.1]:{ssh_home.sshd.port} {kind} {data}\n"

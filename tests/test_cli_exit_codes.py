"""Exit statuses: every command through every error class, against the real sshd (docs/commands.md, "Exit statuses")."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from conftest import SshHome
from sshd import free_port, keygen

OK, FAILED, USAGE, UNREACHABLE, REFUSED, NO_JOB = 0, 1, 2, 3, 4, 5

#: Each command once, as it reaches host ``box``; the table below breaks one thing at a time.
COMMANDS = {
    "run": ["run", "box", "--", "true"],
    "jobs": ["jobs"],
    "history": ["history", "box"],
    "logs": ["logs", "box", "1"],
    "kill": ["kill", "box", "1", "--yes"],
    "status": ["status"],
    "trust": ["trust", "box", "--yes"],
    "cost": ["cost"],
    "release": ["release", "box", "--yes"],
    "autostop": ["autostop", "box", "--cancel"],
    "doctor": ["doctor", "--timeout", "5"],
}

#: Bad usage, caught before any connection: (argv, message).
USAGE_CASES = {
    "run": (["run", "box"], "nothing to run: give the command after --"),
    "jobs": (["jobs", "nosuch"], "unknown host 'nosuch'"),
    "history": (["history", "nosuch"], "unknown host 'nosuch'"),
    "logs": (["logs", "box"], "the following arguments are required: job"),
    "kill": (["kill", "box", "1", "--grace", "soon"], "argument --grace: "),
    "status": (["status", "box"], "unrecognized arguments: box"),
    "trust": (["trust"], "the following arguments are required: host"),
    "cost": (["cost", "--since", "yesterday"], "--since 'yesterday': expected a date like 2026-11-01"),
    "release": (["release", "box"], "releasing box needs confirmation: run on a terminal or pass --yes"),
    "autostop": (["autostop", "box"], "one of the arguments --snooze --cancel is required"),
    "doctor": (["doctor", "--timeout", "0"], "--timeout must be between 0 and 600 seconds"),
}


def configure(home: SshHome, **changes: object) -> None:
    """Host ``box`` with a release command (``true``), so that ``release`` too gets as far as the host."""
    home.configure(**{"release": ["true"], **changes})


def _unknown_key(home: SshHome) -> str:
    home.known_hosts.write_text("")
    return "unknown host key for"


def _changed_key(home: SshHome) -> str:
    impostor = keygen(home.root / "impostor")
    kind, data = impostor.with_suffix(".pub").read_text().split()[:2]
    home.known_hosts.write_text(f"[127.0.0.1]:{home.sshd.port} {kind} {data}\n")
    return "the host key CHANGED"


def _closed_port(home: SshHome) -> str:
    port = free_port()
    configure(home, port=port)
    return f"connection refused by [127.0.0.1]:{port}"


def _no_identity(home: SshHome) -> str:
    configure(home, identity_file="/no/such/key")
    return "identity_file /no/such/key: no such file"


def _bad_setting(home: SshHome) -> str:
    configure(home, prot=22)
    return "hosts.box.prot: unknown setting"


def _no_release(home: SshHome) -> str:
    configure(home, release=None)
    return "no release command for box: set release"


def _failing_release(home: SshHome) -> str:
    configure(home, release=["sh", "-c", "echo out of credit; exit 3"])
    return "release command for box exited 3: out of credit"


#: Host error classes every command goes through: name -> (set-up that returns the message, exit status).
CLASSES = {
    "unreachable": (_closed_port, UNREACHABLE),
    "bad-setting": (_bad_setting, USAGE),
    "no-identity-file": (_no_identity, USAGE),
    "unknown-host-key": (_unknown_key, REFUSED),
}
#: Where a command answers a class differently: an unknown host key is what trust is for.
EXCEPTIONS = {("trust", "unknown-host-key"): (OK, "added [127.0.0.1]:")}

CASES = [
    pytest.param(COMMANDS[c], setup, *EXCEPTIONS.get((c, cls), (status, None)), id=f"{c}-{cls}")
    for cls, (setup, status) in CLASSES.items()
    for c in COMMANDS
]
CASES += [pytest.param(argv, None, USAGE, msg, id=f"{c}-usage") for c, (argv, msg) in USAGE_CASES.items()]
CASES += [
    pytest.param(COMMANDS["trust"], _changed_key, REFUSED, None, id="trust-changed-host-key"),
    pytest.param(["trust", "box"], _unknown_key, USAGE, "not trusted: confirm on a terminal, or pass --yes", id="trust-no-terminal"),
    pytest.param(["release", "box"], _no_release, USAGE, None, id="release-not-configured-asks-nothing"),
    pytest.param(COMMANDS["release"], _failing_release, FAILED, None, id="release-command-fails"),
    pytest.param(["logs", "box", "999"], None, NO_JOB, "no job '999' on box; gputui jobs box lists its jobs", id="logs-no-such-job"),
    pytest.param(["kill", "box", "999", "--yes"], None, NO_JOB, "no job '999' on box; gputui jobs box lists its jobs", id="kill-no-such-job"),
    pytest.param(["autostop", "box", "--snooze", "5"], None, USAGE, "box has no autostop to snooze: set autostop_minutes", id="autostop-without-watchdog"),
    pytest.param(["run", "box", "--gpus", "0;reboot", "--", "true"], None, USAGE, "--gpus '0;reboot': expected all, none,", id="run-gpus-syntax"),
    pytest.param(["run", "box", "--gpus", "0,x", "--", "true"], None, USAGE, "--gpus '0,x': expected all, none,", id="run-gpus-item"),
    pytest.param(["run", "box", "--gpus", "GPU-abc", "--", "true"], None, USAGE, "--gpus 'GPU-abc': box has no GPU GPU-abc; its GPUs:", id="run-gpus-not-on-host"),
]


@pytest.mark.parametrize(("argv", "setup", "status", "message"), CASES)
def test_exit_status(
    ssh_home: SshHome,
    argv: list[str],
    setup: Callable[[SshHome], str] | None,
    status: int,
    message: str | None,
) -> None:
    """Each row: one command, one thing broken; the documented status and a message that says what."""
    configure(ssh_home)
    expected = setup(ssh_home) if setup else None
    res = ssh_home.cli(*argv, timeout=90)
    assert res.returncode == status, res.stderr
    want = message or expected
    assert want and want in (res.stdout if status == OK else res.stderr), res.stderr
    assert "Traceback" not in res.stderr


def test_multi_host_commands_show_the_hosts_that_answered_and_exit_with_the_others(ssh_home: SshHome) -> None:
    """``status``/``jobs``/``cost``/``doctor`` report every host; one that did not answer sets the status."""
    port = free_port()
    box = ssh_home.host_settings()
    down = ssh_home.host_settings(port=port)
    lines = [f"[hosts.{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items()) for name, s in
             (("box", box), ("down", down))]
    ssh_home.write_config("\n".join(lines))
    for cmd in (["status", "--json"], ["jobs", "--json"], ["cost", "--json"], ["doctor", "--json"]):
        res = ssh_home.cli(*cmd, *(["--timeout", "5"] if cmd[0] == "doctor" else []), timeout=90)
        assert res.returncode == UNREACHABLE, (cmd, res.stderr)
        assert f"gputui: down: connection refused by [127.0.0.1]:{port}" in res.stderr, res.stderr
        json.loads(res.stdout)  # the report is still printed in full
    hosts = {h["name"]: h for h in json.loads(ssh_home.cli("status", "--json").stdout)["hosts"]}
    assert hosts["box"]["state"] == "connected" and hosts["down"]["state"] == "error"

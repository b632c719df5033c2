"""Real-world ssh_config files (``../shared/corpus/ssh_config/``): every name resolves as ``ssh -G`` says.

Each case folder is placed as a temp ``~/.ssh``; its names are its concrete ``Host`` aliases (Included files too)
and its ``probes.txt``. OpenSSH expands ``~`` (and relative Includes) from the passwd entry's home, not $HOME: the
``ssh`` on PATH here runs the real one in a private mount namespace with that home bind-mounted to $HOME, so
OpenSSH, our resolution through it, and asyncssh's parser (the fallback without an ssh client) all read the
case's files. Names OpenSSH itself rejects are skipped.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gputui.core.hosts import edit
from gputui.core.transport import ssh_config as sr
from gputui.core.transport.base import HostError

ROOT = Path(__file__).resolve().parent.parent
CORPUS = next(
    (p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if (p / "corpus" / "ssh_config").is_dir()),
    ROOT.parent / "shared",
) / "corpus" / "ssh_config"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir()) if CORPUS.is_dir() else []
REAL_SSH = shutil.which("ssh")
FIELDS = ("host", "port", "user", "identity_files", "proxy_jump", "proxy_command", "identity_agent")
ANY_NAME = "gputui-probe.example.org"  # every case: what its ``Host *`` / Match blocks give any other name



def _account_home() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def _namespace_ssh(bin_dir: Path) -> Path:
    """An ``ssh`` that is the real one with the passwd home bind-mounted to $HOME (a private mount namespace)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "ssh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec unshare --mount --propagation private /bin/sh -c "
        f"'mount --bind \"$HOME\" {_account_home()} && exec {REAL_SSH} \"$@\"' ssh \"$@\"\n"
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


@pytest.fixture(scope="module")
def can_namespace(tmp_path_factory: pytest.TempPathFactory) -> None:
    if REAL_SSH is None:
        pytest.skip("no OpenSSH client (apt install openssh-client)")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0 or os.geteuid() != 0:
        pytest.skip("needs root and mount namespaces (unshare --mount) to give OpenSSH a temp home")


def _placed(case: str, home: Path) -> Path:
    """The case's files as ``~/.ssh`` of ``home``; its config's path."""
    shutil.copytree(CORPUS / case, home / ".ssh", ignore=shutil.ignore_patterns("probes.txt"))
    return home / ".ssh" / "config"


def _names(case: str, config: Path) -> list[str]:
    probes = CORPUS / case / "probes.txt"
    extra = probes.read_text().split() if probes.exists() else []
    try:
        aliases = edit.ssh_config_aliases(str(config))
    except edit.EditError:  # a recursive Include: OpenSSH rejects every name (checked below)
        aliases = []
    return list(dict.fromkeys([*aliases, *extra, ANY_NAME]))


def _in_home(path: str) -> str:
    """A path OpenSSH expanded from ``~`` (the account's home: $HOME in the namespace) as under $HOME."""
    account = _account_home().rstrip("/")
    return os.environ["HOME"] + path[len(account) :] if path.startswith(account + "/") else path


def _oracle(ssh: Path, config: Path, name: str) -> sr.Resolved | None:
    """``ssh -G``'s answer read independently of ours (None: OpenSSH rejects the name)."""
    done = subprocess.run([str(ssh), "-G", "-F", str(config), "--", name], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    g: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        g.setdefault(key, []).append(value)
    jump, command = g.get("proxyjump", [""])[0], g.get("proxycommand", [""])[0]
    raw = sr.Resolved(
        name=name, host=g["hostname"][0], port=int(g["port"][0]), user=g["user"][0],
        identity_files=tuple(g.get("identityfile", [])), certificate_files=(),
        proxy_jump=tuple(jump.split(",")) if jump else (), proxy_command=command or None, user_known_hosts=(),
        identity_agent=_in_home(g["identityagent"][0]) if "identityagent" in g else None,
    )
    return sr._expanded(raw)  # noqa: SLF001 - ~ and % tokens as both resolutions expand them


@pytest.mark.parametrize("case", CASES)
def test_every_name_resolves_as_openssh_says(
    case: str, can_namespace: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = Path(os.environ["HOME"])
    config = _placed(case, home)
    ssh = _namespace_ssh(tmp_path / "bin")
    monkeypatch.setattr(sr, "ssh_binary", lambda: str(ssh))
    fallback_differs: list[tuple[str, str, object]] = []
    for name in _names(case, config):
        want = _oracle(ssh, config, name)
        if want is None:
            with pytest.raises(HostError):
                sr.resolve(name, str(config))
            continue
        got = sr.resolve(name, str(config))
        assert {f: getattr(got, f) for f in FIELDS} == {f: getattr(want, f) for f in FIELDS}, name
        try:
            fallback = sr._from_asyncssh(str(config), name, None, None)  # noqa: SLF001
        except HostError as exc:
            fallback_differs += [(name, "error", str(exc))]
            continue
        fallback_differs += [
            (name, f, (getattr(fallback, f), getattr(want, f)))
            for f in FIELDS
            if getattr(fallback, f) != getattr(want, f)
        ]
    assert not fallback_differs, f"asyncssh's parser differs from ssh -G: {fallback_differs}"


MISREADS = {  # each named in the issue: asyncssh's own parser read these unlike OpenSSH
    "end-of-line comment": "Host box # the box\n  HostName h.example # its name\n  Port 2222 # its port\n",
    "missing identity files": "Host box\n  IdentityFile /no/such/key\n  CertificateFile /no/such/cert\n",
    "ProxyJump URL and [v6]:port": "Host box\n  ProxyJump ssh://bob@jh.example:2222,[fe80::1]:23\n",
    "ProxyCommand before ProxyJump": "Host box\n  ProxyCommand nc %h %p\n  ProxyJump jump\n",
    "Match final": "Host box\n  HostName box.example.org\nMatch final host *.example.org\n  Port 1002\n",
    "Windows paths": "Host box\n  IdentityFile C:\\Users\\me\\.ssh\\key\n  ProxyCommand C:\\bin\\nc.exe %h %p\n",
    "quotes and =": 'Host=box\n  IdentityFile="/a b/key"\n  User = "alice"\n',
}


@pytest.mark.parametrize("text", MISREADS.values(), ids=MISREADS.keys())
def test_the_fallback_reads_what_asyncssh_misread_as_openssh_does(text: str, tmp_path: Path) -> None:
    if REAL_SSH is None:
        pytest.skip("no OpenSSH client (apt install openssh-client)")
    config = tmp_path / "config"
    config.write_text(text)
    want = _oracle(Path(REAL_SSH), config, "box")
    assert want is not None
    fallback = sr._from_asyncssh(str(config), "box", None, None)  # noqa: SLF001
    assert {f: getattr(fallback, f) for f in FIELDS} == {f: getattr(want, f) for f in FIELDS}


@pytest.mark.parametrize(
    ("spec", "hop"),
    [
        ("jump", sr.Hop("jump", None, None)),
        ("bob@jh.example:2222", sr.Hop("jh.example", "bob", 2222)),
        ("ssh://bob@jh.example:2222", sr.Hop("jh.example", "bob", 2222)),
        ("[fe80::1]:23", sr.Hop("fe80::1", None, 23)),
        ("alice@[::1]", sr.Hop("::1", "alice", None)),
        ("fe80::1", sr.Hop("fe80::1", None, None)),
    ],
)
def test_proxy_jump_hops_are_read_as_openssh_reads_them(spec: str, hop: sr.Hop) -> None:
    assert sr.parse_hop(spec) == hop


@pytest.mark.parametrize("case", [c for c in CASES if c != "k15-include-recursive"])
def test_hosts_lists_the_aliases_of_every_included_file(case: str) -> None:
    """``gputui hosts --ssh-config``: every concrete ``Host`` name of the case's files (its config Includes the
    others), not only those of ``config``."""
    home = Path(os.environ["HOME"])
    config = _placed(case, home)
    everywhere = set()
    for file in (f for f in (home / ".ssh").rglob("*") if f.is_file()):
        for line in file.read_text(errors="replace").split("\n"):
            words = line.replace("=", " ", 1).split()
            if words and words[0].lower() == "host":
                for word in words[1:]:
                    if word.startswith("#"):
                        break
                    if not any(c in word for c in "*?!"):
                        everywhere.add(word)
    assert set(edit.ssh_config_aliases(str(config))) == everywhere


def test_a_recursive_include_is_named(can_namespace: None, tmp_path: Path) -> None:
    """The name whose block Includes a file that Includes itself: a clear error from each reader."""
    config = _placed("k15-include-recursive", Path(os.environ["HOME"]))
    name = "kevinburke.ssh_config.test.example.com"
    with pytest.raises(edit.EditError, match="Include nested more than 16 deep"):
        edit.ssh_config_aliases(str(config))
    with pytest.raises(HostError, match="Include nested more than 16 deep"):
        sr._from_asyncssh(str(config), name, None, None)  # noqa: SLF001
    with pytest.raises(HostError, match="(?i)too many recursive configuration includes"):
        sr._from_openssh(str(_namespace_ssh(tmp_path / "bin")), str(config), name, None, None)  # noqa: SLF001

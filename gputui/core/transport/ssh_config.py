"""ssh_config, resolved as OpenSSH resolves it: ``ssh -G`` where an ssh client exists, asyncssh's parser else.

One resolution per host name, settings and config file per process (``ssh -G`` is a ~5-10 ms subprocess). The
result names everything a connection needs (host, port, user, identity and certificate files, ProxyJump or
ProxyCommand, known_hosts files, HostKeyAlias), so that asyncssh's own config parser decides nothing: the key
``gputui trust`` fetches and the later connection go to the same place (``ssh_transport.connect_options``).
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gputui.core.safetext import clean
from gputui.core.transport.base import HostError

RESOLVE_TIMEOUT_S = 10.0  # ``ssh -G`` never connects, but ``Match exec`` runs the user's commands
MAX_OUTPUT_BYTES = 1 << 20
MAX_HOPS = 16  # a ProxyJump chain longer than this is refused (a loop through names not seen as equal)
#: OpenSSH's identity files when none is configured: asyncssh's defaults then apply (encrypted ones skipped).
DEFAULT_IDENTITIES = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_xmss", "id_dsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")


@dataclass(frozen=True)
class Resolved:
    """One name as ssh_config resolves it; files and ProxyCommand with ``~`` and ``%`` tokens expanded."""

    name: str  # as asked (OpenSSH's original host, %n)
    host: str  # HostName
    port: int
    user: str
    identity_files: tuple[str, ...]  # all configured (missing ones included: OpenSSH skips them)
    certificate_files: tuple[str, ...]
    proxy_jump: tuple[str, ...]  # hops as written (``[user@]host[:port]``, ``ssh://...``, ``[v6]:port``)
    proxy_command: str | None
    user_known_hosts: tuple[str, ...]
    host_key_alias: str | None = None
    identities_only: bool = False
    ciphers: str | None = None  # configured ``Ciphers`` (None: the client's defaults)
    identity_agent: str | None = None  # ``IdentityAgent``: a socket path, ``none`` or ``SSH_AUTH_SOCK``

    @property
    def default_identities(self) -> bool:
        """Whether no IdentityFile is configured (OpenSSH then tries its default key files)."""
        home = os.path.expanduser("~/.ssh/")
        return self.identity_files == tuple(home + name for name in DEFAULT_IDENTITIES)

    @property
    def configured_known_hosts(self) -> list[str] | None:
        """``UserKnownHostsFile`` when set (``none`` entries dropped), else None (the defaults apply)."""
        files = [f for f in self.user_known_hosts if f.lower() != "none"]
        defaults = [os.path.expanduser(f) for f in DEFAULT_USER_KNOWN_HOSTS]
        return None if not files or files == defaults else files

    def existing(self, files: Sequence[str]) -> list[str]:
        """The files that exist (OpenSSH carries on past a missing IdentityFile/CertificateFile)."""
        return [f for f in files if os.path.isfile(f)]


@dataclass(frozen=True)
class Hop:
    """One ProxyJump hop as written: the name to resolve and what it overrides."""

    host: str
    user: str | None
    port: int | None


def parse_hop(spec: str) -> Hop:
    """``[user@]host[:port]``, ``ssh://[user@]host[:port]`` or ``[user@][v6addr]:port``, as OpenSSH reads them."""
    text = spec[len("ssh://") :] if spec.lower().startswith("ssh://") else spec
    user, sep, rest = text.rpartition("@")
    port: int | None = None
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            raise HostError(f"ProxyJump {spec!r}: cannot read the hop (an unclosed [address])", "config")
        port_text = tail[1:] if tail else ""
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host, port_text = rest, ""
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise HostError(f"ProxyJump {spec!r}: bad port {port_text!r}", "config")
        port = int(port_text)
    if not host:
        raise HostError(f"ProxyJump {spec!r}: no host name", "config")
    return Hop(host, user if sep else None, port)


def expand_tokens(text: str, r: Resolved, jump: str = "") -> str:
    """OpenSSH's ``%`` tokens (ssh_config(5) TOKENS) in IdentityFile, CertificateFile and ProxyCommand."""
    values = {
        "%": "%", "h": r.host, "n": r.name, "p": str(r.port), "r": r.user, "u": _local_user(),
        "d": os.path.expanduser("~"), "i": str(os.getuid()) if hasattr(os, "getuid") else "",
        "k": r.host_key_alias or r.name, "l": socket.gethostname(), "L": socket.gethostname().split(".")[0],
        "j": jump,
    }

    def one(m: re.Match[str]) -> str:
        return values.get(m.group(1), m.group(0))

    return re.sub(r"%(.)", one, text)


def _expand_file(path: str, r: Resolved) -> str:
    return os.path.expanduser(expand_tokens(path, r))


def _in_home(path: str) -> str:
    """A path ``ssh -G`` expanded from ``~``, with ``~`` meaning $HOME as everywhere in gputui (OpenSSH takes
    the home of the passwd entry: the same dir unless HOME was changed)."""
    try:
        import pwd

        account_home = pwd.getpwuid(os.getuid()).pw_dir.rstrip("/")
    except (ImportError, KeyError, OSError):
        return path
    home = os.path.expanduser("~").rstrip("/")
    if account_home and home != account_home and path.startswith(account_home + "/"):
        return home + path[len(account_home) :]
    return path


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


# --- OpenSSH ----------------------------------------------------------------------------------------------------
def ssh_binary() -> str | None:
    """The OpenSSH client on PATH, if any."""
    return shutil.which("ssh")


def _ssh_g(ssh: str, config: str | None, name: str, port: int | None, user: str | None) -> dict[str, list[str]]:
    """``ssh -G``'s answer, each key's values in order (IdentityFile and CertificateFile may come many times)."""
    argv = [ssh, "-G", "-F", config or "none"]
    if port is not None:
        argv += ["-p", str(port)]
    if user is not None:
        argv += ["-l", user]
    argv += ["--", name]
    try:
        done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HostError(f"ssh -G {name}: no answer within {RESOLVE_TIMEOUT_S:g} s (a Match exec that hangs?)",
                        "config") from None
    except OSError as exc:
        raise HostError(f"cannot run {ssh} -G: {exc.strerror or exc}", "config") from None
    if done.returncode != 0:
        why = clean(" ".join(done.stderr.decode("utf-8", "replace").split()), limit=500)
        why = why or f"exit status {done.returncode}"
        raise HostError(f"ssh_config {config or '(none)'} does not resolve {name!r}: {why}", "config")
    values: dict[str, list[str]] = {}
    for line in done.stdout[:MAX_OUTPUT_BYTES].decode("utf-8", "replace").split("\n"):
        key, _, value = line.partition(" ")
        if key:
            values.setdefault(key.lower(), []).append(value)
    return values


@functools.lru_cache(maxsize=4)
def _openssh_default_ciphers(ssh: str) -> str:
    return _ssh_g(ssh, None, "gputui.invalid", None, None).get("ciphers", [""])[0]


def _from_openssh(ssh: str, config: str | None, name: str, port: int | None, user: str | None) -> Resolved:
    g = _ssh_g(ssh, config, name, port, user)

    def one(key: str, default: str = "") -> str:
        return g.get(key, [default])[0]

    try:
        port_value = int(one("port", "22"))
    except ValueError:
        raise HostError(f"ssh -G {name}: port {one('port')!r} is not a number", "config") from None
    jump = one("proxyjump")
    command = one("proxycommand")
    ciphers = one("ciphers") or None
    raw = Resolved(
        name=name, host=one("hostname", name), port=port_value, user=one("user") or _local_user(),
        identity_files=tuple(g.get("identityfile", [])), certificate_files=tuple(g.get("certificatefile", [])),
        proxy_jump=tuple(jump.split(",")) if jump and jump.lower() != "none" else (),
        proxy_command=command if command and command.lower() != "none" else None,
        user_known_hosts=tuple(_in_home(f) for f in one("userknownhostsfile").split()),
        host_key_alias=one("hostkeyalias") or None,
        identities_only=one("identitiesonly") == "yes",
        ciphers=ciphers if ciphers != _openssh_default_ciphers(ssh) else None,
        identity_agent=_in_home(one("identityagent")) or None,
    )
    return _expanded(raw)


def _expanded(raw: Resolved) -> Resolved:
    """``raw`` with ``~`` and ``%`` tokens expanded in its files and ProxyCommand."""
    return Resolved(
        name=raw.name, host=raw.host, port=raw.port, user=raw.user,
        identity_files=tuple(_expand_file(f, raw) for f in raw.identity_files),
        certificate_files=tuple(_expand_file(f, raw) for f in raw.certificate_files),
        proxy_jump=raw.proxy_jump,
        proxy_command=expand_tokens(raw.proxy_command, raw, ",".join(raw.proxy_jump)) if raw.proxy_command else None,
        user_known_hosts=tuple(_expand_file(f, raw) for f in raw.user_known_hosts),
        host_key_alias=raw.host_key_alias, identities_only=raw.identities_only, ciphers=raw.ciphers,
        identity_agent=_expand_file(raw.identity_agent, raw) if raw.identity_agent else None,
    )


# --- asyncssh's parser (no ssh client here) ---------------------------------------------------------------------
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_KEYWORD = re.compile(r"\s*([^\s=]+)(?:\s*=\s*|\s+|$)(.*)", re.S)


def split_args(text: str) -> list[str]:
    """OpenSSH's ``argv_split`` (misc.c) for a config line's arguments: quotes group, a backslash escapes only a
    quote, a backslash or (unquoted) a space and is kept otherwise (``C:\\Users\\me``), a word starting with
    ``#`` ends the line. An unclosed quote is a ValueError."""
    args: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t":
            i += 1
            continue
        if text[i] == "#":
            break
        word: list[str] = []
        quote = ""
        while i < n:
            ch = text[i]
            if ch == "\\" and i + 1 < n and (text[i + 1] in "'\"\\" or (not quote and text[i + 1] == " ")):
                word.append(text[i + 1])
                i += 1
            elif not quote and ch in " \t":
                break
            elif not quote and ch in "'\"":
                quote = ch
            elif quote and ch == quote:
                quote = ""
            else:
                word.append(ch)
            i += 1
        if quote:
            raise ValueError("unclosed quote")
        args.append("".join(word))
    return args


def _fallback_config() -> Any:
    """asyncssh's client config read as OpenSSH reads the file (see ``_from_asyncssh``)."""
    from pathlib import Path

    from gputui.core.transport.sshlib import asyncssh

    class OpenSSHRead(asyncssh.config.SSHClientConfig):
        """Lines split as OpenSSH splits them (end-of-line comments, backslashes kept, ``=``), the first of
        ProxyCommand/ProxyJump winning, Include bounded to OpenSSH's depth; ``%`` tokens left to us."""

        _percent_expand: set[str] = set()
        _depth = 0

        def parse(self, path: Path) -> None:
            if self._depth >= MAX_INCLUDE_DEPTH:
                self._error(f"Include nested more than {MAX_INCLUDE_DEPTH} deep (a file that includes itself?)")
            self._depth += 1
            try:
                self._parse(path)
            finally:
                self._depth -= 1

        def _parse(self, path: Path) -> None:
            self._path, self._line_no, self._matching, self._tokens = path, 0, True, {"%": "%"}
            with open(path, encoding="utf-8", errors="replace", newline="") as file:
                for line in file.read(MAX_OUTPUT_BYTES).split("\n"):
                    self._line_no += 1
                    m = _KEYWORD.match(line.strip())
                    if not m or m.group(1).startswith("#"):
                        continue
                    option, rest = m.group(1).lower(), m.group(2)
                    if option in self._no_split:
                        args = [rest.strip()]
                    else:
                        try:
                            args = split_args(rest)
                        except ValueError as exc:
                            self._error(str(exc))
                    if option in self._conditionals:  # Match host=NAME: asyncssh's split at '='
                        args = [part for arg in args for part in arg.split("=", 1) if part]
                    if not self._matching and option not in self._conditionals:
                        continue
                    if option in ("proxycommand", "proxyjump") and {"ProxyCommand", "ProxyJump"} & set(self._options):
                        continue  # OpenSSH: whichever of the two comes first wins
                    if option not in self._handlers:
                        continue
                    if not args:
                        self._error(f"Missing {option} value")
                    name, handler = self._handlers[option]
                    handler(self, name, args)
                    if args:
                        self._error(f"Extra data at end: {' '.join(args)}")

    return OpenSSHRead


def _from_asyncssh(config: str | None, name: str, port: int | None, user: str | None) -> Resolved:
    local = _local_user()
    cls = _fallback_config()

    def load(final: bool) -> Any:
        return cls.load(None, [config] if config else [], False, False, final, local,
                        () if user is None else user, name, () if port is None else port)

    try:
        c = load(False)
        if c.has_match_final():  # OpenSSH reads the files again with ``Match final`` blocks on
            c = load(True)
    except (OSError, ValueError) as exc:
        raise HostError(f"ssh_config {config}: {exc}", "config") from None

    def get(key: str, default: Any = None) -> Any:
        return c.get(key, default)

    jump = get("ProxyJump")
    command = get("ProxyCommand")
    identities = get("IdentityFile") or [f"~/.ssh/{n}" for n in DEFAULT_IDENTITIES]
    ciphers = get("Ciphers")
    raw = Resolved(
        name=name, host=str(get("Hostname") or name).lower(), port=int(get("Port") or 22),
        user=str(get("User") or local), identity_files=tuple(dict.fromkeys(str(f) for f in identities)),
        certificate_files=tuple(dict.fromkeys(str(f) for f in get("CertificateFile") or ())),
        proxy_jump=tuple(str(jump).split(",")) if jump and str(jump).lower() != "none" else (),
        proxy_command=str(command) if command and str(command).lower() != "none" else None,
        user_known_hosts=tuple(str(f) for f in get("UserKnownHostsFile") or DEFAULT_USER_KNOWN_HOSTS),
        host_key_alias=str(get("HostKeyAlias")) if get("HostKeyAlias") else None,
        identities_only=bool(get("IdentitiesOnly")),
        ciphers=",".join(ciphers) if isinstance(ciphers, (list, tuple)) else (str(ciphers) if ciphers else None),
        identity_agent=str(get("IdentityAgent")) if get("IdentityAgent") else None,
    )
    return _expanded(raw)


# --- the one entry point ----------------------------------------------------------------------------------------
def resolve(name: str, config: str | None, port: int | None = None, user: str | None = None) -> Resolved:
    """``name`` as ssh_config ``config`` (None: no file) resolves it, ``port``/``user`` given winning.

    ``ssh -G`` decides where an ssh client is installed, asyncssh's parser elsewhere. Cached per process and
    per state of the config file (edited while a UI runs: resolved again) and $HOME.
    """
    try:
        st = os.stat(config) if config else None
        stamp = (st.st_mtime_ns, st.st_size) if st else None
    except OSError:
        stamp = None
    return _resolve_cached(name, config, port, user, stamp, ssh_binary(), os.path.expanduser("~"))


@functools.lru_cache(maxsize=256)
def _resolve_cached(name: str, config: str | None, port: int | None, user: str | None,
                    stamp: tuple[int, int] | None, ssh: str | None, home: str) -> Resolved:
    del stamp, home  # part of the cache key only (``~`` is $HOME in the files resolved)
    if ssh is not None:
        return _from_openssh(ssh, config, name, port, user)
    return _from_asyncssh(config, name, port, user)


def jump_chain(target: Resolved, config: str | None) -> list[Resolved]:
    """The hops to go through to reach ``target``, in connect order, each resolved as OpenSSH resolves it.

    ``ProxyJump a,b``: ``a`` is reached as its own ssh_config says (its own ProxyJump too), ``b`` through ``a``.
    A chain that comes back to a name it passed is a HostError naming the loop.
    """
    return _chain(target, config, [target.name])


def _chain(target: Resolved, config: str | None, path: list[str]) -> list[Resolved]:
    if target.proxy_command is not None or not target.proxy_jump:
        return []
    hops: list[Resolved] = []
    for i, spec in enumerate(target.proxy_jump):
        hop = parse_hop(spec.strip())
        if hop.host in path or len(path) >= MAX_HOPS:
            loop = " -> ".join([*path, hop.host])
            raise HostError(f"ProxyJump loop: {loop} (ssh_config sends this host through itself)", "config")
        path = [*path, hop.host]
        r = resolve(hop.host, config, hop.port, hop.user)
        if i == 0:
            hops += _chain(r, config, path)
        hops.append(r)
    return hops

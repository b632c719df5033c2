"""Host key trust: which known_hosts files apply, fingerprints, and appending a key in OpenSSH format."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gputui.core.transport.sshlib import asyncssh

DEFAULT_PORT = 22
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"

_KEY_TYPES = {"ssh-ed25519": "ED25519", "ssh-rsa": "RSA", "ssh-dss": "DSA", "ssh-ed448": "ED448"}


def host_pattern(name: str, port: int) -> str:
    """The name known_hosts uses: ``host`` on port 22, ``[host]:port`` elsewhere."""
    return name if port == DEFAULT_PORT else f"[{name}]:{port}"


def hashed_pattern(pattern: str, salt: bytes | None = None) -> str:
    """OpenSSH's hashed form (HashKnownHosts): ``|1|base64(salt)|base64(HMAC-SHA1(salt, pattern))``."""
    salt = salt if salt is not None else os.urandom(20)
    digest = hmac.new(salt, pattern.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def key_type(key: asyncssh.SSHKey) -> str:
    alg = key.get_algorithm()
    if alg.startswith("ecdsa-"):
        return "ECDSA"
    return _KEY_TYPES.get(alg, alg)


def describe(key: asyncssh.SSHKey) -> str:
    """``ED25519 key SHA256:...``, as OpenSSH prints it."""
    return f"{key_type(key)} key {key.get_fingerprint('sha256')}"


def files_for(explicit: str | None, configured: Sequence[str] | None) -> list[str]:
    """known_hosts files for a host: the host's own setting, else ssh_config's, else OpenSSH's defaults.

    ``UserKnownHostsFile none`` in ssh_config does not turn verification off here; only the per-host
    setting ``verify_host_key = false`` does.
    """
    if explicit:
        return [os.path.expanduser(explicit)]
    if configured:
        return [os.path.expanduser(p) for p in configured]
    return [os.path.expanduser("~/.ssh/known_hosts"), GLOBAL_KNOWN_HOSTS]


def load(files: Sequence[str]) -> asyncssh.SSHKnownHosts:
    existing = [f for f in files if os.path.isfile(f) and os.access(f, os.R_OK)]
    return asyncssh.read_known_hosts(existing) if existing else asyncssh.import_known_hosts("")


KnownHostsMatch = Callable[[str, str, "int | None"], tuple[Any, ...]]


def also_trusting(known: asyncssh.SSHKnownHosts, name: str, port: int) -> KnownHostsMatch:
    """A match (what asyncssh takes as ``known_hosts``) that trusts, besides the endpoint's own entries, the
    keys trusted for ``name``:``port``: where the config says a host is when its provider moved its SSH to
    another port. The instance's host key is its identity: the key the user trusted there proves it here."""
    base = known.match(name, "", port if port != DEFAULT_PORT else None)

    def match(host: str, addr: str, at: int | None) -> tuple[Any, ...]:
        own = known.match(host, addr, at)
        return (*(list(own[i]) + list(base[i]) for i in range(3)), *own[3:])

    return match


def trusted_keys(files: Sequence[str], name: str, addr: str, port: int) -> list[asyncssh.SSHKey]:
    """The keys these files record for ``name`` (and ``addr``) on exactly ``port``: ``[host]:port`` entries
    off port 22.

    Whether a key *changed* is judged on these alone, as OpenSSH does. Connecting still accepts a plain
    ``host`` entry with the very key presented when no ``[host]:port`` entry exists (OpenSSH: "found
    matching key w/out port", asyncssh's fallback), but a different key there makes the host unknown, not
    changed.
    """
    found = load(files)._match(name, addr, port if port != DEFAULT_PORT else None)  # noqa: SLF001 - no fallback
    return list(dict.fromkeys(found[0]))  # an entry matching both the name and the address comes twice


def append(path: str, name: str, port: int, key: asyncssh.SSHKey, hashed: bool = False) -> str:
    """Append ``key`` for ``name``:``port`` to ``path`` (created 0600 in a 0700 dir); return the line."""
    pattern = host_pattern(name, port)
    kind, data = key.export_public_key("openssh").decode().split()[:2]
    line = f"{hashed_pattern(pattern) if hashed else pattern} {kind} {data}\n"
    file = Path(path)
    if not file.parent.exists():
        file.parent.mkdir(mode=0o700, parents=True)
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell() > 0 and not file.read_bytes().endswith(b"\n"):
            f.write("\n")
        f.write(line)
    return line

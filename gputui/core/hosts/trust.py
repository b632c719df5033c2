"""Trusting an SSH host's key: what the host presents, whether a known_hosts file already has it, where it goes."""

from __future__ import annotations

from dataclasses import dataclass

from gputui.core.config.file import Config
from gputui.core.errors import UsageError
from gputui.core.transport import known_hosts as kh
from gputui.core.transport.base import HostError
from gputui.core.transport.ssh import SSHTransport, Target, fetch_host_key
from gputui.core.transport.sshlib import asyncssh


class NoHostKey(UsageError, ValueError):
    """The host is this machine (transport = local): there is no key to trust."""


@dataclass(frozen=True)
class TrustCheck:
    """The key a host presents and where it stands: already trusted in ``trusted_in``, else to go in ``path``."""

    host: str
    target: Target
    key: asyncssh.SSHKey
    trusted_in: str | None

    @property
    def path(self) -> str:
        return self.target.known_hosts[0]

    @property
    def description(self) -> str:
        return kh.describe(self.key)


async def check_host_key(config: Config, name: str) -> TrustCheck:
    """Fetch the key ``name`` presents and look it up in its known_hosts files.

    A file that trusts a *different* key for the host is a HostError (kind ``host_key``): never add a second one.
    """
    host = config.host(name)
    if host.transport == "local":
        raise NoHostKey(f"{name} is this machine (transport = local): there is no host key")
    target, key = await fetch_host_key(SSHTransport(host, ssh_config=config.ssh_config))
    for path in target.known_hosts:
        known = kh.trusted_keys([path], target.key_name, "", target.port)
        if key in known:
            return TrustCheck(name, target, key, path)
        if known:
            raise HostError(
                f"{path} trusts a different key for {target.pattern} "
                f"({', '.join(kh.describe(k) for k in known)}): the host key CHANGED. If that is expected "
                f"(host reinstalled), remove the old one first: ssh-keygen -R '{target.pattern}' -f {path}",
                "host_key",
            )
    return TrustCheck(name, target, key, None)


def trust(check: TrustCheck, hashed: bool = False) -> str:
    """Append the checked key to its known_hosts file (the user confirmed it); the path it went to."""
    kh.append(check.path, check.target.key_name, check.target.port, check.key, hashed=hashed)
    return check.path

"""SSHTransport: the agent on a remote host over ONE asyncssh connection, deployed when the host lacks it.

Every remote command is a shell string by nature (sshd hands it to the user's login shell), so each one is
``sh -c '<script>'`` with every value inside the script passed through ``shlex.quote``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import secrets
import shlex
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gputui.core import paths
from gputui.core.config.file import HostConfig
from gputui.core.deploy.agentproc import AGENT_PYTHON_FLAGS
from gputui.core.deploy.bundle import (
    agent_build,
    ensure_local_build,
    installer_source,
    tree_hash,
    unpacked_name,
)
from gputui.core.transport import instances
from gputui.core.transport import known_hosts as kh
from gputui.core.transport import ssh_config as sr
from gputui.core.transport.base import AgentChannel, HostError, HostUnavailable, Transport
from gputui.core.transport.sshlib import asyncssh
from remote_agent.protocol import MAX_FRAME_BYTES

log = logging.getLogger(__name__)

#: The agent channel's SSH receive window: room for the largest frame; flow control keeps log data far below.
AGENT_WINDOW = 2 * MAX_FRAME_BYTES
#: The agent's exit status when its build vanished from the host (re-probe and upload again).
EXIT_NO_AGENT = 97
COMMAND_TIMEOUT_S = 60.0
#: How an agent build starts on a host: umask 077 (its state, logs and ``__pycache__`` private), the login's
#: umask kept for the jobs it starts (remote_agent.fsutil.user_umask).
PRIVATE = 'GPUTUI_USER_UMASK=$(umask); export GPUTUI_USER_UMASK; umask 077'
STALE_UPLOAD_MIN = 10  # an upload temp file this many minutes old belongs to an upload that died
CONNECT_CONCURRENCY = 8  # sshd's MaxStartups (10:30:100 by default) drops bursts of new connections
DEFAULT_SSH_CONFIG = "~/.ssh/config"  # honoured when present, like OpenSSH
#: AES-GCM first (about 1.5x chacha20-poly1305's rate for bulk bytes on CPUs with AES-NI), the rest of
#: asyncssh's defaults after it; a ``Ciphers`` line in ssh_config wins.
PREFERRED_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"

#: The host's python for the probe and install steps: stdlib only, so ``-S`` (no site-packages, no ``.pth``).
PY_FLAGS = " ".join(AGENT_PYTHON_FLAGS)
_SHA256_PY = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"

_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _connect_gate() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _gates:
        _gates[loop] = asyncio.Semaphore(CONNECT_CONCURRENCY)
    return _gates[loop]


def sh(script: str) -> str:
    """A remote command that runs ``script`` under sh whatever the login shell is (bash, zsh, fish)."""
    return "sh -c " + shlex.quote(script)


def _kind_of(detail: str) -> str:
    """A deploy failure's kind: ``disk_full`` when the host's disk is (the user frees space), else ``deploy``."""
    return "disk_full" if "No space left on device" in detail or "Errno 28" in detail else "deploy"


RUNPOD_PROXY = "ssh.runpod.io"


def is_runpod_proxy(host: str) -> bool:
    """Whether ``host`` is RunPod's basic SSH proxy (it opens interactive shells only: no commands)."""
    host = host.lower().rstrip(".")
    return host == RUNPOD_PROXY or host.endswith("." + RUNPOD_PROXY)


def no_exec_message(name: str, host: str, reason: str) -> str:
    """The error for an SSH server that runs no commands (no exec channel), with the fix."""
    said = (f"{name}: {host} did not run a command over SSH ({reason}); gputui needs what `ssh HOST CMD` "
            "uses (an exec channel).")
    if is_runpod_proxy(host):
        return (f"{said} {RUNPOD_PROXY} is RunPod's basic SSH proxy, which allows interactive shells only: use "
                "the pod's exposed TCP port instead (RunPod: Connect → SSH over exposed TCP, e.g. "
                "`gputui add NAME root@IP -p PORT -i KEY`)")
    return (f"{said} A proxy or jump service that allows interactive shells only cannot be used: connect to "
            "the host's own sshd (for RunPod: the pod's exposed TCP port, not ssh.runpod.io)")


def shell_path(path: str) -> str:
    """``path`` quoted for sh, keeping a leading ``~`` meaning the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class Target:
    """Where a host really is once ssh_config is applied: what host key checks and ``trust`` need."""

    alias: str  # the name in gputui's config (``host`` setting or the table name)
    host: str  # HostName after ssh_config
    port: int
    user: str
    key_name: str  # the name in known_hosts: HostKeyAlias, else host
    known_hosts: tuple[str, ...]
    hops: tuple[sr.Resolved, ...] = ()  # ProxyJump hosts to go through, in connect order
    moved_from: tuple[str, int] | None = None  # (known_hosts name, port) of the config's endpoint, when moved

    @property
    def pattern(self) -> str:
        return kh.host_pattern(self.key_name, self.port)


@functools.lru_cache(maxsize=1)
def build_name() -> str:
    """This client's agent build's file name (``gputui-agent-HASH.pyz``) without making the zipapp (tens of
    ms of compression at every start) when this machine has the build unpacked: its folder is named after
    it and checked to hold exactly its files (``bundle.ensure_local_build``, which makes it when missing).
    Once per process (a fleet deploys to many hosts); the host checks what it runs against ``tree_hash``."""
    try:
        return ensure_local_build(paths.cache_dir()).name + ".pyz"
    except OSError:  # no writable cache here: the zipapp names itself
        return agent_build()[0]


def name_digest(name: str) -> str:
    """The start of the zipapp's sha256 that its ``name`` carries (``gputui-agent-<16 hex>.pyz``)."""
    return name[len("gputui-agent-") : -len(".pyz")]


@dataclass(frozen=True)
class RemoteAgent:
    python: str  # absolute path of the interpreter on the host
    state_dir: str  # absolute
    pyz: str  # absolute path of this client's agent build on the host (the zipapp, as uploaded)
    build: str  # the same build unpacked beside it (checked): what runs, so Python caches its bytecode


def connect_options(r: sr.Resolved, cfg: HostConfig, identity_file: str | None) -> dict[str, Any]:
    """asyncssh.connect()'s keyword arguments for the resolved ``r``, every one explicit (asyncssh reads no
    ssh_config): the connection and ``gputui trust``'s key fetch both use these. ``identity_file`` (gputui's
    own setting) wins over IdentityFile; missing identity and certificate files are skipped, as OpenSSH does."""
    kw: dict[str, Any] = {
        "host": r.host,
        "port": r.port,
        "username": r.user,
        "config": None,
        "connect_timeout": cfg.connect_timeout,
        "keepalive_interval": cfg.keepalive_interval,
        "keepalive_count_max": cfg.keepalive_count_max,
        "agent_forwarding": False,
        "encryption_algs": _ciphers(r.ciphers),
    }
    if r.host_key_alias:
        kw["host_key_alias"] = r.host_key_alias
    if identity_file is not None:
        path = os.path.expanduser(identity_file)
        if not os.path.isfile(path):
            raise HostError(f"identity_file {path}: no such file", "config")
        kw["client_keys"] = [path]
    elif not r.default_identities:
        kw["client_keys"] = [path for path in r.existing(r.identity_files) if _loadable(path)]
    if r.identities_only and "client_keys" in kw:
        kw["agent_identities"] = kw["client_keys"]
    if r.identity_agent is not None:
        kw["agent_path"] = _agent_path(r.identity_agent)
    certs = r.existing(r.certificate_files)
    if certs:
        kw["client_certs"] = certs
    if r.proxy_command is not None:  # as OpenSSH runs it: the user's shell, exec'ing the command
        kw["proxy_command"] = [os.environ.get("SHELL") or "/bin/sh", "-c", "exec " + r.proxy_command]
    return kw


def _agent_path(identity_agent: str) -> str | None:
    """``IdentityAgent`` as OpenSSH reads it: ``none`` (no agent), ``SSH_AUTH_SOCK`` or ``$VAR`` (that
    variable's socket), else a socket path."""
    if identity_agent.lower() == "none":
        return None
    if identity_agent == "SSH_AUTH_SOCK" or identity_agent.startswith("$"):
        return os.environ.get(identity_agent.lstrip("$")) or None
    return identity_agent


def _loadable(path: str) -> bool:
    """Whether an ssh_config IdentityFile is a private key asyncssh can load without a passphrase; OpenSSH
    carries on past one it cannot (an encrypted one: the agent may hold it)."""
    try:
        asyncssh.read_private_key(path)
    except (asyncssh.KeyImportError, OSError, ValueError):
        log.debug("skipping identity file %s: not loadable without a passphrase", path)
        return False
    return True


def _ciphers(configured: str | None) -> str | list[str]:
    """AES-GCM first unless ssh_config names ``Ciphers`` (those asyncssh has, in their order, then)."""
    if configured:
        have = {alg.decode() for alg in asyncssh.encryption.get_encryption_algs()}
        usable = [c for c in configured.split(",") if c in have]
        if usable:
            return usable
    return PREFERRED_CIPHERS


class _Client(asyncssh.SSHClient):
    """Remembers the host key the server presented when known_hosts did not trust it (for the message)."""

    def __init__(self) -> None:
        self.presented: tuple[str, str, int, asyncssh.SSHKey] | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.presented = (host, addr, port, key)
        return False  # only known_hosts decides


class _Writer:
    """The agent's stdin; asyncssh errors become OSErrors, which Link treats as a lost link."""

    def __init__(self, stdin: asyncssh.SSHWriter[bytes]) -> None:
        self._stdin = stdin

    def write(self, data: bytes) -> None:
        try:
            self._stdin.write(data)
        except asyncssh.Error as exc:
            raise BrokenPipeError(str(exc)) from exc

    async def drain(self) -> None:
        try:
            await self._stdin.drain()
        except asyncssh.Error as exc:
            raise BrokenPipeError(str(exc)) from exc


class _Ran(NamedTuple):
    """A finished setup command; asyncssh types its output ``bytes | str | None``, but it runs with
    ``encoding=None``: bytes."""

    exit_status: int
    stdout: bytes
    stderr: bytes


class SSHTransport(Transport):
    """One host over SSH: one connection, one agent channel on it, the agent uploaded when missing."""

    def __init__(self, host: HostConfig, ssh_config: str | None = None, idle_timeout: float = 30.0) -> None:
        self.cfg = host
        self.ssh_config = ssh_config
        self.idle_timeout = idle_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._agent: RemoteAgent | None = None
        self._target: Target | None = None
        self._warned_unverified = False

    # --- config -----------------------------------------------------------------------------------------------
    def _config_paths(self) -> list[str] | None:
        """The ssh_config to honour: ~/.ssh/config (by default or by name) only when present, as OpenSSH
        does; any other named file must exist."""
        default = os.path.expanduser(DEFAULT_SSH_CONFIG)
        path = os.path.expanduser(self.ssh_config or DEFAULT_SSH_CONFIG)
        if os.path.isfile(path):
            return [path]
        if path == default:
            return None
        raise HostError(f"ssh_config {path}: no such file", "config")

    def resolved(self) -> sr.Resolved:
        """This host as ssh_config resolves it (``ssh -G`` where an ssh client exists), explicit settings winning,
        and moved where its provider moved it (``instances.endpoint_for``: gputui start learnt a new port)."""
        return self._moved()[0]

    def _moved(self) -> tuple[sr.Resolved, sr.Resolved | None]:
        """Where the host answers, and where the config says it is when its provider moved it (else None)."""
        r = self.configured()
        moved = instances.endpoint_for(self.cfg.name, r.host, r.port)
        return (r, None) if moved is None else (dataclasses.replace(r, host=moved[0], port=moved[1]), r)

    def configured(self) -> sr.Resolved:
        """This host as the config and ssh_config say, before any move."""
        config = self._config_paths()
        return sr.resolve(self.cfg.address, config[0] if config else None, self.cfg.port, self.cfg.user)

    async def resolve(self) -> tuple[Target, dict[str, Any]]:
        """The host as ssh_config describes it, and the keyword arguments for asyncssh.connect() (see
        ``connect_options``: the one place they are built)."""
        config = self._config_paths()
        r, base = await asyncio.to_thread(self._moved)
        hops = await asyncio.to_thread(sr.jump_chain, r, config[0] if config else None)
        target = Target(
            alias=self.cfg.address,
            host=r.host,
            port=r.port,
            user=r.user,
            key_name=r.host_key_alias or r.host,
            known_hosts=tuple(kh.files_for(self.cfg.known_hosts, r.configured_known_hosts)),
            hops=tuple(hops),
            moved_from=None if base is None else (base.host_key_alias or base.host, base.port),
        )
        try:
            target.host.encode("idna")  # what name resolution does; an empty or 64+ char label fails it
        except UnicodeError:
            raise HostError(
                f"host name {target.host!r} is not a valid DNS name (a label between dots is empty or longer "
                "than 63 characters, or cannot be encoded)",
                "config",
            ) from None
        return target, connect_options(r, self.cfg, self.cfg.identity_file)

    def terminal_prefix(self) -> list[str]:
        argv = ["ssh", "-t"]
        config = self._config_paths()
        if self.ssh_config and config:
            argv += ["-F", config[0]]
        moved, base = self._moved()
        if base is not None:  # its provider moved it (gputui start): the key trusted where it was still holds
            alias = base.host_key_alias or kh.host_pattern(base.host, base.port)  # as OpenSSH names it
            argv += ["-o", f"HostName={moved.host}", "-p", str(moved.port), "-o", f"HostKeyAlias={alias}"]
        elif self.cfg.port is not None:
            argv += ["-p", str(self.cfg.port)]
        if self.cfg.user:
            argv += ["-l", self.cfg.user]
        if self.cfg.identity_file:
            argv += ["-i", os.path.expanduser(self.cfg.identity_file)]
        if self.cfg.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(self.cfg.known_hosts)}"]
        return [*argv, "--", self.cfg.address]

    # --- connection -------------------------------------------------------------------------------------------
    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        self._conn = None
        target, kw = await self.resolve()
        self._target = target
        if is_runpod_proxy(target.host):  # it runs no commands: say so now instead of failing later
            raise HostError(no_exec_message(self.cfg.name, target.host, "it offers interactive shells only"),
                            "no_exec")
        client = _Client()
        if self.cfg.verify_host_key:
            known: Any = kh.load(target.known_hosts)
            if target.moved_from is not None:  # the instance's key, trusted where the config says it is, holds
                known = kh.also_trusting(known, *target.moved_from)
        else:
            known = None
            if not self._warned_unverified:
                self._warned_unverified = True
                log.warning(
                    "%s: verify_host_key = false: NOT checking the host key of %s (anyone in between can "
                    "pose as the host)",
                    self.cfg.name,
                    target.pattern,
                )
        async with _connect_gate():
            tunnel = await self._through_hops(target, known is not None)
            try:
                self._conn = await self._dial(
                    kw, known, client, tunnel, lambda reason: self._host_key_error(target, client, reason)
                )
            except BaseException:
                if tunnel is not None:
                    tunnel.close()
                raise
            if tunnel is not None:
                self._conn.set_tunnel(tunnel)  # closing the connection closes its hops
        return self._conn

    async def _through_hops(self, target: Target, verify: bool) -> asyncssh.SSHClientConnection | None:
        """The ProxyJump hops connected in order, each through the one before (closing the last closes them
        all); the last one, None without hops. Each hop's key is checked against its own known_hosts files."""
        last: asyncssh.SSHClientConnection | None = None
        try:
            for hop in target.hops:
                kw = connect_options(hop, self.cfg, None)
                if last is not None:
                    kw.pop("proxy_command", None)  # reached through the hop before (as ``ssh -J``)
                files = kh.files_for(None, hop.configured_known_hosts)
                pattern = kh.host_pattern(hop.host_key_alias or hop.host, hop.port)

                def unknown(reason: str, pattern: str = pattern, files: list[str] = files) -> HostError:
                    return HostError(
                        f"jump host {pattern}: host key not trusted ({reason}); it is checked against "
                        f"{' or '.join(files)}: connect once with `ssh` to check and add it",
                        "host_key", tuple(files),
                    )

                conn = await self._dial(kw, kh.load(files) if verify else None, _Client(), last, unknown, "jump host ")
                if last is not None:
                    conn.set_tunnel(last)
                last = conn
        except BaseException:
            if last is not None:
                last.close()
            raise
        return last

    async def _dial(
        self,
        kw: dict[str, Any],
        known: Any,
        client: _Client,
        tunnel: asyncssh.SSHClientConnection | None,
        host_key_error: Callable[[str], HostError],
        role: str = "",
    ) -> asyncssh.SSHClientConnection:
        """asyncssh.connect() with ``kw``, its failures turned into HostError / HostUnavailable with the fix."""
        pattern = kh.host_pattern(kw["host"], kw["port"])
        where = f"{role}{kw['username']}@{pattern}"
        try:
            return await asyncssh.connect(known_hosts=known, client_factory=lambda: client, tunnel=tunnel or (), **kw)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise host_key_error(str(exc)) from None
        except asyncssh.KeyImportError as exc:  # a ValueError: before the catch-all below
            raise HostError(
                f"{role}cannot load the identity file: {exc} (an encrypted key must be loaded into ssh-agent: "
                "ssh-add)",
                "auth",
            ) from None
        except asyncssh.PermissionDenied:
            keys = f" with {kw['client_keys'][0]}" if kw.get("client_keys") else ""
            raise HostError(
                f"authentication failed for {where}{keys}: the server accepted none of our keys. "
                f"Check user/identity_file for this host, or add your public key to "
                f"~/.ssh/authorized_keys on the host",
                "auth",
            ) from None
        except asyncssh.KeyExchangeFailed as exc:
            raise HostError(f"{where}: key exchange failed: {exc}", "host_key") from None
        except ConnectionRefusedError:
            raise HostUnavailable(
                f"connection refused by {role}{pattern}: no sshd listens there (wrong port, or sshd is down)"
            ) from None
        except socket.gaierror as exc:
            raise HostUnavailable(f"cannot resolve {role}host name {kw['host']!r}: {exc.strerror}") from None
        except asyncio.TimeoutError:
            raise HostUnavailable(
                f"no SSH answer from {where} within {self.cfg.connect_timeout:g} s (host down, "
                "firewall, or the link is dead)"
            ) from None
        except ValueError as exc:  # asyncssh refusing a setting (a bad key or certificate file...)
            raise HostError(f"ssh settings for {where}: {exc}", "config") from None
        except (OSError, asyncssh.Error) as exc:
            raise HostUnavailable(f"cannot connect to {where}: {exc or type(exc).__name__}") from None

    def _host_key_error(self, target: Target, client: _Client, reason: str) -> HostError:
        fix, files = f"gputui trust {self.cfg.name}", tuple(target.known_hosts)  # (trusting it edits one of them)
        if client.presented is None:  # e.g. a revoked key: asyncssh refused it before asking us
            return HostError(f"host key of {target.pattern} rejected: {reason}", "host_key", files)
        name, addr, port, key = client.presented
        for path in target.known_hosts:
            old = kh.trusted_keys([path], name, addr, port)
            if old:
                return HostError(
                    f"HOST KEY CHANGED for {target.pattern}: {path} trusts "
                    f"{', '.join(kh.describe(k) for k in old)}, but the server now presents {kh.describe(key)}. "
                    "Someone may be intercepting the connection, or the host was reinstalled; not connecting. "
                    f"If the change is expected: ssh-keygen -R {shlex.quote(target.pattern)} -f "
                    f"{shlex.quote(path)} && {fix}",
                    "host_key", files,
                )
        return HostError(
            f"unknown host key for {target.pattern}: the server presents {kh.describe(key)}, which is not in "
            f"{' or '.join(target.known_hosts)}. If that is the host's key, run: {fix}",
            "host_key", files,
        )

    async def _run(self, conn: asyncssh.SSHClientConnection, script: str, data: bytes | None = None) -> _Ran:
        proc = await self._exec(conn, script)
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), COMMAND_TIMEOUT_S)
        except asyncio.TimeoutError:  # before OSError: on Python >= 3.11 it is one
            conn.abort()
            raise HostUnavailable(
                f"{self.cfg.name} did not finish preparing the agent within {COMMAND_TIMEOUT_S:g} s"
            ) from None
        except (OSError, asyncssh.Error) as exc:
            conn.abort()
            raise HostUnavailable(
                f"link lost while preparing the agent: {exc or type(exc).__name__}"
            ) from None
        if proc.exit_status is None:  # the connection died under the command
            raise HostUnavailable("link lost while preparing the agent")
        return _Ran(proc.exit_status, out or b"", err or b"")

    async def _exec(self, conn: asyncssh.SSHClientConnection, script: str) -> asyncssh.SSHClientProcess[bytes]:
        """A command's channel, open within connect_timeout; a server that runs no commands says the fix."""
        try:
            return await asyncio.wait_for(
                conn.create_process(sh(script), encoding=None), self.cfg.connect_timeout
            )
        except asyncio.TimeoutError:
            conn.abort()
            raise HostError(no_exec_message(self.cfg.name, self._target_host(), "no answer to the request "
                                            f"within {self.cfg.connect_timeout:g} s"), "no_exec") from None
        except asyncssh.ChannelOpenError as exc:
            raise HostError(no_exec_message(self.cfg.name, self._target_host(), exc.reason), "no_exec") from None
        except (OSError, asyncssh.Error) as exc:
            conn.abort()
            raise HostUnavailable(
                f"link lost while preparing the agent: {exc or type(exc).__name__}"
            ) from None

    def _target_host(self) -> str:
        return self._target.host if self._target is not None else self.cfg.address

    # --- deploy -----------------------------------------------------------------------------------------------
    async def _probe(self, conn: asyncssh.SSHClientConnection, name: str) -> dict[str, str]:
        """Facts about the host, read between markers with a random nonce: login noise cannot pass for them."""
        python = self.cfg.python or "python3"
        nonce = secrets.token_hex(8)
        begin, end = f"gputui-probe-{nonce}-begin", f"gputui-probe-{nonce}-end"
        prepare = (
            f'"$py" {PY_FLAGS} -c {shlex.quote(installer_source())} prepare "$dir" '
            f'{shlex.quote(name)} {shlex.quote(unpacked_name(name))} {STALE_UPLOAD_MIN} || {{ '
            f'"$py" {PY_FLAGS} -c "import sys; sys.exit(sys.version_info < (3, 8))" >/dev/null 2>&1 '
            '|| echo "old-python $("$py" -V 2>&1 | head -n 1)"; }\n'
        )
        probe = (
            f"printf '\\n%s\\n' {begin}; trap 'echo {end}' EXIT\n"
            f"umask 077; py={shlex.quote(python)}; dir={shell_path(self.cfg.remote_dir)}\n"
            'command -v "$py" >/dev/null 2>&1 || { echo missing-python; exit 0; }\n'
            'py=$(command -v "$py")\n'
            "command -v tmux >/dev/null 2>&1 || { echo missing-tmux; exit 0; }\n"
            'echo "python $py"\n'
            # One python start: the installer checks the version first (an older one fails or exits 3 before
            # doing anything; only then a second start says which version it is), then the ownership and modes
            # of the state dir and all above it, before anything is written or run there; then temp files of
            # uploads or unpacks that died go (a fresh one may be another client's).
            f"{prepare}"
            "exit 0\n"
        )
        res = await self._run(conn, probe)
        out = res.stdout.decode("utf-8", "replace")
        _, found, rest = out.partition(begin + "\n")
        body, finished, _ = rest.partition(end)
        if not (found and finished):
            detail = (res.stderr.decode("utf-8", "replace").strip() or out.strip() or "no output")[-500:]
            if "pty" in detail.lower():  # a proxy that wants an interactive terminal (RunPod's basic one)
                raise HostError(no_exec_message(self.cfg.name, self._target_host(), detail), "no_exec")
            raise HostError(
                f"the setup check on {self.cfg.name} did not run to its end (exit status {res.exit_status}): "
                f"{detail}. Does the login shell start (a .bashrc that exits or fails)?",
                "deploy",
            )
        facts = {"stderr": res.stderr.decode("utf-8", "replace").strip()[-500:]}
        for line in body.splitlines():
            key, _, value = line.partition(" ")
            facts[key] = value
        return facts

    async def _deploy(self, conn: asyncssh.SSHClientConnection) -> RemoteAgent:
        """Find python3 and tmux on the host; upload this agent build unless the host has it intact (the
        zipapp is made only when the host lacks it or holds it damaged)."""
        name = build_name()
        agent, facts = self._agent_of(await self._probe(conn, name), name)
        present, tree = facts.get("agent-sha256"), facts.get("agent-tree")
        if tree == tree_hash() and present is not None and present.startswith(name_digest(name)):
            return agent
        real, data = agent_build()
        if real != name:  # the local folder build_name read was misnamed: ask about the real build
            name = real
            agent, facts = self._agent_of(await self._probe(conn, name), name)
            present, tree = facts.get("agent-sha256"), facts.get("agent-tree")
        upload = present != hashlib.sha256(data).hexdigest()
        if upload and present is not None:
            log.warning("%s: the agent build on the host is damaged (%s); uploading it again", self.cfg.name, present)
        if tree != tree_hash() and tree is not None:
            log.warning("%s: the unpacked agent build on the host is damaged; unpacking it again", self.cfg.name)
        if upload or tree != tree_hash():
            await self._install(conn, agent, name, data if upload else None)
        return agent

    def _agent_of(self, facts: dict[str, str], name: str) -> tuple[RemoteAgent, dict[str, str]]:
        """Where the build ``name`` lives on the host, from the probe's ``facts``; HostError (with the fix)
        for a host that cannot run it."""
        python = self.cfg.python or "python3"
        host = self.cfg.name
        if "missing-python" in facts:
            raise HostError(
                f"{python} not found on {host} (looked in the login PATH). The agent needs Python >= 3.8: "
                f'install it (e.g. apt install python3) or set python = "/path/to/python3" for this host',
                "missing_python",
            )
        if "old-python" in facts:
            raise HostError(
                f"{python} on {host} is {facts['old-python'] or 'too old'}; the agent needs Python >= 3.8: "
                'install a newer one or set python = "/path/to/python3" for this host',
                "missing_python",
            )
        if "missing-tmux" in facts:
            raise HostError(
                f"tmux not found on {host} (looked in the login PATH). Jobs run in tmux so that they survive "
                "a dropped link: install it (e.g. apt install tmux)",
                "missing_tmux",
            )
        if "unsafe-dir" in facts:
            raise HostError(
                f"refusing remote_dir {self.cfg.remote_dir} on {host}: {facts['unsafe-dir']}; nothing was "
                "written or run there. Set remote_dir to a dir of your own that only you can write, "
                "e.g. ~/.gputui",
                "state_dir",
            )
        if "bad-dir" in facts or "dir" not in facts or "python" not in facts:
            detail = facts.get("bad-dir") or facts["stderr"] or "no output"
            raise HostError(f"cannot use remote_dir {self.cfg.remote_dir} on {host}: {detail}", _kind_of(detail))
        base = f"{facts['dir']}/agent/"
        return RemoteAgent(facts["python"], facts["dir"], base + name, base + unpacked_name(name)), facts

    async def _install(
        self, conn: asyncssh.SSHClientConnection, agent: RemoteAgent, name: str, data: bytes | None
    ) -> None:
        """Upload the zipapp when ``data`` is given (``cat > tmp``, check sha256 on the host, then ``mv``:
        hosts without sftp/scp work too), then unpack it beside itself, checked against ``tree_hash``.

        Temp files go whatever happens (a trap); one left by a killed upload is removed by a later probe.
        """
        py = shlex.quote(agent.python)
        script = f'umask 077; dir={shlex.quote(f"{agent.state_dir}/agent")}; mkdir -p "$dir" || exit 1\n'
        if data is not None:
            script += (
                f'tmp="$dir"/.{shlex.quote(name)}.$$\n'
                "trap 'rm -f \"$tmp\"' EXIT; trap 'exit 1' HUP INT TERM PIPE\n"
                'cat > "$tmp" || exit 1\n'
                f'sum=$({py} {PY_FLAGS} -c {shlex.quote(_SHA256_PY)} "$tmp") || exit 1\n'
                f'[ "$sum" = {hashlib.sha256(data).hexdigest()} ] '
                '|| { echo "sha256 mismatch after upload: $sum" >&2; exit 1; }\n'
                f'mv -f "$tmp" {shlex.quote(agent.pyz)} || exit 1\n'
            )
        script += (
            f"{py} {PY_FLAGS} -c {shlex.quote(installer_source())} unpack "
            f"{shlex.quote(agent.pyz)} {shlex.quote(agent.build)} {tree_hash()}\n"
        )
        res = await self._run(conn, script, data)
        if res.exit_status != 0:
            err = res.stderr.decode("utf-8", "replace").strip()[-500:] or f"exit status {res.exit_status}"
            what = "uploading the agent to" if data is not None else "unpacking the agent on"
            kind = _kind_of(err)
            if kind == "disk_full":
                err += f" (the disk holding {agent.state_dir} is full: free some space there)"
            raise HostError(f"{what} {self.cfg.name} failed: {err}", kind)
        log.info("%s: installed agent %s (%d bytes uploaded)", self.cfg.name, name, len(data or b""))

    # --- agent ------------------------------------------------------------------------------------------------
    async def open_agent(self) -> AgentChannel:
        conn = await self._connection()
        if self._agent is None:
            self._agent = await self._deploy(conn)
        agent = self._agent
        argv = [agent.python, *AGENT_PYTHON_FLAGS, agent.build, "serve", "--state-dir", agent.state_dir]
        argv += ["--idle-timeout", f"{self.idle_timeout:g}"]
        # The newline ends whatever a login script printed without one, so the agent's hello starts a line.
        main = shlex.quote(f"{agent.build}/__main__.py")
        script = f"{PRIVATE}; test -f {main} || exit {EXIT_NO_AGENT}; echo; exec {shlex.join(argv)}"
        try:
            proc = await asyncio.wait_for(
                conn.create_process(sh(script), encoding=None, window=AGENT_WINDOW),
                self.cfg.connect_timeout,
            )
        except asyncio.TimeoutError:  # before OSError: on Python >= 3.11 it is one
            conn.abort()
            raise HostUnavailable(
                f"{self.cfg.name} did not open the agent's channel within {self.cfg.connect_timeout:g} s"
            ) from None
        except (OSError, asyncssh.Error) as exc:
            conn.abort()
            raise HostUnavailable(f"cannot start the agent: {exc or type(exc).__name__}") from None
        channel = AgentChannel(proc.stdout, _Writer(proc.stdin), lambda: self._stop_agent(proc))
        channel.collect_stderr(proc.stderr)
        return channel

    async def open_agent_stream(self, args: list[str]) -> AgentChannel:
        conn = await self._connection()
        if self._agent is None:
            self._agent = await self._deploy(conn)
        argv = [self._agent.python, *AGENT_PYTHON_FLAGS, self._agent.build, *args]
        try:
            proc = await asyncio.wait_for(
                conn.create_process(sh(f"{PRIVATE}; exec {shlex.join(argv)}"), encoding=None),
                self.cfg.connect_timeout,
            )
        except (asyncio.TimeoutError, OSError, asyncssh.Error) as exc:
            raise HostUnavailable(f"cannot start the agent: {exc or type(exc).__name__}") from None
        channel = AgentChannel(proc.stdout, _Writer(proc.stdin), lambda: self._close_stream(proc))
        channel.collect_stderr(proc.stderr)
        return channel

    async def _close_stream(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        proc.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait_closed(), 5)

    async def open_tcp(
        self, host: str, port: int
    ) -> tuple[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]]:
        """A TCP stream from the host to ``host:port``, over this transport's one connection (as ``ssh -L``)."""
        conn = await self._connection()
        return await conn.open_connection(host, port, encoding=None)

    async def _stop_agent(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        """EOF on the agent's stdin (it exits then); close the channel if it lingers."""
        with contextlib.suppress(Exception):
            proc.stdin.write_eof()
        try:
            await asyncio.wait_for(proc.wait_closed(), 5)
        except (asyncio.TimeoutError, Exception):
            proc.close()
        if proc.exit_status not in (0, None):
            self._agent = None  # the build or the interpreter vanished or broke: probe (and upload) again

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)


async def fetch_host_key(transport: SSHTransport) -> tuple[Target, asyncssh.SSHKey]:
    """The key the host presents (no authentication of the host itself, nothing trusted): for ``gputui trust``.
    It goes exactly where the connection goes: the same options (``connect_options``), through the same
    ProxyCommand or ProxyJump hops (those are authenticated, as for the connection)."""
    target, kw = await transport.resolve()
    where = kh.host_pattern(target.host, target.port)
    async with _connect_gate():
        tunnel = await transport._through_hops(target, transport.cfg.verify_host_key)  # noqa: SLF001
        try:
            opts = await asyncssh.SSHClientConnectionOptions.construct(
                connect_timeout=transport.cfg.connect_timeout, config=None
            )
            key = await asyncssh.get_server_host_key(
                kw["host"], kw["port"], tunnel=tunnel or (), proxy_command=kw.get("proxy_command", ()), config=None,
                options=opts,
            )
        except ConnectionRefusedError:
            raise HostUnavailable(f"connection refused by {where}: no sshd listens there") from None
        except asyncio.TimeoutError:
            raise HostUnavailable(
                f"no SSH answer from {where} within {transport.cfg.connect_timeout:g} s"
            ) from None
        except (OSError, asyncssh.Error) as exc:
            raise HostUnavailable(f"cannot fetch the host key of {where}: {exc or type(exc).__name__}") from None
        finally:
            if tunnel is not None:
                tunnel.close()
    if key is None:
        raise HostError(f"{where} presented no host key", "host_key")
    return target, key

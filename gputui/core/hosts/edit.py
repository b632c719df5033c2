"""Adding and removing hosts: what ``ssh`` takes as a destination, and the config file edited in place.

``gputui add`` and ``gputui remove`` (gputui/cli/hosts.py) use this. The config is the user's file: a table is
appended or cut out as text, so every byte outside it (comments, order, formatting) stays as it was; tomlkit
writes the new table's TOML, and the result is parsed back and compared with what was meant before it replaces
the file (atomically, and never over a file that changed since it was read). A BOM, CRLF line ends, a missing
final newline and bytes that are not UTF-8 in comments are kept as they are.

gputui's writers (``add``, ``remove``, the app's ``+``) take turns: each holds an ``flock`` on a lock file beside
the config (``.NAME.gputui-lock``) from its last "unchanged since read" check to its rename. What remains is an
editor (not gputui) that saves in the instant between that check and the rename: its save is lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import ipaddress
import itertools
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from gputui.core.config import file as cfg

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NEW_FILE_HEADER = (
    "# gputui config: hosts and settings (every setting: docs/config.md in gputui's source).\n"
    "# `gputui add` appends [hosts.NAME] tables here; edit freely, comments are kept.\n"
)
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config file larger than this is not one gputui edits
MAX_SSH_CONFIG_BYTES = 1024 * 1024
LOCK_WAIT_S = 10.0  # how long a writer waits for another gputui writing the same config
BOM = "\ufeff"
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
#: ssh's flags that take no value and change nothing gputui would store: ignored in a pasted command line.
HARMLESS_FLAGS = set("tTCqv46")
#: ssh's options with a value that gputui stores (the letter, or the -o keyword in lower case).
VALUE_FLAGS = {"p": "port", "l": "user", "i": "identity_file"}
OPTION_KEYS = {"port": "port", "user": "user", "identityfile": "identity_file"}
_HINTS = {
    "L": "port forwards are `gputui forward HOST PORT`",
    "R": "gputui does not forward ports back",
    "D": "gputui does not open SOCKS proxies",
    "J": "put ProxyJump in ~/.ssh/config under a Host alias, then `gputui add NAME ALIAS`",
    "F": 'set ssh_config = "PATH" in the gputui config instead',
    "A": "gputui never forwards the ssh agent",
}


class EditError(ValueError):
    """The config cannot be edited as asked; nothing was written."""


class DestinationError(ValueError):
    """A destination or pasted ``ssh`` command line gputui cannot take (a usage error)."""


@dataclass(frozen=True)
class Destination:
    """Where a new host is, as the user gave it: only what was given is set (ssh_config fills in the rest)."""

    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None

    def table(self) -> dict[str, Any]:
        """The ``[hosts.NAME]`` keys for it."""
        keys = {"host": self.host, "user": self.user, "port": self.port, "identity_file": self.identity_file}
        return {k: v for k, v in keys.items() if v is not None}

    def merged(self, port: int | None = None, identity_file: str | None = None) -> Destination:
        """With ``-p``/``-i`` given beside it; a clash with what the destination says is an error."""
        for flag, ours, theirs in (("-p", self.port, port), ("-i", self.identity_file, identity_file)):
            if ours is not None and theirs is not None and ours != theirs:
                raise DestinationError(f"{flag} {theirs} contradicts the destination's {ours}: give one")
        return replace(self, port=self.port if port is None else port,
                       identity_file=self.identity_file or identity_file)


# --- destinations -------------------------------------------------------------------------------------------------
def _port(text: str, where: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise DestinationError(f"{where}: port must be a number from 1 to 65535, not {text!r}")
    return int(text)


def _check_host(host: str, given: str) -> str:
    if not host:
        raise DestinationError(f"{given!r}: no host name in it")
    if cfg.has_control(host) or any(ch.isspace() for ch in host) or host.startswith("-"):
        raise DestinationError(f"{given!r}: {host!r} is not a host name or address")
    return host


def _check_user(user: str, given: str) -> str:
    if not user or cfg.has_control(user) or any(ch.isspace() for ch in user) or user.startswith("-"):
        raise DestinationError(f"{given!r}: {user!r} is not a user name")
    return user


def _unbracket(host: str, given: str) -> str:
    """``[2001:db8::1]`` -> ``2001:db8::1``; a bracketed name must be an IPv6 address."""
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner.split("%")[0])
        except ValueError:
            raise DestinationError(f"{given!r}: [{inner}] is not an IPv6 address") from None
        return inner
    return host


def parse_destination(text: str) -> Destination:
    """A destination as ``ssh`` takes it: ``host``, ``user@host``, ``[v6addr]``, ``ssh://[user@]host[:port]``,
    or a ~/.ssh/config alias (kept as the host: ssh_config resolves it when gputui connects)."""
    given = text
    if text.lower().startswith("ssh://"):
        try:
            url = urlsplit(text)
            port = url.port
        except ValueError as exc:
            raise DestinationError(f"{given!r}: not an ssh:// URL: {exc}") from None
        if url.path not in ("", "/") or url.query or url.fragment or url.password is not None:
            raise DestinationError(f"{given!r}: an ssh:// destination is ssh://[user@]host[:port], nothing more")
        hostport = url.netloc.rpartition("@")[2]
        if hostport.startswith("["):
            host = _unbracket(hostport[: hostport.find("]") + 1], given)
        else:
            host = hostport.rsplit(":", 1)[0] if port is not None else hostport
        host = _check_host(host, given)
        user = _check_user(unquote(url.username), given) if url.username is not None else None
        return Destination(host=host, user=user, port=port)
    user_part, at, host = text.rpartition("@")
    user = _check_user(user_part, given) if at else None
    host = _unbracket(host, given)
    if host.count(":") == 1:
        raise DestinationError(
            f"{given!r}: ssh takes no host:port; use -p {host.rsplit(':', 1)[1]} or ssh://{text}"
        )
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise DestinationError(f"{given!r}: {host!r} is not a host name or IPv6 address") from None
    return Destination(host=_check_host(host, given), user=user)


def _unknown_option(flag: str) -> DestinationError:
    hint = _HINTS.get(flag.lstrip("-")[:1], "")
    return DestinationError(
        f"ssh option {flag} is not one gputui add takes (it takes -p PORT, -l USER, -i KEY, "
        f"-o Port=/User=/IdentityFile=){': ' + hint if hint else ''}"
    )


def _option(words: list[str], i: int, letter: str, rest: str) -> tuple[str, str, int]:
    """(gputui key, value, next index) of the value flag ``-<letter>`` at ``words[i]``."""
    value = rest
    if not value:
        if i + 1 >= len(words):
            raise DestinationError(f"ssh option -{letter} needs a value")
        value, i = words[i + 1], i + 1
    if letter != "o":
        return VALUE_FLAGS[letter], value, i + 1
    key, eq, val = value.partition("=")
    if not eq:  # -o "Port 22022"
        key, _, val = value.strip().partition(" ")
    key, val = key.strip(), val.strip()
    if key.lower() not in OPTION_KEYS:
        raise DestinationError(
            f"ssh option -o {key} is not one gputui add takes (it takes Port, User and IdentityFile; put "
            f"others in ~/.ssh/config under a Host alias, then `gputui add NAME ALIAS`)"
        )
    if not val:
        raise DestinationError(f"ssh option -o {key} needs a value")
    return OPTION_KEYS[key.lower()], val, i + 1


def parse_ssh_command(argv: Sequence[str]) -> Destination:
    """The destination in a pasted ``ssh ...`` command line (``ssh root@203.0.113.7 -p 22022 -i KEY``).

    ssh reads options before and after the destination; the first other word after it would be a remote
    command, which gputui add refuses, as it refuses any option it would not store (naming it).
    """
    words = list(argv)
    if not words or os.path.basename(words[0]) != "ssh":
        raise DestinationError(f"not an ssh command line: {shlex.join(words)!r} (it starts with ssh)")
    found: dict[str, str] = {}
    dest: str | None = None
    i = 1
    while i < len(words):
        word = words[i]
        if word == "--" and dest is None and i + 1 < len(words):
            dest, i = words[i + 1], i + 2
            continue
        if not word.startswith("-") or word == "-":
            if dest is not None:
                raise DestinationError(
                    f"{shlex.join(words[i:])!r} after the destination is a remote command: gputui add takes "
                    "none (jobs are `gputui run NAME -- CMD`)"
                )
            dest, i = word, i + 1
            continue
        letters = word[1:]
        if all(ch in HARMLESS_FLAGS for ch in letters):
            i += 1
            continue
        lead = letters.lstrip("".join(HARMLESS_FLAGS))  # -tp 22: harmless flags may come first
        letter, rest = lead[:1], lead[1:]
        if letter in VALUE_FLAGS or letter == "o":
            key, value, i = _option(words, i, letter, rest)
            if key in found and found[key] != value:
                raise DestinationError(f"ssh command line gives {key} twice ({found[key]!r}, {value!r})")
            found[key] = value
            continue
        raise _unknown_option(f"-{letter}")
    if dest is None:
        raise DestinationError(f"no destination in {shlex.join(words)!r} (like ssh user@host -p PORT)")
    base = parse_destination(dest)
    user = found.get("user")
    if user is not None and base.user is not None and user != base.user:
        raise DestinationError(f"ssh command line names two users ({base.user!r}, {user!r})")
    port = _port(found["port"], "ssh -p") if "port" in found else None
    base = base.merged(port=port, identity_file=found.get("identity_file"))
    return replace(base, user=base.user or (_check_user(user, dest) if user else None))


def parse(destination: str | None, command: Sequence[str] | None) -> Destination:
    """A ``gputui add`` destination: the word given, a quoted ``"ssh ..."`` in it, or the argv after ``--``."""
    if command:
        if destination is not None:
            raise DestinationError("give the destination or an ssh command line after --, not both")
        return parse_ssh_command(command)
    if destination is None:
        raise DestinationError("no destination: gputui add NAME USER@HOST [-p PORT] [-i KEY], or NAME -- ssh ...")
    if any(ch.isspace() for ch in destination):  # "ssh root@host -p 22022", quoted in one word
        try:
            words = shlex.split(destination)
        except ValueError as exc:  # an open quote
            raise DestinationError(f"cannot split {destination!r}: {exc}") from None
        return parse_ssh_command(words)
    return parse_destination(destination)


# --- ~/.ssh/config aliases --------------------------------------------------------------------------------------
def ssh_config_aliases(path: str | None) -> list[str]:
    """The plain ``Host`` names of an ssh_config and of the files it Includes (no wildcards, no negations), in
    the order OpenSSH reads them. A file that Includes itself (deeper than OpenSSH's 16 levels) is an
    EditError naming it."""
    found: list[str] = []
    _read_aliases(Path(os.path.expanduser(path or "~/.ssh/config")), found, 0)
    return found


def _read_aliases(file: Path, found: list[str], depth: int) -> None:
    try:
        with file.open("rb") as f:
            data = f.read(MAX_SSH_CONFIG_BYTES + 1)
    except OSError:  # a missing file, or an Include matching nothing readable: OpenSSH carries on too
        return
    if len(data) > MAX_SSH_CONFIG_BYTES:
        raise EditError(f"{file}: larger than {MAX_SSH_CONFIG_BYTES} bytes: not read")
    for raw in data.decode("utf-8", "replace").split("\n"):  # OpenSSH's line ends, not str.splitlines()'
        words = raw.strip().replace("=", " ", 1).split()
        if len(words) < 2 or words[0].lower() not in ("host", "include"):
            continue
        values = list(itertools.takewhile(lambda w: not w.startswith("#"), words[1:]))
        if words[0].lower() == "include":
            if depth >= MAX_INCLUDE_DEPTH:
                raise EditError(f"{file}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a file that "
                                "includes itself?): fix that Include line")
            for pattern in values:
                for included in _include_files(pattern):
                    _read_aliases(included, found, depth + 1)
            continue
        for name in values:
            if not any(ch in name for ch in "*?!") and name not in found and not cfg.has_control(name):
                found.append(name)


def _include_files(pattern: str) -> list[Path]:
    """The files an ``Include`` names, as OpenSSH finds them: relative to ~/.ssh, globbed, in sorted order."""
    pattern = os.path.expanduser(pattern)
    if not os.path.isabs(pattern):
        pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
    return [Path(p) for p in sorted(glob.glob(pattern))]


# --- the config file ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigFile:
    """The config as read: its path (a symlink resolved: the file it points to is edited), text, hash, mode,
    size and modification time."""

    path: Path
    text: str  # bytes that are not UTF-8 as surrogates (cfg.decode)
    sha256: str | None  # None: the file did not exist
    mode: int = 0o600
    stamp: tuple[int, int] | None = None  # (size, mtime in ns) as read

    @property
    def exists(self) -> bool:
        return self.sha256 is not None

    def config(self) -> cfg.Config:
        """The file's settings as gputui loads them (a ConfigError when they are broken)."""
        return cfg.parse(self.text, self.path)


def read(path: Path) -> ConfigFile:
    """Read the config at ``path`` to edit it (a missing file reads as empty: it is created on write)."""
    real = Path(os.path.realpath(path))
    try:
        with real.open("rb") as f:
            data, stamp, mode = _read_open(f)
    except FileNotFoundError:
        return ConfigFile(real, "", None)
    except OSError as exc:
        raise EditError(f"{real}: cannot read the config: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise EditError(f"{real}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not a config gputui edits")
    return ConfigFile(real, cfg.decode(data), hashlib.sha256(data).hexdigest(), mode, stamp)


def _read_open(f: BinaryIO) -> tuple[bytes, tuple[int, int], int]:
    """(at most MAX_CONFIG_BYTES + 1 bytes, (size, mtime_ns), mode) of an open file."""
    st = os.fstat(f.fileno())
    return f.read(MAX_CONFIG_BYTES + 1), (st.st_size, st.st_mtime_ns), st.st_mode & 0o7777


def _data(text: str, path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = tomllib.loads(text.removeprefix(BOM))
    except tomllib.TOMLDecodeError as exc:
        raise EditError(f"{path}: invalid TOML: {exc}") from None
    where = cfg.not_utf8(data)
    if where is not None:
        raise EditError(f"{path}: {where} holds bytes that are not UTF-8 (only comments may): edit it by hand")
    return data


def _eol(text: str) -> str:
    """The file's line end: CRLF when its first line ends so, else LF."""
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


def _lines(text: str) -> list[str]:
    """``text`` cut after each LF only (``str.splitlines`` also cuts at U+2028, FF, lone CR, ...)."""
    return [line for line in re.split(r"(?<=\n)", text) if line]


def _hosts(data: Mapping[str, Any]) -> dict[str, Any]:
    hosts = data.get("hosts", {})
    return hosts if isinstance(hosts, dict) else {}


def check_name(name: str) -> None:
    """A host name the config accepts; an EditError saying what it may be otherwise."""
    if not cfg._NAME.match(name) or name == cfg.LOCAL:
        what = f"{name!r} is gputui's name for this machine" if name == cfg.LOCAL else f"bad host name {name!r}"
        raise EditError(f"{what}: a host name is letters, digits, '.', '_' and '-' (at most 64, starting "
                        "with a letter or digit)")


def render_table(name: str, table: Mapping[str, Any]) -> str:
    """``[hosts.NAME]`` and its keys as TOML (tomlkit quotes what needs quoting)."""
    import tomlkit  # only when a host is added

    return tomlkit.dumps({"hosts": {name: dict(table)}})


def with_host(file: ConfigFile, name: str, table: Mapping[str, Any]) -> str:
    """The config's text with ``[hosts.NAME]`` appended; every byte before it as it was.

    An EditError when the name is taken or bad, or the file's TOML would not take the table as meant.
    """
    check_name(name)
    before = _data(file.text, file.path)
    if name in _hosts(before):
        raise EditError(f"{file.path}: a host named {name!r} exists already (gputui remove {name} first, or "
                        "choose another name)")
    text = file.text if file.exists else NEW_FILE_HEADER
    eol = _eol(text)
    if text.removeprefix(BOM) and not text.endswith("\n"):
        text += eol
    if text.removeprefix(BOM).strip() and not text.endswith(eol * 2):
        text += eol
    text += render_table(name, table).replace("\n", eol)
    expected = dict(before)
    expected["hosts"] = {**_hosts(before), name: dict(table)}
    try:
        after: Any = _data(text, file.path)
    except EditError:
        after = None
    if after != expected:
        raise EditError(f"{file.path}: the file's TOML does not take a [hosts.{name}] table at its end (hosts "
                        "written inline?): add it by hand")
    return text


_HEADER = re.compile(r"^\s*\[")


def _header_path(line: str) -> list[str] | None:
    """The key path of a table header line (``[hosts."a.b"]`` -> ``['hosts', 'a.b']``), else None."""
    if not _HEADER.match(line):
        return None
    try:
        data: Any = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(data, dict) and len(data) == 1:
        key = next(iter(data))
        path.append(key)
        data = data[key]
        if isinstance(data, list):  # [[array]]
            data = data[0] if data else None
    return path or None


def _is_comment_or_blank(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def without_host(file: ConfigFile, name: str) -> str:
    """The config's text without ``[hosts.NAME]`` (and its sub-tables, and the comment block set off above
    its header); every other byte as it was. Comments after its last key stay: they lead the next table, or,
    after the last table, belong to nobody."""
    before = _data(file.text, file.path)
    if name not in _hosts(before):
        known = ", ".join(sorted(_hosts(before))) or "none"
        raise EditError(f"{file.path}: no [hosts.{name}] table (hosts in the file: {known})")
    bom = BOM if file.text.startswith(BOM) else ""
    lines = _lines(file.text[len(bom) :])
    heads = [(i, p) for i, line in enumerate(lines) if (p := _header_path(line)) is not None]
    ours = [i for i, p in heads if p[:2] == ["hosts", name]]
    if not ours:
        raise EditError(f"{file.path}: [hosts.{name}] is not written as a table of its own: remove it by hand")
    start = ours[0]
    later = [i for i, p in heads if i > start and p[:2] != ["hosts", name]]
    end = later[0] if later else len(lines)
    while end - 1 > start and _is_comment_or_blank(lines[end - 1]):
        end -= 1  # the comments before the next header are that table's; after the last, nobody's
    if not later and all(not line.strip() for line in lines[end:]):
        end = len(lines)  # only blank lines after it: they go with it
    top = start
    while top > 0 and lines[top - 1].lstrip().startswith("#"):
        top -= 1
    if top < start and (top == 0 or lines[top - 1].strip()):
        top = start  # no blank line above the comments: they end the table before (or head the file), they stay
    if top > 0 and not lines[top - 1].strip() and (end == len(lines) or not lines[end].strip()):
        top -= 1  # one blank line of the two around the cut
    while top == 0 and end < len(lines) and not lines[end].strip():
        end += 1  # the file does not start with blank lines it did not have
    text = bom + "".join(lines[:top] + lines[end:])
    expected = dict(before)
    expected["hosts"] = {k: v for k, v in _hosts(before).items() if k != name}
    if not expected["hosts"] and "hosts" not in _data(text, file.path):
        del expected["hosts"]
    if _data(text, file.path) != expected:
        raise EditError(f"{file.path}: [hosts.{name}] is split over the file or written inline: remove it by hand")
    return text


def only_host(file: ConfigFile, name: str) -> str:
    """The config's text with every ``[hosts.X]`` table but ``name``'s cut out (as ``without_host`` cuts)."""
    text = file.text
    for other in _hosts(_data(file.text, file.path)):
        if other != name:
            text = without_host(replace(file, text=text), other)
    return text


def write(file: ConfigFile, text: str) -> None:
    """Replace the config with ``text`` atomically (a temp file beside it, then rename; its mode kept, 0600
    when new), unless it changed since ``file`` was read: then an EditError and nothing written. The last check
    and the rename are made holding gputui's lock (``locked``)."""
    path = file.path
    if not file.exists:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".gputui-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cfg.encode(text))
            f.flush()
            os.fsync(f.fileno())
        with locked(path):
            os.chmod(tmp, _check_unchanged(file))
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold gputui's lock of the config at ``path`` (an ``flock`` on ``.NAME.gputui-lock`` beside it, created
    0600 and left there), waiting at most ``LOCK_WAIT_S`` for another gputui holding it."""
    lock = path.parent / f".{path.name}.gputui-lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise EditError(f"{lock}: cannot open gputui's lock of the config: {exc.strerror or exc}") from None
    try:
        end = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise EditError(f"{path}: another gputui is writing it (it has held {lock} for "
                                    f"{LOCK_WAIT_S:g} s): nothing written; run the command again") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def _check_unchanged(file: ConfigFile) -> int:
    """The mode to give the new file; an EditError when the config's size, mtime or content is not as read."""
    mode, now = file.mode, None
    try:
        with file.path.open("rb") as f:
            data, stamp, mode = _read_open(f)
            now = (stamp, hashlib.sha256(data).hexdigest() if stamp == file.stamp else None)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise EditError(f"{file.path}: cannot read the config again: {exc.strerror or exc}") from None
    if now != ((file.stamp, file.sha256) if file.exists else None):
        what = "was created" if not file.exists else ("was removed" if now is None else "changed")
        raise EditError(f"{file.path} {what} while gputui worked on it (edited elsewhere?): nothing written; "
                        "run the command again")
    return mode


# --- hosts already there ------------------------------------------------------------------------------------------
def source(host: cfg.HostConfig, aliases: Sequence[str]) -> str:
    """Where a host's address comes from: ``local``, ``ssh_config`` (an alias there) or ``config``."""
    if host.transport == "local":
        return "local"
    return "ssh_config" if host.address in aliases else "config"


def address(host: cfg.HostConfig) -> str:
    """``user@host:port`` as configured (ssh_config may fill in the rest)."""
    if host.transport == "local":
        return "this machine"
    where = f"[{host.address}]" if ":" in host.address else host.address
    return f"{host.user + '@' if host.user else ''}{where}{f':{host.port}' if host.port else ''}"


async def same_host(config: cfg.Config, new: cfg.HostConfig) -> str | None:
    """The configured host that is ``new`` under another name (same address, port and user once ssh_config
    is applied), else None. A host whose settings do not resolve is skipped."""
    from gputui.core.transport.base import HostError
    from gputui.core.transport.ssh import SSHTransport

    async def where(host: cfg.HostConfig) -> tuple[str, int, str] | None:
        try:
            target, _ = await SSHTransport(host, ssh_config=config.ssh_config).resolve()
        except HostError:
            return None
        return target.host.lower(), target.port, target.user

    ours = await where(new)
    for name, host in config.hosts.items():
        if name != new.name and host.transport == "ssh" and ours is not None and await where(host) == ours:
            return name
    return None

"""Job secrets on this machine: where ``gputui run --secret NAME`` takes each value from.

The value of NAME is this machine's environment variable NAME (set and not empty), else ``NAME = "value"`` in
gputui's secrets file, ``secrets.toml`` next to the config in use (``~/.config/gputui/secrets.toml``), which must
be the user's own and readable by nobody else (mode 0600). The file is read only when a name is not in the
environment. The values travel to the host in the start request only; remote_agent/jobs/secrets.py says where
they live there, and for how long. No message here ever holds a value.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from gputui.core import paths
from gputui.core.errors import UsageError
from remote_agent.jobs import secrets as agent_secrets

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FILE_NAME = "secrets.toml"
#: Largest secrets file read.
MAX_FILE_BYTES = 1024 * 1024


class SecretError(UsageError, ValueError):
    """A ``--secret`` that has no value here, or a secrets file that cannot be used; names, never values."""


def secrets_file(config_path: Path | None) -> Path:
    """gputui's secrets file: beside the config file in use, else in gputui's config dir."""
    return (config_path.parent if config_path is not None else paths.config_dir()) / FILE_NAME


def resolve(names: Iterable[str], config_path: Path | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The value of each of ``names``: ``env`` (this process's environment), else the secrets file.

    A SecretError names what is wrong: a bad name, a name found nowhere, a file someone else may read."""
    names = list(dict.fromkeys(names))
    bad = [n for n in names if not agent_secrets.NAME.fullmatch(n)]
    if bad:
        raise SecretError(f"--secret {bad[0][:60]!r}: a variable name (letters, digits and _, not first)")
    if len(names) > agent_secrets.MAX_SECRETS:
        raise SecretError(f"--secret: at most {agent_secrets.MAX_SECRETS} secrets per job, not {len(names)}")
    env = os.environ if env is None else env
    values = {n: env[n] for n in names if env.get(n)}
    missing = [n for n in names if n not in values]
    if missing:
        path = secrets_file(config_path)
        stored = read_file(path)
        for name in missing:
            if name not in stored:
                raise SecretError(f"--secret {name}: no value: set ${name} here, or add {name} = \"...\" to {path} "
                                  "(mode 0600)")
            values[name] = stored[name]
    try:
        return agent_secrets.check(values)
    except ValueError as exc:  # (too long, NUL): worded with the name only
        raise SecretError(f"--secret: {exc}") from None


def read_file(path: Path) -> dict[str, str]:
    """The secrets file's ``NAME = "value"`` pairs ({} when there is no file). A file that is not the user's own
    regular file readable by them alone, or that is not TOML of strings, is a SecretError saying how to fix it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SecretError(f"secrets file {path}: cannot read it: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SecretError(f"secrets file {path}: not a regular file")
        if st.st_uid != os.getuid():
            raise SecretError(f"secrets file {path}: it belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
                              "keep your own copy there")
        if st.st_mode & 0o077:
            mode = oct(stat.S_IMODE(st.st_mode))[2:]
            raise SecretError(f"secrets file {path}: others may read it (mode {mode}); make it yours alone: "
                              f"chmod 600 {path}")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise SecretError(f"secrets file {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:  # the position only: tomllib may quote a character
        at = re.search(r"at line \d+, column \d+|at end of document", str(exc))
        where = f" ({at.group(0)})" if at else ""
        raise SecretError(f"secrets file {path}: not valid TOML{where}; write one NAME = \"value\" per line") from None
    bad = next((name for name, value in table.items() if not isinstance(value, str)), None)
    if bad is not None:
        raise SecretError(f"secrets file {path}: {bad[:60]!r} must be a string (NAME = \"value\")")
    return {name: str(value) for name, value in table.items()}

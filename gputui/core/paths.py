"""Where gputui keeps its files on this machine (XDG base directories), and writing them atomically."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from remote_agent.fsutil import write_atomic as _write_atomic


def _xdg(variable: str, *fallback: str) -> Path:
    base = os.environ.get(variable) or os.path.join(os.path.expanduser("~"), *fallback)
    return Path(base) / "gputui"


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/gputui`` (``~/.config/gputui``): config.toml, themes/."""
    return _xdg("XDG_CONFIG_HOME", ".config")


def state_dir() -> Path:
    """``$XDG_STATE_HOME/gputui`` (``~/.local/state/gputui``): the cost ledger, the app's remembered choices."""
    return _xdg("XDG_STATE_HOME", ".local", "state")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gputui`` (``~/.cache/gputui``): the agent build, ended jobs' insights."""
    return _xdg("XDG_CACHE_HOME", ".cache")


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (the XDG rule: costs, host names and job records
    are kept there), and tighten gputui's own dir on the way (``.../gputui``) where an older gputui left it 0755."""
    chain = [path, *path.parents]
    for missing in reversed([p for p in chain if not p.is_dir()]):
        with contextlib.suppress(FileExistsError):
            missing.mkdir(mode=0o700)
    for own in chain:
        if own.name == "gputui":
            with contextlib.suppress(OSError):
                st = own.stat()
                if st.st_uid == os.getuid() and st.st_mode & 0o077:
                    own.chmod(0o700)
            return


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` (synced, then renamed into place): a reader sees the old or the new file,
    never a mix; the parent directory is created when missing (0700, see ``make_dirs``)."""
    make_dirs(path.parent)
    _write_atomic(str(path), data, mode)


def sha256_file(path: str | Path, block: int = 1024 * 1024) -> str:
    """The file's sha256, read a block at a time (never the whole file in memory)."""
    import hashlib  # here: the app's first frame need not wait for it

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()

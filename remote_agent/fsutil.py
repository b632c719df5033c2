"""Crash-safe file helpers: every state file is written to a temp name and renamed into place."""

import json
import os
import tempfile
from typing import Any, Optional


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new content, never a mix."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode("utf-8") + b"\n")


def read_json(path: str) -> Optional[Any]:
    """Return the parsed file, or None when it is missing or unreadable (a torn write cannot happen)."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def ensure_private_dir(path: str) -> str:
    """Create ``path`` (and parents) with mode 0700 and return its absolute form."""
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path

"""What pulls fetched from each host: host path -> size and mtime of the version fetched (and where it went).

``gputui release`` compares the host's artifacts with this record to say what would be lost. The record errs
on the safe side: an entry missing (a crash, two pulls at once) only makes a file show as not yet pulled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gputui.core import paths

#: Most files one host's record remembers (the oldest are forgotten first).
MAX_ENTRIES = 50_000


def record_path(host: str) -> Path:
    return paths.state_dir() / "pulled" / f"{host}.json"


def load(host: str) -> dict[str, dict[str, Any]]:
    """Host path -> {"size", "mtime", "local"}; empty when there is no (readable) record."""
    try:
        data = json.loads(record_path(host).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def note(host: str, fetched: list[tuple[str, int, float, str]]) -> None:
    """Add (host path, size, mtime, local path) of each file now held here, verified."""
    if not fetched:
        return
    entries = load(host)
    for path, size, mtime, local in fetched:
        entries.pop(path, None)  # re-inserted last: the newest entries are kept when the record is trimmed
        entries[path] = {"size": size, "mtime": mtime, "local": local}
    kept = dict(list(entries.items())[-MAX_ENTRIES:])
    paths.write_atomic(record_path(host), json.dumps(kept).encode())


def is_fetched(entries: dict[str, dict[str, Any]], path: str, size: int, mtime: float) -> bool:
    """Whether the record holds exactly this version of the host's file."""
    e = entries.get(path)
    return e is not None and e.get("size") == size and e.get("mtime") == mtime

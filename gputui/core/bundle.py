"""Build the agent zipapp: ``remote_agent`` + the ``pynvml`` module, named by its content hash."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import zipfile
from pathlib import Path

import remote_agent

from .paths import write_atomic

_MAIN = b"from remote_agent.__main__ import main\nmain()\n"
_EPOCH = (2020, 1, 1, 0, 0, 0)  # fixed timestamps: the same sources always give the same bytes


def _sources() -> list[tuple[str, bytes]]:
    pkg = Path(remote_agent.__file__).parent
    files = [(f"remote_agent/{p.name}", p.read_bytes()) for p in sorted(pkg.glob("*.py"))]
    spec = importlib.util.find_spec("pynvml")
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        files.append(("pynvml.py", Path(spec.origin).read_bytes()))
    files.append(("__main__.py", _MAIN))
    return files


def build_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in _sources():
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return buf.getvalue()


def agent_build() -> tuple[str, bytes]:
    """(file name, bytes) of this client's agent build; the name carries the first 16 hex of its sha256."""
    data = build_bytes()
    return f"gputui-agent-{hashlib.sha256(data).hexdigest()[:16]}.pyz", data


def ensure_local_build(cache_dir: Path) -> Path:
    """Write the build into ``cache_dir`` once (atomically) and return its path."""
    name, data = agent_build()
    path = cache_dir / name
    if not path.exists() or path.read_bytes() != data:
        write_atomic(path, data, mode=0o644)
    return path

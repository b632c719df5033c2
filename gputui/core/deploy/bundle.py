"""Build the agent zipapp: ``remote_agent`` + the ``pynvml`` module, named by its content hash.

It runs unpacked beside it (``agent_install``), so the host caches its bytecode."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import shutil
import time
import zipfile
from pathlib import Path

import remote_agent
from gputui.core import paths
from gputui.core.deploy import install as agent_install

# The build's own folder always caches its bytecode, whatever PYTHONDONTWRITEBYTECODE says (jobs still see it).
_MAIN = b"import sys\nsys.dont_write_bytecode = False\nfrom remote_agent.__main__ import main\nmain()\n"
STALE_TEMP_S = 600.0  # a temp folder this old belongs to an unpack that died
_EPOCH = (2020, 1, 1, 0, 0, 0)  # fixed timestamps: the same sources always give the same bytes


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[tuple[str, bytes], ...]:
    pkg = Path(remote_agent.__file__).parent
    files = [(f"remote_agent/{p.relative_to(pkg).as_posix()}", p.read_bytes())
             for p in sorted(pkg.rglob("*.py")) if "__pycache__" not in p.parts]
    spec = importlib.util.find_spec("pynvml")
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        files.append(("pynvml.py", Path(spec.origin).read_bytes()))
    files.append(("__main__.py", _MAIN))
    return tuple(files)


@functools.lru_cache(maxsize=1)
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


def tree_hash() -> str:
    """The hash (``agent_install.files_hash``) the unpacked build must have."""
    return agent_install.files_hash(_sources())


def unpacked_name(pyz_name: str) -> str:
    """The folder the build named ``pyz_name`` is unpacked into: the same name without ``.pyz``."""
    return pyz_name[: -len(".pyz")]


def installer_source() -> str:
    """The text of ``agent_install``, run on a host as ``python3 -c TEXT check|unpack ...``."""
    return Path(agent_install.__file__).read_text(encoding="utf-8")


def ensure_local_build(cache_dir: Path) -> Path:
    """The build unpacked in ``cache_dir`` (checked; unpacked again when missing or damaged): run it with
    ``python3 DIR``.

    A folder already there with the right files is this build (its name is the hash of a zipapp made from
    the same files): found without making the zipapp, which costs ~40 ms of compression at every CLI start."""
    expected = tree_hash()
    with contextlib.suppress(OSError):
        for found in sorted(cache_dir.glob("gputui-agent-*"), key=lambda p: -p.stat().st_mtime):
            if found.is_dir() and agent_install.tree_hash(str(found)) == expected:
                return found
    name, data = agent_build()
    out = cache_dir / unpacked_name(name)
    if agent_install.tree_hash(str(out)) != expected:
        paths.make_dirs(cache_dir)
        for left in cache_dir.glob(".gputui-agent-*"):  # temp folders of unpacks that were killed
            with contextlib.suppress(OSError):
                if time.time() - left.stat().st_mtime > STALE_TEMP_S:
                    shutil.rmtree(left)
        agent_install.unpack(io.BytesIO(data), str(out), expected)
    return out

"""Unpack an agent build next to its zipapp and check it, on the host as here (stdlib only, Python >= 3.8).

The agent runs from the unpacked folder so Python caches its bytecode (``__pycache__``); zipimport would
compile every module at every start. The folder is checked by ``tree_hash`` (every file but ``__pycache__``),
which the client computes from its own sources. On a host this file's text runs as ``python3 -c TEXT``:

    check PYZ DIR            print ``agent-sha256 HEX`` (the zipapp) and ``agent-tree HEX`` (the folder)
    unpack PYZ DIR TREEHASH  unpack PYZ into DIR unless DIR already holds exactly TREEHASH
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import zipfile
from typing import IO, Iterable, List, Tuple, Union

CACHE_DIR = "__pycache__"


def files_hash(files: Iterable[Tuple[str, bytes]]) -> str:
    """sha256 over (name, size, bytes) of each file in name order."""
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(b"%s\0%d\0" % (name.encode("utf-8"), len(data)))
        digest.update(data)
    return digest.hexdigest()


def _read_tree(root: str) -> Iterable[Tuple[str, bytes]]:
    for here, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != CACHE_DIR]
        for name in names:
            path = os.path.join(here, name)
            with open(path, "rb") as fh:
                yield os.path.relpath(path, root).replace(os.sep, "/"), fh.read()


def tree_hash(root: str) -> str:
    """``files_hash`` of the files under ``root``, ``__pycache__`` left out; empty when it cannot be read."""
    try:
        return files_hash(_read_tree(root))
    except OSError:
        return ""


def unpack(pyz: Union[str, IO[bytes]], out: str, expected: str) -> None:
    """Make ``out`` hold the files of ``pyz``, checked against ``expected``; atomic, safe against a twin.

    A damaged ``out`` is moved aside and removed; one another process just completed is kept.
    """
    if os.path.isdir(out) and tree_hash(out) == expected:
        return
    parent, base = os.path.split(os.path.abspath(out))
    tmp = os.path.join(parent, f".{base}.d.{os.getpid()}")
    old = os.path.join(parent, f".{base}.old.{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(pyz) as zf:
            zf.extractall(tmp)
        if tree_hash(tmp) != expected:
            raise OSError(f"the unpacked agent build does not match its hash {expected}")
        if os.path.isdir(out) and tree_hash(out) == expected:
            return  # a twin finished first: its copy may be running already, keep it
        if os.path.lexists(out):
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (os.path.isdir(out) and tree_hash(out) == expected):  # not a twin's good copy: a failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: List[str]) -> int:
    if len(argv) == 3 and argv[0] == "check":
        if os.path.isfile(argv[1]):
            try:
                print("agent-sha256 " + _sha256_file(argv[1]))
            except OSError as exc:
                print(f"agent-sha256 unreadable: {exc}")
        if os.path.isdir(argv[2]):
            print("agent-tree " + tree_hash(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "unpack":
        try:
            unpack(argv[1], argv[2], argv[3])
        except (OSError, zipfile.BadZipFile) as exc:
            print(f"cannot unpack the agent build: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: check PYZ DIR | unpack PYZ DIR TREEHASH", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Unpack an agent build next to its zipapp and check it, on the host as here (stdlib only, Python >= 3.8).

The agent runs from the unpacked folder so Python caches its bytecode (``__pycache__``); zipimport would
compile every module at every start. The folder is checked by ``tree_hash`` (every file but ``__pycache__``),
which the client computes from its own sources. Python trusts any ``.pyc`` whose header matches its source,
whoever wrote it: so nothing is read, written or run in a state dir before ``safe_dir`` found it and every
dir above it safe, and a build with any entry (``__pycache__`` included) that is not ours alone counts as
damaged. On a host this file's text runs as ``python3 -c TEXT``:

    prepare STATEDIR PYZ DIR STALEMIN  check STATEDIR (creating it 0700 when missing), remove temp files
                             older than STALEMIN minutes from its ``agent/``, then print ``dir PATH`` (resolved),
                             ``agent-sha256 HEX`` (the zipapp) and ``agent-tree HEX`` (the folder), both
                             relative to ``agent/``; or ``unsafe-dir REASON`` and nothing else
    unpack PYZ DIR TREEHASH  unpack PYZ into DIR unless DIR already holds exactly TREEHASH
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import time
import zipfile
from typing import IO, Iterable, List, Optional, Tuple, Union

CACHE_DIR = "__pycache__"
TEMP_PREFIX = ".gputui-agent-"  # uploads and unpacks in progress (or killed) in the state dir's agent/


class UnsafePath(OSError):
    """A path another user could change: running code from it would run theirs."""


def _check_owned(path: str, st: os.stat_result) -> None:
    """``path`` must be ours and writable by nobody else."""
    if st.st_uid != os.getuid():
        raise UnsafePath("%s belongs to uid %d, not to you (uid %d)" % (path, st.st_uid, os.getuid()))
    if st.st_mode & 0o022:
        raise UnsafePath("%s is writable by others (mode %s)" % (path, oct(stat.S_IMODE(st.st_mode))[2:]))


def _check_above(path: str) -> None:
    """Every existing dir from ``/`` down to ``path``: owned by root or us, and writable by nobody else unless
    sticky (as ``/tmp``: others cannot rename what is ours there)."""
    here = os.path.sep
    for part in [p for p in path.split(os.path.sep) if p]:
        st = os.stat(here)
        if st.st_uid not in (0, os.getuid()):
            raise UnsafePath("%s belongs to uid %d (neither root nor you)" % (here, st.st_uid))
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePath("%s is writable by others (mode %s)" % (here, oct(stat.S_IMODE(st.st_mode))[2:]))
        here = os.path.join(here, part)
        if not os.path.isdir(here):
            return


def safe_dir(path: str) -> str:
    """``path`` resolved, created (0700) when missing, checked: ours, writable by nobody else, and every dir
    above it safe (``_check_above``). Raises UnsafePath (or OSError) with the path and why."""
    path = os.path.realpath(os.path.expanduser(path))
    _check_above(path)  # before anything is created below a dir someone else controls
    if not os.path.lexists(path):
        os.makedirs(path, 0o700)
        os.chmod(path, 0o700)  # makedirs' mode went through the umask
        path = os.path.realpath(path)
        _check_above(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath("%s is not a directory" % path)
    _check_owned(path, st)
    return path


def files_hash(files: Iterable[Tuple[str, bytes]]) -> str:
    """sha256 over (name, size, bytes) of each file in name order."""
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(b"%s\0%d\0" % (name.encode("utf-8"), len(data)))
        digest.update(data)
    return digest.hexdigest()


def _read_tree(root: str) -> Iterable[Tuple[str, bytes]]:
    """Each file under ``root`` but ``__pycache__``'s, with its bytes; UnsafePath for an entry that is not a
    plain dir or file of ours alone (``__pycache__``'s too: a planted ``.pyc`` would run)."""
    _check_owned(root, os.lstat(root))
    for here, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(here, name)
            st = os.lstat(path)
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise UnsafePath("%s is neither a file nor a directory" % path)
            _check_owned(path, st)
        if os.path.basename(here) == CACHE_DIR:
            continue
        for name in names:
            path = os.path.join(here, name)
            with open(path, "rb") as fh:
                yield os.path.relpath(path, root).replace(os.sep, "/"), fh.read()


def tree_hash(root: str) -> str:
    """``files_hash`` of the files under ``root``, ``__pycache__`` left out; empty when it cannot be read or
    holds anything that is not ours alone (then it is damaged: unpacked again)."""
    try:
        return files_hash(_read_tree(root))
    except OSError:
        return ""


def _make_private(root: str) -> None:
    """Dirs 0700, files 0600 under ``root``, whatever the umask."""
    for here, _dirs, names in os.walk(root):
        os.chmod(here, 0o700)
        for name in names:
            os.chmod(os.path.join(here, name), 0o600)


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
        _make_private(tmp)
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


def _remove_stale(agent_dir: str, minutes: float) -> None:
    """Temp files and folders of uploads or unpacks that died; a fresh one may be another client's at work."""
    try:
        names = os.listdir(agent_dir)
    except OSError:
        return
    for name in names:
        path = os.path.join(agent_dir, name)
        try:
            if name.startswith(TEMP_PREFIX) and time.time() - os.lstat(path).st_mtime > minutes * 60:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
        except OSError:
            pass


def _zipapp_hash(path: str) -> Optional[str]:
    """The zipapp's sha256 when it is a plain file of ours alone, ``damaged: WHY`` otherwise, None if absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath("%s is not a regular file" % path)
        _check_owned(path, st)
        return _sha256_file(path)
    except OSError as exc:
        return "damaged: %s" % exc


def prepare(state_dir: str, pyz: str, build: str, stale_min: float) -> List[str]:
    """The probe's lines (see the module's docstring); UnsafePath when the state dir must not be used."""
    top = safe_dir(state_dir)
    lines = ["dir " + top]
    agent_dir = os.path.join(top, "agent")
    if os.path.lexists(agent_dir):
        st = os.lstat(agent_dir)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath("%s is not a directory" % agent_dir)
        _check_owned(agent_dir, st)
        _remove_stale(agent_dir, stale_min)
        found = _zipapp_hash(os.path.join(agent_dir, pyz))
        if found is not None:
            lines.append("agent-sha256 " + found)
        if os.path.lexists(os.path.join(agent_dir, build)):
            lines.append("agent-tree " + tree_hash(os.path.join(agent_dir, build)))
    return lines


def main(argv: List[str]) -> int:
    if sys.version_info < (3, 8):  # the agent's floor: nothing is done with an older one (the probe says why)
        return 3
    os.umask(0o077)
    if len(argv) == 5 and argv[0] == "prepare":
        try:
            lines = prepare(argv[1], argv[2], argv[3], float(argv[4]))
        except UnsafePath as exc:
            lines = ["unsafe-dir %s" % exc]
        except OSError as exc:  # the dir cannot be made or read (a full disk, no permission)
            lines = ["bad-dir %s: %s" % (argv[1], exc.strerror or exc)]
        print("\n".join(lines))
        return 0
    if len(argv) == 4 and argv[0] == "unpack":
        try:
            unpack(argv[1], argv[2], argv[3])
        except (OSError, zipfile.BadZipFile) as exc:
            print(f"cannot unpack the agent build: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: prepare STATEDIR PYZ DIR STALEMIN | unpack PYZ DIR TREEHASH", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

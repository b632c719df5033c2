"""The local agent build: unpacked beside its hash, checked, unpacked again when damaged; runs with .pyc."""

from __future__ import annotations

import ctypes
import io
import os
import subprocess
import sys
import time
from pathlib import Path

from gputui.core.deploy import bundle
from gputui.core.deploy import install as agent_install
from gputui.core.deploy.agentproc import AGENT_PYTHON_FLAGS
from gputui.core.deploy.bundle import agent_build, ensure_local_build, tree_hash


def test_local_build_is_unpacked_checked_and_repaired(tmp_path: Path) -> None:
    build = ensure_local_build(tmp_path)
    assert build.name == agent_build()[0][: -len(".pyz")]
    assert agent_install.tree_hash(str(build)) == tree_hash()
    res = subprocess.run([sys.executable, str(build), "cat", str(build / "__main__.py"), "0"],
                         capture_output=True, check=True)
    assert res.stdout == (build / "__main__.py").read_bytes()
    assert list((build / "remote_agent" / "__pycache__").glob("*.pyc")), "no bytecode cached"

    stale, fresh = tmp_path / f".{build.name}.d.4242", tmp_path / f".{build.name}.d.4343"  # killed; in progress
    for path in (stale, fresh):
        path.mkdir()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    (build / "remote_agent" / "jobs.py").write_bytes(b"damaged")
    assert ensure_local_build(tmp_path) == build
    assert agent_install.tree_hash(str(build)) == tree_hash()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([build.name, fresh.name])  # ours are gone


def test_unpack_refuses_a_build_that_does_not_match_its_hash(tmp_path: Path) -> None:
    out = tmp_path / "gputui-agent-x"
    try:
        agent_install.unpack(io.BytesIO(agent_build()[1]), str(out), "0" * 64)
    except OSError as exc:
        assert "does not match" in str(exc)
    else:
        raise AssertionError("a build with the wrong hash was unpacked")
    assert list(tmp_path.iterdir()) == []


def test_a_local_build_already_unpacked_is_found_without_making_the_zipapp(tmp_path: Path, monkeypatch) -> None:
    build = ensure_local_build(tmp_path)
    (tmp_path / "gputui-agent-0123456789abcdef").mkdir()  # an older build beside it: not this one

    def no_zipapp() -> bytes:
        raise AssertionError("the zipapp was made (zlib at every CLI start)")

    monkeypatch.setattr(bundle, "build_bytes", no_zipapp)
    assert ensure_local_build(tmp_path) == build


def test_the_agent_starts_without_site_packages_and_without_http(tmp_path: Path) -> None:
    """``-S``: no site-packages ``.pth`` files at every start; notify's urllib only when a webhook is sent;
    pynvml only where the NVML library is."""
    build = ensure_local_build(tmp_path)
    argv = [sys.executable, *AGENT_PYTHON_FLAGS, "-X", "importtime", str(build), "serve"]
    res = subprocess.run([*argv, "--state-dir", str(tmp_path / "state"), "--linger", "0"],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert res.stdout.startswith('{"event":"hello"'), res.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "remote_agent.server" in imported
    assert {"site", "urllib.request", "http.client"} & imported == set()
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:  # no NVIDIA driver here: pynvml is not even imported
        assert "pynvml" not in imported
